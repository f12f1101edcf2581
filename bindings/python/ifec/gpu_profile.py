"""A GPU profile from a measurement: times DeepSeek-V3's expert kernels with PyTorch on whatever CUDA GPU it finds
(routed experts as one GEMM chain per expert and as torch._grouped_mm, and the shared expert, at EP 8 to 128, i.e.
32 down to 2 local experts, and 32..4096 tokens per GPU: the reference table docs/gpu-model.md was fitted to is its
EP 8/16/32, 128..4096 part), fits the GPU model's constants
(workloads/include/ifec/workloads/gpu_model.h) to them and writes the profile file `--gpu-profile` reads.

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
import sys

HIDDEN, INTER, EXPERTS, TOPK = 7168, 2048, 256, 8
# Peak dense bf16 TFLOP/s and HBM GB/s by device name (the fractions are fitted against these).
PEAKS = {"H100": (989.0, 3350.0), "H200": (989.0, 4800.0), "H800": (989.0, 3350.0), "A100": (312.0, 2039.0),
         "B200": (2250.0, 8000.0)}
# The fitted constants (GpuProfile's fields); chain_gemm_us is pinned: the measurements cannot tell it from
# mem_fraction_chain (every chain GEMM streams the same weights).
FITTED = ("mma_fraction", "mem_fraction_grouped", "grouped_launch_us", "overlap_p", "mma_fraction_chain",
          "mem_fraction_chain", "loop_call_us", "overlap_p_chain")
DEFAULTS = dict(mma_fraction=0.664, mem_fraction_grouped=0.84, mem_fraction_chain=0.43, grouped_launch_us=25.0,
                chain_gemm_us=5.0, loop_call_us=136.0, overlap_p=3.9, l2_bytes=50e6, tile_m=64,
                mma_fraction_chain=0.664, overlap_p_chain=3.9)
# The H100 measurements the built-in profile was fitted to (../shared/references/h100-expert-timings.md):
# (ep, tokens per GPU, routed loop us, routed grouped us, shared us).
H100_TABLE = [(8, 128, 2691.4, 1061.7, 81.1), (8, 256, 2816.2, 1094.3, 71.1), (8, 512, 2818.4, 1131.3, 94.9),
              (8, 4096, 4780.6, 4603.8, 591.8), (16, 128, 1431.8, 570.6, 79.3), (16, 256, 1369.4, 590.1, 70.5),
              (16, 512, 1261.8, 680.5, 94.5), (16, 4096, 4150.7, 4536.0, 578.9), (32, 128, 785.7, 326.0, 83.0),
              (32, 256, 722.3, 371.4, 72.7), (32, 512, 771.8, 561.2, 93.8), (32, 4096, 4471.6, 4699.8, 562.8)]


def even_spread(pairs, experts):
    return [pairs // experts + (1 if e < pairs % experts else 0) for e in range(experts)]


# --------------------------------------------------------------------------------------------- the model --

def _launch(torch, c, rows, n, k, grouped, peaks, elem=2):
    """One GEMM launch (gpu_model.cpp gemm_launch_seconds), microseconds; c holds tensors or floats."""
    rows = [m for m in rows if m > 0]
    if not rows:
        return torch.tensor(0.0, dtype=torch.float64)
    tile = c["tile_m"]
    flops = sum(2.0 * math.ceil(m / tile) * tile * n * k for m in rows)
    weights = len(rows) * n * k * elem
    act = sum(m * (k + n) * elem for m in rows)
    nbytes = weights + max(0.0, act - c["l2_bytes"])
    tc = flops / (peaks[0] * 1e12 * (c["mma_fraction"] if grouped else c["mma_fraction_chain"])) * 1e6
    tm = (c["grouped_launch_us"] if grouped else c["chain_gemm_us"]) + \
        nbytes / (peaks[1] * 1e9 * (c["mem_fraction_grouped"] if grouped else c["mem_fraction_chain"])) * 1e6
    tc, tm = torch.as_tensor(tc, dtype=torch.float64), torch.as_tensor(tm, dtype=torch.float64)
    hi = torch.maximum(tc, tm)
    p = torch.as_tensor(c["overlap_p"] if grouped else c["overlap_p_chain"], dtype=torch.float64)
    return hi * ((tc / hi) ** p + (tm / hi) ** p) ** (1 / p)


def _swiglu(c, rows, inter, peaks, elem=2):
    return max(0.0, 3.0 * rows * inter * elem - c["l2_bytes"]) / (peaks[1] * 1e9 * c["mem_fraction_grouped"]) * 1e6


def model_us(torch, c, kind, per_expert, peaks, hidden=HIDDEN, inter=INTER):
    """The model's time (us) of `kind`: "loop" / "grouped" (routed, tokens per local expert) or "chain" (one FFN on
    per_expert[0] rows)."""
    if kind == "grouped":
        return 2 * _launch(torch, c, per_expert, inter, hidden, True, peaks) + \
            _launch(torch, c, per_expert, hidden, inter, True, peaks) + _swiglu(c, sum(per_expert), inter, peaks)
    from collections import Counter  # experts with the same rows cost the same: each size once
    t = sum(n * (2 * _launch(torch, c, [m], inter, hidden, False, peaks) +
                 _launch(torch, c, [m], hidden, inter, False, peaks) + _swiglu(c, m, inter, peaks))
            for m, n in Counter(m for m in per_expert if m > 0).items())
    return t + (c["loop_call_us"] if kind == "loop" else 0.0)


def cases(table):
    """(kind, tokens per local expert, measured us) from (ep, tokens, loop, grouped, shared) rows."""
    out = []
    for ep, tokens, loop, grouped, shared in table:
        per = even_spread(tokens * TOPK, EXPERTS // ep)
        out += [("loop", per, loop), ("grouped", per, grouped), ("chain", [tokens], shared)]
    return out


# The fit's stages: the grouped kernel's constants from its own numbers first (GPU-bound at every point, stable to a
# few percent between runs), then the per-expert chain's from the loop and shared numbers with those fixed. The
# chain's small-M numbers are bounded by how fast the host launches kernels (measured on a VM host: up to 2x
# between processes): they cannot pull the grouped kernel's constants, which the testbed's figures use.
STAGES = ((("grouped",), FITTED[:4]), (("loop", "chain"), FITTED[4:]))


def fit(table, peaks, steps=400, start=None):
    """The constants (FITTED) minimising the worst log errors over the table, stage by stage (STAGES), from `start`
    (default: the H100 fit)."""
    consts = dict({k: DEFAULTS[k] for k in FITTED}, **(start or {}))
    for kinds, names in STAGES:
        consts.update(_fit_stage([c for c in cases(table) if c[0] in kinds], peaks, steps, consts, names))
    return consts


def _fit_stage(cs, peaks, steps, consts, names):
    import torch

    # Unconstrained parameters, so every constant stays in range: fractions through a sigmoid, the overlap exponents
    # as 1 + exp, the fixed costs through exp.
    def to_raw(k, v):
        return math.log(v / (1 - v)) if "fraction" in k else math.log(v - 1 if k.startswith("overlap_p") else v)

    def from_raw(k, r):
        return torch.sigmoid(r) if "fraction" in k else torch.exp(r) + (1 if k.startswith("overlap_p") else 0)
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
    return max(abs(r[5] - 1) for r in rows if grouped is None or (r[2] == "grouped") == grouped)


def report(table, constants, peaks):
    """[(ep, tokens, kind, measured, model, ratio)] and the worst |ratio - 1|."""
    import torch
    c = dict(DEFAULTS, **constants)
    rows = []
    for (ep, tokens, *_), (kind, per, meas) in zip([r for r in table for _ in range(3)], cases(table)):
        m = float(model_us(torch, c, kind, per, peaks))
        rows.append((ep, tokens, "shared" if kind == "chain" else kind, meas, m, m / meas))
    return rows, worst(rows)


def leave_one_ep_out(table, peaks, steps=400):
    """Validation out of sample: for each EP size of the table, the constants fitted to the other EP sizes' rows
    predict its rows. {ep: {"grouped": worst |ratio - 1|, "loop": ..., "shared": ...}} (a kind the table does not
    measure at that EP is left out)."""
    out = {}
    for ep in sorted({r[0] for r in table}):
        rows, _ = report([r for r in table if r[0] == ep], fit([r for r in table if r[0] != ep], peaks, steps), peaks)
        out[ep] = {kind: max(abs(r[5] - 1) for r in rows if r[2] == kind) for kind in ("grouped", "loop", "shared")}
    return out


def profile_yaml(name, peaks, constants, comment):
    c = dict(DEFAULTS, **constants)
    lines = [f"# {comment}", f"name: {json.dumps(name)}", f"tflops: {peaks[0]:g}", f"hbm_gbs: {peaks[1]:g}"]
    lines += [f"{k}: {c[k]:.4g}" for k in FITTED + ("chain_gemm_us",)]
    lines += [f"l2_bytes: {c['l2_bytes']:g}", f"tile_m: {int(c['tile_m'])}", "kernel: grouped"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------- measuring --

def measure(eps=(8, 16, 32, 64, 128), tokens=(32, 64, 128, 256, 512, 4096), iters=10, batches=5, warmup=3,
            progress=print, device="cuda", hidden=HIDDEN, inter=INTER, dtype=None):
    """The table on this machine's GPU: (ep, tokens, loop us, grouped us, shared us) rows (CUDA events: the median
    over `batches` of the mean of `iters` calls, after `warmup` and a second of GEMMs that brings the clocks up;
    wall time on the CPU, where the tests run it small); grouped is None where
    torch._grouped_mm is missing. Before timing, the grouped kernel's output is checked against the loop's: a
    grouped call that computed something else would time the wrong work."""
    import time

    import torch
    import torch.nn.functional as F
    dev = torch.device(device)
    dt = dtype or torch.bfloat16
    grouped_mm = getattr(torch, "_grouped_mm", None)

    def timed(fn):
        """Median over `batches` of the mean time of `iters` calls: a batch that met a host hiccup (the per-expert
        loop is bounded by how fast the CPU launches kernels) does not move it. Also returns the batches' spread."""
        for _ in range(warmup):
            fn()
        means = []
        for _ in range(batches):
            if dev.type != "cuda":
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                means.append((time.perf_counter() - t0) * 1e6 / iters)
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            means.append(start.elapsed_time(end) * 1000 / iters)
        means.sort()
        return means[len(means) // 2], means[-1] / means[0] - 1

    if dev.type == "cuda":  # clocks up before the first point: a second of large GEMMs
        a = torch.randn(8192, 8192, device=dev, dtype=dt)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 1.0:
            a @ a
            torch.cuda.synchronize()
        del a

    def one_ep(ep):  # this EP's experts' weights live as long as the call
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
            progress(f"gpu_profile: EP {ep}, {t} tokens/GPU: loop {lt:.1f} us, grouped "
                     f"{gt if gt is None else round(gt, 1)} us, shared {st:.1f} us (medians of {batches} batches; "
                     f"slowest/fastest batch +{ls:.0%}, +{gs:.0%}, +{ss:.0%})")
            rows.append(row)
        return rows

    rows = []
    for ep in eps:
        rows += one_ep(ep)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


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


def read_table(path):
    """A --fit-only table: a JSON list of [ep, tokens, loop us, grouped us, shared us] rows, positive numbers; None
    (after saying what is wrong) otherwise."""
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
                all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf for v in r[2:])):
            print(f"gpu_profile: {path}: row {i} is {r!r}, not [ep, tokens, loop us, grouped us, shared us] (ep and "
                  "tokens whole numbers, times positive and finite)", file=sys.stderr)
            return None
        if EXPERTS % r[0]:
            print(f"gpu_profile: {path}: row {i}: EP {r[0]} does not divide the {EXPERTS} experts", file=sys.stderr)
            return None
    return [tuple(r) for r in rows]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m ifec.gpu_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the profile here (YAML)")
    ap.add_argument("--fit-only", metavar="TABLE", help="fit a JSON table [[ep, tokens, loop, grouped, shared], ...] "
                                                        "instead of measuring; 'h100' for the built-in table")
    ap.add_argument("--name", help="the profile's name (default: the GPU's; with --fit-only, the table's)")
    ap.add_argument("--table-out", metavar="JSON", help="also write the table fitted (what --fit-only reads)")
    ap.add_argument("--tflops", type=float, help="peak dense bf16 TFLOP/s (default: by device name)")
    ap.add_argument("--hbm-gbs", type=float, help="peak HBM GB/s (default: by device name)")
    ap.add_argument("--quick", action="store_true", help="EP 8 and 32, 128 and 4096 tokens, 3 batches of 5")
    ap.add_argument("--leave-one-out", action="store_true",
                    help="also fit without each EP size and predict it: the worst error per kernel (out of sample)")
    args = ap.parse_args(argv)
    name = "NVIDIA H100 (the reference table)"
    if args.fit_only:
        table = H100_TABLE if args.fit_only == "h100" else read_table(args.fit_only)
        if table is None:
            return 2
        peaks = (args.tflops or PEAKS["H100"][0], args.hbm_gbs or PEAKS["H100"][1])
        how = f"fitted to {'the H100 reference table' if args.fit_only == 'h100' else args.fit_only}"
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
        q = dict(eps=(8, 32), tokens=(128, 4096), iters=5, batches=3) if args.quick else {}
        table = [r for r in measure(**q) if r[3] is not None] or []
        if not table:
            print("gpu_profile: torch._grouped_mm is missing: the grouped kernel cannot be measured", file=sys.stderr)
            return 2
        how = f"measured with PyTorch {torch.__version__} (bf16, CUDA events, medians of batches) and fitted"
    if args.table_out:
        with open(args.table_out, "w") as f:
            json.dump([list(r) for r in table], f)
        print(f"wrote {args.table_out} (the table fitted: ep, tokens, loop us, grouped us, shared us)")
    name = args.name or name
    constants = fit(table, peaks)
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
        for ep, w in leave_one_ep_out(table, peaks).items():
            print(f"  EP {ep:>3}: " + ", ".join(f"{k} {v:.1%}" for k, v in w.items()))
    builtin = report(table, {k: DEFAULTS[k] for k in FITTED}, peaks)[0]
    print(f"the built-in profile (fitted to the H100 reference table) at these peaks, on this table: grouped kernel "
          f"within {worst(builtin, True):.1%}, all within {worst(builtin):.1%}")
    if args.out:
        with open(args.out, "w") as f:
            f.write(profile_yaml(name, peaks, constants, f"GPU profile of {name}, {how}; model/measured {deviation} "
                                                         f"over {len(rows)} numbers"))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
