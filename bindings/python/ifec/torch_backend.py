"""The `ifec` torch.distributed backend: importing this module registers it, so an unmodified script's
`dist.init_process_group("ifec")` runs its collectives on the live fabric (`./ifec live torchrun` imports it for the
script; docs/torch-backend.md).

Each rank process talks to its own GPU's hostd (Host.Run over gRPC: its tensor's bytes in, its result out); the
process group is C++ (ifec._c10d, a c10d ProcessGroup of PyTorch 1.13). The environment says where and how:

  IFEC_HOSTD    this rank's hostd, host:port (set by torchrun: the GPU's management address, port 50051)
  IFEC_NODE     its node name, for errors (gpu3)
  IFEC_GPU      its GPU index (default: the rank), which a group's members tell each other
  IFEC_ALGO     reductions: ifec (in-switch, default) | best | ring | tree | rd | oneshot
  IFEC_TIMEOUT  seconds an operation may take before it fails naming hostd (default 120; the group's own timeout
                where that is shorter)
  IFEC_TRACE    a folder: each rank appends its operations to rank<R>.jsonl there (docs/torch-backend.md)
  IFEC_TLS      the testbed's certificates (set by torchrun): the rank presents DIR/rank.pem, trusting DIR/ca.pem;
                unset, it speaks plaintext (a testbed brought up --insecure)
"""
import math
import os
import pathlib
import time

import torch.distributed as dist

from .torchrun import ALGOS
DEFAULT_TIMEOUT_S = 120.0


def _setting(name, default=None):
    value = os.environ.get(name, default)
    if value is None:
        raise RuntimeError(f"ifec: {name} is not set: run the script under ./ifec live torchrun, or set {name} "
                           "(docs/torch-backend.md)")
    return value


_WORLD_TAG = [None]  # this process's ifec world's first operation number (the same on every rank)


def _group_number(world_tag, count):
    """A new_group's number at the hostds: torch's count of groups, apart from another program's on the same fabric
    (another program's group of the same number and other members was refused by a hostd still holding it) by the
    world's first operation number (microseconds when it started, the same on every rank): tag * 4096 + count,
    consecutive within a program (a hostd takes a group's windows by its number mod 4096, and lets go of the groups
    of another tag, an ended program's, when a group of a new one runs); below 2^31, where a hostd's point-to-point
    channels' numbers start."""
    tag = 1 + (world_tag // 3) % ((1 << 19) - 1)
    return tag * 4096 + count % 4096


def _trace_file(rank):
    """This rank's trace file in IFEC_TRACE ("" when unset), the folder made; RuntimeError naming a folder that cannot
    be."""
    if not os.environ.get("IFEC_TRACE"):
        return ""
    folder = pathlib.Path(os.environ["IFEC_TRACE"])
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = "not a folder" if folder.exists() else e.strerror
        raise RuntimeError(f"ifec: IFEC_TRACE={str(folder)!r}: {why}") from None
    return str(folder / f"rank{rank}.jsonl")


def _timeout_s(group_timeout):
    """Seconds an operation may take: IFEC_TIMEOUT, or the group's own timeout (a timedelta) where that is shorter."""
    try:
        limit = float(_setting("IFEC_TIMEOUT", str(DEFAULT_TIMEOUT_S)))
    except ValueError:
        raise RuntimeError(f"ifec: IFEC_TIMEOUT={os.environ['IFEC_TIMEOUT']!r} is not a number of seconds")
    if not (math.isfinite(limit) and 0.001 <= limit <= 86400):
        raise RuntimeError(f"ifec: IFEC_TIMEOUT={os.environ['IFEC_TIMEOUT']!r} s outside 0.001..86400")
    seconds = min(limit, group_timeout.total_seconds()) if group_timeout else limit
    if not seconds >= 0.001:  # milliseconds at hostd: below one (or negative), every operation failed at once
        raise RuntimeError(f"ifec: the process group's timeout {group_timeout}: expected 1 ms or more")
    return seconds


def _gpu_index(rank):
    """IFEC_GPU (default: the global rank), which a group's members tell each other."""
    gpu = _setting("IFEC_GPU", str(dist.get_rank() if dist.is_initialized() else rank)).strip()
    if not (gpu.isascii() and gpu.isdigit() and int(gpu) < 2**31):  # -1 or 2^40 reached hostd or failed in pybind
        raise RuntimeError(f"ifec: IFEC_GPU={gpu!r} is not a GPU index (0 or more)")
    return int(gpu)


def _create(store, rank, size, timeout):
    """torch.distributed's factory for the backend: (prefix store, group rank, group size, timeout) -> group."""
    from . import _c10d
    hostd = _setting("IFEC_HOSTD")
    if not hostd:
        raise RuntimeError("ifec: IFEC_HOSTD='': expected this rank's hostd as host:port")
    if os.environ.get("IFEC_TLS"):
        from . import pki
        try:
            pki.client_files(os.environ["IFEC_TLS"], "rank")
        except pki.PkiError as e:
            raise RuntimeError(f"ifec: IFEC_TLS={os.environ['IFEC_TLS']}: {e}")
    algo = _setting("IFEC_ALGO", "ifec")
    if algo not in ALGOS:
        raise RuntimeError(f"ifec: IFEC_ALGO={algo!r} is not one of {', '.join(ALGOS)}")
    timeout_s, gpu = _timeout_s(timeout), _gpu_index(rank)
    trace = _trace_file(dist.get_rank() if dist.is_initialized() else rank)
    store.set(f"ifec_gpu_{rank}", str(gpu))  # every rank's GPU: a group's members, the channels' ends
    gpus = [int(store.get(f"ifec_gpu_{r}")) for r in range(size)]
    if dist.is_initialized():  # a new_group: torch numbers every group alike on every rank (members or not)
        if _WORLD_TAG[0] is None:
            raise RuntimeError("ifec: new_group before an ifec world: init_process_group('ifec') makes the world first")
        group, global_rank = _group_number(_WORLD_TAG[0], dist.distributed_c10d._group_count - 1), dist.get_rank()
        members = gpus
        if size < 2:
            raise RuntimeError(f"ifec: new_group of one rank ({global_rank}): a group needs two or more ranks here")
    else:
        group, global_rank, members = 0, rank, []
    if rank == 0:  # the group's operations are numbered from here on every member (RunRequest.run_id)
        # (a multiple of 3: hostd takes an operation's windows by its number mod 3, the first gets the first pair)
        store.set("ifec_first_run_id", str((time.time_ns() // 1000 // 3 + 1) * 3))
    first_run_id = int(store.get("ifec_first_run_id"))
    if not dist.is_initialized():  # the world's: its groups' numbers at the hostds start from it (_group_number)
        _WORLD_TAG[0] = first_run_id
    return _c10d.create(rank, size, hostd, os.environ.get("IFEC_NODE", hostd), algo, timeout_s, first_run_id,
                        trace, group, members, gpus)


if "ifec" not in getattr(dist.Backend, "_plugins", {}) and not hasattr(dist.Backend, "IFEC"):
    dist.Backend.register_backend("ifec", _create)
