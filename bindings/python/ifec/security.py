"""The control plane's security matrix (`./ifec live security`; bindings/tests/test_live_security.py): every kind of
caller against a switchd and a hostd, each call's outcome against what control.proto's roles table says.

Callers: plaintext, TLS without a client certificate, a certificate from another CA, an expired certificate of the
testbed's CA, a certificate naming no role, and each role (viewer, operator, rank of the testbed's job, a rank of
another job, a daemon). Calls: reads (Status, Routes, Counters), the operator's SetLoss and SetLink (harmless: loss
0, a link that is up set up), the daemons' Reserve (an empty reservation: refused by the handler if let through)
and ReadWindow of a window of job 1. Outcomes:
    refused   the TLS handshake failed (UNAVAILABLE): nothing was served
    denied    PERMISSION_DENIED from the role check (or a rank reading another job's window)
    allowed   the handler ran (OK, or its own error about the request)
"""
import datetime
import math
import pathlib
import sys
import tempfile

from . import live, pki

CALLS = (("Switch", "Status"), ("Switch", "Routes"), ("Switch", "SetLoss"), ("Switch", "SetLink"),
         ("Switch", "Reserve"), ("Host", "Status"), ("Host", "Counters"), ("Host", "SetLink"), ("Host", "ReadWindow"))
# The callers every call of theirs should find refused at the handshake (the rest: as the roles table says).
HANDSHAKE_REFUSED = ("plaintext", "no certificate", "another CA", "expired")


def _callers(fab, folder):
    """Certificates of the odd callers, made in `folder` (the testbed's own roles' are in fab.tls_dir)."""
    folder = pathlib.Path(folder)
    pki.make_ca(folder / "other")
    pki.issue(folder, "another-ca", pki.identity("viewer"), ca_folder=folder / "other")
    long_ago = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=40)
    pki.issue(folder, "expired", pki.identity("viewer"), days=1, valid_from=long_ago, ca_folder=fab.tls_dir)
    pki.issue(folder, "no-role", "intruder", ca_folder=fab.tls_dir)
    pki.issue(folder, "rank-job2", pki.identity("rank", 2), ca_folder=fab.tls_dir)
    return {"plaintext": None, "no certificate": (None, None), "another CA": folder / "another-ca",
            "expired": folder / "expired", "no role": folder / "no-role", "viewer": fab.tls_dir / "viewer",
            "operator": fab.tls_dir / "operator", "rank": fab.tls_dir / "rank", "rank of job 2": folder / "rank-job2",
            "daemon": fab.tls_dir / gpu_node(fab)}


def gpu_node(fab):
    return next(n["name"] for n in fab.nodes if n["kind"] == "gpu" and n["name"] not in fab.frr_names)


def _stub(fab, node, cert):
    grpc, _, rpc = live._grpc()
    nd = fab.node(node)
    addr = fab.address(nd)
    if cert is None:
        ch = grpc.insecure_channel(addr)
    else:
        ca = (fab.tls_dir / "ca.pem").read_bytes()
        if cert == (None, None):
            creds = grpc.ssl_channel_credentials(ca)
        else:
            creds = grpc.ssl_channel_credentials(ca, pathlib.Path(f"{cert}.key").read_bytes(),
                                                 pathlib.Path(f"{cert}.pem").read_bytes())
        ch = grpc.secure_channel(addr, creds)
    return (rpc.HostStub if nd["kind"] == "gpu" else rpc.SwitchStub)(ch), ch


def _request(rpc):
    _, pb, _ = live._grpc()
    if rpc == "SetLoss":
        return pb.SetLossRequest(port=0, probability=0.0)
    if rpc == "SetLink":  # port 0's link, which is up: set up again
        return pb.SetLinkRequest(port=0, up=True)
    if rpc == "Reserve":
        return pb.GroupReservation()
    if rpc == "ReadWindow":
        return pb.ReadWindowRequest(window=1, offset=0, length=16)
    return pb.Empty()


def expected(who, service, rpc, table):
    if who in HANDSHAKE_REFUSED:
        return "refused"
    if who == "no role":
        return "denied"
    role = "rank" if who == "rank of job 2" else who
    if role not in table[service][rpc]:
        return "denied"
    return "denied" if who == "rank of job 2" and rpc == "ReadWindow" else "allowed"


def outcome(call):
    """(outcome, detail) of calling `call()`."""
    grpc, _, _ = live._grpc()
    try:
        call()
        return "allowed", "OK"
    except grpc.RpcError as e:
        code, detail = e.code(), (e.details() or "").splitlines()[0][:100]
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return "denied", detail
        if code == grpc.StatusCode.UNAVAILABLE:
            return "refused", detail
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return "no answer", detail
        return "allowed", f"{code.name}: {detail}"


def matrix(fab, progress=print):
    """Every caller x CALLS against the fabric's first switch and first GPU; rows of dict(who, rpc, expect, got,
    detail, ok). Needs a testbed brought up with certificates (fab.tls_dir) and window 1 on the GPU (any operation
    run makes it)."""
    if fab.tls_dir is None:
        raise live.LiveError("the testbed is up --insecure: there is no security matrix to check")
    table = {s: live.rpc_roles(s) for s in ("Switch", "Host")}
    sw = next(n["name"] for n in fab.nodes if n["kind"] == "switch" and n["name"] not in fab.frr_names)
    gpu = gpu_node(fab)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ifec-security-") as tmp:
        for who, cert in _callers(fab, tmp).items():
            stubs = {s: _stub(fab, node, cert) for s, node in (("Switch", sw), ("Host", gpu))}
            for service, rpc in CALLS:
                stub = stubs[service][0]
                req = _request(rpc)
                got, detail = outcome(lambda: getattr(stub, rpc)(req, timeout=5))
                want = expected(who, service, rpc, table)
                rows.append(dict(who=who, rpc=f"{service}.{rpc}", expect=want, got=got, detail=detail,
                                 ok=got == want))
            for _, ch in stubs.values():
                ch.close()
    progress(matrix_text(rows))
    return rows


def matrix_text(rows):
    calls = list(dict.fromkeys(r["rpc"] for r in rows))
    who = list(dict.fromkeys(r["who"] for r in rows))
    cell = {(r["who"], r["rpc"]): r for r in rows}
    width = max(len(c) for c in calls) + 2
    out = ["# the control plane's security matrix: each caller's outcome per rpc (refused: TLS handshake failed; "
           "denied: PERMISSION_DENIED; allowed: served); '!' marks a row the roles table disagrees with",
           f"{'caller':<16}" + "".join(f"{c:>{width}}" for c in calls)]
    for w in who:
        out.append(f"{w:<16}" + "".join(
            f"{cell[(w, c)]['got'] + ('' if cell[(w, c)]['ok'] else '!'):>{width}}" for c in calls))
    bad = [r for r in rows if not r["ok"]]
    out.append(f"# {len(rows) - len(bad)} of {len(rows)} as the table says" +
               "".join(f"\n#   WRONG: {r['who']} {r['rpc']}: expected {r['expect']}, got {r['got']} ({r['detail']})"
                       for r in bad))
    return "\n".join(out)


# ------------------------------------------------------------------------------- frames from another job --
#
# The data plane's boundary: a GPU of another job (or an address that is no GPU) writing into a job's window through
# the fabric. The frames are crafted (ifec._native.rdma_write_frame) and sent from a GPU's own namespace out of its
# fabric interface, so the switches carry them as they carry any frame; the target's responder must NAK them
# (Remote Access Error) and leave its memory alone, or drop them (a source that is no GPU), and count them.

NAK_REMOTE_ACCESS = 0x62  # AETH syndrome: NAK (011) | Remote Access Error (00010)


def inject(host, interface, frames, listen_s=1.0):
    """Sends `frames` (bytes) out of `interface` in Mininet host `host` (its namespace) and returns the RoCEv2
    acknowledgements any interface there receives within `listen_s` (a responder answers on its QP's own port) as
    parse_frame dicts."""
    import json
    import os
    import subprocess
    pkg = str(pathlib.Path(__file__).resolve().parent.parent)
    p = host.popen([sys.executable, "-m", "ifec.security", "_inject", interface, str(listen_s)] +
                   [f.hex() for f in frames], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   env=dict(os.environ, PYTHONPATH=pkg))
    out, err = p.communicate(timeout=30)
    if p.returncode != 0:
        raise live.LiveError(f"inject from {interface}: {err.decode()[-500:]}")
    return json.loads(out)


def _inject_main(interface, listen_s, frames_hex):
    """In the namespace: raw frames out of `interface`, then every acknowledgement heard on any interface for
    listen_s."""
    import json
    import select
    import socket
    import time
    from . import _native
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))  # every interface, every frame
    out = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    out.bind((interface, 0))
    for h in frames_hex:
        out.send(bytes.fromhex(h))
    acks, end = [], time.time() + float(listen_s)
    while (left := end - time.time()) > 0:
        if not select.select([s], [], [], left)[0]:
            break
        frame = s.recv(65536)
        try:
            pf = _native.parse_frame(frame)
        except ValueError:
            continue
        if pf["opcode"] == 17:  # RC Acknowledge: ACK or NAK
            acks.append({k: pf[k] for k in ("dest_qp", "psn", "syndrome", "ip_src", "ip_dst")})
    print(json.dumps(acks))
    return 0


# ---------------------------------------------------------------------------------------------- the soak --
#
# Malformed and random frames at the highest rate one process sends them, into a switchd (from a GPU's namespace,
# out of its fabric interfaces) and straight into a hostd (from the switch's namespace, out of the port facing that
# GPU), while collectives run: every frame dropped or answered, the collectives still correct, the daemons serving.

SOAK_KINDS = ("random", "truncated", "bit-flipped", "valid RoCEv2, random fields")


def soak_frames(src_mac, dst_mac, gpu_ips, count, seed):
    """(kind, frame) pool: random bytes behind an Ethernet header; RoCEv2 WRITEs with random QPs, PSNs, keys,
    addresses and lengths toward the fabric's GPUs (valid ICRC: they reach the transport); and those truncated or
    with bits flipped (their checksums fail)."""
    import random
    from . import _native
    rnd = random.Random(seed)
    eth = dst_mac + src_mac + b"\x08\x00"
    out = []
    for i in range(count):
        valid = _native.rdma_write_frame(
            src_mac, dst_mac, rnd.choice(gpu_ips), rnd.choice(gpu_ips), _native.rc_qpn(rnd.randrange(64), rnd.randrange(4)),
            rnd.randrange(1 << 24), rnd.randrange(1 << 16), rnd.randrange(1 << 64), rnd.randrange(1 << 32),
            rnd.randbytes(rnd.randrange(0, 1025)))
        kind = SOAK_KINDS[i % 4]
        if kind == "random":
            frame = eth + rnd.randbytes(rnd.randrange(46, 1500))
        elif kind == "truncated":
            frame = valid[:rnd.randrange(14, len(valid))]
        elif kind == "bit-flipped":
            b = bytearray(valid)
            for _ in range(rnd.randrange(1, 4)):
                b[rnd.randrange(14, len(b))] ^= 1 << rnd.randrange(8)
            frame = bytes(b)
        else:
            frame = valid
        out.append((kind, frame))
    return out


def _soak_main(config):
    """In a namespace: config = {"ports": [[interface, src_mac_hex, dst_mac_hex], ...], "gpu_ips": [...],
    "seconds": S, "seed": N}; sends the pool round robin over the ports until S seconds pass; prints what it sent."""
    import json
    import socket
    import time
    cfg = json.loads(config)
    socks, pools = [], []
    for i, (ifname, src, dst) in enumerate(cfg["ports"]):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        s.bind((ifname, 0))
        socks.append(s)
        pools.append(soak_frames(bytes.fromhex(src), bytes.fromhex(dst), cfg["gpu_ips"], 2048, cfg["seed"] + i))
    sent = dict.fromkeys(SOAK_KINDS, 0)
    refused = 0  # sends the kernel refused (its queue full): the rate is the machine's
    t0 = time.time()
    end = t0 + cfg["seconds"]
    n = 0
    while time.time() < end:
        for _ in range(256):
            k = n % len(socks)
            kind, frame = pools[k][(n // len(socks)) % len(pools[k])]
            try:
                socks[k].send(frame)
                sent[kind] += 1
            except OSError:
                refused += 1
            n += 1
    print(json.dumps(dict(sent=sent, refused=refused, seconds=time.time() - t0)))
    return 0


def start_soak(fab, host, ports, seconds, seed=1):
    """Starts the soak in Mininet host `host` out of `ports` ([(interface, src_mac, dst_mac)]); returns the
    process (its stdout: what it sent, as JSON)."""
    import json
    import os
    import subprocess
    pkg = str(pathlib.Path(__file__).resolve().parent.parent)
    gpu_ips = [n["loopback"] for n in fab.nodes if n["kind"] == "gpu"]
    cfg = dict(ports=[[i, s.hex(), d.hex()] for i, s, d in ports], gpu_ips=gpu_ips, seconds=seconds, seed=seed)
    return fab.hosts[host].popen([sys.executable, "-m", "ifec.security", "_soak", json.dumps(cfg)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=pkg))


# The private entries inject() and start_soak() run in a namespace: their arguments, as a usage line says them.
_USAGE = {"_inject": "_inject INTERFACE LISTEN_S [FRAME_HEX ...]", "_soak": "_soak CONFIG_JSON"}


def _seconds_ok(value):
    """A finite number of seconds, 0 or more (a string from the command line, or a number from JSON)."""
    if isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value)) and float(value) >= 0
    except (TypeError, ValueError, OverflowError):
        return False


def _hex_ok(text, nbytes=None):
    try:
        b = bytes.fromhex(text)
    except (TypeError, ValueError):
        return False
    return len(b) > 0 if nbytes is None else len(b) == nbytes


def _inject_problem(args):
    """What is missing or bad in _inject's arguments ("" when nothing is)."""
    if len(args) < 2:
        return f"{' and '.join(('INTERFACE', 'LISTEN_S')[len(args):])} missing"
    if not args[0]:
        return "INTERFACE '': expected an interface name"
    if not _seconds_ok(args[1]):
        return f"LISTEN_S {args[1]!r}: expected a finite number of seconds, 0 or more"
    for i, h in enumerate(args[2:], 1):
        if not _hex_ok(h):
            return f"FRAME_HEX {i} {h[:40]!r}: expected a frame's bytes in hex"
    return ""


def _soak_problem(args):
    """What is missing or bad in _soak's configuration ("" when nothing is): what _soak_main reads of it."""
    import json
    if len(args) != 1:
        return "CONFIG_JSON missing" if not args else f"unexpected {' '.join(args[1:])!r}"
    try:
        cfg = json.loads(args[0])
    except ValueError as e:
        return f"CONFIG_JSON: not JSON ({e})"
    if not isinstance(cfg, dict) or not {"ports", "gpu_ips", "seconds", "seed"} <= cfg.keys():
        return "CONFIG_JSON: expected an object with ports, gpu_ips, seconds and seed"
    ports, ips, seed = cfg["ports"], cfg["gpu_ips"], cfg["seed"]
    if not (isinstance(ports, list) and ports and all(
            isinstance(p, list) and len(p) == 3 and isinstance(p[0], str) and p[0] and _hex_ok(p[1], 6)
            and _hex_ok(p[2], 6) for p in ports)):
        return f"ports {ports!r}: expected [[interface, source MAC hex, destination MAC hex], ...], at least one"
    if not (isinstance(ips, list) and ips and all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**32 for x in ips)):
        return f"gpu_ips {ips!r}: expected the GPUs' IPv4 addresses as 32-bit integers, at least one"
    if not _seconds_ok(cfg["seconds"]) or isinstance(cfg["seconds"], str):
        return f"seconds {cfg['seconds']!r}: expected a finite number of seconds, 0 or more"
    if isinstance(seed, bool) or not isinstance(seed, int):
        return f"seed {seed!r}: expected a whole number"
    return ""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in _USAGE:  # checked before any socket: a traceback said less, later
        why = (_inject_problem if argv[0] == "_inject" else _soak_problem)(argv[1:])
        if why:
            print(f"usage: python -m ifec.security {_USAGE[argv[0]]}\n{argv[0]}: {why}", file=sys.stderr)
            return 2
        return _inject_main(argv[1], argv[2], argv[3:]) if argv[0] == "_inject" else _soak_main(argv[1])
    try:
        rows = matrix(live.attach())
    except live.LiveError as e:
        print(f"live security: {e}", file=sys.stderr)
        return 1
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
