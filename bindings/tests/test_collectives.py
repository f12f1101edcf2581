"""In-switch and ring AllReduce from Python against numpy, plus the nccl-tests row and its wire-byte saving."""

import re

import numpy as np
import pytest

import ifec
from ifec import collectives as coll


def cluster(n=8, planes=2, loss=0.0):
    c = ifec.Cluster(ifec.make_superpod(n, planes), ordering="weak", loss=loss, seed=4)
    return c


@pytest.mark.parametrize("algo", ["ifec", "ring"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "int32"])
def test_allreduce_matches_numpy(algo, dtype):
    c = cluster()
    rng = np.random.default_rng(5)
    count = 3000
    coll.prepare(c, count, dtype)
    if dtype == "int32":
        arrays = [rng.integers(-1000, 1000, count).astype(np.int32) for _ in range(8)]
    else:
        arrays = [rng.standard_normal(count).astype(np.float32).astype(coll._DTYPES[dtype]) for _ in range(8)]
    out, res = coll.allreduce(c, arrays, algo=algo, dtype=dtype)
    assert res["ok"], res["error"]
    ref = np.sum(np.stack([a.astype(np.float64) for a in arrays]), axis=0)
    for o in out:
        if dtype == "int32":
            np.testing.assert_array_equal(o, ref.astype(np.int32))
        else:
            tol = 8 * (1e-3 if dtype == "fp16" else 1e-6) * np.sum(np.abs(np.stack(arrays).astype(np.float64)), axis=0)
            assert np.all(np.abs(o.astype(np.float64) - ref) <= tol + 1e-6)


def test_bf16_in_switch_is_more_precise_than_ring():
    rng = np.random.default_rng(9)
    arrays32 = [rng.standard_normal(4096).astype(np.float32) for _ in range(8)]
    arrays = [coll.to_bf16_bits(a) for a in arrays32]
    ref = np.sum(np.stack([coll.from_bf16_bits(a).astype(np.float64) for a in arrays]), axis=0)
    err = {}
    for algo in ["ifec", "ring"]:
        c = cluster()
        coll.prepare(c, 4096, "bf16")
        out, res = coll.allreduce(c, arrays, algo=algo, dtype="bf16")
        assert res["ok"]
        err[algo] = np.max(np.abs(coll.from_bf16_bits(out[0]).astype(np.float64) - ref))
    assert err["ifec"] < err["ring"], err


def test_measure_row_and_wire_bytes():
    topo = ifec.make_superpod(8, 2)
    rows = {a: coll.measure(topo, algo=a, bytes=1 << 20) for a in ["ifec", "ring"]}
    for a, r in rows.items():
        assert r["ok"] and r["wrong"] == 0 and r["driver"] == "sim", r
    sent = {a: sum(r["plane_tx_bytes"]) / 8 for a, r in rows.items()}
    # In-switch: each GPU sends each byte once (plus headers); ring: 2(N-1)/N = 1.75 times.
    assert 1.0 < sent["ifec"] / (1 << 20) < 1.05
    assert 1.70 < sent["ring"] / (1 << 20) < 1.85
    assert rows["ifec"]["time_us"] < rows["ring"]["time_us"]


def test_bad_collective_arguments_name_the_value():
    with pytest.raises(ValueError, match="allgather"):
        coll.measure(ifec.make_superpod(4, 2), kind="allgather")
    with pytest.raises(ValueError, match="fp64"):
        coll.measure(ifec.make_superpod(4, 2), dtype="fp64")


def test_measure_and_allreduce_check_their_arguments():
    topo = ifec.make_superpod(4, 2)
    with pytest.raises(ValueError, match="members=-5 outside 2.."):
        coll.measure(topo, members=-5)
    # Each refused by name, before anything runs (they were bare casts, or wrong types taken).
    for kwargs, error, named in [
            (dict(members="4"), TypeError, "members='4': expected a whole number"),
            (dict(loss=None), TypeError, "loss=None: expected a number"),
            (dict(loss="0.1"), TypeError, "loss='0.1': expected a number"),
            (dict(bytes=float("nan")), TypeError, "bytes=nan: expected a whole number"),
            (dict(members=10**400), ValueError, "outside 2..1048576"),
            (dict(kind="barrier", bytes=64), ValueError, "bytes=64: a barrier moves no data"),
            (dict(slot_pool=2**40), ValueError, "slot_pool=1099511627776 outside 0..4294967295"),
            (dict(turns=[1, 2]), TypeError, r"turns=\[1, 2\]: expected a dict"),
            (dict(turns={"bogus": 1}), ifec.IfecError, "turns: unknown key 'bogus'"),
            (dict(turns={"group": "x"}), ifec.IfecError, "turns: group 'x': expected a group counter"),
            (dict(turns={"stripe": [-1] * 4}), ifec.IfecError, r"turns: stripe \[-1, -1, -1, -1\]: expected a list")]:
        with pytest.raises(error, match=named):
            coll.measure(topo, bytes=kwargs.pop("bytes", 4096), **kwargs)
    assert coll.measure(topo, bytes=4096, threads=2.0, gpu_groups=2.0)["ok"]  # whole floats, as every other count
    assert coll.measure(topo, kind="barrier")["ok"]  # a barrier's size is 0 (1 MiB was the default for every kind)
    with pytest.raises(ValueError, match="members 9 outside 2..4"):
        coll.measure(topo, members=9)
    with pytest.raises(ValueError, match="slot budget 0"):
        coll.measure(topo, slot_budget=0)
    cluster = ifec.Cluster(topo, ordering="weak")
    coll.prepare(cluster, 8)
    with pytest.raises(ValueError, match=r"different lengths \[4, 5\]"):
        coll.allreduce(cluster, [np.zeros(4, np.float32), np.zeros(5, np.float32)])
    with pytest.raises(ValueError, match="1 arrays"):
        coll.allreduce(cluster, [np.zeros(4, np.float32)])


@pytest.mark.parametrize("call,error,named", [
    # "members 1 outside 2..1" named no members given; an all-to-all of one GPU was "ok" in 0 us.
    (lambda: coll.measure(ifec.make_superpod(1, 1), bytes=4096), ifec.IfecError,
     "topology 'superpod-1x1' has 1 GPU: a collective needs 2 or more"),
    (lambda: coll.measure(ifec.make_superpod(1, 1), kind="alltoall", algo="stores", bytes=4096), ifec.IfecError,
     "all-to-all: topology 'superpod-1x1' has 1 GPU"),
    # bytes x GPUs x 2 x GPUs wrapped: "allocated window size 0"
    (lambda: coll.measure(ifec.make_superpod(8, 2), kind="alltoall", algo="stores", bytes=2**61), ifec.IfecError,
     "all-to-all: 2305843009213693952 B per peer on 8 GPUs needs more than"),
    (lambda: coll.measure(ifec.make_superpod(8, 2), kind="alltoall", algo="stores", bytes=64, root=3),
     ifec.IfecError, "all-to-all: root 3: every GPU stores to every other"),  # was ignored
    (lambda: coll.measure(ifec.make_superpod(4, 2), bytes=4096, trace=""), ValueError,
     "trace '': expected a folder"),  # was taken for no trace
    (lambda: coll._native.run_collective_json(ifec.make_superpod(4, 2), "allreduce", "ifec", 4096, gpu_groups=2),
     ifec.IfecError, "GPU groups 2 on one event loop"),  # ignored
], ids=["one-gpu", "one-gpu-alltoall", "alltoall-wrapped-size", "alltoall-root", "empty-trace", "native-gpu-groups"])
def test_measure_names_what_ran_silently_or_was_named_wrong(call, error, named):
    with pytest.raises(error, match=named):
        call()


@pytest.mark.parametrize("kwargs,error,named", [
    (dict(dtype="fp64"), ValueError, "dtype 'fp64': expected one of fp32"),  # KeyError: 'fp64'
    (dict(count=-1), ValueError, "count=-1 outside 0..1099511627776"),  # pybind11's bare signature list
    (dict(count=1.5), TypeError, "count=1.5: expected a whole number"),
    (dict(members=[]), ValueError, "scratch_bytes: members is empty"),  # [] was every GPU
], ids=["dtype", "negative-count", "fractional-count", "no-members"])
def test_prepare_names_its_bad_arguments(kwargs, error, named):
    args = dict(count=16)
    args.update(kwargs)
    with pytest.raises(error, match=named):
        coll.prepare(ifec.Cluster(ifec.make_superpod(4, 2)), **args)


@pytest.mark.parametrize("dtype,value,largest", [("fp16", 1e6, "65504.0"), ("fp32", 1e300, "3.4028234663852886e+38")])
def test_inputs_beyond_the_dtypes_range_are_refused_not_reduced_as_inf(dtype, value, largest):
    c = cluster(4)
    coll.prepare(c, 4, dtype)
    named = f"{dtype} inputs: {value!r} (element 0) is beyond {dtype}'s range (largest {largest})"
    with pytest.raises(ValueError, match=re.escape(named)):
        coll.allreduce(c, [np.full(4, value)] * 4, dtype=dtype)


def test_measure_reports_faults_and_survives_a_lost_plane():
    r = coll.measure(ifec.make_superpod(8, 2), bytes=1 << 20, fail=["gpu5:plane1@2us"], loss=0.01, seed=3)
    assert r["ok"] and r["wrong"] == 0
    assert any("plane 1 given up" in f for f in r["faults"]) and any("frames lost" in f for f in r["faults"])
    assert r["time_us"] < 1000


def test_a_row_counts_what_loss_made_the_members_send_again():
    """Loss adds the packets a row reports sent again (and the answers their copies drew) to the bytes the members
    sent: a clean run's plus `resent_bytes`, exactly for the in-fabric AllReduce; the ring's RC responders also
    answer a gap with NAKs and ACKs of their own (a few frames of at most 72 bytes per frame lost)."""
    topo = ifec.make_superpod(8, 2)
    for algo in ["ring", "ifec"]:
        clean = coll.measure(topo, algo=algo, bytes=1 << 20, seed=3)
        lossy = coll.measure(topo, algo=algo, bytes=1 << 20, loss=0.01, seed=3)
        assert clean["ok"] and lossy["ok"], (algo, lossy.get("error"))
        assert clean["resent"] == clean["resent_bytes"] == clean["ifec_retransmissions"] == 0, (algo, clean)
        assert lossy["resent"] > 0 and lossy["host_stall_us"] == 0, (algo, lossy)
        extra = sum(lossy["plane_tx_bytes"]) - sum(clean["plane_tx_bytes"]) - lossy["resent_bytes"]
        assert (extra == 0) if algo == "ifec" else (0 < extra <= 4 * 72 * lossy["frames_lost"]), (algo, extra)
        assert (lossy["ifec_retransmissions"] > 0) == (algo == "ifec"), (algo, lossy["ifec_retransmissions"])


def test_elided_payloads_time_the_collective_as_real_ones_and_check_nothing():
    topo = ifec.make_superpod(8, 2)
    for algo in ["ifec", "ring"]:
        real = coll.measure(topo, algo=algo, bytes=1 << 20, loss=0.01)
        elided = coll.measure(topo, algo=algo, bytes=1 << 20, loss=0.01, payload="elided")
        assert real["ok"] and elided["ok"] and elided["timing_only"] and not real["timing_only"]
        for key in ["time_us", "plane_tx_bytes", "gpu_link_up_bytes", "frame_hops", "sim_events", "faults"]:
            assert elided[key] == real[key], (algo, key)
    with pytest.raises(ValueError, match="'none'"):
        coll.measure(topo, payload="none")


def test_a_partitioned_run_is_the_same_row_on_one_thread_and_two():
    topo = ifec.make_superpod(8, 2)
    for algo in ["ifec", "ring"]:
        one, two, three = (coll.measure(topo, algo=algo, bytes=1 << 20, loss=0.01, fail=["gpu5:plane1@2us"],
                                        threads=t, gpu_groups=g) for t, g in ((1, 0), (2, 0), (2, 3)))
        assert one["ok"] and one["wrong"] == 0, one.get("error")
        assert one["partitions"].endswith("on 1 thread: GPUs 0-7 planes 0 1")
        assert two["partitions"].endswith("on 2 threads: GPUs 0-3 planes 0 | GPUs 4-7 planes 1")
        assert three["partitions"].endswith("on 2 threads: GPUs 0-1 GPUs 5-7 planes 1 | GPUs 2-4 planes 0")
        for key in ["time_us", "plane_tx_bytes", "gpu_link_up_bytes", "frame_hops", "sim_events", "faults",
                    "windows", "resent", "resent_bytes", "ifec_retransmissions"]:
            assert one[key] == two[key] == three[key], (algo, key)
    with pytest.raises(ValueError, match="threads=-1 outside 0.."):
        coll.measure(topo, threads=-1)
    with pytest.raises(Exception, match="--threads 4 outside 1..3"):
        coll.measure(topo, threads=4, gpu_groups=1)
    with pytest.raises(ValueError, match="gpu_groups 2: needs a partitioned run"):
        coll.measure(topo, gpu_groups=2)
    with pytest.raises(Exception, match="GPU groups 9 outside 1..8"):
        coll.measure(topo, threads=2, gpu_groups=9)


def test_leaf_groups_give_the_same_row_whatever_the_groups_and_threads():
    topo = ifec.make_fat_tree(32, 2, 4, 2)
    for algo in ["ifec", "ring"]:
        rows = [coll.measure(topo, algo=algo, bytes=256 << 10, loss=0.01, fail=["p0-leaf1:p0-spine1@2us"],
                             threads=t, leaf_groups=k, gpu_groups=g) for t, k, g in ((1, 1, 0), (2, 2, 0), (2, 4, 3))]
        assert rows[0]["ok"] and rows[0]["wrong"] == 0, rows[0].get("error")
        assert rows[0]["partitions"] == ("3 partitions (one per plane and leaf group, and the GPUs') on 1 thread: "
                                         "GPUs 0-31, p0 leaves 0-3, p1 leaves 0-3")
        assert "p0 leaves 0-1" in rows[1]["partitions"] and "p1 leaves 3" in rows[2]["partitions"]
        for key in ["time_us", "plane_tx_bytes", "gpu_link_up_bytes", "frame_hops", "sim_events", "faults",
                    "windows", "resent", "ifec_retransmissions"]:
            assert rows[0][key] == rows[1][key] == rows[2][key], (algo, key)
    with pytest.raises(ValueError, match="leaf_groups 2: needs a partitioned run"):
        coll.measure(topo, leaf_groups=2)
    with pytest.raises(Exception, match="--leaf-groups 5: plane 0 of topology 'fat-tree-32x2' has 4 leaf switches"):
        coll.measure(topo, threads=1, leaf_groups=5)
