"""The live testbed on superpod-8x2: 10 daemons in Mininet hosts, real frames on veths, gRPC control.

Every result is checked by the ranks themselves against the fp64 reference of every rank's input (the sim's check);
faults are real: a link taken down at its switch, a switchd killed. The fabric comes up once for the module and is
torn down even when a test fails; a test that breaks it restores what it broke.
"""

import re
import struct
import subprocess
import time

import pytest

from conftest import live_fabric, live_marks
from ifec import live

TOPO = "testbed/topologies/superpod-8x2.yaml"

# Every test is bounded: a hang raises in the test (signal method), so the fixture still tears the fabric down.
pytestmark = live_marks(150)


fab = live_fabric(TOPO, ready_timeout=90)


def _ok(row):
    assert row["ok"], row.get("error")
    assert row["wrong"] == 0
    assert row["ranks"] == 8
    return row


@pytest.mark.parametrize("algo", ["ifec", "best", "ring"])
def test_allreduce_equals_the_reference(fab, algo):
    row = _ok(fab.run("allreduce", algo=algo, bytes=256 * 1024, seed=5))
    assert row["driver"] == "live"
    assert row["ran"] != "best"  # best names the algorithm it chose


@pytest.mark.parametrize("what,algo", [("reduce", "ifec"), ("reduce", "ring"), ("multicast", "ifec"),
                                       ("multicast", "ring"), ("barrier", "ifec"), ("barrier", "ring")])
def test_other_collectives_equal_the_reference(fab, what, algo):
    _ok(fab.run(what, algo=algo, bytes=0 if what == "barrier" else 64 * 1024, root=3, seed=7))


def test_alltoall_delivers_every_block_to_every_rank(fab):
    row = _ok(fab.run("alltoall", bytes=64 * 1024, seed=23))
    assert row["collective"] == "alltoall" and row["time_us"] > 0


def test_moe_layer_in_every_variant_equals_the_reference(fab):
    """Each rank gates its own tokens, the ranks swap routing tables, and every variant's outputs match the
    single-process layer; the in-fabric variant sends each token row once (multicast), the baselines once per rank
    (per_rank) or per expert (per_expert)."""
    rows = {}
    for v in ("per_expert", "per_rank", "ifec"):
        r = fab.run("moe", algo=v, dtype="bf16", seed=4, moe=dict(tokens=24))
        assert r["ok"], r.get("error")
        assert r["wrong"] == 0 and 0 <= r["max_rel_error"] <= r["tolerance"] == 2e-2
        assert r["driver"] == "live" and r["ep"] == 8 and r["variant"] == v
        assert r["compute_source"].startswith("measured")
        assert r["fallback_chunks"] == 0, r["faults"]
        rows[v] = r
    # The same routing in every variant: per_rank and ifec carry the same token rows, per_expert one per expert.
    assert rows["ifec"]["dispatch_logical_bytes"] == rows["per_rank"]["dispatch_logical_bytes"] > 0
    assert rows["per_expert"]["dispatch_logical_bytes"] > rows["per_rank"]["dispatch_logical_bytes"]
    # Multicast: a token row leaves its GPU once, not once per destination rank.
    assert rows["ifec"]["dispatch_wire_bytes"] < rows["per_rank"]["dispatch_wire_bytes"] / 2
    fp32 = fab.run("moe", algo="ifec", dtype="fp32", seed=4, moe=dict(tokens=8, hidden=256))
    assert fp32["ok"] and fp32["max_rel_error"] <= 1e-5, fp32.get("error")


def test_a_bad_moe_request_names_the_value(fab):
    with pytest.raises(live.LiveError, match="30 experts do not split over 8 ranks"):
        fab.run("moe", algo="ifec", dtype="bf16", moe=dict(experts=30, groups=6, topk_groups=3, topk=4))
    with pytest.raises(live.LiveError, match="unknown MoE variant 'sharp'"):
        fab.run("moe", algo="sharp", dtype="bf16")
    with pytest.raises(live.LiveError, match="unknown collective 'gather' .*; a hostd also runs alltoall and moe"):
        fab.run("gather")


def _pattern(seed, rows, row_bytes):
    return bytes(((seed * 29 + i * 131 + k * 7) ^ (k >> 8)) & 0xFF for i in range(rows) for k in range(row_bytes))


def test_a_local_programs_stores_and_fetch_adds_reach_another_hostd_once_through_the_ring(fab):
    """A CPU program posts through gpu0's descriptor ring (shared memory): its stores land in gpu5's memory through
    the switches, and each of its fetch-adds runs exactly once (the fetched values are consecutive and the counter
    grew by their number), read back from gpu5 itself over gRPC."""
    counter = 8192
    before = struct.unpack("<Q", fab.read_window("gpu5", 100, counter, 8))[0]
    rc, r, err = fab.ring("gpu0", "exercise", 5, "--puts", 24, "--bytes", 4096, "--fetch-adds", 3000, "--threads", 4,
                          "--counter", counter, "--seed", 7)
    assert rc == 0 and r is not None, err
    assert r["completed"] and r["errors"] == 0 and r["wrong_bytes"] == 0 and r["fetched_consecutive"]
    assert r["first_fetched"] == before
    assert struct.unpack("<Q", fab.read_window("gpu5", 100, counter, 8))[0] == before + 3000
    assert fab.read_window("gpu5", 100, counter + 64, 24 * 4096) == _pattern(7, 24, 4096)


def test_a_cuda_kernels_stores_and_fetch_adds_reach_another_hostd_once(fab):
    """The gpu case of the ring: a CUDA kernel posts into gpu1's ring (its shared region registered as mapped host
    memory); its stores land in gpu4's memory through the switches and its fetch-adds run exactly once. Skips,
    saying why, where no CUDA device (or no CUDA build) is there."""
    counter = 16384
    before = struct.unpack("<Q", fab.read_window("gpu4", 100, counter, 8))[0]
    rc, r, err = fab.ring("gpu1", "exercise", 4, "--gpu", "--puts", 16, "--bytes", 4096, "--fetch-adds", 2048,
                          "--counter", counter, "--seed", 3)
    if rc != 0 and ("no usable CUDA device" in err or "built without CUDA" in err):
        pytest.skip(err)
    assert rc == 0 and r is not None, err
    assert r["producer"] == "cuda kernel"
    assert r["completed"] and r["errors"] == 0 and r["wrong_bytes"] == 0 and r["fetched_consecutive"]
    assert struct.unpack("<Q", fab.read_window("gpu4", 100, counter, 8))[0] == before + 2048
    assert fab.read_window("gpu4", 100, counter + 64, 16 * 4096) == _pattern(3, 16, 4096)


def test_bad_descriptors_complete_with_errors_and_the_ring_goes_on(fab):
    rc, r, err = fab.ring("gpu2", "bad")
    assert rc == 0 and r == {"posted": 4, "completed": True, "errors": 4, "then_ok": True}, (r, err)
    assert fab.status()["gpu2"]["ready"]
    with pytest.raises(live.LiveError, match="no window 7777"):
        fab.read_window("gpu2", 7777, 0, 8)
    with pytest.raises(live.LiveError, match="at most 1 MiB"):
        fab.read_window("gpu2", 100, 0, 2 << 20)
    rc, r, err = fab.ring("gpu9", "info")
    assert rc == 1 and "no descriptor ring of hostd 'gpu9'" in err


def test_a_wrong_rkey_between_hostds_is_naked_and_the_qp_pair_reconnects(fab):
    """A store from gpu0 into gpu1 under a wrong rkey (raw, as ibv_post_send takes it) is NAKed with a remote access
    error, which puts gpu1's responder of that QP into the error state. gpu0 renumbers the QP's work, asks gpu1's
    hostd to reset its responder (Host.ResetResponder) and sends nothing new until it has: operations between the
    two GPUs then complete, and a second wrong rkey fails the same way (not by a timeout)."""
    import grpc
    _, pb, _ = live._grpc()

    def counters(node):
        return fab.stub(node).Counters(pb.Empty(), timeout=5).values

    bad = pb.PeerOpsRequest(peer_gpu=1, rkey=0x0BAD0BAD, vaddr=0x1000, size=64, write=b"\x55" * 64)
    before0, before1 = counters("gpu0"), counters("gpu1")
    for attempt in (1, 2):
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            fab.stub("gpu0").PeerOps(bad, timeout=30)
        assert e.value.code() == grpc.StatusCode.ABORTED and "remote_access_error" in e.value.details(), \
            e.value.details()
        assert time.monotonic() - t0 < 5, "the NAK came back late: a retransmission timeout, not the NAK"
        _ok(fab.run("allreduce", algo="ring", bytes=256 * 1024, seed=30 + attempt))
    after0, after1 = counters("gpu0"), counters("gpu1")
    assert after1["access_naks_sent"] - before1["access_naks_sent"] >= 2
    assert after0["reconnects"] - before0["reconnects"] == 2
    assert after0["reconnects_refused"] == before0["reconnects_refused"]
    # A bad reset request is refused naming the value (gpu1 itself; a QP beyond its ports; a PSN beyond 24 bits).
    bad_resets = [((99, 0, 5), "GPU 99"), ((1, 0, 5), "GPU 1 is not another"), ((0, 7, 5), "QP 7"),
                  ((0, 0, 1 << 24), "PSN 16777216")]
    for (gpu, qp, psn), named in bad_resets:
        with pytest.raises(grpc.RpcError) as e:
            req = pb.ResetResponderRequest(requester_gpu=gpu, qp=qp, psn=psn)
            fab.stub("gpu1").ResetResponder(req, timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and named in e.value.details(), e.value.details()


def test_bf16_and_int32_sums(fab):
    _ok(fab.run("allreduce", algo="ifec", bytes=128 * 1024, dtype="bf16", seed=2))
    _ok(fab.run("allreduce", algo="ifec", bytes=128 * 1024, dtype="int32", seed=2))


def _wait_for(pred, timeout=10.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return time.time() - t0
        time.sleep(0.05)
    return None


def test_collectives_on_the_callers_own_data_return_each_ranks_buffer(fab):
    """The way in for a torch.distributed backend: each rank's own bytes in, its buffer after the operation out."""
    import numpy as np
    rng = np.random.default_rng(11)
    x = {g: rng.standard_normal(3000).astype(np.float32) for g in range(8)}
    for algo in ("ring", "ifec"):
        r = fab.run("allreduce", algo=algo, inputs={g: v.tobytes() for g, v in x.items()}, seed=0)
        assert r["ok"], r.get("error")
        want = np.sum([x[g].astype(np.float64) for g in range(8)], axis=0)
        for g in range(8):
            got = np.frombuffer(r["outputs"][g], dtype=np.float32)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{algo}, rank {g}")
    m = fab.run("multicast", algo="ring", root=3, inputs={g: (x[g] * (g == 3)).tobytes() for g in range(8)})
    assert m["ok"], m.get("error")
    for g in range(8):
        assert m["outputs"][g] == x[3].tobytes(), f"rank {g} did not get the root's bytes"
    ag = fab.run("all-gather", algo="ring", inputs={g: x[g].tobytes() for g in range(8)})
    assert ag["ok"], ag.get("error")
    for g in range(8):  # every rank's block, in rank order
        assert ag["outputs"][g] == b"".join(x[k].tobytes() for k in range(8)), f"rank {g}"
    with pytest.raises(live.LiveError, match="a barrier takes no input"):
        fab.run("barrier", algo="ring", inputs={g: x[g].tobytes() for g in range(8)})


def test_a_half_failed_y_cable_halves_that_planes_share_and_restoring_restores_it(fab):
    before = fab.plane_gbps(0, 5)
    assert before[0] == before[1] > 0
    link = fab.set_link("gpu5:2", False)  # GPU 5's plane-1 Y-cable, sub-link 0 (down at the switch end)
    try:
        took = _wait_for(lambda: fab.plane_gbps(0, 5)[1] == before[1] / 2)
        assert took is not None, f"plane 1 share toward GPU 5 stayed {fab.plane_gbps(0, 5)} after {link}"
        assert fab.plane_gbps(0, 5)[0] == before[0]
        assert fab.plane_gbps(0, 4) == before, "other pairs keep their shares"
        _ok(fab.run("allreduce", algo="ifec", bytes=256 * 1024, seed=9))
    finally:
        fab.set_link("gpu5:2", True)
    assert _wait_for(lambda: fab.plane_gbps(0, 5) == before) is not None


def test_a_sub_link_failed_mid_operation_completes_correctly(fab):
    import threading
    timer = threading.Timer(0.002, lambda: fab.set_link("gpu2:0", False))
    timer.start()
    try:
        _ok(fab.run("allreduce", algo="ifec", bytes=4 << 20, seed=11))
    finally:
        timer.join()
        fab.set_link("gpu2:0", True)
        _wait_for(lambda: fab.plane_gbps(0, 2)[0] == fab.plane_gbps(0, 1)[0])


def test_one_percent_loss_at_the_switches_is_repaired(fab):
    for sw in ("p0-sw", "p1-sw"):
        fab.set_loss(sw, 0.01, seed=3)
    try:
        for algo in ("ifec", "ring"):
            _ok(fab.run("allreduce", algo=algo, bytes=1 << 20, seed=21))
        from ifec.v1 import control_pb2 as pb
        st = fab.stub("p0-sw").Status(pb.Empty(), timeout=5)
        assert sum(p.counters.values["injected_drops"] for p in st.ports) > 0, "the loss must have hit something"
    finally:
        for sw in ("p0-sw", "p1-sw"):
            fab.set_loss(sw, 0.0)
    with pytest.raises(live.LiveError, match="outside"):
        fab.set_loss("p0-sw", 0.01, port=99)


def test_a_control_plane_error_names_the_daemon_and_the_value(fab):
    with pytest.raises(live.LiveError, match="link selector 'gpu9:0': unknown node 'gpu9'"):
        fab.set_link("gpu9:0", False)
    with pytest.raises(live.LiveError, match="link selector 'gpu1:9': gpu1 has no link on port 9"):
        fab.set_link("gpu1:9", False)
    with pytest.raises(live.LiveError, match="link selector 'gpu1:plane7': plane 7 outside"):
        fab.set_link("gpu1:plane7", False)
    row = fab.run("allreduce", algo="ifec", bytes=1000, dtype="fp32")  # 1000 B is 250 fp32 elements: fine
    _ok(row)
    with pytest.raises(live.LiveError, match="not a positive whole number"):
        fab.run("allreduce", algo="ifec", bytes=1001)


def test_a_rank_left_behind_in_an_operations_bootstrap_does_not_hold_the_next_one(fab):
    """A failed operation can leave ranks at different allgathers of rank 0's hub (found with a switch container
    killed during an MoE step: the next operation paired one rank's window with another's allgather and the hostds
    died). Here rank 3 alone waits in an earlier operation's allgather: the next operation runs and is right, and
    the stale wait ends as soon as it starts, naming it."""
    import concurrent.futures
    import grpc
    from ifec.v1 import control_pb2 as pb
    stale = pb.AllgatherRequest(rank=3, seq=0, part=b"left behind", epoch=time.time_ns() // 1000)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        waiting = ex.submit(fab.stub("gpu0").Allgather, stale, timeout=20)
        time.sleep(0.5)
        assert not waiting.done()
        t0 = time.time()
        _ok(fab.run("allreduce", algo="ifec", bytes=64 << 10, seed=11))
        with pytest.raises(grpc.RpcError) as e:
            waiting.result()
    assert e.value.code() == grpc.StatusCode.ABORTED, e.value.details()
    assert "started before every rank arrived" in e.value.details(), e.value.details()
    assert time.time() - t0 < 10
    _ok(fab.run("allreduce", algo="ring", bytes=64 << 10, seed=12))


def _scrape(fab, node):
    import urllib.request
    idx = next(n["index"] for n in fab.nodes if n["name"] == node)
    with urllib.request.urlopen(f"http://{live.mgmt_ip(idx)}:9400/metrics", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_every_daemon_serves_prometheus_metrics_that_count_the_traffic(fab):
    sw = _scrape(fab, "p0-sw")
    assert sw['ifec_ready{node="p0-sw"}'] == 1
    sessions = {k: v for k, v in sw.items() if k.startswith("ifec_bgp_session_established")}
    assert len(sessions) == 16 and set(sessions.values()) == {1}, sessions  # one eBGP session per sub-link
    key = 'ifec_port_bytes_total{node="p0-sw",port="0",plane="0",peer="gpu0",dir="tx"}'
    assert key in sw, sorted(sw)[:5]
    before = sum(v for k, v in sw.items() if k.startswith("ifec_port_bytes_total") and 'dir="tx"' in k)
    _ok(fab.run("allreduce", algo="ifec", bytes=1 << 20, seed=19))
    sw2 = _scrape(fab, "p0-sw")
    after = sum(v for k, v in sw2.items() if k.startswith("ifec_port_bytes_total") and 'dir="tx"' in k)
    assert after - before > (1 << 20), "a 1 MiB in-fabric AllReduce sends results out of plane 0's switch"
    assert sw2['ifec_switch_ifec_total{node="p0-sw",counter="results_sent"}'] > \
        sw['ifec_switch_ifec_total{node="p0-sw",counter="results_sent"}']
    g = _scrape(fab, "gpu3")
    assert g['ifec_ready{node="gpu3"}'] == 1
    assert g['ifec_endpoint_total{node="gpu3",counter="ech_contributions_sent"}'] > 0


def _inject(fab, node, intf, frames, tmp_path):
    """Sends raw frames out of `intf` inside `node`'s namespace (an AF_PACKET socket there), bounded in time."""
    path = tmp_path / "frames.bin"
    path.write_bytes(b"".join(len(f).to_bytes(2, "big") + f for f in frames))
    code = ("import socket,sys; d=open(sys.argv[1],'rb').read(); s=socket.socket(socket.AF_PACKET, socket.SOCK_RAW); "
            "s.bind((sys.argv[2], 0)); i=0\n"
            "while i < len(d): n=int.from_bytes(d[i:i+2],'big'); s.send(d[i+2:i+2+n]); i+=2+n\n"
            "print('sent')")
    p = fab.hosts[node].popen(["python3", "-c", code, str(path), intf], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
    out, _ = p.communicate(timeout=20)
    assert b"sent" in out, out


def _ipv4_checksum(hdr):
    s = sum(int.from_bytes(hdr[i:i + 2], "big") for i in range(0, len(hdr), 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def test_malformed_frames_on_a_link_are_counted_and_dropped(fab, tmp_path):
    from ifec import _native
    from ifec.v1 import control_pb2 as pb
    write = dict(_native.sample_frames())["rdma_write_only"]

    def frame(dst_ip, total_length=None, corrupt_icrc=False):
        f = bytearray(write)
        ip = bytearray(f[14:34])
        ip[16:20] = dst_ip.to_bytes(4, "big")
        if total_length is not None:
            ip[2:4] = total_length.to_bytes(2, "big")
        ip[10:12] = b"\0\0"
        ip[10:12] = _ipv4_checksum(bytes(ip)).to_bytes(2, "big")
        f[14:34] = ip
        if corrupt_icrc:
            f[-1] ^= 0xFF
        return bytes(f)

    def switch_malformed():
        st = fab.stub("p0-sw").Status(pb.Empty(), timeout=5)
        return sum(p.counters.values["switch_malformed_drops"] for p in st.ports)

    def gpu1(name):
        return fab.stub("gpu1").Counters(pb.Empty(), timeout=5).values[name]

    sw0, ep0 = switch_malformed(), gpu1("rx_malformed")
    gpu1_ip = 0x0A000002  # 10.0.0.2: GPU 1's loopback
    _inject(fab, "gpu0", "f0", [frame(gpu1_ip, total_length=9000)] * 20, tmp_path)  # IPv4 length beyond the frame
    _inject(fab, "gpu0", "f0", [frame(gpu1_ip, corrupt_icrc=True)] * 20, tmp_path)  # forwarded, refused by GPU 1
    assert _wait_for(lambda: switch_malformed() - sw0 == 20 and gpu1("rx_malformed") - ep0 == 20, timeout=5), \
        (switch_malformed() - sw0, gpu1("rx_malformed") - ep0)
    _ok(fab.run("allreduce", algo="ifec", bytes=64 * 1024, seed=17))  # nothing else disturbed


def test_a_killed_switchd_leaves_its_plane_and_the_operation_finishes_then_it_rejoins(fab):
    # Last but one: kills and restarts p1-sw. Its interfaces stay up, but the kernel closes its BGP sessions with
    # it, so FARE takes plane 1 out at once, and the in-fabric AllReduce runs on plane 0 (or the endpoint path).
    fab.kill("p1-sw")
    try:
        gone = _wait_for(lambda: fab.plane_gbps(0, 1)[1] == 0, timeout=8)
        assert gone is not None, f"plane 1 still weighted {fab.plane_gbps(0, 1)} with its switch dead"
        row = _ok(fab.run("allreduce", algo="ifec", bytes=256 * 1024, seed=13))
        assert any("plane 1" in f for f in row["faults"]) or row["fell_back"], row["faults"]
    finally:
        fab.start("p1-sw")
    # Back means every GPU's FARE has plane 1 toward every other GPU again: the routes return one leaf at a time, and
    # an operation started when only some have returned finds "no path" on plane 1 for the others.
    n = fab.topo.num_gpus

    def plane1_everywhere():
        return all(fab.plane_gbps(s, d)[1] > 0 for s in range(n) for d in range(n) if s != d)

    back = _wait_for(lambda: fab.status(timeout=1)["p1-sw"].get("ready") and plane1_everywhere(), timeout=15)
    assert back is not None, "p1-sw did not rejoin"
    row = _ok(fab.run("allreduce", algo="ifec", bytes=256 * 1024, seed=14))
    assert not row["faults"], row["faults"]


def test_a_killed_hostd_is_named_within_a_bounded_time(fab):
    # Last: the fabric is not usable for more operations afterwards (a restarted rank would need a new bootstrap).
    fab.kill("gpu7")
    t0 = time.time()
    with pytest.raises(live.LiveError) as e:
        row = fab.run("allreduce", algo="ifec", bytes=64 * 1024, timeout=20)
        if not row["ok"]:
            raise live.LiveError(row.get("error"))
    assert "gpu7" in str(e.value)
    # The ranks that did arrive hear from the hub who did not, not that the hub itself was silent: the hub asks the
    # missing rank's hostd every 2 s and names it once it has not answered for 4 s, well inside the 18 s their
    # caller allows them to wait (the timeout less a tenth).
    assert re.search(r"rank 7 \(gpu7\): its hostd has not answered for [4-9](\.\d)? s: gpu7 \(", str(e.value)), e.value
    assert time.time() - t0 < 12


