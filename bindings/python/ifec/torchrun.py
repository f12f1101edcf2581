"""`./ifec live torchrun`: an unmodified PyTorch script on every GPU of the live fabric, torchrun's way.

Rank r runs in GPU r's network namespace (the Mininet host its hostd runs in) with the environment torch.distributed
expects (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR / MASTER_PORT: rank 0's management address,
where its TCPStore listens) and the backend's (IFEC_HOSTD: its hostd; IFEC_TLS: the testbed's certificates; IFEC_ALGO,
IFEC_TRACE, IFEC_TIMEOUT), and
with the `ifec` backend registered before the script starts (`python3 -m ifec.torchrun --rank-entry`), so
`dist.init_process_group("ifec")` needs no import. Output comes back line by line, prefixed by rank; the launcher
exits with the worst rank's status, and once a rank failed, ends the others after a grace period.
"""
import argparse
import ctypes
import os
import pathlib
import runpy
import signal
import subprocess
import sys
import threading
import time

GRACE_S = 15.0  # after a rank failed: the others' own errors (which may name the cause) come first
ALGOS = ("ifec", "best", "ring", "tree", "rd", "oneshot")  # the backend's reductions (IFEC_ALGO)


def _gpus(fab):
    return sorted((n for n in fab.nodes if n["kind"] == "gpu"), key=lambda n: n["gpu"])


def rank_env(fab, rank, nproc, master_addr, master_port=29500, algo="ifec", trace=None, timeout=None):
    """The environment of rank `rank` of `nproc` on fabric `fab` (a LiveFabric, its attached view or a
    ContainerFabric: IFEC_HOSTD is where `fab` itself reaches that GPU's hostd)."""
    me = _gpus(fab)[rank]
    env = dict(os.environ)
    package_root = str(pathlib.Path(__file__).resolve().parent.parent)
    env.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc),
               GROUP_RANK="0", MASTER_ADDR=master_addr, MASTER_PORT=str(master_port),
               IFEC_HOSTD=fab.address(me), IFEC_NODE=me["name"], IFEC_GPU=str(me["gpu"]), IFEC_ALGO=algo,
               OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
               PYTHONPATH=os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p))
    if getattr(fab, "tls_dir", None):  # the rank's certificate (role rank), as every hostd requires one
        env["IFEC_TLS"] = str(fab.tls_dir)
    else:
        env.pop("IFEC_TLS", None)
    env["IFEC_LAUNCHER_PID"] = str(os.getpid())
    if trace:
        env["IFEC_TRACE"] = str(pathlib.Path(trace).resolve())
    if timeout is not None:
        env["IFEC_TIMEOUT"] = str(timeout)
    return env


def launch(fab, script, args=(), nproc=None, algo="ifec", trace=None, timeout=None, master_port=29500,
           out=sys.stdout, grace_s=GRACE_S):
    """Runs `script args` as ranks 0..nproc-1 (default: every GPU) in their GPUs' namespaces; returns the worst
    exit status (0 when every rank succeeded; a rank killed by signal S counts 128 + S)."""
    from .live import LiveError
    gpus = _gpus(fab)
    nproc = len(gpus) if nproc is None else nproc
    if nproc != len(gpus):
        raise LiveError(f"--nproc {nproc}: the fabric has {len(gpus)} GPUs and the backend's collectives span every "
                        f"one of them (--nproc {len(gpus)})")
    if not pathlib.Path(script).is_file():
        raise LiveError(f"{script}: no such script")
    if algo not in ALGOS:  # every rank refused it at init_process_group before
        raise LiveError(f"--algo {algo!r}: expected one of {', '.join(ALGOS)}")
    # Mininet's hosts: each rank in its GPU's namespace, rank 0's TCPStore on its management address. Containers
    # (whose images hold no PyTorch): the ranks run beside them and reach each hostd where it is published.
    from .live import mgmt_ip
    pids = getattr(fab, "host_pids", {}) or {n: h.pid for n, h in getattr(fab, "hosts", {}).items()}
    master = mgmt_ip(gpus[0]["index"]) if pids else "127.0.0.1"
    procs, lock = [], threading.Lock()
    for r, g in enumerate(gpus):
        if pids and g["name"] not in pids:
            raise LiveError(f"{g['name']}: no namespace to run rank {r} in (is the live testbed up?)")
        enter = ["nsenter", f"--net=/proc/{pids[g['name']]}/ns/net", "--"] if pids else []
        cmd = enter + [sys.executable, "-u", "-m", "ifec.torchrun", "--rank-entry", str(script), *args]
        procs.append(subprocess.Popen(cmd, env=rank_env(fab, r, nproc, master, master_port, algo, trace, timeout),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))

    def pump(r, p):
        for line in p.stdout:
            with lock:
                out.write(f"[rank {r}] {line}")
                out.flush()
    threads = [threading.Thread(target=pump, args=(r, p), daemon=True) for r, p in enumerate(procs)]
    for t in threads:
        t.start()
    failed_at = None
    try:
        while any(p.poll() is None for p in procs):
            if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                failed_at = time.time()
            if failed_at is not None and time.time() - failed_at > grace_s:
                with lock:
                    out.write(f"[torchrun] a rank failed {grace_s:g} s ago: ending the ranks still running\n")
                _end(procs)
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        _end(procs)
        raise
    finally:
        for p in procs:
            p.wait()
        for t in threads:
            t.join(timeout=5)
    codes = [128 - p.returncode if p.returncode < 0 else p.returncode for p in procs]
    for r, c in enumerate(codes):
        if c:
            out.write(f"[torchrun] rank {r} ({gpus[r]['name']}) exited {c}\n")
    return max(codes)


def _end(procs):
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, sig)  # its own session: the rank and whatever it started
        t0 = time.time()
        while time.time() - t0 < wait and any(p.poll() is None for p in procs):
            time.sleep(0.1)


def _die_with_launcher():
    """A rank ends when the process that launched it does (a test or ./ifec live torchrun killed by SIGTERM or
    SIGKILL, which has no chance to end its ranks), not orphaned and waiting on its peers."""
    text = (os.environ.get("IFEC_LAUNCHER_PID") or "0").strip()
    if not (text.isascii() and text.isdigit()):
        sys.exit(f"ifec.torchrun: IFEC_LAUNCHER_PID={text!r}: expected the launcher's process id")
    launcher = int(text)
    if launcher:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        if os.getppid() != launcher:  # it went before the call took
            os._exit(128 + int(signal.SIGTERM))


def _rank_entry(argv):
    """In the rank's namespace: register the backend, then run the script as __main__ with its own argv."""
    _die_with_launcher()
    if not pathlib.Path(argv[0]).is_file():
        sys.exit(f"ifec.torchrun: {argv[0]!r}: no such script")
    from . import torch_backend  # noqa: F401  (registers "ifec")
    sys.argv = list(argv)
    sys.path.insert(0, str(pathlib.Path(argv[0]).resolve().parent))
    runpy.run_path(argv[0], run_name="__main__")


def _in_range(kind, lo, hi, what):
    """An argparse type: a `kind` number in lo..hi, refused naming the value (a port of 70000 failed in every rank)."""
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {what}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{text}: expected {what} in {lo:g}..{hi:g}")
        return v
    return parse


def add_command(sub):
    """`torchrun` for a fabric's command set (./ifec live torchrun)."""
    p = sub.add_parser("torchrun", help="run a PyTorch script on every GPU (torch.distributed backend 'ifec'): "
                                        "output prefixed by rank, the worst rank's exit status")
    p.add_argument("--nproc", type=int, help="ranks (default and only: every GPU of the fabric)")
    p.add_argument("--algo", default="ifec", choices=ALGOS, help="reductions (IFEC_ALGO)")
    p.add_argument("--trace", help="a folder: each rank's operations as JSON lines (rank<R>.jsonl)")
    p.add_argument("--timeout", type=_in_range(float, 0.001, 86400, "seconds"),
                   help="seconds an operation may take (IFEC_TIMEOUT, default 120)")
    p.add_argument("--master-port", type=_in_range(int, 1, 65535, "a TCP port"), default=29500,
                   help="rank 0's TCPStore port (default 29500)")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    return _cmd_torchrun


def _cmd_torchrun(args):
    from .live import LiveError, _check_trace_folder
    fab = args.attach()
    if args.trace is not None:  # a trace folder that cannot be written is named before any rank starts
        if not args.trace:
            raise LiveError("--trace '': expected a folder (no trace: leave --trace out)")
        _check_trace_folder(args.trace)
    return launch(fab, args.script, args.args, nproc=args.nproc, algo=args.algo, trace=args.trace,
                  timeout=args.timeout, master_port=args.master_port)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--rank-entry":
        _rank_entry(sys.argv[2:])
    else:
        sys.exit("usage: python3 -m ifec.torchrun --rank-entry SCRIPT [ARGS] (./ifec live torchrun starts it)")
