"""A GPU profile from a measurement: times DeepSeek-V3's expert kernels with PyTorch on whatever CUDA GPU it finds
(routed experts as one GEMM chain per expert and as torch._grouped_mm, and the shared expert, replayed from CUDA
graphs, at EP 8 to 256, i.e. 32 down to 1 local experts, and 32..4096 tokens per GPU: the grid of the built-in
H100 table, docs/gpu-model.md), fits the GPU model's constants (workloads/include/ifec/workloads/gpu_model.h: tiles
in waves over the SMs, the faster clock of a partial wave, what the streaming CTAs draw from HBM) to them and writes
the profile file `--gpu-profile` reads.

    python3 -m ifec.gpu_profile --out my-gpu.yaml          # measure, fit, write, print measured vs model
    python3 -m ifec.gpu_profile --fit-only TABLE.json      # fit a table measured elsewhere (--table-out writes one)
    python3 -m ifec.gpu_profile --fit-only h100 --leave-one-out   # and predict each EP size from the others

It needs PyTorch only, not the testbed's native module: on a GPU machine where the testbed is not built,
`PYTHONPATH=bindings/python python3 -m ifec.gpu_profile --out gpu.yaml --table-out gpu.json` runs from a checkout.

The model is evaluated here in PyTorch (differentiable, for the fit) exactly as in C++; a test checks the two agree.
"""

import argparse
import json
import math
import os
import sys

HIDDEN, INTER, EXPERTS, TOPK = 7168, 2048, 256, 8
# Peak dense bf16 TFLOP/s and HBM GB/s by device name (the fractions are fitted against these).
PEAKS = {"H100": (989.0, 3350.0), "H200": (989.0, 4800.0), "H800": (989.0, 3350.0), "A100": (312.0, 2039.0),
         "B200": (2250.0, 8000.0)}
# The fitted constants (GpuProfile's fields), the grouped kernel's then the per-expert chains'.
FITTED = ("mma_fraction", "clock_boost", "mem_fraction", "cta_gbs", "grouped_launch_us", "overlap_p",
          "mma_fraction_chain", "cta_gbs_chain", "chain_gemm_us", "overlap_p_chain", "loop_call_us")
DEFAULTS = dict(mma_fraction=0.615, clock_boost=1.267, mem_fraction=0.8381, cta_gbs=134.3, grouped_launch_us=15.52,
                overlap_p=4.311, mma_fraction_chain=0.5918, cta_gbs_chain=100.0, chain_gemm_us=4.371,
                overlap_p_chain=2.391, loop_call_us=0.1935, sms=132, l2_bytes=50e6)
# The reference H100's measurements (../shared/references/h100-expert-timings.md; eager, mean of 20 calls), which
# the project's first fitted profiles used: (ep, tokens per GPU, routed loop us, routed grouped us, shared us).
H100_TABLE = [(8, 128, 2691.4, 1061.7, 81.1), (8, 256, 2816.2, 1094.3, 71.1), (8, 512, 2818.4, 1131.3, 94.9),
              (8, 4096, 4780.6, 4603.8, 591.8), (16, 128, 1431.8, 570.6, 79.3), (16, 256, 1369.4, 590.1, 70.5),
              (16, 512, 1261.8, 680.5, 94.5), (16, 4096, 4150.7, 4536.0, 578.9), (32, 128, 785.7, 326.0, 83.0),
              (32, 256, 722.3, 371.4, 72.7), (32, 512, 771.8, 561.2, 93.8), (32, 4096, 4471.6, 4699.8, 562.8)]


# The device machine's H100 (testbed/gpu-profiles/README.md): 42 points, EP 8..256 x 32..4096 tokens, every call
# replayed from a CUDA graph, per-cell medians of 6 runs in 6 processes.
GRAPHS_TABLE = os.path.join("testbed", "gpu-profiles", "h100-sxm-graphs.json")  # in the checkout


def builtin_table():
    """What the built-in profile is fitted to: GRAPHS_TABLE, every kind. (H100_TABLE, the reference H100's, was
    measured eagerly: its chains' times include how fast the host launched their kernels.)"""
    here = os.path.dirname(os.path.abspath(__file__))
    while not os.path.exists(os.path.join(here, GRAPHS_TABLE)) and os.path.dirname(here) != here:
        here = os.path.dirname(here)  # the package runs from the checkout or from a build folder inside it
    table = read_table(os.path.join(here, GRAPHS_TABLE))
    if table is None:
        raise RuntimeError(f"gpu_profile: the built-in table {GRAPHS_TABLE} is not found above {__file__}")
    return table


QUICK_EPS = (8, 32, 128)  # --quick: 8 experts' kernels, 2 experts', and between them


def even_spread(pairs, experts):
    return [pairs // experts + (1 if e < pairs % experts else 0) for e in range(experts)]


# --------------------------------------------------------------------------------------------- the model --

def tile_shape(rows, n, grouped):
    """The output tile (rows x columns) a launch computes per CTA (gpu_model.cpp tile_shape): torch._grouped_mm's
    SM90 choice, 64 x 128 where the experts average 128 rows or fewer, else 128 x 256; a chain's GEMM 64 x 128."""
    if grouped and sum(rows) > 128 * len(rows) and n > 128:
        return 128, 256
    return 64, 128


def _launch(torch, c, rows, n, k, grouped, peaks, elem=2):
    """One GEMM launch (gpu_model.cpp gemm_launch_seconds), microseconds; c holds tensors or floats."""
    tm, tn = tile_shape(rows, n, grouped)
    rows = [m for m in rows if m > 0]
    if not rows:
        return torch.tensor(0.0, dtype=torch.float64)
    sms = int(c["sms"])
    tiles = sum(-(-m // tm) * -(-n // tn) for m in rows)
    sfx = "" if grouped else "_chain"
    # Tensor cores: waves of tiles over the SMs, each busy SM at its share of the sustained rate, which rises as
    # fewer SMs are busy (the clock is power-limited under a full wave): full waves, then the partial last one.
    full, last = divmod(tiles, sms)
    tile_us = 2.0 * tm * tn * k * sms / (peaks[0] * 1e12) * 1e6 / c["mma_fraction" + sfx]
    tc = full * tile_us + (tile_us / (1 + (c["clock_boost"] - 1) * (1 - last / sms)) if last else 0.0)
    # HBM: every expert's weights and the activations beyond L2, at what the streaming CTAs can draw.
    nbytes = len(rows) * n * k * elem + max(0.0, sum(m * (k + n) * elem for m in rows) - c["l2_bytes"])
    gbs = torch.minimum(torch.as_tensor(peaks[1] * c["mem_fraction"], dtype=torch.float64),
                        torch.as_tensor(min(tiles, sms) * c["cta_gbs" + sfx], dtype=torch.float64))
    tm_ = c["grouped_launch_us" if grouped else "chain_gemm_us"] + nbytes / (gbs * 1e9) * 1e6
    tc, tm_ = torch.as_tensor(tc, dtype=torch.float64), torch.as_tensor(tm_, dtype=torch.float64)
    hi = torch.maximum(tc, tm_)
    p = torch.as_tensor(c["overlap_p" + sfx], dtype=torch.float64)
    return hi * ((tc / hi) ** p + (tm_ / hi) ** p) ** (1 / p)


def _swiglu(c, rows, inter, peaks, elem=2):
    return max(0.0, 3.0 * rows * inter * elem - c["l2_bytes"]) / (peaks[1] * 1e9 * c["mem_fraction"]) * 1e6


def model_us(torch, c, kind, per_expert, peaks, hidden=HIDDEN, inter=INTER):
    """The model's time (us) of `kind`: "loop" / "grouped" (routed, tokens per local expert) or "chain" (one FFN on
    per_expert[0] rows). Gate and up are one launch (N = 2 x inter), down another, as measure() runs them."""
    if kind == "grouped":
        return _launch(torch, c, per_expert, 2 * inter, hidden, True, peaks) + \
            _launch(torch, c, per_expert, hidden, inter, True, peaks) + _swiglu(c, sum(per_expert), inter, peaks)
    from collections import Counter  # experts with the same rows cost the same: each size once
    t = sum(n * (_launch(torch, c, [m], 2 * inter, hidden, False, peaks) +
                 _launch(torch, c, [m], hidden, inter, False, peaks) + _swiglu(c, m, inter, peaks))
            for m, n in Counter(m for m in per_expert if m > 0).items())
    return t + (c["loop_call_us"] if kind == "loop" else 0.0)


def cases(table):
    """(ep, tokens, kind, tokens per local expert, measured us) from (ep, tokens, loop, grouped, shared) rows; a
    kind whose cell is None (not measured there) is left out."""
    out = []
    for ep, tokens, loop, grouped, shared in table:
        per = even_spread(tokens * TOPK, EXPERTS // ep)
        out += [(ep, tokens, kind, p, us) for kind, p, us in
                (("loop", per, loop), ("grouped", per, grouped), ("chain", [tokens], shared)) if us is not None]
    return out


# The fit's stages: the grouped kernel's constants from its own numbers first (stable to a few percent between
# runs), then the per-expert chains' from the loop and shared numbers with those fixed (clock_boost and
# mem_fraction are the chip's: the chains share them). Measured eagerly, the chains' small-M GEMMs are bounded by
# how fast the host launches kernels (up to 2x between processes on the device machine): they cannot pull the
# grouped kernel's constants, which the testbed uses.
STAGES = ((("grouped",), FITTED[:6]), (("loop", "chain"), FITTED[6:]))


def fit(table, peaks, steps=400, start=None):
    """The constants (FITTED) minimising the worst log errors over the table, stage by stage (STAGES), from `start`
    (default: the H100 fit)."""
    consts = dict({k: DEFAULTS[k] for k in FITTED + ("sms",)}, **(start or {}))
    for kinds, names in STAGES:
        cs = [c[2:] for c in cases(table) if c[2] in kinds]
        if cs:  # a table without a kind's numbers leaves its constants where they start
            consts.update(_fit_stage(cs, peaks, steps, consts, names))
    return consts


def _fit_stage(cs, peaks, steps, consts, names):
    import torch

    # Unconstrained parameters, so every constant stays in range: fractions through a sigmoid, the overlap exponents
    # and the clock boost as 1 + exp, the rates and fixed costs through exp.
    def above_one(k):
        return k.startswith("overlap_p") or k == "clock_boost"

    def to_raw(k, v):
        return math.log(v / (1 - v)) if "fraction" in k else math.log(max(v - 1, 1e-6) if above_one(k) else v)

    def from_raw(k, r):
        return torch.sigmoid(r) if "fraction" in k else torch.exp(r) + (1 if above_one(k) else 0)
    raw = {k: torch.tensor(to_raw(k, consts[k]), dtype=torch.float64, requires_grad=True) for k in names}

    def constants():
        return {**DEFAULTS, **consts, **{k: from_raw(k, r) for k, r in raw.items()}}
    opt = torch.optim.Adam(list(raw.values()), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        c = constants()
        # The worst rows matter (the goal is every row within 10%): a 16-norm of the log errors, close to the max.
        loss = sum((torch.log(model_us(torch, c, kind, per, peaks)) - math.log(meas)) ** 16
                   for kind, per, meas in cs) ** 0.0625
        loss.backward()
        opt.step()
    c = constants()
    return {k: float(c[k].detach()) for k in names}


def worst(rows, grouped=None):
    """The largest |model/measured - 1| of report()'s rows: all of them, or only the grouped kernel's (True) or only
    the per-expert chains' (False)."""
    return max((abs(r[5] - 1) for r in rows if grouped is None or (r[2] == "grouped") == grouped), default=0.0)


def report(table, constants, peaks):
    """[(ep, tokens, kind, measured, model, ratio)] and the worst |ratio - 1|."""
    import torch
    c = dict(DEFAULTS, **constants)
    rows = []
    for ep, tokens, kind, per, meas in cases(table):
        m = float(model_us(torch, c, kind, per, peaks))
        rows.append((ep, tokens, "shared" if kind == "chain" else kind, meas, m, m / meas))
    return rows, worst(rows)


def leave_one_ep_out(table, peaks, steps=400, start=None):
    """Validation out of sample: for each EP size of the table, the constants fitted to the other EP sizes' rows
    predict its rows. {ep: {"grouped": worst |ratio - 1|, "loop": ..., "shared": ...}} (a kind the table does not
    measure at that EP is left out)."""
    out = {}
    for ep in sorted({r[0] for r in table}):
        rows, _ = report([r for r in table if r[0] == ep], fit([r for r in table if r[0] != ep], peaks, steps, start),
                         peaks)
        out[ep] = {kind: max(abs(r[5] - 1) for r in rows if r[2] == kind) for kind in ("grouped", "loop", "shared")
                   if any(r[2] == kind for r in rows)}
    return out


def profile_yaml(name, peaks, constants, comment):
    c = dict(DEFAULTS, **constants)
    comment = " ".join(str(comment).splitlines())  # one line: a newline in --name or a path began a YAML key
    lines = [f"# {comment}", f"name: {json.dumps(name)}", f"tflops: {peaks[0]:g}", f"hbm_gbs: {peaks[1]:g}"]
    lines += [f"sms: {int(c['sms'])}"] + [f"{k}: {c[k]:.4g}" for k in FITTED]
    lines += [f"l2_bytes: {c['l2_bytes']:g}", "kernel: grouped"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------- measuring --

def measure(eps=(8, 16, 32, 64, 128, 256), tokens=(32, 64, 128, 256, 512, 1024, 4096), iters=10, batches=5,
            warmup=3, progress=print, device="cuda", hidden=HIDDEN, inter=INTER, dtype=None, graphs=True,
            batch_ms=20, runs=1):
    """The table on this machine's GPU: (ep, tokens, loop us, grouped us, shared us) rows (CUDA events: the median
    over `batches` of the mean of a batch of calls, at least `iters` and `batch_ms` long, after `warmup` and a second
    of GEMMs that brings the clocks up; wall time on the CPU, where the tests run it small); grouped is None where
    torch._grouped_mm is missing. Before timing, the grouped kernel's output is checked against the loop's: a
    grouped call that computed something else would time the wrong work. With `graphs` (on a CUDA GPU) each call
    is captured once as a CUDA graph and replayed, as a deployment's decode step runs: the time is the GPU's, not
    how fast the host launches the per-expert loop's hundreds of kernels (eager, it is bounded by that on a VM).
    With `runs` > 1 every point is measured that many times, each run starting at another EP (what drifts during a
    run, the clock or the heat, then falls on no one EP's rows), and each cell is the median of its runs."""
    import statistics
    import time

    import torch
    import torch.nn.functional as F
    dev = torch.device(device)
    dt = dtype or torch.bfloat16
    grouped_mm = getattr(torch, "_grouped_mm", None)
    how = "CUDA graphs, " if graphs and dev.type == "cuda" else ""

    def timed(fn):
        """Median over `batches` of the mean time of a batch of calls (at least `iters`, and on a GPU at least
        `batch_ms` of them: a short kernel's batch of 10 calls lasts a millisecond, and its time moves with the
        clocks within that): a batch that met a hiccup does not move it. Also returns the batches' spread."""
        if dev.type != "cuda":
            return _median_of_batches(lambda n: _wall_us(fn, n), iters, warmup, batches)
        if graphs:
            fn = graphed(torch, fn)
        for _ in range(warmup):
            fn()
        n = max(iters, math.ceil(batch_ms * 1000 / _cuda_us(torch, fn, iters)))
        return _median_of_batches(lambda n: _cuda_us(torch, fn, n), n, 0, batches)

    if dev.type == "cuda":  # clocks up before the first point: a second of large GEMMs
        a = torch.randn(8192, 8192, device=dev, dtype=dt)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 1.0:
            a @ a
            torch.cuda.synchronize()
        del a

    def one_ep(ep, run):  # this EP's experts' weights live as long as the call
        rows, local = [], EXPERTS // ep
        w13 = torch.randn(local, 2 * inter, hidden, device=dev, dtype=dt) * 0.02
        w2 = torch.randn(local, hidden, inter, device=dev, dtype=dt) * 0.02
        for t in tokens:
            per = even_spread(t * TOPK, local)
            x = torch.randn(sum(per), hidden, device=dev, dtype=dt)
            offs = torch.tensor(per, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)

            def loop():
                outs, at = [], 0
                for e, m in enumerate(per):
                    h = x[at:at + m] @ w13[e].t()
                    outs.append((F.silu(h[:, :inter]) * h[:, inter:]) @ w2[e].t())
                    at += m
                return torch.cat(outs)

            def grouped():
                h = grouped_mm(x, w13.transpose(1, 2), offs=offs)
                return grouped_mm(F.silu(h[:, :inter]) * h[:, inter:], w2.transpose(1, 2), offs=offs)

            xs = torch.randn(t, hidden, device=dev, dtype=dt)

            def shared():
                h = xs @ w13[0].t()
                return (F.silu(h[:, :inter]) * h[:, inter:]) @ w2[0].t()
            if grouped_mm:
                same_as_loop(torch, grouped(), loop(), f"EP {ep}, {t} tokens")
            (lt, ls), (gt, gs), (st, ss) = timed(loop), timed(grouped) if grouped_mm else (None, 0.0), timed(shared)
            row = (ep, t, lt, gt, st)
            progress(f"gpu_profile: {run}EP {ep}, {t} tokens/GPU: loop {lt:.1f} us, grouped "
                     f"{gt if gt is None else round(gt, 1)} us, shared {st:.1f} us ({how}medians of {batches} "
                     f"batches; slowest/fastest batch +{ls:.0%}, +{gs:.0%}, +{ss:.0%})")
            rows.append(row)
        return rows

    cells = {}
    for r in range(runs):
        for ep in eps[r % len(eps):] + eps[:r % len(eps)]:
            for row in one_ep(ep, f"run {r + 1} of {runs}: " if runs > 1 else ""):
                cells.setdefault(row[:2], []).append(row[2:])
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return [(ep, t) + tuple(None if None in v else statistics.median(v) for v in zip(*cells[(ep, t)]))
            for ep in eps for t in tokens]


def _wall_us(fn, n):
    import time
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) * 1e6 / n


def _cuda_us(torch, fn, n):
    """The mean time of n calls of fn on the current CUDA stream, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / n


def _median_of_batches(batch_us, n, warmup, batches):
    """(median, slowest/fastest - 1) of `batches` batch means of n calls each, after `warmup` unmeasured calls."""
    if warmup:
        batch_us(warmup)
    means = sorted(batch_us(n) for _ in range(batches))
    return means[len(means) // 2], means[-1] / means[0] - 1


def graphed(torch, fn):
    """fn captured as a CUDA graph (after two calls on a side stream, as capture requires): the returned function
    replays it, one launch from the host for all of fn's kernels."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def same_as_loop(torch, grouped, loop, where):
    """The grouped kernel's output against the per-expert loop's: bf16 rounding of two GEMMs apart (relative to
    the output's scale), else a clear error naming the point."""
    same_shape = tuple(grouped.shape) == tuple(loop.shape)
    scale = loop.float().abs().max().item() or 1.0
    err = (grouped.float() - loop.float()).abs().max().item() / scale if same_shape else float("nan")
    if not err <= 0.05:
        raise RuntimeError(f"gpu_profile: at {where} torch._grouped_mm gave {tuple(grouped.shape)} with relative "
                           f"error {err:.3g} against the per-expert loop {tuple(loop.shape)}: not timing it")


def _whole(v):
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _table(name):
    """--fit-only's table: the built-in one (h100) or read_table's; None (after saying why) when there is none."""
    try:
        return builtin_table() if name == "h100" else read_table(name)
    except RuntimeError as e:  # the package away from its checkout
        print(e, file=sys.stderr)
        return None


def read_table(path):
    """A --fit-only table: a JSON list of [ep, tokens, loop us, grouped us, shared us] rows, positive numbers (null
    where a kind was not measured); None (after saying what is wrong) otherwise."""
    try:
        with open(path) as f:
            rows = json.load(f)
    except (OSError, ValueError) as e:
        print(f"gpu_profile: cannot read the table {path}: {e}", file=sys.stderr)
        return None
    if not (isinstance(rows, list) and rows):
        print(f"gpu_profile: {path} holds {type(rows).__name__} {str(rows)[:40]}, not a list of rows", file=sys.stderr)
        return None
    for i, r in enumerate(rows):
        if not (isinstance(r, list) and len(r) == 5 and all(_whole(v) for v in r[:2]) and
                all(v is None or isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf
                    for v in r[2:]) and any(v is not None for v in r[2:])):
            print(f"gpu_profile: {path}: row {i} is {r!r}, not [ep, tokens, loop us, grouped us, shared us] (ep and "
                  "tokens whole numbers, times positive and finite, or null where not measured)", file=sys.stderr)
            return None
        if EXPERTS % r[0]:
            print(f"gpu_profile: {path}: row {i}: EP {r[0]} does not divide the {EXPERTS} experts", file=sys.stderr)
            return None
    return [tuple(r) for r in rows]


def _positive(text):
    """An argparse type: a positive, finite number (0 fell back to the device's peak, NaN and inf made no profile or a
    profile of inf)."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not 0 < v < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive, finite number")
    return v


def _output(text):
    """An argparse type: a file to write, checked before the minutes of measuring and fitting (not after)."""
    folder = os.path.dirname(text) or "."
    if not text or (os.path.exists(text) and not os.path.isfile(text) and text != os.devnull):  # a FIFO: a hang
        raise argparse.ArgumentTypeError(f"{text!r}: expected a file name")
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: its folder {folder!r} is not a writable folder")
    return text


def _check_args(args, table=None):
    """Why the options cannot go together ("" when they can): an empty --fit-only (it measured instead), measuring's
    options with --fit-only, leaving one EP out of a table of one EP size."""
    if args.fit_only == "":
        return "--fit-only '': expected a table file or h100"
    if args.fit_only is not None:
        given = [f for f, on in (("--quick", args.quick), ("--eager", args.eager), ("--runs", args.runs != 1)) if on]
        if given:
            return f"{', '.join(given)}: options of measuring, which --fit-only does not do"
    if args.leave_one_out and table is not None and len({r[0] for r in table}) < 2:
        return f"--leave-one-out: the table has one EP size ({table[0][0]}), none other to fit to"
    return ""


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m ifec.gpu_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=_output, help="write the profile here (YAML)")
    ap.add_argument("--fit-only", metavar="TABLE", help="fit a JSON table [[ep, tokens, loop, grouped, shared], ...] "
                                                        "instead of measuring; 'h100' for the built-in table")
    ap.add_argument("--name", help="the profile's name (default: the GPU's; with --fit-only, the table's)")
    ap.add_argument("--table-out", metavar="JSON", type=_output,
                    help="also write the table fitted (what --fit-only reads)")
    ap.add_argument("--tflops", type=_positive, help="peak dense bf16 TFLOP/s (default: by device name)")
    ap.add_argument("--hbm-gbs", type=_positive, help="peak HBM GB/s (default: by device name)")
    ap.add_argument("--sms", type=int, help="streaming multiprocessors (default: the GPU's; with --fit-only, 132)")
    ap.add_argument("--quick", action="store_true",
                    help="EP 8, 32 and 128 at 32, 128 and 4096 tokens, 3 batches of at least 5 calls")
    ap.add_argument("--runs", type=int, default=1, help="measure every point this many times, each run starting at "
                                                        "another EP, and take each cell's median (1..20)")
    ap.add_argument("--eager", action="store_true", help="launch every kernel from the host instead of replaying "
                                                         "CUDA graphs (the per-expert loop is then host-bound)")
    ap.add_argument("--steps", type=int, default=400, help="the fit's optimiser steps per stage (10..5000)")
    ap.add_argument("--leave-one-out", action="store_true",
                    help="also fit without each EP size and predict it: the worst error per kernel (out of sample)")
    args = ap.parse_args(argv)
    name = "NVIDIA H100 SXM 80GB HBM3 (the built-in table)"
    if args.sms is not None and not 0 < args.sms <= 1024:
        print(f"gpu_profile: --sms {args.sms} is not a streaming multiprocessor count (1..1024)", file=sys.stderr)
        return 2
    if not 10 <= args.steps <= 5000:
        print(f"gpu_profile: --steps {args.steps} is out of range (10..5000)", file=sys.stderr)
        return 2
    if not 1 <= args.runs <= 20:
        print(f"gpu_profile: --runs {args.runs} is out of range (1..20)", file=sys.stderr)
        return 2
    if _check_args(args):
        print(f"gpu_profile: {_check_args(args)}", file=sys.stderr)
        return 2
    sms = args.sms or DEFAULTS["sms"]
    if args.fit_only:
        table = _table(args.fit_only)
        if table is None:
            return 2
        if _check_args(args, table):
            print(f"gpu_profile: {_check_args(args, table)}", file=sys.stderr)
            return 2
        peaks = (args.tflops or PEAKS["H100"][0], args.hbm_gbs or PEAKS["H100"][1])
        how = f"fitted to {'the built-in H100 table' if args.fit_only == 'h100' else args.fit_only}"
        name = name if args.fit_only == "h100" else f"the table {args.fit_only}"
    else:
        try:
            import torch
        except ImportError:
            print("gpu_profile: PyTorch is not installed", file=sys.stderr)
            return 2
        if not torch.cuda.is_available():
            print("gpu_profile: no CUDA GPU here (torch.cuda.is_available() is False)", file=sys.stderr)
            return 2
        name = torch.cuda.get_device_name(0)
        known = next((v for k, v in PEAKS.items() if k in name), None)
        if known is None and not (args.tflops and args.hbm_gbs):
            print(f"gpu_profile: no peaks known for '{name}': give --tflops and --hbm-gbs", file=sys.stderr)
            return 2
        peaks = (args.tflops or known[0], args.hbm_gbs or known[1])
        sms = args.sms or torch.cuda.get_device_properties(0).multi_processor_count
        q = dict(eps=QUICK_EPS, tokens=(32, 128, 4096), iters=5, batches=3) if args.quick else {}
        table = [r for r in measure(graphs=not args.eager, runs=args.runs, **q) if r[3] is not None] or []
        if not table:
            print("gpu_profile: torch._grouped_mm is missing: the grouped kernel cannot be measured", file=sys.stderr)
            return 2
        how = (f"measured with PyTorch {torch.__version__} (bf16, {'eager' if args.eager else 'CUDA graphs'}, CUDA "
               "events, medians of batches) and fitted")
    if args.table_out:
        with open(args.table_out, "w") as f:
            json.dump([list(r) for r in table], f)
        print(f"wrote {args.table_out} (the table fitted: ep, tokens, loop us, grouped us, shared us)")
    name = args.name or name
    constants = fit(table, peaks, args.steps, start={"sms": sms})
    if not all(math.isfinite(v) for v in constants.values()):
        print(f"gpu_profile: the fit did not converge on this table ({constants}); no profile written", file=sys.stderr)
        return 2
    rows, _ = report(table, constants, peaks)
    print(f"{'EP':>3} {'tokens':>6} {'kind':>8} {'measured us':>12} {'model us':>10} {'ratio':>6}")
    for ep, t, kind, meas, model, ratio in rows:
        print(f"{ep:>3} {t:>6} {kind:>8} {meas:>12.1f} {model:>10.1f} {ratio:>6.3f}")
    deviation = (f"worst deviation {worst(rows):.1%} (grouped kernel {worst(rows, True):.1%}, per-expert chains "
                 f"{worst(rows, False):.1%})")
    print("fitted: " + ", ".join(f"{k} {v:.4g}" for k, v in constants.items()) + f"; {deviation}")
    if args.leave_one_out:
        print("leave one EP out (fitted to the other EP sizes, predicting this one): worst |model/measured - 1|")
        for ep, w in leave_one_ep_out(table, peaks, args.steps, start={"sms": sms}).items():
            print(f"  EP {ep:>3}: " + ", ".join(f"{k} {v:.1%}" for k, v in w.items()))
    builtin = report(table, {k: DEFAULTS[k] for k in FITTED + ("sms",)}, peaks)[0]
    print(f"the built-in profile (fitted to the built-in H100 table) at these peaks, on this table: grouped kernel "
          f"within {worst(builtin, True):.1%}, all within {worst(builtin):.1%}")
    if args.out:
        with open(args.out, "w") as f:
            f.write(profile_yaml(name, peaks, constants, f"GPU profile of {name}, {how}; model/measured {deviation} "
                                                         f"over {len(rows)} numbers"))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
