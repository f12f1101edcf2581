"""The MoE layer through the pybind11 module: every variant equals the LibTorch reference, IFEC moves fewer bytes
where it should, in-switch AllReduce is at least as fast as ring from 1 MiB up, and bad input is named."""

import pytest

import ifec
from ifec import collectives, moe

pytestmark = pytest.mark.skipif(not moe.available(), reason="built without LibTorch")


@pytest.mark.parametrize("bf16,tolerance", [(False, 1e-5), (True, 2e-2)])
def test_every_variant_equals_the_reference(bf16, tolerance):
    # fp32: the same sums up to order (1e-5 of the largest output); bf16: rows travel in bf16 and IFEC's switch
    # rounds its fp32 sum to bf16 once more (2e-2).
    rows = moe.measure(ifec.make_superpod(8, 2), 8, 16, hidden=64, run_inter=16, bf16=bf16, compute=True)
    assert [r["variant"] for r in rows] == list(moe.VARIANTS)
    for r in rows:
        assert 0 <= r["max_rel_error"] < tolerance, r
        assert r["dispatch_us"] > 0 and r["combine_us"] > 0 and r["compute_us"] > 0
        assert r["total_us"] == pytest.approx(r["dispatch_us"] + r["compute_us"] + r["combine_us"])
        assert r["fallback_chunks"] == 0


def test_ifec_sends_each_token_once_and_per_rank_deduplicates():
    rows = {r["variant"]: r for r in moe.measure(ifec.make_superpod(16, 4), 16, 32, hidden=512)}
    pe, pr, fc = rows["per_expert"], rows["per_rank"], rows["ifec"]
    assert pr["dispatch_logical_bytes"] < pe["dispatch_logical_bytes"]
    assert fc["dispatch_logical_bytes"] == pr["dispatch_logical_bytes"]
    # A token with k remote ranks leaves its GPU once instead of k times.
    assert fc["dispatch_wire_bytes"] * 2 < pr["dispatch_wire_bytes"]
    assert sum(fc["dispatch_wire_per_plane"]) == fc["dispatch_wire_bytes"]
    assert len(fc["combine_wire_per_plane"]) == 4
    assert fc["dispatch_us"] <= pr["dispatch_us"] and fc["combine_us"] <= pr["combine_us"]


@pytest.mark.parametrize("ep", [8, 64])
def test_every_variant_spreads_its_bytes_over_the_planes_by_the_fare_weights(ep):
    # Every plane healthy, so FARE weighs them equally: each plane carries within 2% of the mean, dispatch and
    # combine, for the baselines too (their stores once put every short tail packet and every peer's first stripe
    # on the low-numbered QPs: the last plane carried about 30% fewer bytes).
    for r in moe.measure(ifec.make_superpod(64, 4), ep, 64, hidden=7168):
        for phase in ("dispatch", "combine"):
            planes = r[f"{phase}_wire_per_plane"]
            mean = sum(planes) / len(planes)
            assert max(abs(b / mean - 1) for b in planes) <= 0.02, (r["variant"], phase, planes)


def test_fp8_dispatch_rows_are_e4m3_plus_scales_and_equal_the_reference():
    # hidden 256: two 128-channel blocks, so a dispatched row is 256 E4M3 bytes + 2 fp32 scales; combine rows stay
    # 256 bf16 elements. The reference's experts see the same dequantised rows (tolerance as bf16).
    rows = moe.measure(ifec.make_superpod(8, 2), 8, 16, hidden=256, run_inter=16, compute=True, fp8_dispatch=True)
    for r in rows:
        assert r["fp8_dispatch"] and 0 <= r["max_rel_error"] < 2e-2, r
        assert r["dispatch_logical_bytes"] % 264 == 0
        assert r["dispatch_logical_bytes"] // 264 == r["combine_logical_bytes"] // 512, r["variant"]
    with pytest.raises(Exception, match="hidden 64"):
        moe.measure(ifec.make_superpod(8, 2), 8, 4, hidden=64, fp8_dispatch=True)


def test_rows_give_line_rate_fractions_their_bound_and_the_overlapped_layer():
    for r in moe.measure(ifec.make_superpod(16, 4), 16, 64, hidden=7168, fp8_dispatch=True, overlap=True):
        assert r["line_gbs"] == pytest.approx(4 * 800 / 8)  # 4 planes x 800 Gb/s
        assert r["dispatch_line_fraction"] == pytest.approx(r["dispatch_gbs"] / r["line_gbs"])
        # The bound is a lower bound on each phase's time (the busiest GPU's bytes at line rate).
        assert 0 < r["dispatch_bound_us"] <= r["dispatch_us"] and 0 < r["combine_bound_us"] <= r["combine_us"]
        # The overlapped layer: at least its experts (the compute stream never overlaps itself), in either schedule.
        assert r["overlap_us"] >= 0.9 * r["compute_us"]
        assert r["overlap2_us"] >= 0.9 * r["compute_us"]


def test_elided_payloads_give_the_same_rows_and_say_timing_only():
    topo = ifec.make_superpod(8, 2)
    real = moe.measure(topo, 8, 16, hidden=512)
    elided = moe.measure(topo, 8, 16, hidden=512, payload="elided")
    for a, b in zip(real, elided):
        assert not a["timing_only"] and a["payload"] == "real"
        assert b["timing_only"] and b["payload"] == "elided"
        for key in ("dispatch_us", "combine_us", "dispatch_wire_per_plane", "combine_wire_per_plane"):
            assert a[key] == b[key], (a["variant"], key)
    with pytest.raises(Exception, match="elided"):
        moe.measure(topo, 8, 4, hidden=64, compute=True, payload="elided")
    with pytest.raises(ValueError, match="'fake'"):
        moe.measure(topo, 8, 4, payload="fake")


def test_partitioned_runs_give_the_same_rows_on_one_thread_and_two_and_equal_the_reference():
    topo = ifec.make_superpod(8, 2)
    one, two = (moe.measure(topo, 8, 8, hidden=64, inter=32, compute=True, threads=t) for t in (1, 2))
    for a, b in zip(one, two):
        assert a["ok"], a
        for key in ("dispatch_us", "combine_us", "dispatch_wire_per_plane", "combine_wire_per_plane", "max_rel_error"):
            assert a[key] == b[key], (a["variant"], key)


def test_ep_sizes_at_once_give_the_serial_rows():
    topo = ifec.make_superpod(16, 2)
    parallel = moe.measure_eps(topo, [8, 16], 16, hidden=512, topk=4, jobs=2)
    serial = [r for e in (8, 16) for r in moe.measure(topo, e, 16, mode="sweep", hidden=512, topk=4)]
    assert [(r["ep"], r["variant"]) for r in parallel] == [(r["ep"], r["variant"]) for r in serial]
    for a, b in zip(parallel, serial):
        assert {k: v for k, v in a.items() if k != "wall_seconds"} == {k: v for k, v in b.items()
                                                                        if k != "wall_seconds"}


def test_scaled_points_say_so():
    (r,) = moe.measure(ifec.make_superpod(8, 2), 8, 64, variants=["ifec"], hidden=256, token_cap=16)
    assert r["scaled"] and r["simulated_tokens"] == 16 and r["tokens"] == 64


@pytest.mark.parametrize("size", [1 << 20, 4 << 20])
def test_in_switch_allreduce_is_at_least_as_fast_as_ring_from_1mib(size):
    topo = ifec.make_superpod(16, 4)
    ring = collectives.measure(topo, algo="ring", bytes=size)
    inc = collectives.measure(topo, algo="ifec", bytes=size)
    assert ring["ok"] and inc["ok"] and ring["wrong"] == 0 and inc["wrong"] == 0
    assert inc["time_us"] <= ring["time_us"]


@pytest.mark.parametrize("kwargs,named", [(dict(ep=3), "EP size 3"), (dict(ep=128), "EP size 128"),
                                          (dict(variants=["sharp"]), "sharp"), (dict(tokens=0), "tokens per rank 0"),
                                          (dict(mode="bogus"), "mode 'bogus'"),
                                          # sizes whose data outgrows the machine: named before any is allocated
                                          (dict(hidden=10**9), "hidden 1000000000, 256 experts, top-8 needs about"),
                                          (dict(run_inter=10**6, compute=True), "run_inter 1000000 needs about"),
                                          (dict(tokens=10**12), "x 1000000000000 tokens per rank"),
                                          (dict(threads=1, gpu_groups=100), "GPU groups 100 outside 1..8")])
def test_bad_arguments_are_named(kwargs, named):
    args = dict(topology=ifec.make_superpod(8, 2), ep=8, tokens=4, hidden=64)
    args.update(kwargs)
    with pytest.raises(ValueError, match=named):
        moe.measure(**args)


def test_rows_say_whether_they_are_right():
    rows = moe.measure(ifec.make_superpod(8, 2), ep=8, tokens=4, hidden=64, compute=True)
    for r in rows:
        assert r["ok"] and 0 <= r["max_rel_error"] <= r["tolerance"], r


def test_ifec_phases_beat_per_rank_without_retransmission_bloat():
    """EP 32 at 128 tokens per rank: the in-fabric phases are faster than the per-rank baseline and the combine puts
    no more bytes on the wire than it (a regression once sent 2.7x the bytes: retransmissions from windows too deep
    for the receivers' fan-in)."""
    rows = {r["variant"]: r for r in moe.measure(ifec.make_superpod(32, 4), ep=32, tokens=128,
                                                 variants=["per_rank", "ifec"])}
    base, inc = rows["per_rank"], rows["ifec"]
    assert inc["dispatch_us"] < base["dispatch_us"] and inc["combine_us"] < base["combine_us"], (base, inc)
    assert inc["combine_wire_bytes"] <= 1.02 * base["combine_wire_bytes"]
    assert inc["dispatch_wire_bytes"] < 0.25 * base["dispatch_wire_bytes"]
    assert inc["fallback_chunks"] == 0 and inc["faults"] == []


def test_measure_eps_checks_its_arguments_as_measure_does(repo):
    topo = ifec.make_superpod(8, 2)
    small = dict(hidden=64, experts=16, topk=2, inter=64)
    for kwargs, error, named in [(dict(eps=8), TypeError, "eps=8: expected a list of EP sizes"),
                                 (dict(eps=[8.7]), TypeError, "eps=8.7: expected a whole number"),
                                 (dict(eps=[]), ValueError, r"eps=\[\]: expected at least one EP size"),
                                 (dict(tokens=4.9), TypeError, "tokens=4.9: expected a whole number"),
                                 (dict(jobs=100000), ValueError, "jobs=100000 outside 0..4096"),
                                 (dict(jobs=-1), ValueError, "jobs=-1 outside 0..4096")]:
        args = dict(eps=[8], tokens=4, jobs=1)
        args.update(kwargs)
        with pytest.raises(error, match=named):
            moe.measure_eps(topo, **args, **small)
    # One variant given as a string, a path for the topology, and more jobs than runs (no more threads are made).
    rows = moe.measure_eps(str(repo / "testbed/topologies/superpod-8x2.yaml"), [8], 4, variants="ifec", jobs=4096,
                           **small)
    assert [r["variant"] for r in rows] == ["ifec"]


@pytest.mark.parametrize("call,named", [
    # overflowing widths: nan us, and an inter of 2^62 modelled its experts in 0 us
    (lambda: ifec._native.gpu_model_us("", "grouped", [4], hidden=2**62, inter=2**62),
     "GPU model: hidden 4611686018427387904 and inter 4611686018427387904 must each be 1..1073741824"),
    (lambda: ifec._native.gpu_model_us("", "grouped", [2**41]),
     r"tokens_per_expert\[0\]=2199023255552: the experts' rows exceed 1099511627776"),
    (lambda: moe.measure(ifec.make_superpod(8, 2), 8, 4, hidden=64, experts=16, topk=2, inter=2**62),
     "MoeConfig.hidden 64 and inter 4611686018427387904 must each be at most 1073741824"),
    # the native layer took a negative cap for none, and GPU groups on one event loop for nothing
    (lambda: ifec._native.run_moe_json(ifec.make_superpod(8, 2), "scaled", 8, 4, ["ifec"], 64, 16, 2, 64,
                                       token_cap=-1), r"MoE point: token_cap -1 \(0: every token"),
    (lambda: ifec._native.run_moe_json(ifec.make_superpod(8, 2), "scaled", 8, 4, ["ifec"], 64, 16, 2, 64,
                                       gpu_groups=2), "cluster: GPU groups 2 on one event loop"),
], ids=["model-widths", "model-rows", "point-inter", "native-token-cap", "native-gpu-groups"])
def test_values_the_model_or_the_native_layer_took_silently_are_named(call, named):
    with pytest.raises(ifec.IfecError, match=named):
        call()
