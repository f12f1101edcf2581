"""Soft-RoCE guests: QEMU (KVM when it works, software emulation otherwise) booting Debian 12's own kernel with the
rxe modules from a small initramfs (testbed/rxe/build_guest.sh), an rxe device on the guest's NIC, a script run in
the guest, its output and exit status back. The real RDMA stack the project's RoCEv2 is checked against."""

import base64
import contextlib
import ipaddress
import math
import numbers
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

from . import _args, containers, live
from .pcap import read_pcap

HERE = pathlib.Path(__file__).resolve()
GUEST_MEMORY_MB = (64, 65536)  # a guest's -m, in MB: a small Debian guest's least to more than any test needs


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


def kvm_works(kernel, initrd):
    """Whether guests run under KVM here: IFEC_RXE_KVM=0/1 decides; otherwise one short guest is booted with KVM
    the first time and the answer is kept beside the cached kernel (on some machines /dev/kvm exists but a Debian
    guest never comes up under it: software emulation, TCG, then)."""
    forced = kvm_setting()
    if forced is not None:
        return forced
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    verdict = pathlib.Path(kernel).with_name("kvm-" + pathlib.Path(kernel).name)
    if not verdict.exists():
        cmd = ["qemu-system-x86_64", "-enable-kvm", "-cpu", "host", "-m", "256", "-smp", "1", "-nographic",
               "-no-reboot", "-kernel", kernel, "-initrd", initrd, "-append",
               "console=ttyS0 quiet panic=-1 ifec.ip=10.0.0.1/24", "-nic", "none"]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
            ok = "IFEC-GUEST exit 0" in p.stdout
        except subprocess.TimeoutExpired:
            ok = False
        verdict.write_text("yes\n" if ok else "no\n")
    return verdict.read_text().strip() == "yes"


def kvm_setting():
    """IFEC_RXE_KVM: True (1), False (0) or None (unset or empty: try KVM); GuestError naming any other value (a
    'yes' or 'off' was silently taken for unset)."""
    forced = os.environ.get("IFEC_RXE_KVM") or None
    if forced not in (None, "0", "1"):
        raise GuestError(f"IFEC_RXE_KVM={forced!r}: expected 0 or 1 (or unset: KVM where a guest comes up under it)")
    return None if forced is None else forced == "1"


def captures_folder(path):
    """The folder the captures stay in, made (and checked writable) before any fabric comes up; GuestError naming
    it otherwise (an empty one put about 300 MB in the current directory, a file failed after minutes)."""
    if not str(path):
        raise GuestError("--captures '': expected a folder")
    root = pathlib.Path(path)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GuestError(f"--captures {str(path)!r}: {'not a folder' if root.exists() else e.strerror}") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise GuestError(f"--captures {str(path)!r}: not writable")
    return root


def _memory_mb(value):
    """A guest's memory in MB, a whole number in GUEST_MEMORY_MB (0, -1 or 'lots' reached QEMU after the build)."""
    return _args.whole(value, "memory_mb", *GUEST_MEMORY_MB)


def _seconds(value, name):
    """A finite number of seconds above 0 (0, a negative or NaN ended a guest at once or never)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={value!r}: expected a number of seconds")
    try:
        ok = math.isfinite(value) and value > 0
    except OverflowError:  # an int past a float's range
        ok = False
    if not ok:
        raise ValueError(f"{name}={value!r}: expected a finite number of seconds above 0")
    return value


def guest_command(script, ip="10.0.0.1/24", nic=("-nic", "user,model=virtio-net-pci"), memory_mb=256):
    """The QEMU command line of a guest that runs `script` (sh) once rxe0 is up on eth0 (its first NIC)."""
    memory_mb = _memory_mb(memory_mb)
    kernel, initrd = build()
    run = base64.b64encode(script.encode()).decode()
    cmd = ["qemu-system-x86_64", "-m", str(memory_mb), "-smp", "1", "-nographic", "-no-reboot", "-kernel", kernel,
           "-initrd", initrd, "-append", f"console=ttyS0 quiet panic=-1 ifec.ip={ip} ifec.run={run}", *nic]
    if kvm_works(kernel, initrd):
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
    script). Raises GuestError when the guest never reports (QEMU failed, or it hung past `timeout`); TypeError or
    ValueError naming a bad memory_mb or timeout before anything is built or started."""
    memory_mb, timeout = _memory_mb(memory_mb), _seconds(timeout, "timeout")
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
    return str(ipaddress.IPv4Address(int(n)))


class RxeFabric(live.LiveFabric):
    """A live topology (ifec.live) whose GPUs named in `guests` are Soft-RoCE guests instead of hostds: each guest's
    fabric NIC is a tap in its GPU's namespace joined to the GPU's link interface f<port> by tc mirred (every frame,
    PFC included, both ways, but ARP and TCP to the hostd's link address), the interface carries the guest's MAC and
    the GPU's hostd runs with --guest-mac and only speaks BGP for it (so the switch's ARP learns the guest's MAC and
    FARE routes to its address), and a second NIC on QEMU's user network reaches the other guests'
    management addresses for perftest's TCP exchange (forwarded to port 18515 of the guest). The other GPUs' hostds
    treat the guests as external RDMA peers (--external-peers)."""

    driver = "live (rxe guests)"

    def __init__(self, topology_file, guests=None, log_dir=None):
        super().__init__(topology_file, log_dir=log_dir)
        gpus = [n for n in self.nodes if n["kind"] == "gpu"]
        self.guests = list(guests) if guests is not None else [g["name"] for g in gpus]
        for g in self.guests:
            if not any(n["name"] == g for n in gpus):
                raise GuestError(f"no GPU '{g}' in {self.topo.name}")
            links = [l for l in self.links if g in (l["a"], l["b"])]
            if len(links) != 1:
                raise GuestError(f"{g}: a guest has one NIC on the fabric; {g} has {len(links)} links")

    def daemon_args(self, nd):
        if nd["name"] in self.guests:  # hostd only speaks FARE for the guest
            return ["--guest-mac", self.mac(nd["name"])]
        if nd["kind"] == "gpu" and self.guests:  # a hostd among guests: they are its external peers
            return ["--external-peers", ",".join(self.guests)]
        return []

    def _configure(self):
        super()._configure()
        for g in self.guests:
            intf = self.fabric_intf(g)
            redirect = "parent ffff: prio 3 protocol all u32 match u32 0 0 action mirred egress redirect dev"
            # The hostd's BGP session (TCP to its link address) and ARP stay in its namespace (a match that only
            # classifies ends the filters and passes the frame up); the interface carries the guest's MAC, so the
            # switch's ARP learns that MAC for the GPU.
            keep = f"parent ffff: prio 1 protocol ip u32 match ip dst {self.link_address(g)}/32 flowid ffff:1"
            live._host_sh(self.hosts[g], " && ".join([
                f"ip link set {intf} address {self.mac(g)}",
                "ip tuntap add g0 mode tap", "ip link set g0 mtu 9216 up",
                f"tc qdisc add dev {intf} ingress",
                f"tc filter add dev {intf} {keep}",
                f"tc filter add dev {intf} parent ffff: prio 2 protocol arp u32 match u32 0 0 flowid ffff:1",
                f"tc filter add dev {intf} {redirect} g0",
                "tc qdisc add dev g0 ingress", f"tc filter add dev g0 {redirect} {intf}"]))

    def link_of(self, name):
        return next(l for l in self.links if name in (l["a"], l["b"]))

    def fabric_intf(self, name):
        l = self.link_of(name)
        return f"f{l['a_port'] if l['a'] == name else l['b_port']}"

    def link_address(self, name):
        """The GPU's address on its link (its hostd's BGP session): the /29 plan of ifec.containers."""
        l = self.link_of(name)
        return str(containers.link_subnet(l["id"])[2 if l["a"] == name else 3])

    def mac(self, name):
        return GUEST_MAC.format(self.node(name)["gpu"])

    def ip(self, name):
        return _ip(self.node(name)["loopback"])

    def mgmt_ip(self, name):
        return live.mgmt_ip(self.node(name)["index"])

    def switch_mac(self, name):
        """The MAC of the switch port facing guest `name` (the guests' next hop for every fabric address)."""
        l = self.link_of(name)
        sw, port = (l["b"], l["b_port"]) if l["a"] == name else (l["a"], l["a_port"])
        out = self.hosts[sw].cmd(f"cat /sys/class/net/f{port}/address").strip()
        if not re.fullmatch(r"[0-9a-f:]{17}", out):
            raise GuestError(f"{sw}: no MAC for f{port}: {out}")
        return out

    def prologue(self, name):
        """Guest shell lines: the user-network NIC for the connection exchange, and every other guest's fabric
        address reached on eth0 through the switch port's MAC (the switch routes; it answers no ARP)."""
        lines = [f"ip addr add {SLIRP_IP} dev eth1", "ip link set eth1 up", f"ip route add default via {SLIRP_GW}"]
        sw = self.switch_mac(name)
        for n in self.nodes:
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
        return self.hosts[name].popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run_guest(self, name, script, timeout=300):
        """Boots the guest of `name`, waits for it (ended by PID at `timeout`); returns (exit status, lines)."""
        timeout = _seconds(timeout, "timeout")
        p = self.start_guest(name, script)
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise GuestError(f"{name}'s guest did not finish in {timeout} s")
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        return report(so, se, p.returncode)

    def run_pair(self, server, server_script, client, client_script, timeout=300):
        """Runs two guests at once; returns {name: (exit status, lines)}. Both are ended (by PID) at `timeout`."""
        timeout = _seconds(timeout, "timeout")
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


# A connection exchange that failed before any RDMA traffic: the client's connect raced the server's listen (QEMU's
# user network accepts for the guest and closes again), or a message came in two reads (ibv_rc_pingpong reads each
# with one read()). Both sides run the tool again; anything else is the tool's answer.
EXCHANGE_FAILED = "couldn.t connect|connection refused|unable to|couldn.t read|read/write|failed to exchange"


def _retrying(limit_s, tries):
    return ("try() { n=0; while :; do timeout " + str(limit_s) + " \"$@\" > /tmp/out 2>&1; rc=$?; "
            f"if [ $rc -ne 0 ] && grep -qiE \"{EXCHANGE_FAILED}\" /tmp/out && [ $n -lt {tries} ]; then "
            "n=$((n+1)); sleep 0.5; continue; fi; return $rc; done; }")


def server_script(tools=TOOLS, extra="", limit_s=90):
    """Guest shell: each tool's server in turn (bounded; again after a failed exchange), its output tagged and its
    exit status on an IFEC-RESULT line."""
    lines = [_retrying(limit_s, 5)]
    for name, cmd in tools:
        lines.append(f"try {cmd} {extra}; rc=$?; sed 's/^/[{_tag(name)}] /' /tmp/out; "
                     f"echo \"IFEC-RESULT {_tag(name)} rc=$rc\"")
    return "\n".join(lines) + "\n"


def client_script(server_mgmt_ip, tools=TOOLS, extra="", limit_s=90):
    """Guest shell: each tool's client toward the server guest (again while its server is not listening yet, or
    after a failed exchange), its output tagged and its exit status on an IFEC-RESULT line. sh's pipeline status
    is the last command's, so the tool's own status goes through a file."""
    lines = [_retrying(limit_s, 60)]
    for name, cmd in tools:
        lines.append(f"try {cmd} {extra} {server_mgmt_ip}; rc=$?; sed 's/^/[{_tag(name)}] /' /tmp/out; "
                     f"echo \"IFEC-RESULT {_tag(name)} rc=$rc\"")
    return "\n".join(lines) + "\n"


def results(lines, tools=TOOLS):
    """{tool: dict(rc, gbps, mpps, usec, text)} from a guest's output (perftest's result row, or ibv_rc_pingpong's
    summary lines)."""
    out = {}
    for name, _ in tools:
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

def pcap_records(path):
    """[(seconds, frame)] of a classic pcap file (dumpcap -P)."""
    return [(ns * 1e-9, f) for ns, f in read_pcap(path)]


def pcap_frames(path):
    """The frames of a classic pcap file."""
    return [f for _, f in read_pcap(path)]


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
            self.procs.append(self.rf.hosts[g].popen(
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
    for name, st in rf.status().items():
        if next(n for n in rf.nodes if n["name"] == name)["kind"] != "switch":
            continue
        for p in st.get("ports", []):
            for k, v in p.get("counters", {}).get("values", {}).items():
                tot[k] = tot.get(k, 0) + int(v)
    return tot


def run_matrix(rf, server, client, loss=0.0, tools=TOOLS, capture_dir=None, extra="", label=None):
    """Every tool of `tools` between guest `client` (requester) and guest `server`, through the fabric's switch,
    with `loss` injected there. Returns (rows, facts): a row per tool, and the switch's counter deltas, the pcaps'
    ICRC report and the guests' exit statuses."""
    sw = [n["name"] for n in rf.nodes if n["kind"] == "switch"]
    for s in sw:
        rf.set_loss(s, loss)
    before = switch_counters(rf)
    cap = Captures(rf, capture_dir) if capture_dir else contextlib.nullcontext()
    t0 = time.time()
    try:
        with cap:
            out = rf.run_pair(server, server_script(tools, extra), client,
                              client_script(rf.mgmt_ip(server), tools, extra))
    finally:
        for s in sw:
            rf.set_loss(s, 0.0)
    after = switch_counters(rf)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    got_s, got_c = results(out[server][1]), results(out[client][1])
    rows = []
    for name, _ in tools:
        c, s = got_c[name], got_s[name]
        ok = c["rc"] == 0 and s["rc"] == 0
        rows.append(dict(tool=name, direction=f"{client} -> {server}", path=label or "through ifec-switchd",
                         loss=loss, ok=ok, gbps=c.get("gbps"), mpps=c.get("mpps"), usec=c.get("usec"),
                         detail="" if ok else " | ".join((c["text"] + s["text"])[-6:]),
                         client_tail=c["text"][-4:]))  # what the rates were read from
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


# ------------------------------------------------------------------ perftest's connection exchange, for hostd --
# perftest 4.5 (Debian 12: 4.5+0.17, version string "6.06") exchanges connection data over TCP before and after
# a test, without rdma_cm: the client writes each message first and the server answers with its own of the same
# size (src/perftest_communication.c). In order: the version (16 bytes), the page size and the cache line size
# (4 bytes each, big-endian; both sides keep the larger), the path MTU as an ASCII digit + NUL (both keep the
# smaller), the QP's key message three times (108 bytes: "lid:out_reads:qpn:psn:rkey:vaddr:" in hex, the GID as 16
# "%02x:" and "srqn:", NUL), the test, the key message again, five 8-byte report values (size, iterations, peak,
# average, message rate), the key message a last time, and "done\0" from both sides. The client's first request
# carries the PSN of its own key message; it takes the rkey and address from the third. The shim below is that
# exchange for ifec-hostd, which pairs its QP with the guest's through AttachPeer.

PERFTEST_VERSION = b"6.06".ljust(16, b"\0")
MTU_CODE = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
KEY_BYTES = 108


def key_message(qpn, psn, rkey, vaddr, ip, out_reads=1, lid=0, srqn=0):
    gid = bytes(10) + b"\xff\xff" + int(ip).to_bytes(4, "big")  # ::ffff:a.b.c.d, RoCEv2 over IPv4
    text = "%04x:%04x:%06x:%06x:%08x:%016x:" % (lid, out_reads, qpn, psn, rkey, vaddr) + \
        "".join("%02x:" % b for b in gid) + "%08x:" % srqn
    msg = text.encode() + b"\0"
    assert len(msg) == KEY_BYTES, len(msg)
    return msg


def parse_key(msg):
    """The fields of a key message; GuestError naming what is wrong with a malformed one."""
    try:
        f = msg[:KEY_BYTES - 1].decode("ascii").split(":")
        lid, out_reads, qpn, psn, rkey, vaddr = (int(x, 16) for x in f[:6])
        gid = bytes(int(x, 16) for x in f[6:22])
    except (UnicodeDecodeError, ValueError) as e:
        raise GuestError(f"perftest key message {msg[:KEY_BYTES]!r}: {e}")
    if len(gid) != 16 or msg[KEY_BYTES - 1:KEY_BYTES] != b"\0":
        raise GuestError(f"perftest key message {msg[:KEY_BYTES]!r}: not 107 characters and a NUL")
    return dict(lid=lid, out_reads=out_reads, qpn=qpn, psn=psn, rkey=rkey, vaddr=vaddr, gid=gid,
                ip=int.from_bytes(gid[12:], "big") if gid[:12] == bytes(10) + b"\xff\xff" else None)


def _recv(sock, n, step):
    buf = b""
    while len(buf) < n:
        got = sock.recv(n - len(buf))
        if not got:
            raise GuestError(f"perftest exchange, {step}: the peer closed after {len(buf)} of {n} bytes")
        buf += got
    return buf


class PerftestPeer:
    """ifec-hostd's side of perftest's exchange, as the server (the guest runs the client) or as the client (the
    guest runs the server). `attach(peer_key) -> AttachPeerReply` pairs hostd's QP with the guest's; as the client,
    `traffic(peer_key)` runs between the third and the fourth key messages (hostd's requests to the guest)."""

    def __init__(self, attach, mtu=1024, out_reads=16, traffic=None, timeout=120):
        self.attach, self.mtu, self.out_reads, self.traffic, self.timeout = attach, mtu, out_reads, traffic, timeout
        self.peer_key, self.reports, self.mine, self.attached = None, None, None, None

    def _step(self, sock, mine, n, step, client):
        if client:
            sock.sendall(mine)
            return _recv(sock, n, step)
        theirs = _recv(sock, n, step)
        sock.sendall(mine)
        return theirs

    def _session(self, sock, client):
        import struct
        sock.settimeout(self.timeout)
        v = self._step(sock, PERFTEST_VERSION, 16, "version", client)
        if float(v.rstrip(b"\0").decode(errors="replace") or 0) < 5.70:
            raise GuestError(f"perftest exchange: the peer's version {v!r} is older than 5.70")
        self._step(sock, struct.pack(">i", 4096), 4, "page size", client)
        self._step(sock, struct.pack(">i", 64), 4, "cache line", client)
        peer_mtu = self._step(sock, b"%d\0" % MTU_CODE[self.mtu], 2, "MTU", client)
        if client:  # our key goes first: hostd's QP and PSN do not depend on the peer's
            first = self.attach(dict(qpn=2, psn=0))
            self.mine = key_message(first.qpn, first.psn, first.rkey, first.vaddr, first.ip, self.out_reads)
            self.peer_key = parse_key(self._step(sock, self.mine, KEY_BYTES, "key 1", client))
            self.attach(self.peer_key)
        else:
            self.peer_key = parse_key(_recv(sock, KEY_BYTES, "key 1"))
            r = self.attached = self.attach(self.peer_key)
            self.mine = key_message(r.qpn, r.psn, r.rkey, r.vaddr, r.ip, self.out_reads)
            sock.sendall(self.mine)
        self.peer_mtu = peer_mtu
        for k in (2, 3):
            self.peer_key.update({x: y for x, y in parse_key(self._step(sock, self.mine, KEY_BYTES, f"key {k}",
                                                                        client)).items() if x in ("rkey", "vaddr")})
        if client and self.traffic:
            self.traffic(self.peer_key)
        self._step(sock, self.mine, KEY_BYTES, "key 4 (after the test)", client)
        vals = []
        for i, name in enumerate(("size", "iterations", "peak", "average", "message rate")):
            mine = struct.pack(">Q", 0) if i < 2 else struct.pack(">d", 0.0)
            vals.append(self._step(sock, mine, 8, f"report {name}", client))
        self.reports = dict(size=struct.unpack(">Q", vals[0])[0], iterations=struct.unpack(">Q", vals[1])[0],
                            average=struct.unpack(">d", vals[3])[0])
        self._step(sock, self.mine, KEY_BYTES, "key 5", client)
        sock.sendall(b"done\0")

    def serve(self, address):
        """Accepts one perftest client at `address` (host, port) and runs the exchange; returns self."""
        import socket
        with socket.create_server(address, reuse_port=False) as srv:
            srv.settimeout(self.timeout)
            conn, _ = srv.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._session(conn, client=False)
        return self

    def connect(self, address, tries=120):
        """Connects to a perftest server at `address` (retried while it is not listening yet: QEMU's user network
        accepts for the guest and closes again while nothing listens there); returns self."""
        import socket
        for i in range(tries):
            try:
                with socket.create_connection(address, timeout=self.timeout) as sock:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self._session(sock, client=True)
                return self
            except (OSError, GuestError) as e:
                if i + 1 == tries or (isinstance(e, GuestError) and "version" not in str(e)):
                    raise
                time.sleep(0.5)


# ------------------------------------------------------------------------------- against the project's endpoint --

# BTH opcodes (RC) the checks read from the captures.
WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_ONLY = 6, 7, 8, 10
READ_RESPONSE_FIRST, READ_RESPONSE_MIDDLE, READ_RESPONSE_LAST, READ_RESPONSE_ONLY = 13, 14, 15, 16
ATOMIC_ACK = 18
EXCHANGE_BASE_PORT = 18600  # the shim's ports on the management bridge's root address


def roce_packets(paths, src_ip=None):
    """[(opcode, psn, headers dict, payload)] of the RoCEv2 frames in pcaps (each frame once: the first file that
    has it), from `src_ip` if given; payload excludes RETH/AETH/AtomicAckETH, pad and ICRC."""
    out, seen = [], set()
    for p in paths:
        for fr in pcap_frames(p):
            if roce_icrc(fr) is None:
                continue
            key = bytes(fr[26:])  # from the IP source on: the same frame on both links (MACs, TTL differ)
            if key in seen:
                continue
            seen.add(key)
            ihl = (fr[14] & 0x0F) * 4
            if src_ip is not None and int.from_bytes(fr[26:30], "big") != src_ip:
                continue
            bth = 14 + ihl + 8
            opcode, pad = fr[bth], (fr[bth + 1] >> 4) & 3
            psn = int.from_bytes(fr[bth + 9:bth + 12], "big")
            ip_end = 14 + int.from_bytes(fr[16:18], "big")
            at, h = bth + 12, {}
            if opcode in (WRITE_FIRST, WRITE_ONLY, 12):  # RETH
                h.update(va=int.from_bytes(fr[at:at + 8], "big"), rkey=int.from_bytes(fr[at + 8:at + 12], "big"),
                         length=int.from_bytes(fr[at + 12:at + 16], "big"))
                at += 16
            if opcode in (READ_RESPONSE_FIRST, READ_RESPONSE_LAST, READ_RESPONSE_ONLY, 17, ATOMIC_ACK):  # AETH
                at += 4
            if opcode == ATOMIC_ACK:
                h["original"] = int.from_bytes(fr[at:at + 8], "big")
                at += 8
            h.update(sport=int.from_bytes(fr[14 + ihl:14 + ihl + 2], "big"),
                     dest_qp=int.from_bytes(fr[bth + 5:bth + 8], "big"))
            out.append((opcode, psn, h, bytes(fr[at:ip_end - 4 - pad])))
    return out


def written_image(packets, base_va, size):
    """The bytes RDMA WRITE messages left in [base_va, base_va + size), applied in PSN order (each PSN once)."""
    img, va, done = bytearray(size), None, set()
    first = packets[0][1] if packets else 0
    for opcode, psn, h, payload in sorted(packets, key=lambda x: (x[1] - first) % (1 << 24)):  # PSNs wrap
        if opcode not in (WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_ONLY) or psn in done:
            continue
        done.add(psn)
        if opcode in (WRITE_FIRST, WRITE_ONLY):
            va = h["va"]
        if va is None:
            continue
        off = va - base_va
        if 0 <= off and off + len(payload) <= size:
            img[off:off + len(payload)] = payload
        va += len(payload)
    return bytes(img)


def _unique_psn(packets):
    """The first packet of each PSN (a retransmission carries the same bytes)."""
    seen, out = set(), []
    for x in packets:
        if x[1] not in seen:
            seen.add(x[1])
            out.append(x)
    return out


def _u64s(data):
    return [int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data), 8)]


class EndpointInterop:
    """An rxe guest's unmodified perftest against ifec-hostd (RxeFabric with the guest among `guests` and the hostd
    not): hostd answers perftest's exchange through PerftestPeer and AttachPeer; the bytes and atomic results in its
    memory are checked against what the captured frames carried. And the reverse: hostd's requests (PeerOps) into
    the memory a guest's perftest server registered."""

    WINDOWS = dict(write=200, fetch_add=201, cmp_swap=202, again=203)
    SIZE, ITERS, ATOMICS = 8192, 200, 500

    def __init__(self, rf, hostd, guest):
        self.rf, self.hostd, self.guest = rf, hostd, guest
        self.peer_gpu = rf.node(guest)["gpu"]
        self.stub = rf.stub(hostd)

    def attach(self, window, nbytes):
        from .v1 import control_pb2 as pb
        return lambda key: self.stub.AttachPeer(pb.AttachPeerRequest(
            peer_gpu=self.peer_gpu, peer_qpn=key["qpn"], peer_psn=key["psn"], window=window, window_bytes=nbytes),
            timeout=10)

    def window(self, name, length, offset=0):
        return self.rf.read_window(self.hostd, self.WINDOWS[name], offset, length)

    def counters(self):
        from .v1 import control_pb2 as pb
        return {k: int(v) for k, v in self.stub.Counters(pb.Empty(), timeout=5).values.items()}

    # (name, window, window bytes, client command without -p/server): the guest runs them in this order.
    def plan(self):
        n, s, a = self.ITERS, self.SIZE, self.ATOMICS
        return [("ib_write_bw", "write", 1 << 20, f"ib_write_bw -d rxe0 -x 1 -F -n {n} -s {s}"),
                ("ib_read_bw", "write", 1 << 20, f"ib_read_bw -d rxe0 -x 1 -F -n {n} -s {s}"),
                ("ib_atomic_bw fetch_add", "fetch_add", 4096, f"ib_atomic_bw -d rxe0 -x 1 -F -n {a} -A FETCH_AND_ADD"),
                ("ib_atomic_bw cmp_swap", "cmp_swap", 4096, f"ib_atomic_bw -d rxe0 -x 1 -F -n {a} -A CMP_AND_SWAP"),
                ("ib_send_bw", "again", 1 << 20, f"ib_send_bw -d rxe0 -x 1 -F -n {n} -s {s}"),
                ("ib_write_bw again", "again", 1 << 20, f"ib_write_bw -d rxe0 -x 1 -F -n {n} -s {s}")]

    def guest_to_hostd(self, capture_dir):
        """The guest's clients against hostd, one shim per tool; returns (rows, facts)."""
        import threading
        plan = self.plan()
        peers, threads, errors = [], [], {}
        for i, (name, win, nbytes, _) in enumerate(plan):
            peer = PerftestPeer(self.attach(self.WINDOWS[win], nbytes), timeout=90)

            def serve(peer=peer, port=EXCHANGE_BASE_PORT + i, name=name):
                try:
                    peer.serve((live.MGMT_ROOT_IP, port))
                except Exception as e:  # noqa: BLE001 - reported in the row
                    errors[name] = str(e)
            peers.append(peer)
            threads.append(threading.Thread(target=serve, daemon=True))
        for t in threads:
            t.start()
        tools = [(name, f"{cmd} -p {EXCHANGE_BASE_PORT + i}") for i, (name, _, _, cmd) in enumerate(plan)]
        before = self.counters()
        with Captures(self.rf, capture_dir) as cap:
            st, lines = self.rf.run_guest(self.guest, client_script(live.MGMT_ROOT_IP, tools))
        for t in threads:
            t.join(5)
        got = results(lines, tools)
        packets = roce_packets(cap.files)
        after = self.counters()
        rows = []
        for i, (name, win, nbytes, _) in enumerate(plan):
            ok, check = self.check(name, win, got[name], peers[i], packets, errors.get(name), before, after)
            rows.append(dict(tool=name, direction=f"{self.guest} -> {self.hostd}", path="against ifec-hostd",
                             loss=0.0, ok=ok, gbps=got[name].get("gbps"), mpps=got[name].get("mpps"), usec=None,
                             detail=check))
        return rows, dict(icrc=icrc_report(cap.files), counters={k: after[k] - before.get(k, 0) for k in after})

    def check(self, name, win, res, peer, packets, shim_error, before, after):
        """(passed, what was checked) for one tool against hostd."""
        if name == "ib_send_bw":
            naks = after.get("invalid_naks_sent", 0) - before.get("invalid_naks_sent", 0)
            why = next((l.strip() for l in res["text"] if "error" in l.lower()), "")
            ok = res["rc"] not in (0, None) and naks > 0
            return ok, f"not supported: NAK Invalid Request x{naks}, the client stops ({why or 'rc ' + str(res['rc'])})"
        if res["rc"] != 0 or shim_error:
            return False, shim_error or " | ".join(res["text"][-4:])
        key = peer.peer_key
        if name.startswith("ib_write_bw"):
            first = next((x for x in packets if x[1] == key["psn"] and x[0] in (WRITE_FIRST, WRITE_ONLY)), None)
            reqs = [x for x in packets if first and x[2]["sport"] == first[2]["sport"] and
                    x[2]["dest_qp"] == first[2]["dest_qp"]]
            want = written_image(reqs, peer.attached.vaddr, self.SIZE)
            got = self.window(win, self.SIZE)
            ok = got == want and any(want)
            return ok, (f"{self.SIZE} B in hostd's window = the captured WRITE payloads" if ok else
                        "hostd's window differs from the captured WRITE payloads")
        if name == "ib_read_bw":
            resp = sorted([x for x in packets if x[2]["dest_qp"] == key["qpn"] and
                           x[0] in (READ_RESPONSE_FIRST, READ_RESPONSE_MIDDLE, READ_RESPONSE_LAST, READ_RESPONSE_ONLY)],
                          key=lambda x: x[1])
            data = b"".join(x[3] for x in _unique_psn(resp))
            want = self.window(win, self.SIZE)
            msgs = [data[i:i + self.SIZE] for i in range(0, len(data), self.SIZE)]
            ok = len(msgs) >= self.ITERS and all(m == want for m in msgs)
            return ok, f"{len(msgs)} READ responses of {self.SIZE} B = hostd's window"
        if name == "ib_atomic_bw fetch_add":
            got = _u64s(self.window(win, 4096))
            want = [0] * 512
            for k in range(self.ATOMICS):
                want[(k % 64) * 8] += 1
            acks = [x[2]["original"] for x in _unique_psn([x for x in packets if x[0] == ATOMIC_ACK and
                                                           x[2]["dest_qp"] == key["qpn"]])]
            ok = got == want and sorted(acks) == sorted(v for j in range(64) for v in range(want[j * 8]))
            return ok, f"{self.ATOMICS} fetch-adds of 1 over 64 words: each word = its count, each original once"
        if name == "ib_atomic_bw cmp_swap":
            got = _u64s(self.window(win, 4096))
            acks = [x[2]["original"] for x in _unique_psn([x for x in packets if x[0] == ATOMIC_ACK and
                                                           x[2]["dest_qp"] == key["qpn"]])]
            ok = not any(got) and len(acks) == self.ATOMICS and not any(acks)
            return ok, f"{len(acks)} compare(0)-and-swap(0): originals 0, memory still 0"
        return False, "no check"

    def hostd_to_guest(self):
        """hostd's requests into the memory of the guest's perftest servers (write, read, fetch-and-add), through
        PerftestPeer as the client; returns rows. perftest's server keeps no record of what reached its memory,
        so the checks are what the guest's RDMA stack answers: the write is acknowledged, two reads of the same
        region agree, and fetch-and-adds return the guest's word advancing by the amount added."""
        import threading
        from .v1 import control_pb2 as pb
        n, s = self.ITERS, self.SIZE
        servers = [("ib_write_bw", f"ib_write_bw -d rxe0 -x 1 -F -n {n} -s {s}"),
                   ("ib_read_bw", f"ib_read_bw -d rxe0 -x 1 -F -n {n} -s {s}"),
                   ("ib_atomic_bw fetch_add", f"ib_atomic_bw -d rxe0 -x 1 -F -n {n} -A FETCH_AND_ADD")]
        pattern = bytes((i * 7 + 3) & 0xFF for i in range(s))
        outcome = {}

        def ops(name):
            def run(key):
                t0 = time.time()
                q = pb.PeerOpsRequest(peer_gpu=self.peer_gpu, rkey=key["rkey"], vaddr=key["vaddr"], size=s)
                if name == "ib_write_bw":
                    q.write = pattern
                    self.stub.PeerOps(q, timeout=60)
                    outcome[name] = (True, f"{s} B RDMA WRITE into the guest's MR, acknowledged", s, t0)
                elif name == "ib_read_bw":
                    q.read = s
                    a, b = self.stub.PeerOps(q, timeout=60).read, self.stub.PeerOps(q, timeout=60).read
                    outcome[name] = (a == b and len(a) == s, f"two {s} B RDMA READs of the guest's MR agree", 2 * s,
                                     t0)
                else:
                    q.fetch_adds, q.add = 64, 3
                    got = list(self.stub.PeerOps(q, timeout=60).fetched)
                    ok = len(got) == 64 and all((got[i] - got[0]) % (1 << 64) == 3 * i for i in range(64))
                    outcome[name] = (ok, "64 fetch-adds of 3 on the guest's word: originals v, v+3, v+6, ...", 64 * 8,
                                     t0)
                outcome[name] += (time.time(),)
            return run

        def client():
            for name, _ in servers:
                try:
                    PerftestPeer(self.attach(0, 0), traffic=ops(name), timeout=90).connect(
                        (self.rf.mgmt_ip(self.guest), EXCHANGE_PORT))
                except Exception as e:  # noqa: BLE001 - reported in the row
                    outcome.setdefault(name, (False, str(e), 0, 0, 0))
        t = threading.Thread(target=client, daemon=True)
        t.start()
        lines = self.rf.run_guest(self.guest, server_script(servers))[1]
        t.join(10)
        got = results(lines, servers)
        rows = []
        for name, _ in servers:
            ok, what, nbytes, t0, t1 = outcome.get(name, (False, "no exchange", 0, 0, 0))
            ok = ok and got[name]["rc"] == 0
            rows.append(dict(tool=name + " (server)", direction=f"{self.hostd} -> {self.guest}",
                             path="against ifec-hostd", loss=0.0, ok=ok,
                             gbps=None, mpps=None, usec=None,
                             detail=what if ok else f"{what} | {' | '.join(got[name]['text'][-3:])}"))
        return rows


# ------------------------------------------------------------------------------------------------------- PFC --

def pfc_frames(records):
    """[(seconds, quanta of the priorities it names)] of the 802.1Qbb frames among pcap records."""
    out = []
    for t, f in records:
        if len(f) >= 34 and f[12:14] == b"\x88\x08" and f[14:16] == b"\x01\x01":
            enable = int.from_bytes(f[16:18], "big")
            out.append((t, {p: int.from_bytes(f[18 + 2 * p:20 + 2 * p], "big") for p in range(8) if enable >> p & 1}))
    return out


def pfc_probe(rf, sender, receiver, capture_dir, lossless_priority=3, link_gbps=1.0):
    """ib_write_bw in the lossless class (traffic class 104 = DSCP 26) from guest `sender` to guest `receiver`
    whose link is slower, so the switch's ingress from `sender` passes XOFF and it sends PFC pauses. Whether the
    guest honours them is measured on its link: RoCEv2 frames it sent while a pause was in force (more than 50 us
    after the pause left the switch, before it expired or a resume). Returns a dict."""
    tools = [("ib_write_bw pfc", "ib_write_bw -d rxe0 -x 1 -F -n 60 -s 65536 --report_gbits --tclass=104")]
    before = switch_counters(rf)
    with Captures(rf, capture_dir) as cap:
        out = rf.run_pair(receiver, server_script(tools), sender, client_script(rf.mgmt_ip(receiver), tools))
    after = switch_counters(rf)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    recs = pcap_records(next(f for f in cap.files if f.name.startswith(sender + "-")))
    pauses = pfc_frames(recs)
    quantum_s = 512 / (link_gbps * 1e9)
    windows = []
    for t, q in pauses:
        if lossless_priority in q:
            if q[lossless_priority] > 0:
                windows.append([t + 50e-6, t + q[lossless_priority] * quantum_s])
            elif windows:
                windows[-1][1] = min(windows[-1][1], t)
    sent = [t for t, f in recs if roce_icrc(f) is not None and int.from_bytes(f[26:30], "big") == int(
        rf.node(sender)["loopback"])]
    while_paused = sum(1 for t in sent if any(a < t < b for a, b in windows))
    res = results(out[sender][1], tools)["ib_write_bw pfc"]
    return dict(pauses_sent=delta.get("switch_pause_sent", 0), pause_frames_on_link=sum(1 for _, q in pauses
                                                                                 if q.get(lossless_priority, 0) > 0),
                frames_sent=len(sent), frames_while_paused=while_paused, honoured=bool(pauses) and while_paused == 0,
                transfer_ok=res["rc"] == 0 and results(out[receiver][1], tools)["ib_write_bw pfc"]["rc"] == 0,
                gbps=res.get("gbps"), switch_drops=delta.get("switch_buffer_drops", 0))


# ---------------------------------------------------------------------------------------- the whole suite --

def _topology(name):
    return _repo() / "testbed" / "rxe" / name


@contextlib.contextmanager
def _quietly_up(rf):
    rf.up(progress=lambda line: None)
    try:
        yield rf
    finally:
        rf.down()


def interop(progress=print, capture_root=None):
    """The whole interop matrix: (rows, facts). Three fabrics in turn: two guests through ifec-switchd (no loss,
    1% loss), a guest and ifec-hostd (both directions), and the PFC probe. The captures (about 300 MB) stay in
    `capture_root` when given, else in a temporary directory removed at the end."""
    if capture_root is None:
        import tempfile
        with tempfile.TemporaryDirectory(prefix="ifec-rxe-") as tmp:
            rows, facts = interop(progress, tmp)
        facts["captures"] = "removed (--captures DIR keeps them)"
        return rows, facts
    root = captures_folder(capture_root)
    rows, facts = [], {}
    t0 = time.time()
    with _quietly_up(RxeFabric(_topology("rxe-2x1.yaml"))) as rf:
        for loss in (0.0, 0.01):
            progress(f"interop: ibv_rc_pingpong and perftest, gpu0 -> gpu1 through ifec-switchd, {loss:.0%} loss "
                     f"({time.time() - t0:.0f} s)")
            r, f = run_matrix(rf, "gpu1", "gpu0", loss=loss, capture_dir=root / f"switch-loss{int(loss * 100)}")
            rows += r
            facts[f"switch, {loss:.0%} loss"] = f
    with _quietly_up(RxeFabric(_topology("rxe-2x1.yaml"), guests=["gpu1"])) as rf:
        e = EndpointInterop(rf, "gpu0", "gpu1")
        progress(f"interop: perftest clients in the guest against ifec-hostd ({time.time() - t0:.0f} s)")
        r, f = e.guest_to_hostd(root / "hostd")
        rows += r
        facts["against ifec-hostd"] = f
        progress(f"interop: ifec-hostd against perftest servers in the guest ({time.time() - t0:.0f} s)")
        rows += e.hostd_to_guest()
    with _quietly_up(RxeFabric(_topology("rxe-2x1-pfc.yaml"))) as rf:
        progress(f"interop: PFC, gpu0 -> gpu1 behind a 50 Mb/s link, lossless class ({time.time() - t0:.0f} s)")
        facts["pfc"] = pfc_probe(rf, "gpu0", "gpu1", root / "pfc")
    facts["seconds"] = time.time() - t0
    facts["captures"] = str(root)
    return rows, facts


def pfc_line(p):
    return (f"PFC: ifec-switchd sent {p['pauses_sent']} pauses (lossless priority, {p['pause_frames_on_link']} seen on "
            f"the guest's link); the guest sent {p['frames_while_paused']} of its {p['frames_sent']} frames while "
            f"paused: {'honoured' if p['honoured'] else 'NOT honoured (QEMU virtio-net and rxe implement no PFC)'}; "
            f"the transfer {'completed' if p['transfer_ok'] else 'FAILED'} at {p['gbps']} Gb/s, "
            f"{p['switch_drops']} switch drops")


def main(argv=None):
    import argparse
    import json
    ap = argparse.ArgumentParser(prog="./ifec interop", description="Interop with real RDMA stacks.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rxe", help="Soft-RoCE guests (QEMU) through ifec-switchd and against ifec-hostd: the matrix")
    r.add_argument("--captures", help="keep the pcaps here (about 300 MB; default: none kept)")
    r.add_argument("--json", action="store_true", help="rows and facts as JSON")
    args = ap.parse_args(argv)
    why = unavailable()
    if why:
        print(f"interop: cannot run guests here: {why}", file=sys.stderr)
        return 2
    try:
        kvm_setting()
        if args.captures is not None:
            captures_folder(args.captures)
    except GuestError as e:
        print(f"interop: {e}", file=sys.stderr)
        return 2
    rows, facts = interop(progress=lambda l: print(l, file=sys.stderr, flush=True), capture_root=args.captures)
    if args.json:
        print(json.dumps(dict(rows=rows, facts=facts), default=str))
    else:
        print("# Soft-RoCE interop [rdma-core's own tools, unmodified, in QEMU guests (software emulation); Gb/s and "
              "Mop/s as emulated, not a NIC's]")
        print(table(rows))
        for name, f in facts.items():
            if isinstance(f, dict) and "icrc" in f:
                for path, (n, bad) in f["icrc"].items():
                    print(f"# ICRC, {name}: {n} RoCEv2 frames in {pathlib.Path(path).name}, {bad} wrong")
        print("# " + pfc_line(facts["pfc"]))
        print(f"# {facts['seconds']:.0f} s; captures: {facts['captures']}")
    return 0 if all(x["ok"] for x in rows) and facts["pfc"]["transfer_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
