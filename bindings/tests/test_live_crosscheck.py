"""The simulator and the live testbed on the same scenario: paced-4x2 (4 GPUs, 2 planes, 2 x 10 Mb/s Y-cables, slow
enough that the software switches on two cores keep up, so the link rates bound the transfers), the simulator
given the live daemons' timers (live_timing). Both must put the same bytes on each plane, link and sub-link, and take
the same time within 10% (medians of several runs, the machine's noise aside)."""

import statistics

import pytest

from conftest import live_fabric, live_marks
from ifec import live

TOPO = "testbed/topologies/paced-4x2.yaml"

pytestmark = live_marks(120)


fab = live_fabric(TOPO, ready_timeout=60)


@pytest.mark.parametrize("algo", ["ring", "ifec"])
def test_sim_and_live_agree_on_bytes_per_plane_and_bandwidth_bound_time(fab, algo):
    """8 MiB, bandwidth-bound: the simulated time is at least the link rates' bound, the live total time (the control
    plane included) within 10% of it, every sub-link's bytes in each direction within 3% (a link's bytes depend on how
    the endpoint and the switch spread packets over the Y-cable's sub-links: the same code on both sides), in the
    median of three runs (a wall-clock run's odd retransmission aside)."""
    size = 8 << 20  # the fixed costs of a live operation (gRPC plan rounds, ~10 ms) stay a few percent
    ratios, links = [], []
    for seed in (1, 2, 3):
        sim, lv = live.compare(fab, "allreduce", algo, size, seed=seed)
        assert sim["ok"] and lv["ok"], (sim.get("error"), lv.get("error"))
        assert sim["driver"] == "sim" and lv["driver"] == "live"
        assert all(s > size // 2 for s in sim["plane_tx_bytes"]) and len(sim["gpu_link_ids"]) == 16
        assert sorted(sim["gpu_link_ids"]) == sorted(lv["gpu_link_ids"])
        links.append(live.link_deviation(sim, lv))
        ratios.append(lv["time_us"] / sim["time_us"])
    # Bandwidth-bound: the sim's time is the link rates' (at least the bytes one GPU sends over its two planes).
    per_gpu_bits = (2 * 3 / 4 if algo == "ring" else 1) * size * 8
    cable_bps = sum(l["rate_gbps"] for l in fab.topo.links if l["a"] == "gpu0" and l["plane"] == 0) * 1e9
    assert sim["time_us"] >= per_gpu_bits / (2 * cable_bps) * 1e6 * 0.95
    assert statistics.median(links) <= live.BYTES_TOLERANCE, f"largest sub-link deviation per run {links}"
    assert 0.9 <= statistics.median(ratios) <= 1.10, f"live/sim time ratios {ratios}"


def test_the_sweep_64k_to_4m_agrees_within_3_percent_bytes_and_10_percent_time(fab, capsys):
    """`./ifec live compare` on the paced topology (issue 34's cross-validation), printed with its verdicts: ring and
    in-fabric AllReduce from 64 KiB to 4 MiB, and the all-to-all (RC stores) from 64 KiB to 1 MiB per peer. At every
    point, in the median of five runs (a wall-clock run's odd retransmission aside): the bytes per plane, per link of
    the topology file (a GPU's Y-cable to a switch) and per sub-link within 3% (the simulator starts from the live
    run's turns; endpoints and switches spread bytes over a Y-cable's sub-links by the same rotation), and the data
    path's time (the control plane's plan and report apart) within 10%."""
    lines = ["", "# paced-4x2: data-path times and bytes, live vs sim (seed 1 of 5)", live.COMPARE_HEADER]
    sizes = (64 << 10, 256 << 10, 1 << 20, 4 << 20)
    points = [("allreduce", algo, size) for algo in ("ring", "ifec") for size in sizes]
    points += [("alltoall", "stores", size) for size in (64 << 10, 256 << 10, 1 << 20)]
    runs = {}
    for what, algo, size in points:
        for seed in (1, 2, 3, 4, 5):
            sim, lv = live.compare(fab, what, algo, size, seed=seed)
            assert sim["ok"] and lv["ok"], (what, algo, size, sim.get("error"), lv.get("error"))
            if seed == 1:
                lines.append(live.compare_text(size, sim, lv, fab.topo.links))
            runs.setdefault((algo, size), []).append(
                (lv["data_us"] / sim["data_us"], live.plane_deviation(sim, lv),
                 live.link_deviation(sim, lv, fab.topo.links), live.link_deviation(sim, lv)))
    medians = {k: [statistics.median(r[i] for r in v) for i in range(4)] for k, v in runs.items()}
    lines.append("# medians of 5 (live/sim data-path time, planes, links, sub-links): " +
                 "; ".join(f"{a} {s >> 10} KiB {m[0]:.3f} {m[1]:.2%} {m[2]:.2%} {m[3]:.2%}"
                           for (a, s), m in medians.items()))
    with capsys.disabled():
        print("\n".join(lines))
    for (algo, size), (time, planes, links, subs) in medians.items():
        assert abs(time - 1) <= live.TIME_TOLERANCE, f"{algo} {size} B: {runs[(algo, size)]}"
        assert max(planes, links, subs) <= live.BYTES_TOLERANCE, f"{algo} {size} B: {runs[(algo, size)]}"


def test_an_moe_step_agrees_on_bytes_and_the_in_fabric_variant_on_time(fab, capsys):
    """One MoE layer (MOE_COMPARE_SHAPE, 128 tokens per rank, bf16) in each variant, live and simulated from the same
    tokens, routing, weights and turns (`./ifec live compare moe`), five seeds. Every variant: each phase's bytes sent
    the first time within 3% in total (the same rows, headers and ACKs), in the median of five; packets sent again
    (RC retransmissions, ECH resends: the simulator takes none, a wall-clock run on a loaded machine may) are
    counted apart, printed, and in the median under a quarter of the phase's bytes. The in-fabric variant
    (multicast dispatch, reduced combine): per plane within 3% and each phase's data-path time within 10%, in the
    median of five; a run whose daemons the host stalled (`live.host_stalled`: all of them unscheduled for tens of
    milliseconds at once, seen in one run of ten) is taken again, at most twice. The baselines' per-plane split and
    times are printed, not asserted: their small stores pick a plane per peer by a rotation the endpoint carries
    across operations and the turns do not record yet."""
    lines = ["", "# MoE step on paced-4x2, 128 tokens per rank: data-path times and bytes, live vs sim",
             live.MOE_COMPARE_HEADER]
    ifec, totals, resent = [], {}, {}
    for variant in ("per_expert", "per_rank", "ifec"):
        for seed in (1, 2, 3, 4, 5):
            for attempt in range(3):  # the in-fabric variant's time: a run the host stalled is taken again
                sim, lv = live.compare(fab, "moe", variant, 128, seed=seed)
                assert sim["ok"] and lv["ok"], (variant, seed, sim.get("error"), lv.get("error"))
                lines.append(live.moe_compare_text(128, sim, lv))
                if variant != "ifec" or not live.host_stalled(lv):
                    break
                lines.append(f"# seed {seed}: the host stalled the daemons (stall ms), taken again")
            for ph in ("dispatch", "combine"):
                totals.setdefault((variant, ph), []).append(live.first_sent_ratio(sim, lv, ph))
                resent.setdefault((variant, ph), []).append(lv[f"{ph}_resent_bytes"] / lv[f"{ph}_wire_bytes"])
            if variant == "ifec":
                ifec.append(live.moe_deviations(sim, lv))
    with capsys.disabled():
        print("\n".join(lines))
    for key, ratios in totals.items():
        assert abs(statistics.median(ratios) - 1) <= live.BYTES_TOLERANCE, (key, ratios, "resent", resent[key])
        assert statistics.median(resent[key]) <= 0.25, (key, "resent", resent[key])
    for ph in ("dispatch", "combine"):
        time = statistics.median(d[ph][0] for d in ifec)
        planes = statistics.median(d[ph][1] for d in ifec)
        assert abs(time - 1) <= live.TIME_TOLERANCE, (ph, [d[ph] for d in ifec])
        assert planes <= live.BYTES_TOLERANCE, (ph, [d[ph] for d in ifec])
