"""The live testbed: a topology as real processes on real interfaces.

Every node of the topology becomes a Mininet host (a network namespace; hosts only, no Open vSwitch): every link a
veth pair named f<port> on both ends (MTU 9216, paced at the link's rate by tc tbf), plus one management interface
m0 on a Linux bridge (172.31.0.0/16, the root namespace at 172.31.0.1) for the gRPC control plane. Each switch runs
ifec-switchd, each GPU ifec-hostd (or, for the nodes named in `frr`, FRR's zebra and bgpd: ifec.frr); FARE runs
over BGP between them, one eBGP session per link. `up()` returns once every daemon answers, every hostd is
bootstrapped and FARE has converged.

    with LiveFabric("testbed/topologies/superpod-4x2.yaml") as fab:
        row = fab.run("allreduce", algo="ifec", bytes=1 << 20)

From the shell: ./ifec live up|status|run|fail|restore|capture|kill|start|down (python -m ifec.live --help).
"""

import argparse
import concurrent.futures
import json
import os
import pathlib
import select
import shutil
import signal
import socket
import subprocess
import sys
import time

from . import _args, _native

MGMT_BRIDGE = "ifecmgmt0"
MGMT_ROOT_IP = "172.31.0.1"
GRPC_PORT = 50051
FABRIC_DRIVERS = ("af_packet", "af_xdp", "auto")
STATE_DIR = pathlib.Path(os.environ.get("IFEC_LIVE_STATE", "/run/ifec-live"))
# How long one operation may take on every rank before it fails (run and compare's --timeout): a collective, and the
# MoE layer (its experts run on the hosts' CPUs). A slow host or a large size needs more; a hang fails sooner with less.
RUN_TIMEOUT_S = 120.0
MOE_TIMEOUT_S = 300.0
MAX_TIMEOUT_S = 86400.0  # a day: more is a typo (gRPC would take 1e9 s, and wait that long)


class LiveError(RuntimeError):
    """A live-testbed problem, naming the node, link or daemon concerned."""


def _check_stop(should_stop):
    """Between the steps of a bring-up: a stop asked for (SIGTERM/SIGINT to the supervisor) ends it."""
    if should_stop():
        raise LiveError("stopped during the bring-up (everything it made is down again)")


def mgmt_ip(node_index):
    """The management address of topology node `node_index` (the daemons' own rule: node i at host i + 2)."""
    host = node_index + 2
    return f"172.31.{host // 256}.{host % 256}"


def run_timeout(timeout, what):
    """An operation's deadline in seconds: for None its default (MOE_TIMEOUT_S for what "moe", RUN_TIMEOUT_S else),
    else `timeout`, a finite number of seconds in (0, MAX_TIMEOUT_S]."""
    if timeout is None:
        return MOE_TIMEOUT_S if what == "moe" else RUN_TIMEOUT_S
    v = _args.real(timeout, "timeout", 0, MAX_TIMEOUT_S)
    if v == 0:
        raise ValueError(f"timeout={timeout!r}: expected more than 0 s")
    return v


def _grpc():
    try:
        import grpc
        from .v1 import control_pb2, control_pb2_grpc
    except ImportError as e:  # pragma: no cover - the project's setup installs them
        raise LiveError(f"the live testbed needs python3-grpcio and python3-protobuf ({e}); run ./ifec setup")
    return grpc, control_pb2, control_pb2_grpc


def rpc_roles(service):
    """rpc name -> the roles that may call it, from control.proto's `roles` options (the one table)."""
    _, pb, _ = _grpc()
    return {name: set(m.GetOptions().Extensions[pb.roles].split())
            for name, m in pb.DESCRIPTOR.services_by_name[service].methods_by_name.items()}


class _RoleStub:
    """A daemon's stub whose rpcs each present the certificate of the first of viewer, operator, rank that may call
    it (or of one role for all: as_role), over one channel per role; plaintext where tls_dir is None."""
    CLIENT_ROLES = ("viewer", "operator", "rank")

    def __init__(self, address, service, tls_dir, role=None, stubs=None):
        self._address, self._service, self._tls, self._role = address, service, tls_dir, role
        self._by_role = {} if stubs is None else stubs
        self._roles = rpc_roles(service)

    def as_role(self, role):
        return self if role is None else _RoleStub(self._address, self._service, self._tls, role, self._by_role)

    def _stub(self, role):
        if role not in self._by_role:
            grpc, _, rpc = _grpc()
            # Reconnects within a second once a daemon listens (gRPC's default back-off grows to two minutes: a
            # bring-up that asked before the daemons were up would wait that long), and messages up to 1 GiB. gRPC
            # takes the minimum back-off as how long one connection attempt (TCP, TLS, SETTINGS) may last: 5 s, as
            # the daemons' own channels (at 100 ms a loaded host's handshakes timed out and the calls failed).
            opts = [("grpc.max_receive_message_length", 1 << 30), ("grpc.max_send_message_length", 1 << 30),
                    ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 5000),
                    ("grpc.max_reconnect_backoff_ms", 1000)]
            if self._tls is None:
                ch = grpc.insecure_channel(self._address, options=opts)
            else:
                from . import pki
                ch = grpc.secure_channel(self._address, pki.grpc_credentials(self._tls, role), options=opts)
            self._by_role[role] = getattr(rpc, self._service + "Stub")(ch)
        return self._by_role[role]

    def __getattr__(self, name):
        if name not in self._roles:
            raise AttributeError(f"the {self._service} service has no rpc {name}")
        role = self._role or next((r for r in self.CLIENT_ROLES if r in self._roles[name]), self.CLIENT_ROLES[0])
        return getattr(self._stub(None if self._tls is None else role), name)


def _bin_dir():
    here = pathlib.Path(__file__).resolve().parent  # build/python/ifec
    return pathlib.Path(os.environ.get("IFEC_BIN_DIR", here.parent.parent / "bin"))


def _next_run_id(prev, now_us):
    """An operation's number: the first a multiple of 3 past `now_us`; then the smallest one at least `now_us` that
    continues the previous one's turn mod 3 (prev + 1, prev + 4, ...)."""
    if prev is None:
        return (now_us // 3 + 1) * 3
    return prev + 1 + 3 * max(0, -(-(now_us - prev - 1) // 3))


class LiveFabric:
    """Brings a topology up as live daemons in Mininet hosts, runs measurements on it, and takes it down again."""

    driver = "live"  # what its rows say produced them

    def __init__(self, topology_file, log_dir=None, ready_timeout=60.0, frr=(), insecure=False, tls_dir=None,
                 fabric_driver="af_packet"):
        self.topology_file = str(pathlib.Path(topology_file).resolve())
        self.topo = _native.load_topology(self.topology_file)
        self.nodes = self.topo.nodes
        self.links = self.topo.links
        self.frr_names = list(frr)
        for name in self.frr_names:
            self.node(name)
        self.frr = {}  # node -> ifec.frr.FrrNode, once started
        self.log_dir = pathlib.Path(log_dir or f"/tmp/ifec-live-{os.getpid()}")
        self.ready_timeout = ready_timeout
        self.net = None
        self.hosts = {}
        self.procs = {}
        self._stubs = {}
        # The control plane's certificates (ifec.pki; made by up() unless given): None with insecure (plaintext).
        self.tls_dir = None if insecure else pathlib.Path(tls_dir or self.log_dir / "tls")
        if fabric_driver not in FABRIC_DRIVERS:
            raise LiveError(f"fabric driver {fabric_driver!r}: expected one of {', '.join(FABRIC_DRIVERS)}")
        self.fabric_driver = fabric_driver  # the daemons' fabric sockets (--fabric-driver)

    # ------------------------------------------------------------------------------------------- bring-up --

    def up(self, progress=print, should_stop=lambda: False):
        """Brings the topology up; `should_stop()`, asked between steps, ends the bring-up early (LiveError) with
        everything it made taken down again."""
        from mininet.log import setLogLevel
        from mininet.net import Mininet
        from mininet.nodelib import LinuxBridge

        setLogLevel("error")
        missing = [p for p in ("ifec-switchd", "ifec-hostd") if not (_bin_dir() / p).exists()]
        if missing:
            raise LiveError(f"{', '.join(missing)} not built in {_bin_dir()}: run ./ifec build")
        if subprocess.run(["ip", "link", "show", "ifecbare0"], capture_output=True).returncode == 0:
            raise LiveError("a bare testbed is up here (bridge ifecbare0 holds 172.31.0.1/16): "
                            "testbed/live/bare-up.sh --down")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        reap_leftovers()
        t0 = time.time()
        self.net = Mininet(topo=None, controller=None, build=False, autoSetMacs=False, waitConnected=False)
        try:
            for nd in self.nodes:
                self.hosts[nd["name"]] = self.net.addHost(nd["name"], ip=None)
            bridge = self.net.addSwitch(MGMT_BRIDGE, cls=LinuxBridge, stp=False)
            for nd in self.nodes:
                self.net.addLink(self.hosts[nd["name"]], bridge, intfName1="m0")
            for l in self.links:
                self.net.addLink(self.hosts[l["a"]], self.hosts[l["b"]],
                                 intfName1=f"f{l['a_port']}", intfName2=f"f{l['b_port']}")
            self.net.build()
            _check_stop(should_stop)
            self.net.start()
            self._configure()
            _check_stop(should_stop)
            progress(f"live: {len(self.nodes)} hosts, {len(self.links)} links, management bridge {MGMT_BRIDGE} "
                     f"({time.time() - t0:.1f} s)")
            self._make_certificates(progress)
            self._start_daemons()
            self._wait_ready(progress, should_stop)
            progress(f"live: every daemon ready, FARE converged ({time.time() - t0:.1f} s)")
        except BaseException:
            self.down()
            raise
        return self

    def _configure(self):
        _sh(["ip", "addr", "replace", f"{MGMT_ROOT_IP}/16", "dev", MGMT_BRIDGE])
        _sh(["ip", "link", "set", MGMT_BRIDGE, "up"])
        _mgmt_forwarding(True)
        for nd in self.nodes:
            h = self.hosts[nd["name"]]
            _host_sh(h, f"ip addr add {mgmt_ip(nd['index'])}/16 dev m0 && ip link set m0 up && ip link set lo up")
        for l in self.links:
            for end in ("a", "b"):
                h = self.hosts[l[end]]
                intf = f"f{l[end + '_port']}"
                _host_sh(h, f"ip link set {intf} mtu 9216 up && " + tbf_command(intf, l["rate_gbps"],
                                                                                self.topo.buffer_bytes))
        if self.frr_names:
            from . import frr
            if why := frr.unavailable():
                raise LiveError(f"--frr {','.join(self.frr_names)}: {why}")
            for name in self.frr_names:
                self.frr[name] = frr.FrrNode(self.topo, name, self.hosts[name], self.log_dir)
                self.frr[name].configure()

    def _make_certificates(self, progress):
        """A fresh CA and certificates for every daemon (its management address and name) and client role."""
        if self.tls_dir is None:
            progress("live: --insecure: the control plane is plaintext, without certificates or roles")
            return
        from . import pki
        pki.make(self.tls_dir, {nd["name"]: [self.address(nd).rsplit(":", 1)[0]] for nd in self.nodes
                                if nd["name"] not in self.frr_names}, progress=progress)

    def tls_args(self):
        """A daemon's certificate options: --tls-dir, or --insecure."""
        return ["--insecure"] if self.tls_dir is None else ["--tls-dir", str(self.tls_dir)]

    def _start_daemons(self):
        for nd in self.nodes:
            self.start(nd["name"])

    def _record(self):
        """What this process started, by PID, so a later run can end it if this one dies without down()."""
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        (STATE_DIR / f"fabric-{os.getpid()}.json").write_text(json.dumps(dict(
            owner=os.getpid(), daemons={**{n: p.pid for n, p in self.procs.items()},
                                        **{f"{n}/zebra": f.zebra.pid for n, f in self.frr.items()
                                           if getattr(f, "zebra", None) is not None}},
            hosts={n: h.pid for n, h in self.hosts.items()},
            started=_starts([os.getpid(), *[p.pid for p in self.procs.values()], *[h.pid for h in self.hosts.values()],
                             *[f.zebra.pid for f in self.frr.values() if getattr(f, "zebra", None) is not None]]))))

    def start(self, node):
        """Starts (or restarts) the daemon of `node` in its host; its log goes to log_dir/NODE.log."""
        nd = self.node(node)
        old = self.procs.get(node)
        if old is not None and old.poll() is None:
            raise LiveError(f"{node}: its daemon is still running (pid {old.pid})")
        if node in self.frr:
            self.frr[node].stop()
            self.procs[node] = self.frr[node].start()
            self._record()
            return
        prog = "ifec-hostd" if nd["kind"] == "gpu" else "ifec-switchd"
        log = open(self.log_dir / f"{node}.log", "a")
        self.procs[node] = self.hosts[node].popen(
            [str(_bin_dir() / prog), "--topo", self.topology_file, "--node", node, *self.tls_args(),
             "--fabric-driver", self.fabric_driver, *self.daemon_args(nd)],
            stdout=log, stderr=subprocess.STDOUT)
        self._stubs.pop(node, None)
        self._record()

    def node(self, name):
        """The topology node called `name`, or a LiveError naming it and the nodes there are."""
        nd = next((n for n in self.nodes if n["name"] == name), None)
        if nd is None:
            raise LiveError(f"no node '{name}' in {self.topo.name} (nodes: {', '.join(n['name'] for n in self.nodes)})")
        return nd

    def daemon_args(self, nd):
        """Extra command-line arguments of node `nd`'s daemon: GPUs run by FRR are not ranks (no hostd), so the
        other hostds leave them out (ifec.rxe's guests add their own)."""
        frr_gpus = [n for n in self.frr_names if self.node(n)["kind"] == "gpu"]
        return ["--external-peers", ",".join(frr_gpus)] if frr_gpus and nd["kind"] == "gpu" else []

    def _wait_ready(self, progress, should_stop=lambda: False):
        deadline = time.time() + self.ready_timeout
        last = None
        while True:
            _check_stop(should_stop)
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise LiveError("daemon(s) exited during bring-up: " + "; ".join(
                    f"{n}: {self.log_tail(n)}" for n in dead))
            status = self.status(timeout=2.0)
            waiting = [n for n, s in status.items() if not s.get("ready")]
            if not waiting:
                return
            if waiting != last:
                progress(f"live: waiting for {len(waiting)} of {len(status)} daemons ({', '.join(waiting[:6])}"
                         f"{', ...' if len(waiting) > 6 else ''})")
                last = waiting
            if time.time() > deadline:
                raise LiveError(f"not ready after {self.ready_timeout:.0f} s: " + "; ".join(
                    f"{n}: {status[n].get('error') or 'not ready'}" for n in waiting[:8]))
            time.sleep(0.2)

    def log_tail(self, node, lines=5):
        try:
            return " | ".join((self.log_dir / f"{node}.log").read_text().strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # ------------------------------------------------------------------------------------------ control --

    def stub(self, node, role=None):
        """Node's daemon's gRPC stub. Each rpc presents the certificate of a role that may call it (control.proto's
        `roles`: viewer for reads, operator for links and loss, rank for collectives, windows and peer operations),
        or `role`'s for every rpc (what the security tests use to be refused)."""
        grpc, pb, rpc = _grpc()
        if node in self.frr:
            f = self.frr[node]
            how = f"vtysh -N {f.pathspace}" if f.pathspace else f"docker exec {getattr(f, 'container', node)} vtysh"
            raise LiveError(f"{node} runs FRR, not an ifec daemon: ask it with {how} -c 'show bgp summary'")
        if node not in self._stubs:
            nd = self.node(node)
            self._stubs[node] = _RoleStub(self.address(nd), "Host" if nd["kind"] == "gpu" else "Switch",
                                          self.tls_dir)
        return self._stubs[node].as_role(role)

    def address(self, nd):
        """Where node `nd`'s daemon serves gRPC (its management address)."""
        return f"{mgmt_ip(nd['index'])}:{GRPC_PORT}"

    def status(self, timeout=5.0):
        """node -> dict(ready, ports, fare_changes, ...) or dict(ready=False, error=...) for a daemon that does not answer."""
        grpc, pb, _ = _grpc()
        from google.protobuf.json_format import MessageToDict
        out = {}
        for nd in self.nodes:
            if nd["name"] in self.frr:  # ready once every session is Established
                states = self.frr[nd["name"]].sessions()
                up = sum(1 for st in states.values() if st == "Established")
                out[nd["name"]] = dict(ready=bool(states) and up == len(states), driver="frr", sessions=states,
                                       **({} if states else dict(error="FRR's bgpd does not answer")))
                continue
            try:
                out[nd["name"]] = MessageToDict(self.stub(nd["name"]).Status(pb.Empty(), timeout=timeout),
                                                preserving_proto_field_name=True)
            except grpc.RpcError as e:
                out[nd["name"]] = dict(ready=False, error=f"{e.code().name}: {e.details()}")
                # A TLS channel whose first connection met a daemon not yet listening can stay failing after it
                # listens (grpcio 1.51): the next ask goes over a new one.
                if e.code() == grpc.StatusCode.UNAVAILABLE:
                    self._stubs.pop(nd["name"], None)
        return out

    def run(self, what="allreduce", algo="ifec", bytes=1 << 20, dtype="fp32", op="sum", root=0, seed=1,
            timeout=None, moe=None, inputs=None, trace=None):
        """Runs one measurement on every rank at once; returns the merged row (the sim's row keys, driver "live").
        what="moe": one MoE layer, algo the variant (per_expert, per_rank, ifec), dtype bf16 or fp32, `moe` a dict of
        MoeShape fields (tokens per rank, hidden, inter, experts, topk, groups, topk_groups; defaults in the .proto).
        `inputs` (allreduce, reduce, multicast): each rank's own bytes by GPU index instead of drawn ones; the row's
        "outputs" then holds each rank's buffer afterwards (nothing is checked). `trace`: a folder each rank's part is
        appended to (ifec.trace; not for moe). `timeout`: seconds every rank may take (None: run_timeout's default
        for `what`). Raises LiveError naming every rank that failed or did not answer."""
        timeout = run_timeout(timeout, what)
        if trace and what == "moe":
            raise LiveError("a trace holds collectives and all-to-alls, not the MoE layer")
        grpc, pb, _ = _grpc()
        gpus = [n for n in self.nodes if n["kind"] == "gpu"]
        # Operations are numbered alike on every rank and upward across drivers (at least the microseconds since the
        # epoch): one that a failed operation left some rank behind in starts clean (RunRequest.run_id). hostd takes
        # an operation's windows by its number mod 3, so a driver's numbers keep that turn (three pairs in turn) and
        # its first is a multiple of 3: windows 1 and 2 (what ReadWindow and the security matrix read).
        self._run_id = _next_run_id(getattr(self, "_run_id", None), time.time_ns() // 1000)
        req = pb.RunRequest(what=what, algo=algo, bytes=int(bytes), dtype=dtype, op=op, root=int(root),
                            seed=int(seed), moe=pb.MoeShape(**(moe or {})), run_id=self._run_id)
        def request(g):
            if inputs is None:
                return req
            r = pb.RunRequest()
            r.CopyFrom(req)
            r.input = inputs[g["gpu"]]
            r.bytes = len(r.input)
            return r

        t0 = time.time_ns()
        with concurrent.futures.ThreadPoolExecutor(len(gpus)) as ex:
            futs = {g["name"]: ex.submit(self.stub(g["name"]).Run, request(g), timeout=timeout) for g in gpus}
            replies, errors = {}, []
            for name, f in futs.items():
                try:
                    replies[name] = f.result()
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:  # the deadline is the caller's: say which
                        errors.append(f"{name}: did not answer within {timeout:g} s (--timeout)")
                    else:
                        errors.append(f"{name}: {e.code().name}: {e.details()}")
        t1 = time.time_ns()
        rows = {n: json.loads(r.row_json) for n, r in replies.items() if r.row_json}
        if trace and rows:
            from . import trace as tr
            tr.append(trace, {g["gpu"]: rows[g["name"]] for g in gpus if g["name"] in rows}, what, algo, dtype,
                      bytes, root, t0, t0, t1)
        errors += [f"{n}: {r.error}" for n, r in replies.items() if not r.ok]
        if not rows:
            raise LiveError("no rank answered: " + "; ".join(errors))
        merged = (_merge_moe if what == "moe" else _merge_collective)(list(rows.values()))
        merged["ok"] = not errors and merged["ok"]
        merged["ranks"] = len(rows)
        merged["driver"] = self.driver
        if inputs is not None:
            merged["outputs"] = {g["gpu"]: replies[g["name"]].output for g in gpus if g["name"] in replies}
        if errors:
            merged["error"] = "; ".join(errors)
        return merged

    def select_links(self, selector):
        """The links a selector names: the sim's (a link id, NODE:NODE[:SUB] for every link between two nodes or one
        sub-link, GPU:planeP for the GPU's whole Y-cable on plane P, GPU:planeP:subS for one sub-link) or NODE:PORT
        (the link on that port of either end)."""
        parts = str(selector).split(":")
        if len(parts) == 2 and parts[1].isdigit():
            node, port = parts
            if not any(n["name"] == node for n in self.nodes):
                raise LiveError(f"link selector '{selector}': unknown node '{node}'")
            for l in self.links:
                if (l["a"] == node and str(l["a_port"]) == port) or (l["b"] == node and str(l["b_port"]) == port):
                    return [l]
            raise LiveError(f"link selector '{selector}': {node} has no link on port {port}")
        try:
            return [self.links[i] for i in _native.resolve_links(self.topo, str(selector))]
        except ValueError as e:  # IfecError names the selector and what is wrong with it
            raise LiveError(f"{e} (or NODE:PORT)")

    def link(self, selector):
        """The one link a selector names (a Y-cable's two sub-links are two links: add :subS)."""
        ls = self.select_links(selector)
        if len(ls) != 1:
            ids = ", ".join(str(l["id"]) for l in ls)
            raise LiveError(f"link selector '{selector}' names {len(ls)} links ({ids}); "
                            "name one (a link id, NODE:PORT or GPU:planeP:subS)")
        return ls[0]

    def set_link(self, selector, up):
        """Takes the links `selector` names down or up at their switch ends (the other ends lose carrier with them);
        returns them."""
        grpc, pb, _ = _grpc()
        ls = self.select_links(selector)
        for i, l in enumerate(ls):
            sw_end = "a" if next(n for n in self.nodes if n["name"] == l["a"])["kind"] == "switch" else "b"
            if l[sw_end] in self.frr:  # FRR has no SetLink: the GPU's end takes the link down
                sw_end = "b" if sw_end == "a" else "a"
            try:
                self.stub(l[sw_end]).SetLink(pb.SetLinkRequest(port=l[sw_end + "_port"], up=up), timeout=5)
            except grpc.RpcError as e:
                ids = ", ".join(str(x["id"]) for x in ls[:i])
                done = f" (link(s) {ids} already {'up' if up else 'down'})" if i else ""
                raise LiveError(f"{l[sw_end]}: {e.code().name}: {e.details()}{done}")
        return ls

    def set_loss(self, switch, probability, port=-1, seed=1):
        """Drops frames `switch` forwards out of `port` (-1: all) with `probability` (no netem here)."""
        grpc, pb, _ = _grpc()
        try:
            self.stub(switch).SetLoss(pb.SetLossRequest(port=port, probability=probability, seed=seed), timeout=5)
        except grpc.RpcError as e:
            raise LiveError(f"{switch}: {e.code().name}: {e.details()}")

    def plane_gbps(self, gpu, dest):
        """FARE's path bandwidth from GPU `gpu` toward GPU `dest` per plane, as that hostd sees it now."""
        _, pb, _ = _grpc()
        r = self.stub(f"gpu{gpu}").FareWeights(pb.FareWeightsRequest(dest_gpu=dest), timeout=5)
        return list(r.plane_gbps)

    def capture(self, selector, file, seconds=5):
        """Captures link `selector` at its `a` end for `seconds` into pcap `file`; returns what it captured."""
        l = self.link(selector)
        pid = self.host_pids[l["a"]]
        cmd = ["nsenter", "-t", str(pid), "-n", "dumpcap", "-q", "-i", f"f{l['a_port']}", "-w", str(file),
               "-a", f"duration:{seconds}"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise LiveError(f"capture on {l['a']}:f{l['a_port']}: {r.stderr.strip()}")
        return f"{l['a']}:f{l['a_port']}"

    def read_window(self, node, window, offset, length):
        """Bytes of window `window` of hostd `node` (what remote stores and atomics left there), at most 1 MiB."""
        grpc, pb, _ = _grpc()
        try:
            return self.stub(node).ReadWindow(pb.ReadWindowRequest(window=window, offset=offset, length=length),
                                              timeout=5).data
        except grpc.RpcError as e:
            raise LiveError(f"{node}: {e.code().name}: {e.details()}")

    def ring(self, node, *args, timeout=60):
        """Runs `ifec-ring NODE ARGS...` (a local program posting through hostd `node`'s descriptor ring); returns
        (exit status, the JSON line it printed or None, stderr)."""
        p = subprocess.run([str(_bin_dir() / "ifec-ring"), node, *map(str, args)], capture_output=True, text=True,
                           timeout=timeout)
        line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
        return p.returncode, json.loads(line) if line.startswith("{") else None, p.stderr.strip()

    def kill(self, node):
        """Kills a daemon (SIGKILL): its interfaces stay up, it just stops answering and forwarding."""
        p = self.procs.get(node)
        if p is None:
            raise LiveError(f"no daemon for node '{node}'")
        if p.poll() is not None:
            raise LiveError(f"{node}: its daemon is not running (it exited with status {p.returncode})")
        if node in self.frr:
            self.frr[node].kill()
            return
        p.kill()
        p.wait(5)

    # ---------------------------------------------------------------------------------------- teardown --

    def down(self):
        for name, p in self.procs.items():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name, p in self.procs.items():
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.procs = {}
        for f in self.frr.values():
            f.stop()
        if self.net is not None:
            self.net.stop()
            self.net = None
        subprocess.run(["ip", "link", "del", MGMT_BRIDGE], capture_output=True)
        _mgmt_forwarding(False)
        self._stubs = {}
        (STATE_DIR / f"fabric-{os.getpid()}.json").unlink(missing_ok=True)

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()


def _sum_lists(rows, key):
    return [sum(r[key][q] for r in rows) for q in range(len(rows[0].get(key, [])))]


def _merge_collective(rows):
    """The ranks' rows of one collective as one: the slowest rank's time, every rank's wrong elements and frames."""
    merged = dict(rows[0])
    merged["time_us"] = max(r["time_us"] for r in rows)
    # The data path: from the last rank's start of it to the last rank's end (one machine, one monotonic clock).
    merged["data_us"] = (max(r["data_end_ns"] for r in rows) - max(r["data_start_ns"] for r in rows)) / 1e3
    merged["wrong"] = sum(r["wrong"] for r in rows)
    for k in ("resent", "resent_bytes", "ifec_retransmissions", "ifec_busy_naks", "ifec_duplicate_results"):
        merged[k] = sum(r.get(k, 0) for r in rows)
    for k in ("host_stall_us", "host_cpu_us"):  # the rank the host held back most, the busiest loop
        merged[k] = max(r.get(k, 0) for r in rows)
    merged["ok"] = all(r["ok"] for r in rows)
    merged["faults"] = sorted({f for r in rows for f in r.get("faults", [])})
    merged["plane_tx_bytes"] = _sum_lists(rows, "plane_tx_bytes")
    for k in ("gpu_link_ids", "gpu_link_up_bytes", "gpu_link_down_bytes"):  # each rank's own links, in rank order
        merged[k] = [v for r in rows for v in r.get(k, [])]
    from .replay import merged_turns
    merged["turns"] = merged_turns([r.get("turns") or {} for r in rows])  # where the fabric started, every rank's
    if merged["time_us"] > 0:
        merged["algbw_gbs"] = merged["size"] / (merged["time_us"] * 1e3)
    return merged


def _merge_moe(rows):
    """The ranks' MoE rows as the sim's one row per variant: phases take the slowest rank, bytes add up."""
    merged = dict(rows[0])
    for k in ("dispatch_us", "combine_us", "compute_us", "max_rel_error", "dispatch_host_stall_us",
              "combine_host_stall_us", "dispatch_host_cpu_us", "combine_host_cpu_us"):
        merged[k] = max(r[k] for r in rows)
    merged["total_us"] = merged["dispatch_us"] + merged["compute_us"] + merged["combine_us"]
    for k in ("dispatch_logical_bytes", "combine_logical_bytes", "dispatch_wire_bytes", "combine_wire_bytes",
              "dispatch_resent", "dispatch_resent_bytes", "combine_resent", "combine_resent_bytes",
              "ifec_retransmissions", "ifec_busy_naks", "ifec_duplicate_results", "fallback_chunks", "wrong"):
        merged[k] = sum(r[k] for r in rows)
    for k in ("dispatch_wire_per_plane", "combine_wire_per_plane"):
        merged[k] = _sum_lists(rows, k)
    for phase in ("dispatch", "combine"):  # the data path: the last rank's start of it to the last rank's end
        for end in ("start", "end"):
            merged[f"{phase}_data_{end}_ns"] = max(r[f"{phase}_data_{end}_ns"] for r in rows)
        merged[f"{phase}_data_us"] = (merged[f"{phase}_data_end_ns"] - merged[f"{phase}_data_start_ns"]) / 1e3
    from .replay import merged_turns
    merged["turns"] = merged_turns([r.get("turns") or {} for r in rows])
    ep = merged["ep"]
    for phase in ("dispatch", "combine"):
        us = merged[f"{phase}_us"]
        merged[f"{phase}_gbs"] = merged[f"{phase}_logical_bytes"] / ep / (us * 1e3) if us > 0 else 0.0
    merged["ok"] = all(r["ok"] for r in rows)
    merged["faults"] = sorted({f for r in rows for f in r.get("faults", [])})
    merged.pop("rank", None)
    return merged


MOE_HEADER = (f"#{'variant':<10} {'EP':>3} {'tokens':>6} {'dispatch(us)':>13} {'disp GB/s':>9} {'combine(us)':>12} "
              f"{'comb GB/s':>9} {'experts(us)':>12} {'disp log MB':>11} {'disp wire MB':>12} {'comb log MB':>11} "
              f"{'comb wire MB':>12} {'max err':>9}")


def moe_row_text(r):
    """One merged MoE row as the terminal shows it (the columns of MOE_HEADER)."""
    return (f" {r['variant']:<10} {r['ep']:>3} {r['tokens']:>6} {r['dispatch_us']:>13.1f} {r['dispatch_gbs']:>9.3f} "
            f"{r['combine_us']:>12.1f} {r['combine_gbs']:>9.3f} {r['compute_us']:>12.1f} "
            f"{r['dispatch_logical_bytes'] / 1e6:>11.3f} {r['dispatch_wire_bytes'] / 1e6:>12.3f} "
            f"{r['combine_logical_bytes'] / 1e6:>11.3f} {r['combine_wire_bytes'] / 1e6:>12.3f} "
            f"{r['max_rel_error']:>9.2e}")


def tbf_command(intf, rate_gbps, buffer_bytes):
    """tc pacing a veth at the link's rate (veths have none of their own). The bucket holds 0.5 ms at the rate (at
    least two jumbo frames), so a transfer is paced from its first bytes; the queue holds the topology's egress
    buffer, as the simulator's switches do, so bursts wait rather than drop."""
    bits = rate_gbps * 1e9
    burst = max(2 * 9216 + 1024, int(bits / 8 * 0.0005))
    return (f"tc qdisc replace dev {intf} root tbf rate {int(bits / 1e3)}kbit burst {burst} "
            f"limit {max(int(buffer_bytes), 4 * burst)}")


def parse_size(text):
    """'65536', '64KiB', '1MiB', '2GiB' (or K/M/G) -> bytes; LiveError naming the value otherwise."""
    t = text.strip()
    for suffix, mult in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("K", 1 << 10), ("M", 1 << 20),
                         ("G", 1 << 30), ("B", 1), ("", 1)):
        if t.endswith(suffix) and t[:len(t) - len(suffix)].isascii() and t[:len(t) - len(suffix)].isdigit():
            size = int(t[:len(t) - len(suffix)]) * mult
            if size >= 2**64:  # what a request's field holds (protobuf said only "Value out of range")
                raise LiveError(f"size '{text}' is {size} B: more than a request holds (2^64 - 1 B)")
            return size
    raise LiveError(f"size '{text}' is not a number of bytes (like 65536, 64KiB or 1MiB)")


def _mgmt_forwarding(on):
    """Lets the management bridge forward between its hosts where a firewall would not (dockerd sets the FORWARD
    policy to DROP, and with br_netfilter loaded bridged packets go through it): one ACCEPT rule for the bridge,
    added at bring-up and removed at take-down. Nothing to do without iptables."""
    if not shutil.which("iptables"):
        return
    rule = ["FORWARD", "-i", MGMT_BRIDGE, "-o", MGMT_BRIDGE, "-j", "ACCEPT"]
    present = subprocess.run(["iptables", "-C"] + rule, capture_output=True).returncode == 0
    if on and not present:
        subprocess.run(["iptables", "-I"] + rule, capture_output=True)
    elif not on:
        while subprocess.run(["iptables", "-D"] + rule, capture_output=True).returncode == 0:
            pass


def _sh(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise LiveError(f"{' '.join(cmd)}: {r.stderr.strip() or r.stdout.strip()}")


def _host_sh(host, cmd):
    out = host.cmd(cmd + "; echo __rc=$?")
    rc = out.strip().rsplit("__rc=", 1)[-1]
    if rc != "0":
        raise LiveError(f"{host.name}: {cmd}: {out.rsplit('__rc=', 1)[0].strip()}")


def reap_leftovers():
    """Ends what an earlier fabric started and left behind when its process died without down(): its daemons and
    Mininet hosts by the PIDs it recorded (nothing else), then the management bridge's ports."""
    for f in STATE_DIR.glob("fabric-*.json") if STATE_DIR.exists() else []:
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        started = rec.get("started", {})
        if _alive(rec.get("owner", 0), started.get(str(rec.get("owner")))):
            continue  # its owner still runs: not ours to end
        for pid in list(rec.get("daemons", {}).values()) + list(rec.get("hosts", {}).values()):
            if _alive(pid, started.get(str(pid))):  # only what it started, not a process given its PID since
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        f.unlink(missing_ok=True)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(": ")[1].split("@")[0] if ": " in line else ""
        if name == MGMT_BRIDGE or name.startswith(MGMT_BRIDGE + "-eth"):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
    if not any(_alive(int(f.stem.split("-")[1])) for f in STATE_DIR.glob("fabric-*.json") if f.stem.split("-")[1].isdigit()):
        _mgmt_forwarding(False)


def unavailable():
    """Why the live testbed cannot run here ("" when it can): tests skip with this reason."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veths, raw sockets)"
    try:
        import mininet.net  # noqa: F401
    except ImportError as e:
        return f"Mininet is not installed ({e}); run ./ifec setup"
    try:
        _grpc()
    except LiveError as e:
        return str(e)
    return ""


# ----------------------------------------------------------------------------------------------- command line --
#
# `up` starts a supervisor (this module's `_serve`, in its own session) that holds the Mininet hosts and the
# daemons until `down` sends it SIGTERM; it records itself in STATE_DIR/state.json. The other commands reach the
# daemons over the management bridge from the root namespace.

def _state_file():
    return STATE_DIR / "state.json"


def _read_state():
    try:
        return json.loads(_state_file().read_text())
    except (OSError, ValueError):
        raise LiveError(f"no live testbed is up (no {_state_file()}); ./ifec live up FILE first")


def _started(pid):
    """When process `pid` started (clock ticks since boot, /proc/PID/stat's field 22), or None where none runs."""
    try:
        return int(pathlib.Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid, started=None):
    """Whether `pid` runs and, where its start time was recorded, is still that process: a PID the kernel gave to
    another process since is not signalled (as root, that could be anything). 0 or none is no process (kill(0)
    would ask the whole process group)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return started is None or _started(pid) == started


def _starts(pids):
    """{pid: start time} of the processes named, as records keep them (JSON keys are strings)."""
    return {str(p): _started(p) for p in pids}


def attach():
    """A LiveFabric for the testbed `up` started (control only: no Mininet objects in this process)."""
    st = _read_state()
    if not st.get("ready", True):
        raise LiveError(f"the live testbed is still coming up (supervisor {st['supervisor']}); wait for "
                        "./ifec live up, or ./ifec live down")
    if st.get("topology_sha256") not in (None, _file_sha256(st["topology"])):
        raise LiveError(f"{st['topology']} changed since ./ifec live up (its nodes, addresses and links may no "
                        "longer be the running daemons'); ./ifec live down, then up again")
    fab = _Attached(st["topology"], log_dir=st["log_dir"], insecure=not st.get("tls_dir"), tls_dir=st.get("tls_dir"))
    fab.host_pids = st.get("host_pids", {})
    if st.get("frr"):
        from . import frr
        for name, pathspace in st["frr"].items():
            fab.frr[name] = frr.FrrNode(fab.topo, name, None, fab.log_dir)
            fab.frr[name].pathspace = pathspace
    return fab


def _file_sha256(path):
    import hashlib
    try:
        return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


def _write_state(**state):
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = _state_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(_state_file())


def _serve(topology_file, log_dir, frr=(), insecure=False, fabric_driver="af_packet", ready_timeout=60.0):
    progress_file = pathlib.Path(log_dir) / "progress.log"
    prog = open(progress_file, "a", buffering=1)
    # The handlers only note the stop: the bring-up asks between its steps (an exception raised inside Mininet's
    # shell I/O would leave its teardown unable to run), and a testbed that is up goes down in the loop below.
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    signal.signal(signal.SIGINT, lambda *a: stop.append(1))
    try:
        # The state names this supervisor from the start, so `down` finds a bring-up still under way.
        _write_state(topology=str(topology_file), log_dir=str(log_dir), supervisor=os.getpid(), ready=False,
                     started=_starts([os.getpid()]))
        fab = LiveFabric(topology_file, log_dir=log_dir, frr=frr, insecure=insecure, fabric_driver=fabric_driver,
                         ready_timeout=ready_timeout)
        fab.up(progress=lambda line: prog.write(line + "\n"), should_stop=lambda: bool(stop))
    except Exception as e:
        _state_file().unlink(missing_ok=True)
        prog.write(f"FAILED: {e}\n")
        return 1

    def record():
        _write_state(topology=fab.topology_file, topology_sha256=_file_sha256(fab.topology_file),
                     log_dir=str(fab.log_dir), supervisor=os.getpid(), ready=True,
                     host_pids={n: h.pid for n, h in fab.hosts.items()},
                     frr={n: f.pathspace for n, f in fab.frr.items()},
                     daemon_pids={n: p.pid for n, p in fab.procs.items()},
                     tls_dir=str(fab.tls_dir) if fab.tls_dir else None,
                     started=_starts([os.getpid(), *[p.pid for p in fab.procs.values()]]))
    requests = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:  # whatever happens from here on, the testbed comes down with this process
        _supervisor_socket().unlink(missing_ok=True)
        requests.bind(str(_supervisor_socket()))
        requests.listen(4)
        record()
        prog.write("READY\n")
        while not stop:
            for p in fab.procs.values():
                p.poll()  # reaps a daemon that died: a zombie would still look alive to kill(pid, 0)
            if select.select([requests], [], [], 0.2)[0]:
                _answer(requests, fab, record)
    except Exception as e:
        prog.write(f"FAILED: the supervisor: {e}\n")
        raise
    finally:
        requests.close()
        _supervisor_socket().unlink(missing_ok=True)
        fab.down()
        _state_file().unlink(missing_ok=True)
        prog.write("DOWN\n")
    return 0


# The supervisor's requests (`kill NODE`, `start NODE` from other processes: only it holds the Mininet hosts): one
# JSON line each way on a Unix socket beside the state file.

def _supervisor_socket():
    return STATE_DIR / "supervisor.sock"


def _answer(requests, fab, record):
    conn, _ = requests.accept()
    with conn:
        conn.settimeout(5)
        try:
            req = json.loads(conn.makefile().readline() or "{}")
            if not (isinstance(req, dict) and req.get("op") in ("kill", "start") and isinstance(req.get("node"), str)):
                raise LiveError(f"the supervisor does not know the request {str(req)[:200]!r}")
            getattr(fab, req["op"])(req["node"])
            record()
            reply = dict(ok=True, pid=fab.procs[req["node"]].pid)
        except Exception as e:  # a bad request or a failed kill/start is answered; the supervisor serves on
            reply = dict(ok=False, error=f"{e}" if isinstance(e, LiveError) else f"{type(e).__name__}: {e}")
        try:
            conn.sendall((json.dumps(reply) + "\n").encode())
        except OSError:
            pass  # the asking process went away; the change stands and the state says so


def _ask_supervisor(op, node, timeout=30):
    st = _read_state()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(str(_supervisor_socket()))
            s.sendall((json.dumps(dict(op=op, node=node)) + "\n").encode())
            line = s.makefile().readline()
        except OSError as e:
            raise LiveError(f"the supervisor (pid {st['supervisor']}) did not answer on {_supervisor_socket()}: {e}")
    reply = json.loads(line) if line else dict(ok=False, error="the supervisor closed the request unanswered")
    if not reply["ok"]:
        raise LiveError(reply["error"])
    return reply["pid"]


class _Attached(LiveFabric):
    """The testbed `up` started, from another process: control over gRPC; daemons killed and started by the
    supervisor, which holds the hosts."""

    def kill(self, node):
        return _ask_supervisor("kill", node)

    def start(self, node):
        return _ask_supervisor("start", node)


def _frr_nodes(flags, topo, topo_file, log_dir):
    """The nodes every --frr flag names (NODE[,NODE...], repeatable), each once, in order; LiveError naming a node the
    topology lacks, an empty name, or a log folder FRR cannot take (its `log file` line ends at a space)."""
    nodes = list(dict.fromkeys(n for flag in flags for n in flag.split(",")))
    if not nodes:
        return []
    if "" in nodes:
        raise LiveError(f"--frr {','.join(flags)!r}: an empty node name")
    from . import frr
    if why := frr.unavailable():
        raise LiveError(f"--frr {','.join(nodes)}: {why}")
    for name in nodes:
        if not any(n["name"] == name for n in topo.nodes):
            raise LiveError(f"--frr {','.join(nodes)}: no node '{name}' in {topo_file}")
    if any(c.isspace() for c in str(log_dir)):
        raise LiveError(f"--logs {str(log_dir)!r}: FRR's log file line cannot hold a space (--frr)")
    return nodes


def _cmd_up(args):
    st = json.loads(_state_file().read_text()) if _state_file().exists() else {}
    if _alive(st.get("supervisor", 0), st.get("started", {}).get(str(st.get("supervisor")))):
        raise LiveError(f"a live testbed is already up ({_state_file()}); ./ifec live down first")
    if why := unavailable():
        raise LiveError(why)
    if not args.timeout > 0:
        raise LiveError(f"--timeout {args.timeout}: expected a positive number of seconds")
    topo_file = pathlib.Path(args.file).resolve()
    topo = _native.load_topology(str(topo_file))  # a bad file is named here, not in the supervisor's log
    if any(n["kind"] == "gpu" and n["plane"] >= 0 for n in topo.nodes):
        raise LiveError(f"{topo_file}: its GPUs sit on one plane each (in-node NVLink forwarding): the live "
                        "testbed gives every GPU a port on every plane; run it on the simulator (./ifec sim --traffic)")
    log_dir = pathlib.Path(args.logs or "/tmp/ifec-live")
    frr_nodes = _frr_nodes(args.frr, topo, topo_file, log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    progress = log_dir / "progress.log"
    progress.write_text("")
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).parent.parent))
    sup = subprocess.Popen([sys.executable, "-m", "ifec.live", "_serve", str(topo_file), str(log_dir),
                            "--frr", ",".join(frr_nodes), "--fabric-driver", args.fabric_driver,
                            "--ready-timeout", str(args.timeout + 10),  # this wait, which takes it down, ends first
                            *(["--insecure"] if args.insecure else [])],
                           start_new_session=True, stdout=open(log_dir / "supervisor.log", "w"),
                           stderr=subprocess.STDOUT, env=env)
    shown, t0 = 0, time.time()
    while True:
        lines = progress.read_text().splitlines()
        for line in lines[shown:]:
            if line not in ("READY", "DOWN") and not line.startswith("FAILED"):
                print(line, flush=True)
        shown = len(lines)
        if "READY" in lines:
            st = _read_state()
            print(f"live: up ({time.time() - t0:.1f} s); daemons' logs in {st['log_dir']}; "
                  f"./ifec live status | run | fail | restore | capture | down")
            return 0
        failed = [l[len("FAILED: "):] for l in lines if l.startswith("FAILED")]
        if failed or sup.poll() is not None:
            why = failed[0] if failed else f"the supervisor exited with status {sup.poll()}"
            raise LiveError(f"bring-up failed: {why} (logs: {log_dir}/supervisor.log, {log_dir}/NODE.log)")
        if time.time() - t0 > args.timeout:
            sup.terminate()  # the supervisor unwinds the bring-up and takes down what it made
            try:
                sup.wait(timeout=120)
            except subprocess.TimeoutExpired:
                raise LiveError(f"not up after {args.timeout:g} s, and its supervisor (pid {sup.pid}) did not stop "
                                "within 120 s; ./ifec live down")
            raise LiveError(f"not up after {args.timeout:g} s (taken down again; logs in {log_dir})")
        time.sleep(0.2)


def _cmd_down(args):
    try:
        st = _read_state()
    except LiveError:
        print("live: nothing is up")
        return 0
    pid = st["supervisor"]
    started = st.get("started", {})
    if _alive(pid, started.get(str(pid))):
        os.kill(pid, signal.SIGTERM)  # a bring-up under way unwinds; a testbed that is up goes down
        t0 = time.time()
        while _alive(pid, started.get(str(pid))) and time.time() - t0 < 120:
            time.sleep(0.1)
        if _alive(pid, started.get(str(pid))):
            raise LiveError(f"the supervisor (pid {pid}) is still taking the testbed down after 120 s")
    leftovers = [n for n, p in st.get("daemon_pids", {}).items() if _alive(p, started.get(str(p)))]
    _state_file().unlink(missing_ok=True)
    _supervisor_socket().unlink(missing_ok=True)
    if leftovers:
        raise LiveError(f"daemons still running after down: {', '.join(leftovers)}")
    print("live: down (no hosts, links, bridge or daemons left)")
    return 0


def _cmd_status(args):
    """Every daemon's line; exit 1 when one is down or not ready (a script's `status && run` waits for a fabric)."""
    fab = args.attach()
    statuses = fab.status(timeout=3)
    for name, s in statuses.items():
        if "error" in s:
            print(f"{name:<10} DOWN  {s['error']}")
            continue
        if s.get("driver") == "frr":
            est = sum(1 for st in s["sessions"].values() if st == "Established")
            print(f"{name:<10} {'ready' if s.get('ready') else 'not ready':<9} FRR: {est} of {len(s['sessions'])} "
                  f"BGP sessions Established")
            continue
        ports = s.get("ports", [])
        up = sum(1 for p in ports if p.get("carrier"))
        heard = sum(1 for p in ports if p.get("fare_heard"))
        print(f"{name:<10} {'ready' if s.get('ready') else 'not ready':<9} ports {up}/{len(ports)} up, "
              f"BGP up on {heard}, {int(s.get('fare_changes', 0))} FARE changes, up "
              f"{int(s.get('uptime_ns', 0)) / 1e9:.1f} s")
    down = [n for n, s in statuses.items() if "error" in s or not s.get("ready")]
    if down:
        print(f"# {len(down)} of {len(statuses)} daemons down or not ready: {', '.join(down)}")
        return 1
    return 0


def _cmd_run_moe(fab, args):
    variants = ["per_expert", "per_rank", "ifec"] if args.algo == "all" else args.algo.split(",")
    shape = dict(tokens=args.tokens, hidden=args.hidden, inter=args.inter, experts=args.experts, topk=args.topk)
    print(f"# MoE layer on {fab.topo.name} [driver: {fab.driver}; dispatch/combine wall clock through software switches; "
          f"experts measured on the hosts' CPUs (LibTorch), not modelled]")
    print(f"# DeepSeek-V3 routing: top-{args.topk} of {args.experts} experts in 8 groups (4 used), hidden "
          f"{args.hidden}, expert width {args.inter}, {args.dtype or 'bf16'} rows; each rank checks its outputs against the "
          f"single-process reference")
    print(MOE_HEADER)
    status = 0
    for v in variants:
        row = fab.run("moe", algo=v, dtype=args.dtype or "bf16", seed=args.seed, moe=shape,
                      timeout=run_timeout(args.timeout, "moe"))
        print(moe_row_text(row))
        for f in row["faults"]:
            print(f"#   {v} fault: {f}")
        if not row["ok"]:
            print(f"#   FAILED: {row.get('error')}")
            status = 1
    return status


def _check_trace_folder(path):
    """A trace folder is made (or found) and writable before the first operation runs, not after it."""
    from . import trace
    try:
        pathlib.Path(path).mkdir(parents=True, exist_ok=True)
        trace.last_end_ns(path)
        probe = pathlib.Path(path) / ".ifec-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise LiveError(f"--trace {path}: {e.strerror or e}") from None


def _cmd_run(args):
    fab = args.attach()
    if args.collective == "moe":
        if args.trace:
            raise LiveError("--trace: a trace holds collectives and all-to-alls, not the MoE layer")
        return _cmd_run_moe(fab, args)
    sizes = [parse_size(s) for s in args.bytes.split(",")]
    if args.trace is not None:
        if not args.trace:
            raise LiveError("--trace '': expected a folder")
        _check_trace_folder(args.trace)
    status = 0
    print(f"# {args.collective} on {fab.topo.name} [driver: {fab.driver}; times are wall clock through software switches]")
    print(f"#{'size(B)':>13} {'algo':>8} {'time(us)':>11} {'algbw GB/s':>11} {'#wrong':>7}  faults")
    for size in sizes:
        row = fab.run(args.collective, algo=args.algo, bytes=size, dtype=args.dtype or "fp32", op=args.op, root=args.root,
                      seed=args.seed, trace=args.trace, timeout=run_timeout(args.timeout, args.collective))
        print(f" {size:>13} {row['ran']:>8} {row['time_us']:>11.1f} {row.get('algbw_gbs', 0):>11.3f} "
              f"{row['wrong']:>7}  {'; '.join(row['faults'])}")
        if not row["ok"]:
            print(f"#   FAILED: {row.get('error')}")
            status = 1
    return status


# The live MoE layer's shape (hostd's defaults, small enough for its CPU experts), the same on the simulated side.
MOE_COMPARE_SHAPE = dict(hidden=512, inter=16, experts=32, topk=8)


def compare(fab, what="allreduce", algo="ifec", bytes=1 << 20, seed=1, timeout=None):
    """The same measurement on the simulator (this topology, its link rates) and on the live fabric: (sim, live).
    what "moe": one MoE layer in variant `algo` on every GPU, `bytes` tokens per rank (MOE_COMPARE_SHAPE, bf16): the
    same tokens, routing and weights on both sides. `timeout`: seconds the live run may take (None: RUN_TIMEOUT_S,
    MOE_TIMEOUT_S for moe)."""
    from . import collectives
    timeout = run_timeout(timeout, what)
    if what == "moe":
        return _compare_moe(fab, algo, int(bytes), seed, timeout)
    lv = fab.run(what, algo=algo, bytes=int(bytes), seed=seed, timeout=timeout)
    # The simulated fabric starts where the live one did (each GPU's stripe rotor, the group counter): the same
    # frames take the same sub-links.
    sim = collectives.measure(fab.topo, kind=what, algo=algo, bytes=int(bytes), seed=seed, live_timing=True,
                              turns=lv.get("turns"))
    return sim, lv


def _compare_moe(fab, variant, tokens, seed, timeout):
    from . import moe
    lv = fab.run("moe", algo=variant, dtype="bf16", seed=seed, moe=dict(MOE_COMPARE_SHAPE, tokens=tokens),
                 timeout=timeout)
    shape = MOE_COMPARE_SHAPE
    sim = moe.measure(fab.topo, fab.topo.num_gpus, tokens, variants=[variant], mode="normal",
                      hidden=shape["hidden"], experts=shape["experts"], topk=shape["topk"], inter=shape["inter"],
                      run_inter=shape["inter"], bf16=True, compute=True, seed=seed, live_timing=True,
                      turns=lv.get("turns"))[0]
    return sim, lv


def moe_deviations(sim, lv):
    """Per phase (dispatch, combine): (live/sim data-path time, the largest relative difference of live from sim
    bytes the GPUs sent on a plane)."""
    out = {}
    for ph in ("dispatch", "combine"):
        planes = max((abs(l / s - 1) for l, s in zip(lv[f"{ph}_wire_per_plane"], sim[f"{ph}_wire_per_plane"]) if s),
                     default=0.0)
        out[ph] = (lv[f"{ph}_data_us"] / max(sim[f"{ph}_data_us"], 1e-9), planes)
    return out


def first_sent_ratio(sim, lv, phase):
    """Live over sim bytes a phase put on the wire the first time: its wire bytes less the packets sent again (RC
    retransmissions, ECH resends), which a wall-clock run may take where the simulator takes none."""
    def first(row):
        return row[f"{phase}_wire_bytes"] - row.get(f"{phase}_resent_bytes", 0)
    return first(lv) / max(first(sim), 1)


def host_stalled(lv):
    """Whether the host stalled a live MoE step's data path: a rank's event loop ran a timer 20 ms or more late in a
    phase (`*_host_stall_us`: its latest). Measured on a two-core virtual machine, those loops had used little CPU
    (`*_host_cpu_us`, reported beside): the daemons were not run, all of them at once. Such a run's time measured
    the host, not the fabric."""
    return any(lv.get(f"{ph}_host_stall_us", 0) >= 20e3 for ph in ("dispatch", "combine"))


MOE_COMPARE_HEADER = (f"#{'tokens':>7} {'variant':>10} {'phase':>8} {'sim us':>10} {'live us':>10} {'live/sim':>9} "
                      f"{'planes dev':>10} {'bytes l/s':>9} {'resent l/s':>10} {'stall ms':>8}  "
                      f"within 3% bytes / 10% time")


def moe_compare_text(tokens, sim, lv):
    """Two compare rows (dispatch, combine) of one MoE variant: data-path times (an in-fabric phase's plan apart),
    the largest deviation of the bytes the GPUs sent per plane, live over sim bytes sent the first time, and the
    packets sent again (live, sim)."""
    lines = []
    for ph, (ratio, planes) in moe_deviations(sim, lv).items():
        verdict = [w for w, bad in (("planes", planes > BYTES_TOLERANCE), ("time", abs(ratio - 1) > TIME_TOLERANCE))
                   if bad]
        resent = f"{lv.get(f'{ph}_resent', 0)}/{sim.get(f'{ph}_resent', 0)}"
        stall = lv.get(f"{ph}_host_stall_us", 0) / 1e3
        lines.append(f" {tokens:>7} {sim['variant']:>10} {ph:>8} {sim[f'{ph}_data_us']:>10.1f} "
                     f"{lv[f'{ph}_data_us']:>10.1f} {ratio:>9.3f} {planes:>10.2%} "
                     f"{first_sent_ratio(sim, lv, ph):>9.4f} {resent:>10} {stall:>8.1f}  "
                     f"{'within' if not verdict else 'outside: ' + ', '.join(verdict)}")
    return "\n".join(lines)


def link_deviation(sim, lv, cables=None):
    """The largest relative difference of live from sim bytes over every GPU link and direction: each sub-link, or
    with `cables` (the topology's links, as `Topology.links`) each cable the topology file lists (a Y-cable's
    sub-links together)."""
    def per_link(row):
        out = {}
        for k, up, down in zip(row["gpu_link_ids"], row["gpu_link_up_bytes"], row["gpu_link_down_bytes"]):
            key = k if cables is None else (cables[k]["a"], cables[k]["b"], cables[k]["cable"])
            u, d = out.get(key, (0, 0))
            out[key] = (u + up, d + down)
        return out
    s, l = per_link(sim), per_link(lv)
    return max((abs(a - b) / b for k in s if k in l for a, b in zip(l[k], s[k]) if b), default=0.0)


def plane_deviation(sim, lv):
    """The largest relative difference of live from sim bytes the GPUs sent on a plane."""
    return max((abs(l / s - 1) for l, s in zip(lv["plane_tx_bytes"], sim["plane_tx_bytes"]) if s), default=0.0)


# Issue 34's cross-validation tolerances on a paced topology: bytes per link, data-path time.
BYTES_TOLERANCE = 0.03
TIME_TOLERANCE = 0.10

COMPARE_HEADER = (f"#{'size(B)':>12} {'algo':>6} {'sim us':>10} {'live us':>10} {'live/sim':>9} {'setup us':>11} "
                  f"{'planes dev':>10} {'links dev':>10} {'sub-links':>10} {'resent l/s':>10} {'stall ms':>8}  "
                  f"within 3% bytes / 10% time")


def compare_text(size, sim, lv, cables):
    """One compare row: the data-path times (from the last rank's start of the data path to the last rank's end: an
    in-fabric plan's control plane and the ranks' arrival skew apart), live's setup time (the slowest rank's time
    less the data path), the bytes' largest deviations (per plane, per link of the topology file: `cables`, and per
    sub-link), and whether they are within the tolerances. A switch spreads the frames it forwards over a Y-cable's
    sub-links by its own rotation, whose state at the operation's start the live run does not report: a sub-link
    may carry one frame more or less than simulated (4% of a 256 KiB ring's). Then the packets sent again (live,
    sim) and how late the host ran a rank's loop at worst (stall ms)."""
    ratio = lv["data_us"] / max(sim["data_us"], 1e-9)
    planes, links, subs = plane_deviation(sim, lv), link_deviation(sim, lv, cables), link_deviation(sim, lv)
    verdict = [w for w, bad in (("links", links > BYTES_TOLERANCE), ("planes", planes > BYTES_TOLERANCE),
                                ("time", abs(ratio - 1) > TIME_TOLERANCE)) if bad]
    ran = sim["algo"] if sim["collective"] == "alltoall" else lv["ran"]
    resent = f"{lv.get('resent', 0)}/{sim.get('resent', 0)}"
    stall = lv.get("host_stall_us", 0) / 1e3
    return (f" {size:>12} {ran:>6} {sim['data_us']:>10.1f} {lv['data_us']:>10.1f} {ratio:>9.3f} "
            f"{lv['time_us'] - lv['data_us']:>11.1f} {planes:>10.2%} {links:>10.2%} {subs:>10.2%} {resent:>10} "
            f"{stall:>8.1f}  {'within' if not verdict else 'outside: ' + ', '.join(verdict)}")


def _cmd_compare(args):
    moe = args.collective == "moe"
    sizes = [parse_size(s) for s in (args.bytes or ("32" if moe else "1048576")).split(",")]
    if moe and not all(1 <= s <= 65536 for s in sizes):
        raise LiveError(f"--bytes {args.bytes}: tokens per rank for moe, 1..65536 each (hostd's limit)")
    fab = args.attach()
    print(f"# {args.collective} on {fab.topo.name}: sim (simulated time at the topology's link rates, the live "
          f"daemons' timers, started from the live run's turns) vs live (wall clock through software switches on "
          f"veths); times are the data path (the control plane's part apart)")
    print(MOE_COMPARE_HEADER if moe else COMPARE_HEADER)
    status = 0
    for size in sizes:
        sim, lv = compare(fab, args.collective, args.algo, size, args.seed, args.timeout)
        print(moe_compare_text(size, sim, lv) if moe else compare_text(size, sim, lv, fab.topo.links))
        if not (sim["ok"] and lv["ok"]):
            print(f"#   FAILED: sim {sim.get('error')}; live {lv.get('error')}")
            status = 1
    return status


def _link_text(l):
    return f"link {l['id']} ({l['a']}:{l['a_port']} - {l['b']}:{l['b_port']}, plane {l['plane']})"


def _cmd_link(args, up):
    fab = args.attach()
    for l in fab.set_link(args.link, up):
        print(f"live: {_link_text(l)} {'up' if up else 'down'}")
    return 0


def _bounded_int(text, what, lo, hi=None):
    """int(text) within lo..hi, or LiveError naming `what` and the text."""
    try:
        v = int(text)
    except (TypeError, ValueError):
        raise LiveError(f"{what}: expected a whole number, got {text!r}")
    if v < lo or (hi is not None and v > hi):
        raise LiveError(f"{what}: {v} outside {lo}..{'' if hi is None else hi}")
    return v


def _positive_float(text, what):
    try:
        v = float(text)
    except (TypeError, ValueError):
        v = float("nan")
    if not v > 0 or v == float("inf"):
        raise LiveError(f"{what}: expected a positive number, got {text!r}")
    return v


def _at_least(lo):
    """An argparse type: a whole number >= lo (protobuf takes 0 for "the default", so 0 must not slip through)."""
    def parse(text):
        try:
            return _bounded_int(text, "", lo)
        except LiveError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= {lo}")
    return parse


def _positive_seconds(text):
    """An argparse type: a positive, finite number of seconds."""
    try:
        return _positive_float(text, "")
    except LiveError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")


def _seconds_at_most(hi):
    """An argparse type: a positive, finite number of seconds, at most `hi`."""
    def parse(text):
        try:
            v = _positive_float(text, "")
        except LiveError:
            v = None
        if v is None or v > hi:
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds up to {hi:g}")
        return v
    return parse


def _cmd_capture(args):
    fab = args.attach()
    where = fab.capture(args.link, args.file, args.seconds)
    print(f"{args.seconds} s of {where} in {args.file}; decode with "
          f"tshark -X lua_script:testbed/wireshark/ech.lua -r {args.file}")
    return 0


def _cmd_ctl(args):
    """A gRPC client for one daemon: counters, groups, routes, FARE weights, link state, events."""
    grpc, pb, _ = _grpc()
    from google.protobuf.json_format import MessageToDict
    fab = args.attach()
    try:
        if args.what == "link":
            if args.arg not in ("up", "down"):
                raise LiveError(f"ctl link {args.target}: expected up or down, got {args.arg!r}")
            for l in fab.set_link(args.target, args.arg == "up"):
                print(f"{_link_text(l)} {args.arg}")
            return 0
        stub = fab.stub(args.target)
        if args.what == "counters":
            if hasattr(stub, "IfecCounters"):
                values = dict(stub.IfecCounters(pb.Empty(), timeout=5).values)
                st = stub.Status(pb.Empty(), timeout=5)
                for p in st.ports:
                    for k, v in p.counters.values.items():
                        values[f"port{p.port}.{k}"] = v
            else:
                values = dict(stub.Counters(pb.Empty(), timeout=5).values)
            for k in sorted(values):
                print(f"{k:<40} {values[k]}")
        elif args.what == "groups":
            if not hasattr(stub, "Groups"):
                raise LiveError(f"ctl groups {args.target}: only switches hold in-fabric groups")
            for g in stub.Groups(pb.Empty(), timeout=5).groups:
                print(f"job {g.job} group {g.group}: op {g.op} dtype {g.dtype} {len(g.members)} members, "
                      f"{g.slots} slots, window {g.window}" + (f", upstream {g.upstream_ip:#x}" if g.upstream_ip else ""))
        elif args.what == "routes":
            print(bgp_rib_text(stub.BgpRib(pb.Empty(), timeout=5)))
            if hasattr(stub, "IfecCounters"):
                print("forwarding table (FARE's WECMP groups, installed):")
                for r in stub.Routes(pb.Empty(), timeout=5).routes:
                    ip = ".".join(str((r.dst_ip >> s) & 255) for s in (24, 16, 8, 0))
                    print(f"  {ip:<16} " + ", ".join(f"port {w.port} {w.gbps:g} Gb/s" for w in r.group))
        elif args.what == "weights":
            dest = _bounded_int(args.arg, f"ctl weights {args.target}: the destination GPU", 0, fab.topo.num_gpus - 1)
            r = stub.FareWeights(pb.FareWeightsRequest(dest_gpu=dest), timeout=5)
            print(", ".join(f"port {w.port}: {w.gbps:g} Gb/s" for w in r.weights) or "no route")
            if r.plane_gbps:
                print("per plane: " + ", ".join(f"plane {i}: {g:g} Gb/s" for i, g in enumerate(r.plane_gbps)))
        elif args.what == "events":
            seconds = _positive_float(args.arg or "1", f"ctl events {args.target}: seconds")
            for e in stub.Events(pb.EventsRequest(since_uptime_ns=0), timeout=seconds):
                print(f"{e.uptime_ns / 1e9:10.3f} s  {e.node:<8} {e.kind:<10} {e.detail}")
        elif args.what == "status":
            print(json.dumps(MessageToDict(stub.Status(pb.Empty(), timeout=5), preserving_proto_field_name=True),
                             indent=1))
    except grpc.RpcError as e:
        if args.what == "events" and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return 0  # events stream until the given seconds pass
        raise LiveError(f"{args.target}: {e.code().name}: {e.details()}")
    return 0


def bgp_rib_text(rib):
    """`ctl routes`: a node's BGP sessions, then its RIB (every route received, FARE's selection and weights)."""
    lines = [f"BGP: AS {rib.local_as}, router id {rib.router_id}; sessions (one per link):"]
    for s in rib.sessions:
        lines.append(f"  port {s.port:<3} {s.peer:<10} AS {s.peer_as:<11} {s.state:<12}"
                     + (f" hold {s.hold_time_s} s" if s.state == "Established" else
                        f" ({s.connect_retries} retries)" if s.connect_retries else ""))
    lines.append("RIB: prefix, from (port, peer), BGP next hop, AS_PATH, path bandwidth; * FARE's next hop with its "
                 "weight")
    for r in sorted(rib.routes, key=lambda r: (tuple(int(x) for x in r.prefix.split("/")[0].split(".")), r.port)):
        bw = f"{r.path_gbps:g} Gb/s" if r.path_gbps >= 0 else "no bandwidth"
        sel = f"* {r.weight_gbps:g} Gb/s" if r.selected else ""
        lines.append(f"  {r.prefix:<18} port {r.port:<3} {r.peer:<10} via {r.next_hop:<15} "
                     f"{' '.join(map(str, r.as_path)):<24} "
                     f"{bw:<14} {sel}")
    return "\n".join(lines)


def add_fabric_commands(sub, driver="live"):
    """The commands every running fabric answers (Mininet's or containers'): status, run, compare, fail, restore,
    capture, ctl. Each handler takes the parsed args, whose `attach` gives the fabric."""
    sub.add_parser("status", help="every daemon: ready, ports, FARE (exit 1 when one is down or not ready)")
    run = sub.add_parser("run", help=f"run a collective on every rank (the rows of ifec sim, driver {driver})")
    run.add_argument("collective", choices=["allreduce", "reduce", "multicast", "barrier", "reduce-scatter",
                                            "all-gather", "alltoall", "moe"])
    run.add_argument("--algo", default="ifec", help="the algorithm; moe: per_expert|per_rank|ifec[,...] or all")
    run.add_argument("--bytes", default="1048576", help="SIZE[,SIZE...] in bytes")
    run.add_argument("--dtype", help="fp32|bf16|fp16|int32 (default fp32; moe: bf16)")
    run.add_argument("--op", default="sum")
    run.add_argument("--root", type=_at_least(0), default=0)
    run.add_argument("--seed", type=_at_least(1), default=1)
    run.add_argument("--trace", help="a folder: each rank's part of every operation as JSON lines (./ifec sim --replay)")
    timeout_help = (f"seconds each operation may take on every rank before it fails, up to {MAX_TIMEOUT_S:g} "
                    f"(default: {RUN_TIMEOUT_S:g} s, {MOE_TIMEOUT_S:g} s for moe)")
    run.add_argument("--timeout", type=_seconds_at_most(MAX_TIMEOUT_S), metavar="SECONDS", help=timeout_help)
    for flag, default in (("--tokens", 32), ("--hidden", 512), ("--inter", 16), ("--experts", 32), ("--topk", 8)):
        run.add_argument(flag, type=_at_least(1), default=default, help=f"moe: default {default}")
    cmp = sub.add_parser("compare", help="the same collective on the simulator and the live fabric, side by side")
    cmp.add_argument("collective", choices=["allreduce", "reduce", "multicast", "barrier", "alltoall", "moe"],
                     help="alltoall: --bytes per peer, --algo stores")
    cmp.add_argument("--algo", default="ifec")
    cmp.add_argument("--bytes", default=None, help="SIZE[,SIZE...] (default 1048576; moe: tokens per rank, 1..65536, "
                                                 "default 32)")
    cmp.add_argument("--seed", type=_at_least(1), default=1)
    cmp.add_argument("--timeout", type=_seconds_at_most(MAX_TIMEOUT_S), metavar="SECONDS", help=timeout_help)
    for name in ("fail", "restore"):
        s = sub.add_parser(name, help=f"{'take links down' if name == 'fail' else 'bring links back'} "
                                      "(id, NODE:PORT, NODE:NODE[:SUB], GPU:planeP (the Y-cable) or GPU:planeP:subS)")
        s.add_argument("link")
    cap = sub.add_parser("capture", help="capture a link to a pcap")
    cap.add_argument("link")
    cap.add_argument("file")
    cap.add_argument("--seconds", type=_at_least(1), default=5)
    sub.add_parser("kill", help="kill a node's daemon (SIGKILL: its interfaces stay up; its neighbours count it "
                                "gone at once: the kernel closes its BGP sessions)").add_argument("node")
    start = sub.add_parser("start", help="start a killed switch's daemon again and wait until it is ready")
    start.add_argument("node")
    start.add_argument("--timeout", type=_positive_seconds, default=30.0)
    ctl = sub.add_parser("ctl", help="ask one daemon: counters|groups|status NODE, routes NODE (BGP sessions and RIB: "
                                     "prefix, AS_PATH, path bandwidth, FARE's weights), weights GPU DEST, "
                                     "link LINK up|down, events NODE [SECONDS]")
    ctl.add_argument("what", choices=["counters", "groups", "routes", "status", "weights", "link", "events"])
    ctl.add_argument("target", help="a node (p0-sw, gpu3) or, for link, links (gpu5:plane1[:sub0], NODE:PORT, id)")
    ctl.add_argument("arg", nargs="?", help="link: up|down; weights: the destination GPU; events: seconds")
    from . import torchrun
    run_script = torchrun.add_command(sub)
    return {"status": _cmd_status, "run": _cmd_run, "torchrun": run_script, "fail": lambda x: _cmd_link(x, False),
            "restore": lambda x: _cmd_link(x, True), "capture": _cmd_capture, "ctl": _cmd_ctl,
            "compare": _cmd_compare, "kill": lambda x: _cmd_kill(x, driver), "start": lambda x: _cmd_start(x, driver)}


def _cmd_kill(args, driver):
    fab = args.attach()
    fab.node(args.node)
    fab.kill(args.node)
    what = "its container stopped" if "containers" in driver else "its interfaces stay up"
    print(f"{driver}: {args.node} killed; {what}; its BGP sessions closed with it, so its neighbours count it gone "
          f"at once (status shows it DOWN; start brings a switch back)")
    return 0


def _cmd_start(args, driver):
    fab = args.attach()
    if fab.node(args.node)["kind"] == "gpu":
        raise LiveError(f"{args.node}: a GPU's daemon rejoins only with a new bootstrap of every rank (down, then up)")
    fab.start(args.node)
    t0 = time.time()
    while time.time() - t0 < args.timeout:
        if fab.status(timeout=1.0)[args.node].get("ready"):
            print(f"{driver}: {args.node} started, ready after {time.time() - t0:.1f} s")
            return 0
        time.sleep(0.2)
    raise LiveError(f"{args.node}: started, not ready after {args.timeout:g} s (its log: {args.node}.log)")


def main(argv=None):
    p = argparse.ArgumentParser(prog="./ifec live", description="The live testbed: daemons on real interfaces.")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="bring a topology up (Mininet hosts, veths, daemons)")
    up.add_argument("file")
    up.add_argument("--logs", help="daemon logs here (default /tmp/ifec-live)")
    up.add_argument("--timeout", type=float, default=120)
    up.add_argument("--frr", action="append", default=[],
                    help="NODE[,NODE...] (repeatable): these nodes run FRR's zebra and bgpd instead of an "
                         "ifec daemon (a switch's or a GPU's routing stack; ifec.frr)")
    up.add_argument("--insecure", action="store_true",
                    help="plaintext gRPC, no certificates or roles (every daemon says so loudly in its log)")
    up.add_argument("--fabric-driver", choices=FABRIC_DRIVERS, default="af_packet",
                    help="the daemons' fabric sockets: af_packet (default), af_xdp, or auto (AF_XDP where it can)")
    handlers = add_fabric_commands(sub)
    sub.add_parser("down", help="take everything down")
    sub.add_parser("security", help="every kind of caller against a switchd and a hostd: the control plane's "
                                    "security matrix, checked against control.proto's roles table")
    serve = sub.add_parser("_serve")
    serve.add_argument("file")
    serve.add_argument("logs")
    serve.add_argument("--frr", default="")
    serve.add_argument("--insecure", action="store_true")
    serve.add_argument("--fabric-driver", default="af_packet")
    serve.add_argument("--ready-timeout", type=float, default=60.0)
    a = p.parse_args(argv)
    a.attach = attach
    try:
        if a.cmd == "_serve":
            return _serve(a.file, a.logs, [n for n in a.frr.split(",") if n], a.insecure, a.fabric_driver,
                          a.ready_timeout)
        from . import security
        return dict(handlers, up=_cmd_up, down=_cmd_down, security=lambda _: security.main())[a.cmd](a)
    except (LiveError, ValueError) as e:  # ValueError: IfecError from the native side names the bad value
        print(f"live: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `./ifec live ctl counters gpu0 | head`: the reader had enough, as for any Unix tool
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (Python's exit would flush into it again)
        return 141


if __name__ == "__main__":
    sys.exit(main())
