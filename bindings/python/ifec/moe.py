"""The DeepSeek-V3 MoE layer over the simulated fabric from Python: one point (EP size, tokens per rank) in each
communication variant ("per_expert", "per_rank", "ifec"), as row dicts.

Dispatch and combine times are simulated; expert compute is modelled from the GPU profile at the real expert
width (2048); with compute=True the experts also run on the CPU (LibTorch, at a small width `run_inter`) and each
row carries the output's max error against the single-process reference.
"""

import json

from ifec import _args, _native

VARIANTS = ("per_expert", "per_rank", "ifec")


def available():
    """True when the native module was built with LibTorch (the MoE layer needs it)."""
    return bool(getattr(_native, "has_moe", False))


def measure(topology, ep, tokens, variants=VARIANTS, mode="scaled", hidden=7168, experts=256, topk=8, inter=2048,
            run_inter=8, bf16=True, compute=False, token_cap=0, seed=1, gpu_profile="", fp8_dispatch=False,
            overlap=False, payload="real", threads=0, live_timing=False, turns=None, gpu_groups=0,
            leaf_groups=0):
    """Runs one point; returns one dict per variant (see `./ifec bench moe` for the columns). The experts' time
    comes from the GPU model: the fitted H100 built in, or the profile file `gpu_profile` (YAML/JSON).
    fp8_dispatch: dispatch rows in FP8 (E4M3 + a scale per 128 channels; hidden a multiple of 128), as DeepEP.
    overlap: also the layer as two overlapped micro-batches: DeepEP's schedule (row key overlap_us) and one half's
    dispatch beside the other's combine on the fabric (overlap2_us); -1 when not run.
    payload: "real", or "elided" (frames of headers and lengths only: the same times and bytes, timing only,
    row["timing_only"]; not with compute=True). threads: 0 runs each variant on one event loop; N >= 1 partitioned
    (a partition per plane and one per group of GPUs: gpu_groups, 0 for one per thread) on N threads, the same rows
    for every N and grouping; leaf_groups: K >= 1 partitions each plane's switches further, in K leaf groups (the
    same rows for every K >= 1). live_timing: the live daemons'
    millisecond, adaptive retransmission timers (to compare with a live fabric). turns: the state the EP ranks start
    from, as collectives.measure takes it (a live row's "turns"); row["turns"] says where each variant started."""
    if not available():
        raise RuntimeError("ifec was built without LibTorch: the MoE layer is not available")
    w, f = _args.whole, _args.flag
    gpu_groups, leaf_groups = w(gpu_groups, "gpu_groups", 0, 64000), w(leaf_groups, "leaf_groups", 0, 4096)
    for name, groups in (("gpu_groups", gpu_groups), ("leaf_groups", leaf_groups)):
        if groups and threads == 0:
            raise ValueError(f"{name} {groups}: needs a partitioned run (threads >= 1)")
    return json.loads(_native.run_moe_json(_args.topology(topology, _native.load_topology), mode, w(ep, "ep", 1),
                                           w(tokens, "tokens", 0), _args.items(variants, "variants"),
                                           w(hidden, "hidden", 1), w(experts, "experts", 1), w(topk, "topk", 1),
                                           w(inter, "inter", 1), w(run_inter, "run_inter", 1), f(bf16, "bf16"),
                                           f(compute, "compute"), w(token_cap, "token_cap", 0, 2**30),
                                           w(seed, "seed"), str(gpu_profile or ""), f(fp8_dispatch, "fp8_dispatch"),
                                           f(overlap, "overlap"), _elided(payload), w(threads, "threads", 0, 1024),
                                           f(live_timing, "live_timing"),
                                           _args.turns(turns), gpu_groups,
                                           leaf_groups))


def _elided(payload):
    if payload not in ("real", "elided"):
        raise ValueError(f"payload {payload!r}: expected 'real' or 'elided'")
    return payload == "elided"


def measure_eps(topology, eps, tokens, variants=VARIANTS, mode="sweep", hidden=7168, experts=256, topk=8, inter=2048,
                seed=1, gpu_profile="", fp8_dispatch=False, jobs=0):
    """Timing-mode points at several EP sizes, run at once on `jobs` threads (0: every core); the rows, in (EP,
    variant) order, are those measure() gives one point at a time."""
    if not available():
        raise RuntimeError("ifec was built without LibTorch: the MoE layer is not available")
    w = _args.whole
    if isinstance(eps, (str, bytes)) or not hasattr(eps, "__iter__"):
        raise TypeError(f"eps={eps!r}: expected a list of EP sizes")
    eps = [w(e, "eps", 1, 64000) for e in eps]
    if not eps:
        raise ValueError("eps=[]: expected at least one EP size")
    return json.loads(_native.run_moe_points_json(_args.topology(topology, _native.load_topology), mode, eps,
                                                  w(tokens, "tokens", 0), _args.items(variants, "variants"),
                                                  w(hidden, "hidden", 1), w(experts, "experts", 1), w(topk, "topk", 1),
                                                  w(inter, "inter", 1), w(seed, "seed"), str(gpu_profile or ""),
                                                  _args.flag(fp8_dispatch, "fp8_dispatch"), w(jobs, "jobs", 0, 4096)))


def speedup_rows(rows, topk):
    """Rows for reports.plot_dispatch_combine: (ep, topk, phase, variant, time_us) per phase."""
    return [dict(ep=r["ep"], topk=topk, phase=phase, variant=r["variant"], time_us=r[f"{phase}_us"])
            for r in rows for phase in ("dispatch", "combine")]


def wire_rows(rows, baseline="per_rank"):
    """Rows for reports.plot_wire_bytes: dispatch + combine frame bytes per plane, baseline vs IFEC."""
    out = []
    for r in rows:
        if r["variant"] not in (baseline, "ifec"):
            continue
        name = "baseline" if r["variant"] == baseline else "ifec"
        for plane, (d, c) in enumerate(zip(r["dispatch_wire_per_plane"], r["combine_wire_per_plane"])):
            out.append(dict(variant=name, plane=plane, bytes=d + c))
    return out
