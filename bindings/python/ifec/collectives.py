"""Collectives from Python: in-switch (IFEC) or endpoint-based (ring, tree, rd, oneshot, best), on numpy arrays, over
the simulated fabric."""

import json

import numpy as np

from ifec import _args, _native

_DTYPES = {"fp32": np.float32, "fp16": np.float16, "int32": np.int32, "bf16": np.uint16}
BUF, SCRATCH = 1, 2
# Endpoint-based algorithms (best: the one the communicator's cost model picks for the size).
ENDPOINT_ALGOS = ("ring", "tree", "rd", "oneshot", "best")


def to_bf16_bits(a):
    """float32 array -> bfloat16 bit patterns (uint16), rounded to nearest even, as the switch does."""
    u = np.asarray(a, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _as_elements(a, dtype):
    """One GPU's input as `dtype`'s elements; a cast that would change values is refused (floats given for bf16's
    bit patterns, or for int32; integers beyond int32; finite values beyond fp16's or fp32's range, which became
    inf)."""
    a = np.asarray(a)
    target = np.dtype(_DTYPES[dtype])
    if dtype == "bf16" and a.dtype.kind == "f":
        raise ValueError("bf16 inputs are uint16 bit patterns: convert floats with to_bf16_bits(array)")
    if dtype == "int32" and (a.dtype.kind not in "iub" or
                             (a.size and (a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max))):
        raise ValueError(f"int32 inputs: {a.dtype} values that are not all int32 (a cast would change them)")
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is named below, not warned about
        out = np.ascontiguousarray(a, dtype=target).ravel()
    if target.kind == "f" and a.dtype.kind in "fiu" and a.size:
        overflowed = np.isinf(out) & np.isfinite(a.ravel())
        if overflowed.any():
            i = int(np.argmax(overflowed))
            raise ValueError(f"{dtype} inputs: {a.ravel()[i].item()!r} (element {i}) is beyond {dtype}'s range "
                             f"(largest {float(np.finfo(target).max)}): the cast made it inf")
    return out


def allreduce(cluster, arrays, algo="ifec", dtype="fp32", op="sum", engine=None):
    """In-place AllReduce of one array per GPU (GPU i holds arrays[i]); returns (results per GPU, result dict).

    bf16 arrays are passed as their uint16 bit patterns (see to_bf16_bits)."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(_DTYPES)}")
    n = len(arrays)
    if not 2 <= n <= cluster.size:
        raise ValueError(f"{n} arrays: expected one per GPU, 2..{cluster.size}")
    arrays = [_as_elements(a, dtype) for a in arrays]
    count = arrays[0].size
    sizes = sorted({a.size for a in arrays})
    if len(sizes) > 1:
        raise ValueError(f"arrays of different lengths {sizes}: an AllReduce needs the same count on every GPU")
    if count == 0:
        raise ValueError("arrays are empty: nothing to reduce")
    for g, a in enumerate(arrays):
        cluster.write_window(g, BUF, 0, a.tobytes())
    members = list(range(n))
    if algo == "ifec":
        engine = engine or _native.IfecCollectives(cluster)
        res = engine.run("allreduce", members, 0, BUF, 0, count, dtype, op, SCRATCH)
    elif algo in ENDPOINT_ALGOS:
        res = cluster.run_endpoint_collective("allreduce", members, 0, BUF, 0, count, dtype, op, SCRATCH, algo=algo)
    else:
        raise ValueError(f"algo {algo!r}: expected ifec or one of {', '.join(ENDPOINT_ALGOS)}")
    out = [np.frombuffer(cluster.window_bytes(g, BUF, 0, arrays[0].nbytes), dtype=_DTYPES[dtype]) for g in members]
    return out, res


def prepare(cluster, count, dtype="fp32", members=None):
    """Allocates the buffer and scratch windows a collective of `count` elements needs on every GPU (whichever
    algorithm runs: the largest scratch of them all). members: the GPUs taking part (None: every GPU)."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(_DTYPES)}")
    count = _args.whole(count, "count", 0, 2**40)
    members = list(range(cluster.size)) if members is None else list(members)  # [] is refused, not every GPU
    cluster.allocate_window(BUF, max(64, count * np.dtype(_DTYPES[dtype]).itemsize))
    need = max(cluster.scratch_bytes("allreduce", members, count, dtype, algo=a) for a in ENDPOINT_ALGOS)
    cluster.allocate_window(SCRATCH, max(4096, need))


def measure(topology, kind="allreduce", algo="ifec", bytes=None, dtype="fp32", op="sum", loss=0.0, seed=1,
            reproducible=False, members=None, fail=(), slot_pool=8192, slot_budget=128, live_timing=False,
            payload="real", threads=0, root=0, trace=None, turns=None, gpu_groups=0, leaf_groups=0):
    """One nccl-tests-style row (`./ifec sim --collective ... --json`) as a dict; times are simulated.

    bytes: the operation's size (None: 1 MiB; a barrier moves none, and takes only None or 0).

    kind "alltoall": every GPU stores `bytes` to every other GPU (RC WRITEs, one row per peer: what a live hostd's
    all-to-all runs), algo "stores"; the row checks what each GPU received.

    members: GPUs 0..members-1 take part (None: every GPU). fail: link events "SELECTOR@TIME". live_timing: the
    live daemons' millisecond, adaptive retransmission timers (to compare with a live fabric). payload: "real", or
    "elided" (frames of headers and lengths only: the same times and bytes, nothing checked, row["timing_only"]).
    threads: 0 runs one event loop; N >= 1 a partition per plane and one per group of GPUs on N threads (the same
    row for every N, row["partitions"] says which); gpu_groups: how many groups (0: one per thread; the same row for
    every grouping); leaf_groups: K >= 1 partitions each plane's switches further, in K leaf groups (as
    ifec.sim.run's; the same row for every K >= 1, not always the per-plane one's).
    root: reduce's destination, broadcast's source (a member).
    trace: a folder each member's part is appended to (ifec.trace), in simulated time: this operation starts where
    the folder's last one ended.
    turns: the state a fabric carries between operations to start from, {"group": the first member's in-fabric
    group counter, "stripe": each member's endpoint stripe rotor, "multicast": each member's next multicast PSN} (a
    replay passes the traced operation's; a field left out is a fresh fabric's); row["turns"] says where it started.
    The row's "ok" is False whenever any element is wrong ("wrong" > 0) or the run failed ("error"); "faults" lists
    what it met."""
    if kind == "alltoall" and algo not in ("stores", "ifec"):
        raise ValueError(f"alltoall: algo {algo!r}: an all-to-all is point-to-point stores (algo 'stores')")
    w = _args.whole
    if members is not None:
        w(members, "members", 2, 2**20)
    threads = w(threads, "threads", 0, 1024)
    if kind == "barrier" and bytes not in (None, 0):
        raise ValueError(f"bytes={bytes!r}: a barrier moves no data (None or 0)")
    bytes = (0 if kind == "barrier" else 1 << 20) if bytes is None else w(bytes, "bytes", 0 if kind == "barrier" else 1)
    gpu_groups, leaf_groups = w(gpu_groups, "gpu_groups", 0, 64000), w(leaf_groups, "leaf_groups", 0, 4096)
    for name, groups in (("gpu_groups", gpu_groups), ("leaf_groups", leaf_groups)):
        if groups and threads == 0:
            raise ValueError(f"{name} {groups}: needs a partitioned run (threads >= 1)")
    topology = _args.topology(topology, _native.load_topology)
    if trace is not None:  # '' too: refused naming it, not taken for no trace
        from . import trace as tr
        start = tr.last_end_ns(trace)  # a bad folder is named before the operation runs
    row = json.loads(_native.run_collective_json(topology, kind, algo, bytes, dtype, op,
                                                 _args.real(loss, "loss", 0.0, 1.0), w(seed, "seed"),
                                                 _args.flag(reproducible, "reproducible"), w(members or 0, "members"),
                                                 _args.items(fail, "fail"), w(slot_pool, "slot_pool", 0, 2**32 - 1),
                                                 w(slot_budget, "slot_budget", 0, 2**32 - 1),
                                                 _args.flag(live_timing, "live_timing"), _elided(payload), threads,
                                                 w(root, "root", 0, 2**20), _args.turns(turns), gpu_groups,
                                                 leaf_groups))
    if kind == "alltoall":  # the row's point names no collective of its own: every rank stores to every other
        row.update(collective="alltoall", algo="stores")
    if trace is not None:
        tr.append(trace, tr.split_by_gpu(row, topology), kind, algo, dtype, bytes, root, start, start,
                  start + round(row["time_us"] * 1e3))
    return row


def _elided(payload):
    if payload not in ("real", "elided"):
        raise ValueError(f"payload {payload!r}: expected 'real' or 'elided'")
    return payload == "elided"
