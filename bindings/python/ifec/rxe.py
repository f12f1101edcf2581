"""Soft-RoCE guests: QEMU (KVM when it works, software emulation otherwise) booting Debian 12's own kernel with the
rxe modules from a small initramfs (testbed/rxe/build_guest.sh), an rxe device on the guest's NIC, a script run in
the guest, its output and exit status back. The real RDMA stack the project's RoCEv2 is checked against."""

import base64
import os
import pathlib
import re
import shutil
import subprocess
import time

HERE = pathlib.Path(__file__).resolve()


def _repo():
    for p in HERE.parents:
        if (p / "testbed" / "rxe" / "build_guest.sh").exists():
            return p
    raise RuntimeError("testbed/rxe/build_guest.sh not found above " + str(HERE))


class GuestError(RuntimeError):
    pass


def unavailable():
    """Why guests cannot run here ("" when they can)."""
    missing = [p for p in ("qemu-system-x86_64", "busybox", "cpio", "modinfo", "apt-get") if not shutil.which(p)]
    if missing:
        return f"{', '.join(missing)} not found (./ifec setup installs qemu-system-x86, busybox-static, cpio, kmod)"
    return ""


def build():
    """(kernel, initramfs) paths, built or taken from the cache."""
    p = subprocess.run([str(_repo() / "testbed" / "rxe" / "build_guest.sh")], capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        raise GuestError(f"build_guest.sh: {p.stderr.strip()[-800:]}")
    kernel, initrd = p.stdout.split()[-2:]
    return kernel, initrd


def kvm_works():
    return os.access("/dev/kvm", os.R_OK | os.W_OK) and os.environ.get("IFEC_RXE_KVM", "0") == "1"


def guest_command(script, ip="10.0.0.1/24", nic=("-nic", "user,model=virtio-net-pci"), memory_mb=256):
    """The QEMU command line of a guest that runs `script` (sh) once rxe0 is up on eth0 (its first NIC)."""
    kernel, initrd = build()
    run = base64.b64encode(script.encode()).decode()
    cmd = ["qemu-system-x86_64", "-m", str(memory_mb), "-smp", "1", "-nographic", "-no-reboot", "-kernel", kernel,
           "-initrd", initrd, "-append", f"console=ttyS0 quiet panic=-1 ifec.ip={ip} ifec.run={run}", *nic]
    if kvm_works():
        cmd[1:1] = ["-enable-kvm", "-cpu", "host"]
    return cmd


def report(stdout, stderr="", returncode=None):
    """(exit status, the script's output lines) from a guest's console; GuestError when it never reported."""
    out = stdout.replace("\r", "")
    m = re.search(r"IFEC-GUEST exit (\d+)", out)
    if m is None:
        raise GuestError(f"no report from the guest (qemu exit {returncode}): {(stderr or out).strip()[-600:]}")
    lines = out.splitlines()
    start = next((i for i, l in enumerate(lines) if "IFEC-GUEST" in l), 0)
    body = [l for l in lines[start:] if l.strip() and not l.startswith("IFEC-GUEST exit")]
    return int(m.group(1)), body


def boot(script, ip="10.0.0.1/24", nic=("-nic", "user,model=virtio-net-pci"), memory_mb=256, timeout=120):
    """Boots a guest, runs `script` (sh) in it after rxe0 is up on eth0; returns (exit status, output lines of the
    script). Raises GuestError when the guest never reports (QEMU failed, or it hung past `timeout`)."""
    cmd = guest_command(script, ip, nic, memory_mb)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise GuestError(f"the guest did not finish in {timeout} s")
    return report(p.stdout, p.stderr, p.returncode)


# --------------------------------------------------------------------------------------- guests on a live fabric --

GUEST_MAC = "52:54:00:1f:ec:{:02x}"  # the guest of GPU g (its fabric NIC)
SLIRP_IP, SLIRP_GW = "10.0.2.15/24", "10.0.2.2"  # QEMU's user network: the perftest connection exchange
EXCHANGE_PORT = 18515  # perftest's and ibv_rc_pingpong's default


def _ip(n):
    return ".".join(str((n >> s) & 255) for s in (24, 16, 8, 0))


class RxeFabric:
    """A live topology (ifec.live) whose GPUs named in `guests` are Soft-RoCE guests instead of hostds: each guest's
    fabric NIC is a tap in its GPU's namespace joined to the GPU's link interface f<port> by tc mirred (every frame,
    PFC included, both ways), the GPU's hostd runs with --guest-mac and only speaks FARE for it (so the switch learns
    the guest's MAC and routes to its address), and a second NIC on QEMU's user network reaches the other guests'
    management addresses for perftest's TCP exchange (forwarded to port 18515 of the guest)."""

    def __init__(self, topology_file, guests=None, log_dir=None):
        from . import live
        self.live = live
        fab = self.fab = live.LiveFabric(topology_file, log_dir=log_dir)
        gpus = [n for n in fab.nodes if n["kind"] == "gpu"]
        self.guests = list(guests) if guests is not None else [g["name"] for g in gpus]
        for g in self.guests:
            nd = next((n for n in gpus if n["name"] == g), None)
            if nd is None:
                raise GuestError(f"no GPU '{g}' in {fab.topo.name}")
            links = [l for l in fab.links if g in (l["a"], l["b"])]
            if len(links) != 1:
                raise GuestError(f"{g}: a guest has one NIC on the fabric; {g} has {len(links)} links")
        self.driver = "live (rxe guests)"
        base_start, base_configure = fab.start, fab._configure

        def start(node):
            if node not in self.guests:
                return base_start(node)
            nd = self.node(node)
            log = open(fab.log_dir / f"{node}.log", "a")
            fab.procs[node] = fab.hosts[node].popen(
                [str(live._bin_dir() / "ifec-hostd"), "--topo", fab.topology_file, "--node", node,
                 "--guest-mac", self.mac(node)], stdout=log, stderr=subprocess.STDOUT)
            fab._stubs.pop(node, None)
            fab._record()

        def configure():
            base_configure()
            for g in self.guests:
                intf = self.fabric_intf(g)
                live._host_sh(fab.hosts[g], " && ".join([
                    "ip tuntap add g0 mode tap", "ip link set g0 mtu 9216 up",
                    f"tc qdisc add dev {intf} ingress",
                    f"tc filter add dev {intf} parent ffff: protocol all u32 match u32 0 0 action mirred egress redirect dev g0",
                    "tc qdisc add dev g0 ingress",
                    f"tc filter add dev g0 parent ffff: protocol all u32 match u32 0 0 action mirred egress redirect dev {intf}"]))
        fab.start, fab._configure = start, configure

    def node(self, name):
        return next(n for n in self.fab.nodes if n["name"] == name)

    def link_of(self, name):
        return next(l for l in self.fab.links if name in (l["a"], l["b"]))

    def fabric_intf(self, name):
        l = self.link_of(name)
        return f"f{l['a_port'] if l['a'] == name else l['b_port']}"

    def mac(self, name):
        return GUEST_MAC.format(self.node(name)["gpu"])

    def ip(self, name):
        return _ip(self.node(name)["loopback"])

    def mgmt_ip(self, name):
        return self.live.mgmt_ip(self.node(name)["index"])

    def switch_mac(self, name):
        """The MAC of the switch port facing guest `name` (the guests' next hop for every fabric address)."""
        l = self.link_of(name)
        sw, port = (l["b"], l["b_port"]) if l["a"] == name else (l["a"], l["a_port"])
        out = self.fab.hosts[sw].cmd(f"cat /sys/class/net/f{port}/address").strip()
        if not re.fullmatch(r"[0-9a-f:]{17}", out):
            raise GuestError(f"{sw}: no MAC for f{port}: {out}")
        return out

    def up(self, progress=print):
        self.fab.up(progress=progress)
        return self

    def down(self):
        self.fab.down()

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()

    def prologue(self, name):
        """Guest shell lines: the user-network NIC for the connection exchange, and every other guest's fabric
        address reached on eth0 through the switch port's MAC (the switch routes; it answers no ARP)."""
        lines = [f"ip addr add {SLIRP_IP} dev eth1", "ip link set eth1 up", f"ip route add default via {SLIRP_GW}"]
        sw = self.switch_mac(name)
        for n in self.fab.nodes:
            if n["kind"] == "gpu" and n["name"] != name:
                peer = _ip(n["loopback"])
                lines += [f"ip route add {peer}/32 dev eth0", f"arp -i eth0 -s {peer} {sw}"]
        return "\n".join(lines) + "\n"

    def start_guest(self, name, script, memory_mb=256):
        """Boots the guest of GPU `name` in its namespace running prologue + `script`; returns the QEMU Popen (its
        output through report())."""
        nic = ["-netdev", "tap,id=f,ifname=g0,script=no,downscript=no",
               "-device", f"virtio-net-pci,netdev=f,mac={self.mac(name)}",
               "-netdev", f"user,id=u,hostfwd=tcp:{self.mgmt_ip(name)}:{EXCHANGE_PORT}-:{EXCHANGE_PORT}",
               "-device", "virtio-net-pci,netdev=u"]
        cmd = guest_command(self.prologue(name) + script, ip=f"{self.ip(name)}/32", nic=nic, memory_mb=memory_mb)
        return self.fab.hosts[name].popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run_pair(self, server, server_script, client, client_script, timeout=300):
        """Runs two guests at once; returns {name: (exit status, lines)}. Both are ended (by PID) at `timeout`."""
        procs = {server: self.start_guest(server, server_script), client: self.start_guest(client, client_script)}
        out, deadline = {}, time.time() + timeout
        try:
            for name, p in procs.items():
                try:
                    so, se = p.communicate(timeout=max(1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    so, se = p.communicate()
                    raise GuestError(f"{name}'s guest did not finish in {timeout} s: {so[-800:]}")
                out[name] = report(so, se, p.returncode)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return out


# ------------------------------------------------------------------------------------------ the perftest matrix --

# (name, server command, client command without the server's address): rdma-core's and perftest's own tools,
# unmodified. RoCEv2 is GID index 1 (::ffff:<ip>); -F: no CPU-frequency check (a guest has none).
TOOLS = [
    ("ibv_rc_pingpong", "ibv_rc_pingpong -d rxe0 -g 1 -n 200 -s 4096"),
    ("ib_send_bw", "ib_send_bw -d rxe0 -x 1 -F -n 300 -s 16384 --report_gbits"),
    ("ib_write_bw", "ib_write_bw -d rxe0 -x 1 -F -n 300 -s 65536 --report_gbits"),
    ("ib_read_bw", "ib_read_bw -d rxe0 -x 1 -F -n 300 -s 65536 --report_gbits"),
    ("ib_atomic_bw fetch_add", "ib_atomic_bw -d rxe0 -x 1 -F -n 500 -A FETCH_AND_ADD"),
    ("ib_atomic_bw cmp_swap", "ib_atomic_bw -d rxe0 -x 1 -F -n 500 -A CMP_AND_SWAP"),
]


def _tag(name):
    return name.replace(" ", ":")


def server_script(tools=TOOLS, extra="", limit_s=90):
    """Guest shell: each tool's server in turn (bounded), its exit status on an IFEC-RESULT line."""
    lines = []
    for name, cmd in tools:
        lines.append(f"timeout {limit_s} {cmd} {extra} > /tmp/out 2>&1; rc=$?; sed 's/^/[{_tag(name)}] /' /tmp/out; "
                     f"echo \"IFEC-RESULT {_tag(name)} rc=$rc\"")
    return "\n".join(lines) + "\n"


def client_script(server_mgmt_ip, tools=TOOLS, extra="", limit_s=90):
    """Guest shell: each tool's client toward the server guest (retried while its server is not listening yet),
    its output tagged and its exit status on an IFEC-RESULT line. sh's pipeline status is the last command's, so
    the tool's own status goes through a file."""
    lines = ["try() { n=0; while :; do timeout " + str(limit_s) + " \"$@\" > /tmp/out 2>&1; rc=$?; "
             "if [ $rc -ne 0 ] && grep -qiE \"couldn.t connect|connection refused|unable to\" /tmp/out && "
             "[ $n -lt 60 ]; then n=$((n+1)); sleep 0.5; continue; fi; return $rc; done; }"]
    for name, cmd in tools:
        lines.append(f"try {cmd} {extra} {server_mgmt_ip}; rc=$?; sed 's/^/[{_tag(name)}] /' /tmp/out; "
                     f"echo \"IFEC-RESULT {_tag(name)} rc=$rc\"")
    return "\n".join(lines) + "\n"


def results(lines):
    """{tool: dict(rc, gbps, mpps, usec, text)} from a guest's output (perftest's result row, or ibv_rc_pingpong's
    summary lines)."""
    out = {}
    for name, _ in TOOLS:
        tag = _tag(name)
        mine = [l.split("] ", 1)[1] for l in lines if l.startswith(f"[{tag}] ")]
        rc = next((int(l.rsplit("rc=", 1)[1]) for l in lines if l.startswith(f"IFEC-RESULT {tag} rc=")), None)
        r = dict(rc=rc, text=mine)
        per_gbit = 1.0  # perftest's unit: Gb/sec with --report_gbits, MB/sec otherwise (the atomics)
        for l in mine:
            f = l.split()
            if "BW average[MB/sec]" in l:
                per_gbit = 8e-3
            if len(f) == 5 and f[0].isdigit() and f[1].isdigit():  # bytes iterations peak avg msgrate
                r.update(gbps=float(f[3]) * per_gbit, mpps=float(f[4]))
            m = re.search(r"bytes in [\d.]+ seconds = ([\d.]+) Mbit/sec", l)
            if m:
                r["gbps"] = float(m.group(1)) / 1000
            m = re.search(r"iters in [\d.]+ seconds = ([\d.]+) usec/iter", l)
            if m:
                r["usec"] = float(m.group(1))
        out[name] = r
    return out


# ----------------------------------------------------------------------------------------------- wire checks --

def pcap_frames(path):
    """The frames of a classic pcap file (dumpcap -P), Ethernet link type."""
    import struct
    data = pathlib.Path(path).read_bytes()
    if len(data) < 24:
        raise GuestError(f"{path}: {len(data)} bytes, not a pcap file")
    magic = data[:4]
    endian = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">",
              b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">"}.get(magic)
    if endian is None:
        raise GuestError(f"{path}: not a classic pcap file (magic {magic.hex()})")
    out, at = [], 24
    while at + 16 <= len(data):
        incl = struct.unpack(endian + "IIII", data[at:at + 16])[2]
        out.append(data[at + 16:at + 16 + incl])
        at += 16 + incl
    return out


def roce_icrc(frame):
    """(received, computed) ICRC of a RoCEv2 frame (IPv4, UDP 4791), or None for any other frame."""
    from ._native import compute_icrc
    if len(frame) < 14 + 20 + 8 + 12 + 4 or frame[12:14] != b"\x08\x00":
        return None
    ip = 14
    ihl = (frame[ip] & 0x0F) * 4
    if frame[ip + 9] != 17 or int.from_bytes(frame[ip + ihl + 2:ip + ihl + 4], "big") != 4791:
        return None
    ip_end = ip + int.from_bytes(frame[ip + 2:ip + 4], "big")
    if ip_end > len(frame) or ip_end - 4 < ip + ihl + 8 + 12:
        return None
    got = int.from_bytes(frame[ip_end - 4:ip_end], "little")
    return got, compute_icrc(bytes(frame[ip:ip_end - 4]), ihl + 8)


def icrc_report(paths):
    """{path: (RoCEv2 frames, frames whose ICRC is wrong)} over pcap files."""
    out = {}
    for p in paths:
        checked = [c for c in map(roce_icrc, pcap_frames(p)) if c is not None]
        out[str(p)] = (len(checked), sum(1 for got, want in checked if got != want))
    return out


class Captures:
    """dumpcap on every guest's link interface (the GPU side of the switch: frames before and after it) while the
    block runs; the pcap files in `directory`."""

    def __init__(self, rxe_fabric, directory):
        self.rf, self.dir, self.procs, self.files = rxe_fabric, pathlib.Path(directory), [], []

    def __enter__(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        for g in self.rf.guests:
            f = self.dir / f"{g}-{self.rf.fabric_intf(g)}.pcap"
            self.files.append(f)
            self.procs.append(self.rf.fab.hosts[g].popen(
                ["dumpcap", "-q", "-P", "-i", self.rf.fabric_intf(g), "-w", str(f), "-a", "duration:600"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        deadline = time.time() + 10
        while time.time() < deadline and not all(f.exists() and f.stat().st_size >= 24 for f in self.files):
            time.sleep(0.1)
        return self

    def __exit__(self, *exc):
        import signal
        time.sleep(0.3)  # the last frames reach the ring
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# ---------------------------------------------------------------------------------------------- the matrix --

def switch_counters(rf):
    """Sum over every switch port of the fabric's switch counters (ifec-switchd's own)."""
    tot = {}
    for name, st in rf.fab.status().items():
        if next(n for n in rf.fab.nodes if n["name"] == name)["kind"] != "switch":
            continue
        for p in st.get("ports", []):
            for k, v in p.get("counters", {}).get("values", {}).items():
                tot[k] = tot.get(k, 0) + int(v)
    return tot


def run_matrix(rf, server, client, loss=0.0, tools=TOOLS, capture_dir=None, extra="", label=None):
    """Every tool of `tools` between guest `client` (requester) and guest `server`, through the fabric's switch,
    with `loss` injected there. Returns (rows, facts): a row per tool, and the switch's counter deltas, the pcaps'
    ICRC report and the guests' exit statuses."""
    import contextlib
    sw = [n["name"] for n in rf.fab.nodes if n["kind"] == "switch"]
    for s in sw:
        rf.fab.set_loss(s, loss)
    before = switch_counters(rf)
    cap = Captures(rf, capture_dir) if capture_dir else contextlib.nullcontext()
    t0 = time.time()
    try:
        with cap:
            out = rf.run_pair(server, server_script(tools, extra), client,
                              client_script(rf.mgmt_ip(server), tools, extra))
    finally:
        for s in sw:
            rf.fab.set_loss(s, 0.0)
    after = switch_counters(rf)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    got_s, got_c = results(out[server][1]), results(out[client][1])
    rows = []
    for name, _ in tools:
        c, s = got_c[name], got_s[name]
        ok = c["rc"] == 0 and s["rc"] == 0
        rows.append(dict(tool=name, direction=f"{client} -> {server}", path=label or "through ifec-switchd",
                         loss=loss, ok=ok, gbps=c.get("gbps"), mpps=c.get("mpps"), usec=c.get("usec"),
                         detail="" if ok else " | ".join((c["text"] + s["text"])[-6:])))
    facts = dict(switch=delta, seconds=time.time() - t0, guests={n: st for n, (st, _) in out.items()},
                 icrc=icrc_report(cap.files) if capture_dir else {})
    return rows, facts


def table(rows):
    """The interop table as text."""
    head = f"{'tool':<24} {'direction':<14} {'path':<28} {'loss':>5} {'result':<6} {'Gb/s':>7} {'Mop/s':>8} " \
           f"{'us/iter':>8}"
    lines = [head]
    for r in rows:
        fmt = lambda v, f: (f % v) if v is not None else "-"
        lines.append(f"{r['tool']:<24} {r['direction']:<14} {r['path']:<28} {r['loss'] * 100:>4.0f}% "
                     f"{'pass' if r['ok'] else 'FAIL':<6} {fmt(r['gbps'], '%.3f'):>7} "
                     f"{fmt(r['mpps'] and r['mpps'], '%.4f'):>8} {fmt(r['usec'], '%.0f'):>8}"
                     + (f"  ({r['detail']})" if r.get("detail") else ""))
    return "\n".join(lines)
