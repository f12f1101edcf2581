"""The part of `./ifec demo` that measures collectives and draws the paper-style plots (run with /usr/bin/python3).

Usage: python3 -m ifec.demo OUT_DIR [--sizes 1MiB,4MiB] [--gpus 64] [--planes 4] [--amdahl-size 64MiB]
                              [--amdahl-gpus 16] [--moe-tokens 256] [--moe-sweep-tokens 64] [--deepep-ep 8] [--deepep-tokens 4096]
                              [--no-moe]
Writes OUT_DIR/allreduce.{csv,json}, OUT_DIR/amdahl.png, OUT_DIR/allreduce_wire_bytes.png, and for the MoE layer
OUT_DIR/moe_layer.{csv,json}, OUT_DIR/moe_sweep.{csv,json}, OUT_DIR/moe_speedup.png, OUT_DIR/moe_wire_bytes.png,
and prints the tables: the MoE layer at the demo point (computed and checked) and at DeepEP's normal point (4096
tokens per GPU, timing mode), each with and without two overlapped micro-batches. Fabric times are simulated
(driver: sim); expert compute is modelled from the GPU profile.
"""

import argparse
import inspect
import os
import pathlib
import sys
import time

import ifec
from ifec import collectives, moe, reports

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_size(text):
    for unit in ("KiB", "MiB", "GiB", "B"):
        if text.endswith(unit):
            number = text[: -len(unit)]
            if number.isdigit() and int(number) > 0:
                return int(number) * _UNITS[unit]
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise ValueError(f"size {text!r}: expected a positive number of B, KiB, MiB or GiB")


# The experts of the MoE layer (moe.measure's default, DeepSeek-V3's 256): every EP size the demo runs divides them.
_EXPERTS = inspect.signature(moe.measure).parameters["experts"].default


def _whole_at_least(ap, flag, value, lo, hi=64000):
    if not lo <= value <= hi:
        ap.error(f"{flag} {value}: expected {lo}..{hi}")


def _sizes(ap, flag, text):
    """The fp32 AllReduce sizes of a flag; ap.error names the flag and the size."""
    try:
        sizes = [parse_size(s) for s in text.split(",")]
    except ValueError as e:
        ap.error(f"{flag}: {e}")
    for size in sizes:
        if size % 4:
            ap.error(f"{flag} {text!r}: {size} B is not a whole number of fp32 elements")
    return sizes


def _check_moe_args(ap, args):
    """The MoE section's options, before the AllReduce section runs (they were refused minutes into the demo)."""
    for flag in ("moe_tokens", "moe_sweep_tokens", "moe_hidden", "deepep_ep", "deepep_tokens"):
        _whole_at_least(ap, "--" + flag.replace("_", "-"), getattr(args, flag), 1, 2**31 - 1)
    for flag, ep in (("--gpus", args.gpus), ("--deepep-ep", min(args.deepep_ep, args.gpus))):
        if _EXPERTS % ep:
            ap.error(f"{flag} {ep}: the MoE layer's EP size must divide its {_EXPERTS} experts (or give --no-moe)")
    if args.gpu_profile and moe.available():
        try:
            moe._native.gpu_profile_summary(args.gpu_profile)
        except ValueError as e:
            ap.error(f"--gpu-profile: {e}")


def _make_out(ap, out):
    """Creates OUT_DIR first: a file there, or a folder that cannot be made, was found after the first runs."""
    if not out:
        ap.error("OUT_DIR '': expected a folder (the files would land in /)")
    try:
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        ap.error(f"OUT_DIR {out!r} exists and is not a folder")
    except OSError as e:
        ap.error(f"OUT_DIR {out!r}: cannot make it: {e.strerror}")
    if not os.access(out, os.W_OK | os.X_OK):
        ap.error(f"OUT_DIR {out!r} is not writable")


def check_args(ap, args):
    """Every option checked and OUT_DIR made before the first simulation; returns (sizes, amdahl_size)."""
    _whole_at_least(ap, "--gpus", args.gpus, 2)
    _whole_at_least(ap, "--amdahl-gpus", args.amdahl_gpus, 2)
    _whole_at_least(ap, "--planes", args.planes, 1, 256)
    sizes = _sizes(ap, "--sizes", args.sizes)
    (amdahl_size,) = _sizes(ap, "--amdahl-size", args.amdahl_size)
    if not args.no_moe:
        _check_moe_args(ap, args)
    _make_out(ap, args.out)
    return sizes, amdahl_size


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--sizes", default="1MiB,4MiB")
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--planes", type=int, default=4)
    # The Amdahl comparison wants a bandwidth-bound point, as the paper's 8 GiB one is; 64 MiB on 16 GPUs is one that
    # simulates in about a minute on two cores (on 64 GPUs the ring is still latency-bound below ~64 MiB).
    ap.add_argument("--amdahl-size", default="64MiB")
    ap.add_argument("--amdahl-gpus", type=int, default=16)
    # 256 keeps the whole demo near ten minutes on two cores; 512 takes about four minutes more.
    ap.add_argument("--moe-tokens", type=int, default=256, help="tokens per GPU of the MoE layer point")
    ap.add_argument("--moe-sweep-tokens", type=int, default=64, help="tokens per GPU of the EP x top-k sweep")
    ap.add_argument("--moe-hidden", type=int, default=7168)
    ap.add_argument("--no-moe", action="store_true")
    ap.add_argument("--deepep-ep", type=int, default=8,
                    help="EP size of DeepEP's normal point (8: its intranode benchmark)")
    ap.add_argument("--deepep-tokens", type=int, default=4096, help="tokens per GPU of DeepEP's normal point")
    ap.add_argument("--gpu-profile", default="", help="the experts' GPU model (YAML/JSON; default: the fitted H100)")
    args = ap.parse_args(argv)
    sizes, amdahl_size = check_args(ap, args)
    topo = ifec.make_superpod(args.gpus, args.planes)
    rows = []
    print(f"AllReduce fp32, {args.gpus} GPUs x {args.planes} planes (800G as 2 x 400G) [driver: sim]")
    print("baseline: the best endpoint algorithm at each size (ring, tree, recursive doubling or one-shot, chosen by "
          "the communicator's cost model of this fabric)")
    print(f"{'size(B)':>12} {'best':>8} {'best us':>10} {'ifec us':>10} {'speedup':>8} {'best MB/GPU':>12} "
          f"{'ifec MB/GPU':>12}")
    for size in sizes:
        pair = {}
        for algo in ("best", "ifec"):
            t0 = time.time()
            row = collectives.measure(topo, algo=algo, bytes=size)
            if not row["ok"] or row["wrong"]:
                sys.exit(f"{algo} AllReduce of {size} B failed: {row.get('error', 'wrong results')}")
            row["wall_s"] = round(time.time() - t0, 2)
            rows.append(row)
            pair[algo] = row
        per_gpu = {a: sum(r["plane_tx_bytes"]) / args.gpus / 1e6 for a, r in pair.items()}
        print(f"{size:>12} {pair['best']['ran']:>8} {pair['best']['time_us']:>10.2f} {pair['ifec']['time_us']:>10.2f} "
              f"{pair['best']['time_us'] / pair['ifec']['time_us']:>7.2f}x {per_gpu['best']:>12.2f} "
              f"{per_gpu['ifec']:>12.2f}", flush=True)
    largest = [r for r in rows if r["size"] == max(sizes)]
    amdahl_topo = ifec.make_superpod(args.amdahl_gpus, args.planes)
    point = {a: collectives.measure(amdahl_topo, algo=a, bytes=amdahl_size) for a in ("best", "ifec")}
    for a, r in point.items():
        if not r["ok"] or r["wrong"]:
            sys.exit(f"{a} AllReduce of {amdahl_size} B on {args.amdahl_gpus} GPUs failed")
    ring, inc = point["best"], point["ifec"]
    print(f"Amdahl point: {amdahl_size >> 20} MiB on {args.amdahl_gpus} GPUs: best ({ring['ran']}) "
          f"{ring['time_us']:.1f} us, "
          f"in-switch {inc['time_us']:.1f} us ({ring['time_us'] / inc['time_us']:.2f}x; "
          f"bound 2(N-1)/N = {2 * (args.amdahl_gpus - 1) / args.amdahl_gpus:.3f})")
    rows.extend(point.values())
    amdahl = reports.plot_amdahl(f"{args.out}/amdahl.png", measured=dict(
        ring_time_s=ring["time_us"] * 1e-6, ifec_time_s=inc["time_us"] * 1e-6,
        label=f"this testbed [driver: sim; communication only, no GPU profile]:\n"
              f"{amdahl_size >> 20} MiB on {args.amdahl_gpus} GPUs, best ({ring['ran']}) "
              f"{ring['time_us']:.0f} us vs in-switch {inc['time_us']:.0f} us"))
    reports.write_json(f"{args.out}/allreduce.json", rows)
    reports.write_csv(f"{args.out}/allreduce.csv", rows)
    wire_rows = [dict(variant=f"baseline (best: {r['ran']})" if r["algo"] == "best" else "ifec", plane=p, bytes=b)
                 for r in largest for p, b in enumerate(r["plane_tx_bytes"])]
    wire = reports.plot_wire_bytes(
        f"{args.out}/allreduce_wire_bytes.png", wire_rows,
        context=f"AllReduce of {max(sizes) >> 20} MiB fp32 on {args.gpus} GPUs x {args.planes} planes: frames sent by "
                f"all GPUs (headers, ACKs included); baseline = the best endpoint algorithm [driver: sim; no expert "
                f"compute, so no GPU profile]")
    for path in (amdahl, wire):
        if not reports.is_png(path):
            sys.exit(f"{path} is not a valid PNG")
    ref = reports.hoefler_reference()
    print(f"Amdahl (Hoefler et al. inputs): {100 * ref['comm_saving']:.1f}% AllReduce saving -> overall "
          f"{100 * ref['gain_at_20pct']:.1f}% at 20% communication, {100 * ref['gain_at_60pct']:.1f}% at 60%")
    print(f"wrote {args.out}/allreduce.csv, allreduce.json, {amdahl.name}, {wire.name}")
    if not args.no_moe:
        moe_section(args)


def deepep_point(args, topo, hidden, profile, fp8):
    """DeepEP's normal point (4096 tokens per GPU, FP8 dispatch), simulated directly in timing mode, each variant
    with and without the two-micro-batch overlap; returns its rows."""
    ep, tokens = min(args.deepep_ep, args.gpus), args.deepep_tokens
    print(f"\nDeepEP normal point: EP {ep}, {tokens} tokens per GPU, every row simulated (timing mode), dispatch "
          f"{'FP8' if fp8 else 'bf16'}, combine bf16; layer = dispatch + experts (modelled) + combine", flush=True)
    rows = []
    for variant in moe.VARIANTS:
        t0 = time.time()
        (r,) = moe.measure(topo, ep, tokens, variants=[variant], mode="normal", hidden=hidden, gpu_profile=profile,
                           fp8_dispatch=fp8, overlap=True)
        rows.append(r)
        print(f"  {variant:<10}: dispatch {r['dispatch_us']:7.1f} us ({100 * r['dispatch_line_fraction']:.0f}% of "
              f"line rate), combine {r['combine_us']:7.1f} us ({100 * r['combine_line_fraction']:.0f}%), experts "
              f"{r['compute_us']:7.1f} us; layer {r['total_us']:7.1f} us, overlapped {r['overlap_us']:7.1f} us "
              f"({time.time() - t0:.0f} s wall)", flush=True)
    base = min(rows[:2], key=lambda r: r["total_us"])
    base_o = min(rows[:2], key=lambda r: r["overlap_us"])
    print(f"  IFEC layer: {base['total_us'] / rows[2]['total_us']:.2f}x the best baseline, overlapped "
          f"{base_o['overlap_us'] / rows[2]['overlap_us']:.2f}x; overlap saves "
          + ", ".join(f"{r['variant']} {100 * (1 - r['overlap_us'] / r['total_us']):.0f}%" for r in rows), flush=True)
    return rows


def moe_section(args):
    """The MoE layer at the scaled point in all three variants, the TP AllReduce beside it, and the sweeps."""
    if not moe.available():
        print("MoE layer skipped: this build has no LibTorch (install libtorch-dev and rebuild)")
        return
    topo = ifec.make_superpod(args.gpus, args.planes)
    ep, tokens, hidden = args.gpus, args.moe_tokens, args.moe_hidden
    profile = getattr(args, "gpu_profile", "") or ""
    fp8 = hidden % 128 == 0  # DeepEP's FP8 dispatch needs whole 128-channel blocks
    print(f"\nMoE layer, DeepSeek-V3 routing (hidden {hidden}, top-8 of 256 experts; dispatch "
          f"{'FP8 E4M3 + a scale per 128 channels' if fp8 else 'bf16'}, combine bf16), EP {ep}, "
          f"{tokens} tokens per GPU, {args.gpus} GPUs x {args.planes} planes [dispatch/combine: sim; experts: "
          f"modelled at width 2048 by {moe._native.gpu_profile_summary(profile)}; outputs checked against the "
          f"LibTorch reference at width 8 on the same dequantised rows, tolerance 2e-2; overlap: two micro-batches, "
          f"DeepEP's schedule]", flush=True)
    rows = []
    for variant in moe.VARIANTS:
        t0 = time.time()
        (row,) = moe.measure(topo, ep, tokens, variants=[variant], hidden=hidden, compute=True, gpu_profile=profile,
                             fp8_dispatch=fp8, overlap=True)
        rows.append(row)
        print(f"  {variant}: dispatch {row['dispatch_us']:.1f} us, combine {row['combine_us']:.1f} us, "
              f"max error vs reference {row['max_rel_error']:.2e} ({time.time() - t0:.0f} s wall)", flush=True)
        if row["max_rel_error"] > 2e-2:
            sys.exit(f"MoE {variant}: output differs from the reference by {row['max_rel_error']:.3g} (> 2e-2)")
    # The tensor-parallel AllReduce of the same tokens' activations (one TP group of 8 GPUs), best vs in-switch.
    tp = min(8, args.gpus)
    ar_bytes = tokens * hidden * 2
    tp_topo = ifec.make_superpod(tp, args.planes)
    ar = {a: collectives.measure(tp_topo, algo=a, bytes=ar_bytes, dtype="bf16") for a in ("best", "ifec")}
    for a, r in ar.items():
        if not r["ok"] or r["wrong"]:
            sys.exit(f"TP AllReduce ({a}) of {ar_bytes} B failed: {r.get('error', 'wrong results')}")
    by = {r["variant"]: r for r in rows}
    cols = list(moe.VARIANTS)
    ar_of = {"per_expert": ar["best"], "per_rank": ar["best"], "ifec": ar["ifec"]}
    table = []
    for v in cols:
        r = by[v]
        total = ar_of[v]["time_us"] + r["total_us"]
        table.append(dict(variant=v, allreduce_us=ar_of[v]["time_us"], allreduce_algo=ar_of[v]["ran"],
                          dispatch_us=r["dispatch_us"], compute_us=r["compute_us"], combine_us=r["combine_us"],
                          end_to_end_us=total, overlapped_end_to_end_us=ar_of[v]["time_us"] + r["overlap_us"],
                          dispatch_gbs=r["dispatch_gbs"], combine_gbs=r["combine_gbs"],
                          dispatch_logical_MB=r["dispatch_logical_bytes"] / 1e6,
                          dispatch_wire_MB=r["dispatch_wire_bytes"] / 1e6,
                          combine_logical_MB=r["combine_logical_bytes"] / 1e6,
                          combine_wire_MB=r["combine_wire_bytes"] / 1e6, max_rel_error=r["max_rel_error"]))
    best = min((t for t in table if t["variant"] != "ifec"), key=lambda t: t["end_to_end_us"])
    best_o = min((t for t in table if t["variant"] != "ifec"), key=lambda t: t["overlapped_end_to_end_us"])
    for t in table:
        t["speedup_vs_best_baseline"] = best["end_to_end_us"] / t["end_to_end_us"]
        t["overlapped_speedup_vs_best_baseline"] = best_o["overlapped_end_to_end_us"] / t["overlapped_end_to_end_us"]
    print(f"\n{'phase (us)':<28}" + "".join(f"{v:>14}" for v in cols))
    lines = [("TP AllReduce (" + f"{ar_bytes / 2**20:.1f} MiB, {tp} GPUs)", "allreduce_us"),
             ("dispatch", "dispatch_us"), ("experts (modelled)", "compute_us"), ("combine", "combine_us"),
             ("end to end", "end_to_end_us"), ("end to end, overlapped", "overlapped_end_to_end_us")]
    for label, key in lines:
        print(f"{label:<28}" + "".join(f"{t[key]:>14.1f}" for t in table))
    print(f"{'dispatch GB/s per GPU':<28}" + "".join(f"{t['dispatch_gbs']:>14.1f}" for t in table))
    print(f"{'combine GB/s per GPU':<28}" + "".join(f"{t['combine_gbs']:>14.1f}" for t in table))
    for label, key in (("dispatch logical MB", "dispatch_logical_MB"), ("dispatch wire MB", "dispatch_wire_MB"),
                       ("combine logical MB", "combine_logical_MB"), ("combine wire MB", "combine_wire_MB")):
        print(f"{label:<28}" + "".join(f"{t[key]:>14.1f}" for t in table))
    print(f"{'speedup vs best baseline':<28}" + "".join(f"{t['speedup_vs_best_baseline']:>13.2f}x" for t in table))
    print(f"{'  overlapped':<28}" + "".join(f"{t['overlapped_speedup_vs_best_baseline']:>13.2f}x" for t in table))
    print("(AllReduce: the best endpoint algorithm for the baselines, in-switch for ifec; MB: all GPUs together; wire = frames the GPUs "
          "sent, headers and ACKs included; overlapped: the AllReduce, then two micro-batches of half the tokens each, "
          "one's communication under the other's experts; with few tokens per GPU the experts are bound by streaming "
          "their weights, once per micro-batch, so the overlapped layer can be the slower one)", flush=True)
    reports.write_csv(f"{args.out}/moe_layer.csv", table)
    deepep = deepep_point(args, topo, hidden, profile, fp8)
    reports.write_json(f"{args.out}/moe_layer.json", dict(layer=table, moe_rows=rows, allreduce_rows=list(ar.values()),
                                                          deepep_normal_rows=deepep, driver="sim",
                                                          gpu_profile=moe._native.gpu_profile_summary(profile)))

    # Sweep for plot (b): dispatch/combine speedup against EP size and top-k.
    eps = [e for e in (8, 16, 32, 64) if e <= args.gpus] or [args.gpus]
    sweep, speed = [], []
    print(f"\nSweep: EP {eps} x top-k (2, 4, 8), {args.moe_sweep_tokens} tokens per GPU (timing mode)", flush=True)
    for topk in (2, 4, 8):
        t0 = time.time()  # the EP sizes of one top-k run at once, on every core
        rows_k = moe.measure_eps(topo, eps, args.moe_sweep_tokens, hidden=hidden, topk=topk,
                                 gpu_profile=getattr(args, "gpu_profile", ""))
        for e in eps:
            pr = [r for r in rows_k if r["ep"] == e]
            for r in pr:
                r["topk"] = topk
            sweep.extend(pr)
            speed.extend(moe.speedup_rows(pr, topk))
            t = {r["variant"]: r for r in pr}
            base_d = min(t["per_expert"]["dispatch_us"], t["per_rank"]["dispatch_us"])
            base_c = min(t["per_expert"]["combine_us"], t["per_rank"]["combine_us"])
            print(f"  top-{topk} EP {e:>2}: dispatch {base_d:.1f} -> {t['ifec']['dispatch_us']:.1f} us "
                  f"({base_d / t['ifec']['dispatch_us']:.2f}x), combine {base_c:.1f} -> "
                  f"{t['ifec']['combine_us']:.1f} us ({base_c / t['ifec']['combine_us']:.2f}x)", flush=True)
        print(f"  (top-{topk}: {len(eps)} EP sizes in {time.time() - t0:.0f} s wall)", flush=True)
    reports.write_csv(f"{args.out}/moe_sweep.csv", sweep)
    reports.write_json(f"{args.out}/moe_sweep.json", sweep)
    plot_b = reports.plot_dispatch_combine(
        f"{args.out}/moe_speedup.png", speed,
        context=f"{args.moe_sweep_tokens} tokens per rank, hidden {hidden}, bf16 rows; dispatch/combine times "
                f"on {args.gpus} GPUs x {args.planes} planes [driver: sim; communication only, no GPU profile]")
    plot_c = reports.plot_wire_bytes(
        f"{args.out}/moe_wire_bytes.png", moe.wire_rows(rows),
        context=f"MoE dispatch + combine, EP {ep}, {tokens} tokens per rank, top-8: frames sent by all GPUs; "
                f"baseline = per_rank [driver: sim; communication only, no GPU profile]")
    for path in (plot_b, plot_c):
        if not reports.is_png(path):
            sys.exit(f"{path} is not a valid PNG")
    print(f"wrote {args.out}/moe_layer.csv, moe_layer.json, moe_sweep.csv, moe_sweep.json, {plot_b.name}, "
          f"{plot_c.name}")


if __name__ == "__main__":
    main()
