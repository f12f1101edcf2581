"""`./ifec interop frr`: FRR (Debian's bgpd and zebra, unmodified) against the project's FARE-over-BGP speakers on
the live fabric (superpod-8x2), in both roles, under four conditions, as a matrix that exits non-zero when a row
fails.

- FRR as a switch (p1-sw): its sessions with the GPUs' stub speakers; the GPUs' loopbacks it learns, with the
  bandwidth each GPU advertises; the weights zebra installs in the kernel against those bandwidths; its own loopback
  learned by our GPUs; and every GPU pair's FARE plane shares, through FRR, against the reference (fare_plane_gbps,
  the simulator's FareRib).
- FRR as a GPU (gpu7): its sessions with our switches; every other GPU's loopback from both planes, with our
  switches' path bandwidth; zebra's weights against it (a half-failed Y-cable elsewhere changes them); its loopback
  learned by our switches; and the plane shares toward it.
- Conditions: healthy; a half-failed Y-cable (one sub-link down); a failed plane (every link of the plane-1
  switch down); FRR killed (its sessions close with it: the time until every GPU has withdrawn it is measured);
  FRR started again (the time until the healthy state is back).
- Malformed UPDATEs (a raw speaker in a node's place, FRR or ours killed) to our switch and to our GPU: ORIGIN 5 is
  treat-as-withdraw (the route goes, the session stays, no NOTIFICATION: RFC 7606 §7.1) and a path attribute
  length past the message resets the session with NOTIFICATION 3/1 (Malformed Attribute List, RFC 4271 §6.3); the
  daemon goes on running. The same to FRR, for the record: FRR 8.4 withdraws the ORIGIN 5 route (it logs
  treat-as-withdraw) and then resets the session with 3/10; it keeps running.
"""

import contextlib
import ipaddress
import json
import os
import pathlib
import re
import select
import socket
import struct
import subprocess
import sys
import time

from . import _native, frr, live

TOPOLOGY = "superpod-8x2.yaml"
AS_TRANS = 23456


def _topology_file():
    here = pathlib.Path(__file__).resolve()
    for p in here.parents:
        f = p / "testbed" / "topologies" / TOPOLOGY
        if f.exists():
            return f
    raise RuntimeError(f"testbed/topologies/{TOPOLOGY} not found above {here}")


def _lb_gbps(path):
    """The link bandwidth a path of FRR's JSON carries, in our Gb/s (FRR prints our units as Mbps)."""
    m = re.search(r"LB:\d+:\d+ \(([\d.]+) ([KMG])bps\)", (path.get("extendedCommunity") or {}).get("string", ""))
    if not m:
        return None
    return float(m.group(1)) * {"K": 1e-3, "M": 1.0, "G": 1e3}[m.group(2)]


def _close(weights, bandwidths):
    """Installed weights (zebra's integers) in proportion to the bandwidths, within its rounding."""
    if not weights and not bandwidths:
        return True
    if len(weights) != len(bandwidths):
        return False
    tw, tb = sum(weights), sum(bandwidths)
    return all(abs(w / tw - b / tb) <= 0.02 for w, b in zip(weights, bandwidths))


_ip = frr._ip  # a host-order address as a dotted quad


def _fmt(xs):
    return "/".join(f"{x:g}" for x in xs) or "none"


class Matrix:
    def __init__(self, fab, role, frr_node, progress):
        self.fab, self.role, self.node, self.progress = fab, role, frr_node, progress
        self.f = fab.frr[frr_node]
        self.topo = fab.topo
        self.gpus = [n for n in self.topo.nodes if n["kind"] == "gpu"]
        self.rows = []
        self.down = set()  # link ids down
        self.focus = self.gpus[0]  # the GPU whose routes the weights column shows (the half-failed one)
        self.captures = []

    # -------------------------------------------------------------------------------------- what is expected --

    def up_links(self, a, b):
        return [l for l in self.topo.links if {l["a"], l["b"]} == {a, b} and l["id"] not in self.down]

    def bundle(self, a, b):
        return sum(l["rate_gbps"] for l in self.up_links(a, b))

    def ours(self):
        return [g for g in self.gpus if g["name"] not in self.fab.frr]

    def share_problems(self, alive=True, only=None):
        """Every (our GPU, other GPU) pair's plane shares against the reference (FRR's links down when it is not
        alive); toward `only` alone when given."""
        down = set(self.down)
        if not alive:
            down |= {l["id"] for l in self.topo.links if self.node in (l["a"], l["b"])}
        ref = _native.fare_plane_gbps(self.topo, sorted(down))
        bad = []
        for s in self.ours():
            for d in self.gpus:
                if s is d or (only is not None and d is not only):
                    continue
                got = self.fab.plane_gbps(s["gpu"], d["gpu"])
                want = ref[s["gpu"]][d["gpu"]]
                if any(abs(g - w) > 1e-6 for g, w in zip(got, want)):
                    bad.append(f"{s['name']}->{d['name']} {_fmt(got)} (reference {_fmt(want)})")
        return bad

    # -------------------------------------------------------------------------------------------- the checks --

    def frr_routes(self):
        """GPU loopback -> sorted [(next hop, our Gb/s)] in FRR's BGP table (valid paths), and the kernel's routes."""
        learned = {}
        for d in self.gpus:
            prefix = f"{_ip(d['loopback'])}/32"
            if d["name"] == self.node:
                continue
            paths = self.f.vtysh(f"show bgp ipv4 unicast {prefix} json").get("paths", [])
            learned[prefix] = sorted((p["nexthops"][0]["ip"], _lb_gbps(p)) for p in paths if p.get("valid"))
        return learned, self.f.kernel_routes()

    def expected_paths(self, d):
        """sorted [(next hop address, Gb/s)] FRR should hold for GPU d's loopback."""
        out = []
        if self.role == "switch":  # from d itself, on each up sub-link, with d's bundle toward this switch
            for l in self.up_links(d["name"], self.node):
                out.append((frr.link_address(l, d["name"]), self.bundle(d["name"], self.node)))
        else:  # from each plane's switch, on each of our sub-links, with that switch's path bandwidth toward d
            for sw in (n for n in self.topo.nodes if n["kind"] == "switch"):
                bw = self.bundle(sw["name"], d["name"])
                for l in self.up_links(self.node, sw["name"]):
                    if bw > 0:
                        out.append((frr.link_address(l, sw["name"]), bw))
        return sorted(out)

    def problems(self, alive=True):
        """What differs from the expected state now: (problems, sessions text, routes text, weights text)."""
        problems = []
        states = self.f.sessions() if alive else {}
        want_sessions = sum(1 for l in self.topo.links
                            if self.node in (l["a"], l["b"]) and l["id"] not in self.down) if alive else 0
        est = sum(1 for s in states.values() if s == "Established")
        if est != want_sessions:
            problems.append(f"{est} of {want_sessions} sessions Established")
        routes_text, weights_text = "-", "-"
        if alive:
            try:
                learned, kernel = self.frr_routes()
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
                return problems + [f"FRR: {e}"], f"{est}/{want_sessions}", "-", "-"
            n_ok = 0
            for prefix, got in learned.items():
                d = next(g for g in self.gpus if f"{_ip(g['loopback'])}/32" == prefix)
                want = self.expected_paths(d)
                if got != want:
                    problems.append(f"FRR's {prefix}: {got} (expected {want})")
                    continue
                n_ok += 1
                hops = kernel.get(prefix, [])
                bw_by_hop = dict(want)
                if sorted(h for h, _ in hops) != sorted(bw_by_hop) or \
                        not _close([w for _, w in hops], [bw_by_hop.get(h, 0) for h, _ in hops]):
                    problems.append(f"kernel {prefix}: weights {hops} (bandwidths {want})")
            routes_text = f"{n_ok}/{len(learned)} GPUs, {sum(len(v) for v in learned.values())} paths"
            focus = f"{_ip(self.focus['loopback'])}/32"
            paths = _fmt(sorted(b for _, b in self.expected_paths(self.focus)))
            weights_text = (f"{self.focus['name']}: {paths}{' Gb/s' if paths != 'none' else ''} -> "
                            f"{_fmt(sorted(w for _, w in kernel.get(focus, [])))}")
            problems += self.our_view()
        problems += self.share_problems(alive)
        return problems, (f"{est}/{want_sessions}" if alive else "killed"), routes_text, weights_text

    def check(self, condition, since, alive=True, timeout=15.0, toward=None):
        """A row: the state once it matches the expected one (or as it is after `timeout`), with two times from
        `since` (before the change): until every one of our GPUs' plane shares toward the focus GPU were the
        reference's (polled every 20 ms), and until everything was (FRR's table and kernel too)."""
        ours = self.wait(lambda: not self.share_problems(alive, only=toward or self.focus), timeout, since)
        while True:
            problems, sessions, routes, weights = self.problems(alive)
            if not problems or time.time() - since > timeout:
                break
            time.sleep(0.05)
        seconds = (ours, None if problems else time.time() - since)
        row = dict(role=f"FRR as {self.role} ({self.node})", condition=condition, sessions=sessions, routes=routes,
                   weights=weights, seconds=seconds, ok=not problems, problems=problems[:4])
        self.rows.append(row)
        self.progress(f"interop frr: {row['role']}, {condition}: {'pass' if row['ok'] else 'FAIL'}"
                      + (f" ({'; '.join(problems[:2])})" if problems else ""))
        return row

    def our_view(self):
        """What our speakers learned from FRR: its loopback (switch role, at every GPU) or its GPU loopback with
        its bundle bandwidth (GPU role, at every switch)."""
        _, pb, _ = live._grpc()
        frr_lo = f"{_ip(self.fab.node(self.node)['loopback'])}/32"
        problems = []
        askers = [g["name"] for g in self.ours()] if self.role == "switch" else \
            [n["name"] for n in self.topo.nodes if n["kind"] == "switch"]
        for name in askers:
            if self.bundle(name, self.node) == 0:
                continue
            rib = self.fab.stub(name).BgpRib(pb.Empty(), timeout=5)
            got = [r for r in rib.routes if r.prefix == frr_lo]
            if not got:
                problems.append(f"{name} has no route to FRR's {frr_lo}")
            elif self.role == "gpu" and any(abs(r.path_gbps - self.bundle(name, self.node)) > 1e-6 for r in got):
                problems.append(f"{name}: FRR's {frr_lo} with {[r.path_gbps for r in got]} Gb/s "
                                f"(expected {self.bundle(name, self.node):g})")
        return problems

    # ------------------------------------------------------------------------------------------ conditions --

    def wait(self, ok, timeout=10.0, since=None):
        """Seconds from `since` (default now) until ok() holds (polled every 20 ms), None when it never did."""
        t0 = time.time() if since is None else since
        while time.time() - t0 < timeout:
            try:
                if ok():
                    return time.time() - t0
            except Exception:  # a daemon busy reconverging
                pass
            time.sleep(0.02)
        return None

    @contextlib.contextmanager
    def capture(self, link, what):
        """dumpcap on `link` (at its a-end) while the block runs, then tshark's count of the BGP messages by type
        and of malformed packets, as a row."""
        end = "b" if link["b"] == self.node else "a"  # FRR's end: never taken down administratively here
        pcap = self.fab.log_dir / f"bgp-{self.role}-link{link['id']}.pcap"
        pcap.unlink(missing_ok=True)
        p = self.fab.hosts[link[end]].popen(["dumpcap", "-q", "-i", f"f{link[end + '_port']}", "-f", "tcp port 179",
                                             "-w", str(pcap)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # dumpcap opens the interface
        try:
            yield
        finally:
            time.sleep(0.5)
            p.terminate()
            p.wait(10)
        self.rows.append(decode_capture(pcap, f"capture of link {link['id']} ({link['a']}-{link['b']})", what))
        self.progress(f"interop frr: {self.rows[-1]['role']}: {self.rows[-1]['condition']}")

    def set_links(self, selector, up):
        for l in self.fab.set_link(selector, up):
            (self.down.discard if up else self.down.add)(l["id"])

    def run(self, half_failed, plane_switch):
        self.focus = self.fab.node(half_failed.split(":")[0])
        self.check("healthy", time.time())
        t = time.time()
        self.set_links(half_failed, False)
        self.check("half-failed Y-cable " + half_failed, t)
        t = time.time()
        self.set_links(half_failed, True)
        self.check("restored", t)
        plane = [l for l in self.topo.links if plane_switch in (l["a"], l["b"])]
        t = time.time()
        for l in plane:
            self.set_links(l["id"], False)
        self.check("failed plane (every link of " + plane_switch + ")", t)
        watched = next(l for l in plane if self.focus["name"] in (l["a"], l["b"]))
        with self.capture(watched, "plane restored: sessions between our speakers and FRR's"):
            t = time.time()
            for l in plane:
                self.set_links(l["id"], True)
            self.check("plane restored", t)
        t = time.time()
        self.fab.kill(self.node)
        frr_gpu = self.fab.node(self.node) if self.role == "gpu" else None  # then the shares toward it change
        self.check("FRR killed (its sessions close with it)", t, alive=False, toward=frr_gpu)
        frr_link = next(l for l in self.topo.links if self.node in (l["a"], l["b"]))
        with self.capture(frr_link, "FRR started again: its sessions' bring-up"):
            t = time.time()
            self.fab.start(self.node)
            self.check("FRR started again", t, timeout=30, toward=frr_gpu)


# ------------------------------------------------------------------------------------- a raw BGP speaker --

def _msg(kind, body):
    return b"\xff" * 16 + struct.pack("!HB", 19 + len(body), kind) + body


def _open(asn, router_id, hold=3):
    caps = bytes([1, 4, 0, 1, 0, 1]) + bytes([65, 4]) + struct.pack("!I", asn)
    params = bytes([2, len(caps)]) + caps
    return _msg(1, struct.pack("!BHH4sB", 4, AS_TRANS if asn > 65535 else asn, hold, socket.inet_aton(router_id),
                               len(params)) + params)


def _update(asn, next_hop, prefix, origin=0, overrun=0, gbps=800.0):
    lb = bytes([0x00, 0x04]) + struct.pack("!Hf", AS_TRANS, gbps * 125000)
    attrs = (bytes([0x40, 1, 1, origin]) + bytes([0x40, 2, 6, 2, 1]) + struct.pack("!I", asn) +
             bytes([0x40, 3, 4]) + socket.inet_aton(next_hop) + bytes([0xC0, 16, 8]) + lb)
    nlri = bytes([32]) + socket.inet_aton(prefix)
    return _msg(2, struct.pack("!H", 0) + struct.pack("!H", len(attrs) + overrun) + attrs + nlri)


def raw_speaker(local, peer, asn, router_id, prefix):
    """Runs in a node's namespace (python -m ifec.frr_interop _raw ...): a BGP session to `peer` from `local`, then
    the commands on stdin (announce, bad-origin, overrun), each answered with a JSON line: the session's state and
    the NOTIFICATIONs received since."""
    buf, notes, state, last_ka = b"", [], "OpenSent", 0.0
    s = None

    def pump(timeout):
        nonlocal buf, state
        r, _, _ = select.select([s], [], [], timeout)
        if r:
            data = s.recv(65536)
            if not data:
                state = "closed"
                return
            buf += data
        while len(buf) >= 19 and len(buf) >= struct.unpack("!H", buf[16:18])[0]:
            n, kind = struct.unpack("!HB", buf[16:19])
            body, buf = buf[19:n], buf[n:]
            if kind == 1:
                s.sendall(_msg(4, b""))
            elif kind == 4 and state == "OpenSent":
                state = "Established"
            elif kind == 3:
                notes.append(f"{body[0]}/{body[1]}")

    deadline = time.time() + 10
    while state != "Established" and time.time() < deadline:  # a peer in Idle (idle hold) refuses: again
        s = socket.socket()
        s.bind((local, 0))
        s.settimeout(5)
        try:
            s.connect((peer, 179))
            s.sendall(_open(asn, router_id))
            state, buf = "OpenSent", b""
            t = time.time()
            while state == "OpenSent" and time.time() - t < 3:
                pump(0.2)
        except OSError:
            state = "closed"
        if state != "Established":
            s.close()
            time.sleep(0.3)
    print(json.dumps(dict(state=state, notifications=notes)), flush=True)
    while state != "closed":
        if time.time() - last_ka > 0.8 and state == "Established":
            s.sendall(_msg(4, b""))
            last_ka = time.time()
        r, _, _ = select.select([sys.stdin], [], [], 0.1)
        if r:
            cmd = sys.stdin.readline().strip()
            if not cmd:
                break
            msg = {"announce": _update(asn, local, prefix), "bad-origin": _update(asn, local, prefix, origin=5),
                   "overrun": _update(asn, local, prefix, overrun=10)}[cmd]
            notes.clear()
            s.sendall(msg)
            end = time.time() + 1.0
            while time.time() < end and state != "closed":
                pump(0.1)
            print(json.dumps(dict(state=state, notifications=list(notes))), flush=True)
        pump(0)
    print(json.dumps(dict(state=state, notifications=notes)), flush=True)


def malformed(fab, speaker_node, target, check_has_route, progress):
    """A raw speaker takes `speaker_node`'s place (its daemon killed) toward `target`: a route announced, then the
    same with ORIGIN 5 (treat-as-withdraw: gone, session up), then an overrun attribute length (NOTIFICATION 3/1)."""
    nd = fab.node(speaker_node)
    link = next(l for l in fab.links if {l["a"], l["b"]} == {speaker_node, target})
    local, peer = frr.link_address(link, speaker_node), frr.link_address(link, target)
    prefix = _ip(nd["loopback"])
    fab.kill(speaker_node)
    time.sleep(0.5)
    p = fab.hosts[speaker_node].popen([sys.executable, "-m", "ifec.frr_interop", "_raw", local, peer,
                                       str(frr.AS_BASE + nd["index"]), prefix, prefix], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).parent.parent)))
    steps = []

    def step(cmd):
        try:
            if cmd:
                p.stdin.write(cmd + "\n")
                p.stdin.flush()
            line = p.stdout.readline()
            return json.loads(line)
        except (OSError, ValueError):  # the speaker ended: what it said last
            p.wait(5)
            return dict(state="ended", notifications=[], text=p.stdout.read()[-300:])

    try:
        opened = step(None)
        steps.append(("session", opened["state"] == "Established", opened["state"] + opened.get("text", "")))
        a = step("announce")
        time.sleep(0.5)
        learned = check_has_route(prefix)
        steps.append(("route learned", learned, f"{prefix}/32 {'in' if learned else 'NOT in'} {target}'s RIB"))
        b = step("bad-origin")
        time.sleep(0.5)
        gone = not check_has_route(prefix)
        steps.append(("ORIGIN 5: treat-as-withdraw", gone and b["state"] == "Established" and not b["notifications"],
                      f"route {'withdrawn' if gone else 'kept'}, session {b['state']}, "
                      f"NOTIFICATION {b['notifications'] or 'none'}{b.get('text', '')}"))
        c = step("overrun")
        alive = fab.frr[target].alive() if target in fab.frr else fab.procs[target].poll() is None
        steps.append(("attribute length past the message: session reset 3/1", "3/1" in c["notifications"] and alive,
                      f"NOTIFICATION {c['notifications'] or 'none'}, session {c['state']}, "
                      f"{target} {'still running' if alive else 'GONE'}"))
    finally:
        p.kill()
        p.wait(5)
    if target in fab.frr:  # FRR's own reaction, for the record: it must withdraw the route and keep running
        row = dict(role="malformed UPDATE -> FRR (" + target + ")", ok=steps[2][2].startswith("route withdrawn")
                   and steps[3][2].endswith("still running"))
    else:
        row = dict(role=f"malformed UPDATE -> ifec ({target})", ok=all(ok for _, ok, _ in steps))
    row.update(condition="; ".join(f"{n}: {d}" for n, _, d in steps), sessions="-", routes="-", weights="-",
               seconds=None, problems=[n for n, ok, _ in steps if not ok])
    progress(f"interop frr: {row['role']}: {'pass' if row['ok'] else 'FAIL'} ({row['condition']})")
    return row


def decode_capture(pcap, role, what):
    """A row from tshark's reading of a capture: BGP messages by type, malformed packets (must be none)."""
    if not pcap.exists():
        return dict(role=role, condition=f"{what}: no capture written", sessions="-", routes="-", weights="-",
                    seconds=None, ok=False, problems=["no capture"])
    types = subprocess.run(["tshark", "-r", str(pcap), "-Y", "bgp", "-T", "fields", "-e", "bgp.type"],
                           capture_output=True, text=True).stdout.split()
    bad = subprocess.run(["tshark", "-r", str(pcap), "-Y", "_ws.malformed"], capture_output=True,
                         text=True).stdout.strip().splitlines()
    names = {"1": "OPEN", "2": "UPDATE", "3": "NOTIFICATION", "4": "KEEPALIVE", "5": "ROUTE-REFRESH"}
    counts = {}
    for field in types:
        for t in field.split(","):  # one TCP segment may carry several messages
            counts[names.get(t, t)] = counts.get(names.get(t, t), 0) + 1
    text = ", ".join(f"{n} {c}" for n, c in sorted(counts.items()))
    ok = not bad and counts.get("OPEN", 0) >= 2 and counts.get("UPDATE", 0) >= 1
    return dict(role=role, condition=f"{what}: tshark decodes {sum(counts.values())} BGP messages ({text}); "
                f"{len(bad)} malformed", sessions="-", routes="-", weights="-", seconds=None, ok=ok,
                problems=[] if ok else [f"{len(bad)} malformed, {counts}"])


@contextlib.contextmanager
def _up(fab):
    """The fabric up without its progress lines, and down again whatever happens."""
    try:
        fab.up(progress=lambda line: None)
        yield fab
    finally:
        fab.down()


def interop(progress=print):
    rows = []
    t0 = time.time()
    topo = _topology_file()
    with _up(live.LiveFabric(topo, frr=["p1-sw"])) as fab:
        progress(f"interop frr: FRR as the plane-1 switch ({time.time() - t0:.0f} s)")
        m = Matrix(fab, "switch", "p1-sw", progress)
        m.run("gpu2:plane1:sub0", "p1-sw")
        rows += m.rows

        def frr_has(prefix):
            return any(p.get("valid") for p in m.f.vtysh(f"show bgp ipv4 unicast {prefix}/32 json").get("paths", []))

        rows.append(malformed(fab, "gpu6", "p1-sw", frr_has, progress))
        _, pb, _ = live._grpc()

        def gpu0_has(prefix):
            return any(r.prefix == prefix + "/32" for r in fab.stub("gpu0").BgpRib(pb.Empty(), timeout=5).routes)

        rows.append(malformed(fab, "p1-sw", "gpu0", gpu0_has, progress))
    with _up(live.LiveFabric(topo, frr=["gpu7"])) as fab:
        progress(f"interop frr: FRR as GPU 7 ({time.time() - t0:.0f} s)")
        m = Matrix(fab, "gpu", "gpu7", progress)
        m.run("gpu0:plane1:sub0", "p1-sw")
        rows += m.rows
        _, pb, _ = live._grpc()

        def ours_has(prefix):
            rib = fab.stub("p0-sw").BgpRib(pb.Empty(), timeout=5)
            return any(r.prefix == prefix + "/32" for r in rib.routes)

        rows.append(malformed(fab, "gpu7", "p0-sw", ours_has, progress))
    return rows, time.time() - t0


def table(rows):
    head = f"{'role':<32} {'condition':<44} {'sessions':<9} {'FRR learned':<22} " \
           f"{'FRR weights: path Gb/s -> installed':<46} {'ours s':>6} {'all s':>6} result"
    lines = [head]
    for r in rows:
        ours, every = r.get("seconds") or (None, None)
        s = " ".join(f"{x:6.3f}" if x is not None else f"{'-':>6}" for x in (ours, every))
        long = len(r["condition"]) > 44
        lines.append(f"{r['role']:<32} {'(below)' if long else r['condition']:<44} {r['sessions']:<9} "
                     f"{r['routes']:<22} {r['weights']:<46} {s} {'pass' if r['ok'] else 'FAIL'}")
        if long:
            lines.append(f"{'':<4}{r['condition']}")
        for p in r.get("problems", []) if not r["ok"] else []:
            lines.append(f"{'':<4}! {p}")
    return "\n".join(lines)


RAW_ARGS = ("LOCAL", "PEER", "ASN", "ROUTER_ID", "PREFIX")


def _raw_main(args):
    """`_raw LOCAL PEER ASN ROUTER_ID PREFIX` (what malformed() starts in a node's namespace): the raw speaker; 2 and
    a usage line naming what is missing or bad on stderr otherwise (it was an IndexError or ValueError traceback)."""
    usage = f"usage: python -m ifec.frr_interop _raw {' '.join(RAW_ARGS)}"
    if len(args) != len(RAW_ARGS):
        what = (f"{', '.join(RAW_ARGS[len(args):])} missing" if len(args) < len(RAW_ARGS)
                else f"unexpected {' '.join(args[len(RAW_ARGS):])!r}")
        print(f"{usage}\n_raw: {what}", file=sys.stderr)
        return 2
    for name, value in zip(RAW_ARGS, args):
        if name == "ASN":  # a 4-octet AS number (RFC 6793), 0 reserved
            ok, expected = _whole_in(value, 1, 0xFFFFFFFF), "a whole number in 1..4294967295"
        else:  # the addresses go into the OPEN and the UPDATE through inet_aton
            ok, expected = _ipv4(value), "an IPv4 address (dotted quad)"
        if not ok:
            print(f"{usage}\n_raw: {name} {value!r}: expected {expected}", file=sys.stderr)
            return 2
    local, peer, asn, router_id, prefix = args
    raw_speaker(local, peer, int(asn), router_id, prefix)
    return 0


def _whole_in(text, lo, hi):
    return text.isascii() and text.isdigit() and len(text) <= len(str(hi)) and lo <= int(text) <= hi


def _ipv4(text):
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def main(argv=None):
    import argparse
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_raw":
        return _raw_main(argv[1:])
    ap = argparse.ArgumentParser(prog="./ifec interop frr", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    why = frr.unavailable() or live.unavailable()
    if why:
        print(f"interop frr: skipped: {why}", file=sys.stderr)
        return 2
    rows, seconds = interop(progress=lambda l: print(l, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(dict(rows=rows, seconds=seconds)))
    else:
        print(f"# FARE over BGP: FRR {frr.version()} (Debian's bgpd and zebra, unmodified) against ifec-switchd and "
              f"ifec-hostd on {TOPOLOGY[:-5]} [driver: live; wall-clock seconds from the change until our GPUs' plane shares toward the GPU shown, then everything, matched the reference (FareRib); polled]")
        print(table(rows))
        print(f"# {seconds:.0f} s")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
