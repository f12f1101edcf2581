"""The `ifec` torch.distributed backend: importing this module registers it, so an unmodified script's
`dist.init_process_group("ifec")` runs its collectives on the live fabric (`./ifec live torchrun` imports it for the
script; docs/torch-backend.md).

Each rank process talks to its own GPU's hostd (Host.Run over gRPC: its tensor's bytes in, its result out); the
process group is C++ (ifec._c10d, a c10d ProcessGroup of PyTorch 1.13). The environment says where and how:

  IFEC_HOSTD    this rank's hostd, host:port (set by torchrun: the GPU's management address, port 50051)
  IFEC_NODE     its node name, for errors (gpu3)
  IFEC_ALGO     reductions: ifec (in-switch, default) | best | ring | tree | rd | oneshot
  IFEC_TIMEOUT  seconds an operation may take before it fails naming hostd (default 120; the group's own timeout
                where that is shorter)
  IFEC_TRACE    a folder: each rank appends its operations to rank<R>.jsonl there (docs/torch-backend.md)
"""
import os
import pathlib
import time

import torch.distributed as dist

ALGOS = ("ifec", "best", "ring", "tree", "rd", "oneshot")
DEFAULT_TIMEOUT_S = 120.0
_first_run_id = None  # the process's first operation number, agreed by every rank through the store
_groups = 0


def _setting(name, default=None):
    value = os.environ.get(name, default)
    if value is None:
        raise RuntimeError(f"ifec: {name} is not set: run the script under ./ifec live torchrun, or set {name} "
                           "(docs/torch-backend.md)")
    return value


def _create(store, rank, size, timeout):
    """torch.distributed's factory for the backend: (prefix store, group rank, group size, timeout) -> group."""
    from . import _c10d
    global _first_run_id, _groups
    hostd = _setting("IFEC_HOSTD")
    algo = _setting("IFEC_ALGO", "ifec")
    if algo not in ALGOS:
        raise RuntimeError(f"ifec: IFEC_ALGO={algo!r} is not one of {', '.join(ALGOS)}")
    try:
        limit = float(_setting("IFEC_TIMEOUT", str(DEFAULT_TIMEOUT_S)))
    except ValueError:
        raise RuntimeError(f"ifec: IFEC_TIMEOUT={os.environ['IFEC_TIMEOUT']!r} is not a number of seconds")
    if limit <= 0:
        raise RuntimeError(f"ifec: IFEC_TIMEOUT={limit:g} s must be > 0")
    if dist.is_initialized():  # a new_group: the fabric's communicator spans every GPU
        world = dist.get_world_size()
        if size != world:
            raise RuntimeError(f"ifec: new_group of {size} of {world} ranks: the fabric's collectives span every "
                               "GPU of the topology; groups of a subset are not supported yet (use every rank, "
                               "or gloo for the subgroup)")
        _groups += 1
        group = f"group{_groups}"
        global_rank = dist.get_rank()
    else:
        if rank == 0:
            store.set("ifec_first_run_id", str(time.time_ns() // 1000))
        _first_run_id = int(store.get("ifec_first_run_id"))
        group, global_rank = "world", rank
    trace = ""
    if os.environ.get("IFEC_TRACE"):
        folder = pathlib.Path(os.environ["IFEC_TRACE"])
        folder.mkdir(parents=True, exist_ok=True)
        trace = str(folder / f"rank{global_rank}.jsonl")
    timeout_s = min(limit, timeout.total_seconds()) if timeout else limit
    return _c10d.create(rank, size, hostd, os.environ.get("IFEC_NODE", hostd), algo, timeout_s, _first_run_id,
                        trace, group)


if "ifec" not in getattr(dist.Backend, "_plugins", {}) and not hasattr(dist.Backend, "IFEC"):
    dist.Backend.register_backend("ifec", _create)
