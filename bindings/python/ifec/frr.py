"""FRR (Debian's frr: zebra and bgpd, unmodified) in a topology node's place on the live fabric, and the interop
matrix between it and the project's own FARE-over-BGP speakers (`./ifec interop frr`).

A node run by FRR keeps its namespace, interfaces and link addresses (link L's /29 at 10.64.0.0 + 8 L, .2 at the
a-end, .3 at the b-end), its AS (4200000000 + node index) and its loopback as router id, so the neighbours' speakers
peer with it as they would with ifec-switchd or ifec-hostd: one eBGP session per link.

- As a switch: bgpd peers with the GPUs' stub speakers and passes their routes on; the link-bandwidth community
  they carry goes through unchanged (in a one-tier SuperPoD that is FARE's path bandwidth); zebra installs the
  weighted ECMP routes in the namespace's kernel, which then forwards the plane's RoCEv2 frames (no IFEC engine
  there: in-fabric collectives need ifec-switchd).
- As a GPU: bgpd originates the GPU's loopback on every session with the session's bundle bandwidth (a route-map's
  `set extcommunity bandwidth`, in FRR's Mb/s: our speakers write 1 Gb/s as FRR's 1 Mb/s, see routing/README.md)
  and re-advertises nothing (a stub); it learns every other GPU's loopback from every plane's switch and zebra
  installs them with weights in proportion to the path bandwidth received (`bgp bestpath as-path
  multipath-relax`, `maximum-paths 64`).
"""

import ipaddress
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

from . import containers

FRR_DIR = pathlib.Path("/usr/lib/frr")
AS_BASE = 4200000000
HOLD_TIME_S = 3  # the project's speakers' (testbed::kLiveBgpHoldNs); keepalive 1 s


def unavailable():
    """Why FRR cannot run here ("" when it can)."""
    if not (FRR_DIR / "bgpd").exists() or not (FRR_DIR / "zebra").exists():
        return "FRR is not installed (/usr/lib/frr/bgpd): ./ifec setup installs Debian's frr"
    if shutil.which("vtysh") is None:
        return "FRR's vtysh is not installed"
    if os.geteuid() != 0:
        return "FRR's daemons need root (they run in the node's namespace and install kernel routes)"
    return ""


def version():
    """FRR's version ("8.4.4"), from bgpd."""
    p = subprocess.run([str(FRR_DIR / "bgpd"), "--version"], capture_output=True, text=True)
    first = (p.stdout or p.stderr).strip().splitlines()[:1]
    return first[0].split()[-1] if first else "?"


def _ip(n):
    return str(ipaddress.IPv4Address(int(n)))


def link_address(link, node_name):
    """`node_name`'s address on `link` (a bindings Topology.links entry): the /29's .2 (a-end) or .3 (b-end)."""
    return str(containers.link_subnet(link["id"])[2 if link["a"] == node_name else 3])


def node_links(topo, name):
    return [l for l in topo.links if name in (l["a"], l["b"])]


def peer_of(link, name):
    return link["b"] if link["a"] == name else link["a"]


def _node(topo, name):
    """Node `name` of `topo`, its name and its neighbours' checked fit for FRR's configuration and a shell command (a
    name with a newline or a quote wrote lines of its own there); ValueError naming a node that is not there."""
    nd = next((n for n in topo.nodes if n["name"] == name), None)
    if nd is None:
        raise ValueError(f"no node {name!r} in topology {topo.name}")
    containers.check_node_names(topo)
    return nd


def bundle_gbps(topo, name, peer):
    """The bandwidth of every link between `name` and `peer` (a Y-cable's sub-links together)."""
    return sum(l["rate_gbps"] for l in node_links(topo, name) if peer_of(l, name) == peer)


def bgpd_config(topo, name, log_file=None):
    """bgpd's configuration for node `name` of `topo` (a bindings Topology); logs to `log_file` (None: stdout)."""
    nd = _node(topo, name)
    index = {n["name"]: n["index"] for n in topo.nodes}
    gpu = nd["kind"] == "gpu"
    lo = _ip(nd["loopback"])
    out = [f"hostname {name}", f"log file {log_file}" if log_file else "log stdout", "!"]
    links = node_links(topo, name)
    if gpu:  # a stub: only its own loopback goes out, with the session's bundle bandwidth (FRR's Mb/s = our Gb/s)
        out += [f"ip prefix-list OWN seq 5 permit {lo}/32", "!"]
        for bw in sorted({bundle_gbps(topo, name, peer_of(l, name)) for l in links}):
            if bw != int(bw) or not 1 <= bw <= 25600:
                raise ValueError(f"{name}: a bundle of {bw:g} Gb/s is not a bandwidth FRR's route-maps can set "
                                 "(whole Mb/s, 1..25600: our speakers write 1 Gb/s where FRR reads 1 Mb/s)")
            out += [f"route-map STUB-{bw:g} permit 10", " match ip address prefix-list OWN",
                    f" set extcommunity bandwidth {bw:g}", "!"]
    out += [f"router bgp {AS_BASE + nd['index']}", f" bgp router-id {lo}", " no bgp ebgp-requires-policy",
            " no bgp network import-check", " bgp bestpath as-path multipath-relax",
            f" timers bgp {max(1, HOLD_TIME_S // 3)} {HOLD_TIME_S}"]
    for l in links:
        peer = peer_of(l, name)
        addr = link_address(l, peer)
        out += [f" neighbor {addr} remote-as {AS_BASE + index[peer]}", f" neighbor {addr} description {peer}",
                f" neighbor {addr} timers connect 1"]
    out += [" !", " address-family ipv4 unicast", f"  network {lo}/32", "  maximum-paths 64"]
    for l in links:
        addr = link_address(l, peer_of(l, name))
        out.append(f"  neighbor {addr} send-community extended")
        if gpu:
            out.append(f"  neighbor {addr} route-map STUB-{bundle_gbps(topo, name, peer_of(l, name)):g} out")
    out += [" exit-address-family", "!", ""]
    return "\n".join(out)


def _kernel_routes(ip_json):
    routes = {}
    for r in json.loads(ip_json.strip() or "[]"):
        hops = r.get("nexthops") or [dict(gateway=r.get("gateway"), weight=1)]
        routes[r["dst"] if "/" in r["dst"] else r["dst"] + "/32"] = [(h.get("gateway"), h.get("weight", 1))
                                                                     for h in hops]
    return routes


class FrrNode:
    """zebra and bgpd for one node, in its Mininet host's namespace, with their files under `directory`."""

    def __init__(self, topo, name, host, directory):
        self.topo, self.name, self.host = topo, name, host
        self.dir = pathlib.Path(directory) / f"frr-{name}"
        self.pathspace = f"ifec{os.getpid()}-{name}"  # FRR's -N: its sockets under /var/run/frr/<pathspace>
        self.zebra = self.bgpd = None

    def configure(self):
        """The node's link addresses (our daemons give themselves theirs; FRR is given them here), its loopback on
        lo, and a switch's kernel forwarding (its data plane)."""
        cmds = [f"ip addr replace {link_address(l, self.name)}/29 dev "
                f"f{l['a_port'] if l['a'] == self.name else l['b_port']}" for l in node_links(self.topo, self.name)]
        nd = next(n for n in self.topo.nodes if n["name"] == self.name)
        cmds.append(f"ip addr replace {_ip(nd['loopback'])}/32 dev lo")
        cmds.append(f"sysctl -qw net.ipv4.ip_forward={0 if nd['kind'] == 'gpu' else 1}")
        from . import live
        live._host_sh(self.host, " && ".join(cmds))

    def start(self):
        """Starts zebra, then bgpd (the Popen of bgpd is returned: the node's process, by PID)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "bgpd.conf").write_text(bgpd_config(self.topo, self.name, self.dir / "bgpd.log"))
        # Routes with their next hops inline (RTA_MULTIPATH, weights per hop), not kernel nexthop objects: the
        # kernel drops a nexthop object whose link lost its carrier, and zebra 8.4 does not notice it is gone.
        (self.dir / "zebra.conf").write_text(f"hostname {self.name}\n{ZEBRA_CONF}")
        shutil.chown(self.dir, "frr", "frr")
        for f in self.dir.iterdir():
            shutil.chown(f, "frr", "frr")
        run_dir = pathlib.Path("/var/run/frr") / self.pathspace
        shutil.rmtree(run_dir, ignore_errors=True)
        log = open(self.dir / "daemons.log", "a")
        # zebra drops to the frr user (its sockets must be the frr user's); bgpd stays root (-S)
        self.zebra = self.host.popen([str(FRR_DIR / "zebra"), "-N", self.pathspace, "-f", str(self.dir / "zebra.conf"),
                                      "-i", str(self.dir / "zebra.pid"), "-u", "frr", "-g", "frr",
                                      "--log", f"file:{self.dir / 'zebra.log'}"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while not (run_dir / "zserv.api").exists():
            if self.zebra.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{self.name}: FRR's zebra did not start: "
                                   f"{(self.dir / 'daemons.log').read_text()[-400:]}")
            time.sleep(0.05)
        self.bgpd = self.host.popen([str(FRR_DIR / "bgpd"), "-S", "-N", self.pathspace, "-f",
                                     str(self.dir / "bgpd.conf"), "-i", str(self.dir / "bgpd.pid"),
                                     "--log", f"file:{self.dir / 'bgpd.log'}"], stdout=log, stderr=subprocess.STDOUT)
        return self.bgpd

    def vtysh(self, command):
        """One vtysh command's output, parsed when it is JSON."""
        p = subprocess.run(["vtysh", "-N", self.pathspace, "-c", command], capture_output=True, text=True, timeout=20)
        text = p.stdout.strip()
        if p.returncode != 0:
            raise RuntimeError(f"{self.name}: vtysh -c '{command}': {p.stderr.strip() or text}")
        return json.loads(text) if text.startswith("{") or text.startswith("[") else text

    def sessions(self):
        """peer address -> state, from bgpd (an empty dict when bgpd does not answer)."""
        try:
            s = self.vtysh("show bgp ipv4 unicast summary json")
        except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError):
            return {}
        return {addr: p.get("state", "?") for addr, p in s.get("peers", {}).items()}

    def kernel_routes(self):
        """prefix -> [(gateway, weight)] of the namespace's kernel routes that zebra installed from BGP."""
        return _kernel_routes(self.host.cmd("ip -j route show proto bgp"))

    def alive(self):
        return self.bgpd is not None and self.bgpd.poll() is None

    def kill(self):
        """SIGKILL bgpd and zebra (the kernel closes bgpd's sessions; zebra's routes stay until it is gone)."""
        for p in (self.bgpd, self.zebra):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(5)

    def stop(self):
        for p in (self.bgpd, self.zebra):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in (self.bgpd, self.zebra):
            if p is None:
                continue
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        shutil.rmtree(pathlib.Path("/var/run/frr") / self.pathspace, ignore_errors=True)


ZEBRA_CONF = "no zebra nexthop kernel enable\n"  # see FrrNode.start


def container_command(topo, name):
    """The shell command an FRR container runs (ifec-frr image): its loopback on lo, zebra, then bgpd in the
    foreground with the configuration the compose file passes in $BGPD_CONF."""
    nd = _node(topo, name)
    return " && ".join([
        f"ip addr replace {_ip(nd['loopback'])}/32 dev lo",
        "mkdir -p /etc/frr /var/run/frr && chown frr:frr /var/run/frr",
        "printf '%s' \"$$BGPD_CONF\" > /etc/frr/bgpd.conf",
        f"printf 'hostname {name}\\n{ZEBRA_CONF.strip()}\\n' > /etc/frr/zebra.conf",
        "/usr/lib/frr/zebra -d -f /etc/frr/zebra.conf -u frr -g frr",
        "while [ ! -S /var/run/frr/zserv.api ]; do sleep 0.1; done",
        "exec /usr/lib/frr/bgpd -S -f /etc/frr/bgpd.conf"])


class FrrContainer:
    """FRR in a container of the containerized testbed: what the interop checks ask of it, through docker exec."""

    def __init__(self, name, container, docker="docker"):
        self.name, self.container, self.docker = name, container, docker
        self.pathspace = None

    def _exec(self, *argv):
        return subprocess.run([self.docker, "exec", self.container, *argv], capture_output=True, text=True,
                              timeout=20)

    def vtysh(self, command):
        p = self._exec("vtysh", "-c", command)
        text = p.stdout.strip()
        if p.returncode != 0:
            raise RuntimeError(f"{self.name}: vtysh -c '{command}': {p.stderr.strip() or text}")
        return json.loads(text) if text.startswith("{") or text.startswith("[") else text

    sessions = FrrNode.sessions

    def kernel_routes(self):
        return _kernel_routes(self._exec("ip", "-j", "route", "show", "proto", "bgp").stdout)

    def alive(self):
        return bool(self.sessions())
