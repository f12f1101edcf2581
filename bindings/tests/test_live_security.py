"""Mutual TLS and roles on the live testbed (superpod-8x2): the security matrix (every kind of caller against a
switchd and a hostd, as control.proto's roles table says), and an AllReduce with mTLS on equal to one without.

Each test brings its own fabric up and down (the second one plaintext): the two cannot be up at once."""

import numpy as np
import pytest

from conftest import live_marks
from ifec import live, security

TOPO = "testbed/topologies/superpod-8x2.yaml"
pytestmark = live_marks(300)
INPUTS = {g: np.random.default_rng(g).integers(-1 << 20, 1 << 20, 16384, dtype=np.int32).tobytes() for g in range(8)}
OUTPUTS = {}


def _allreduce(fab):
    row = fab.run("allreduce", algo="ifec", dtype="int32", inputs=INPUTS)
    assert row["ok"], row.get("error")
    want = sum(np.frombuffer(b, dtype=np.int32).astype(np.int64) for b in INPUTS.values()).astype(np.int32)
    for g, out in row["outputs"].items():
        assert np.array_equal(np.frombuffer(out, dtype=np.int32), want), f"GPU {g}"
    return row["outputs"]


def test_every_caller_is_refused_or_served_as_the_roles_table_says(repo, tmp_path, capsys):
    table = {s: live.rpc_roles(s) for s in ("Switch", "Host")}
    # The table itself: the rows.
    assert table["Switch"]["SetLoss"] == table["Switch"]["SetLink"] == {"operator"}
    assert "viewer" not in table["Switch"]["SetLoss"] and "rank" not in table["Host"]["SetLink"]
    assert table["Host"]["Run"] == {"rank"} and "viewer" in table["Switch"]["Routes"]
    fab = live.LiveFabric(repo / TOPO, log_dir=tmp_path / "logs", ready_timeout=90)
    fab.up(progress=lambda line: None)
    try:
        assert (fab.tls_dir / "ca.pem").exists() and oct((fab.tls_dir / "ca.key").stat().st_mode)[-3:] == "600"
        OUTPUTS["tls"] = _allreduce(fab)  # every rank's hostd over mutual TLS; it also makes window 1
        lines = []
        rows = security.matrix(fab, progress=lines.append)
        with capsys.disabled():  # the matrix in ./ifec test's output, not only on failure
            print("\n" + lines[0])
        cell = {(r["who"], r["rpc"]): r for r in rows}
        assert all(r["ok"] for r in rows), lines[0]
        for who in security.HANDSHAKE_REFUSED:
            assert cell[(who, "Switch.Status")]["got"] == "refused"
        assert cell[("viewer", "Switch.SetLoss")]["got"] == "denied"
        assert "role viewer" in cell[("viewer", "Switch.SetLoss")]["detail"]
        assert "Switch.SetLoss" in cell[("viewer", "Switch.SetLoss")]["detail"]
        assert cell[("rank", "Switch.SetLink")]["got"] == cell[("rank", "Host.SetLink")]["got"] == "denied"
        assert cell[("operator", "Switch.SetLoss")]["got"] == cell[("operator", "Switch.SetLink")]["got"] == "allowed"
        assert cell[("rank", "Host.ReadWindow")]["got"] == "allowed"
        assert cell[("rank of job 2", "Host.ReadWindow")]["got"] == "denied"
        assert cell[("no role", "Host.Status")]["got"] == "denied"
        assert cell[("daemon", "Switch.Reserve")]["got"] == "allowed"  # the handler refused the empty reservation
    finally:
        fab.down()


def test_an_allreduce_with_mtls_equals_one_without(repo, tmp_path):
    if "tls" not in OUTPUTS:
        pytest.skip("the mTLS run did not complete")
    fab = live.LiveFabric(repo / TOPO, log_dir=tmp_path / "logs", ready_timeout=90, insecure=True)
    fab.up(progress=lambda line: None)
    try:
        assert fab.tls_dir is None
        assert "WARNING: --insecure" in (tmp_path / "logs" / "p0-sw.log").read_text()
        assert _allreduce(fab) == OUTPUTS["tls"]
    finally:
        fab.down()


def test_frames_from_another_job_are_naked_and_change_no_memory(repo, tmp_path, capsys):
    """From GPU 7's namespace, out of its fabric interface through the switch, RDMA WRITEs into GPU 1's window 1
    (job 1): with job 2's partition key, a wrong rkey, an address past the window: each NAKed (Remote Access Error),
    the window unchanged, counted; from an address that is no GPU: dropped and counted. A control frame with
    everything right does write: the crafted frames are valid, only the protection refuses them."""
    from ifec import _native
    fab = live.LiveFabric(repo / TOPO, log_dir=tmp_path / "logs", ready_timeout=90)
    fab.up(progress=lambda line: None)
    try:
        _allreduce(fab)  # window 1 (64 KiB, job 1) on every GPU
        _, pb, _ = live._grpc()
        gpu1, gpu7 = fab.node("gpu1"), fab.node("gpu7")
        sw_port = next(p for p in fab.stub("p0-sw").Status(pb.Empty(), timeout=5).ports
                       if p.peer == "gpu7" and p.peer_port == 0)
        src_mac = bytes.fromhex(fab.hosts["gpu7"].cmd("cat /sys/class/net/f0/address").strip().replace(":", ""))
        dst_mac = bytes.fromhex(sw_port.mac.replace(":", ""))
        va, rkey = _native.window_va_rkey(1, 1)
        host1 = fab.stub("gpu1")

        def window():
            return host1.ReadWindow(pb.ReadWindowRequest(window=1, offset=0, length=128), timeout=5).data

        def counters():
            return dict(host1.Counters(pb.Empty(), timeout=5).values)

        before, k0 = window(), counters()
        for q in range(4):  # each case on its own QP, its responder expecting PSN 1000 + q
            host1.ResetResponder(pb.ResetResponderRequest(requester_gpu=7, qp=q, psn=1000 + q), timeout=5)

        def write(q, src_ip, pkey, at, key, data):
            return _native.rdma_write_frame(src_mac, dst_mac, src_ip, gpu1["loopback"], _native.rc_qpn(7, q),
                                            1000 + q, pkey, at, key, data)
        job1, job2 = _native.pkey_of_job(1), _native.pkey_of_job(2)
        junk, good = b"\xee" * 64, bytes(range(64))
        frames = [write(0, gpu7["loopback"], job2, va, rkey, junk),  # another job's partition
                  write(1, gpu7["loopback"], job1, va, rkey ^ 1, junk),  # a wrong rkey
                  write(2, gpu7["loopback"], job1, va + 65536 - 32, rkey, junk),  # past the window's end
                  write(3, 0x0AFA0001, job1, va, rkey, junk),  # 10.250.0.1: no GPU of the fabric
                  write(3, gpu7["loopback"], job1, va + 64, rkey, good)]  # the control: everything right
        acks = security.inject(fab.hosts["gpu7"], "f0", frames)
        by_psn = {a["psn"]: a["syndrome"] for a in acks if a["ip_src"] == gpu1["loopback"]}
        after, k1 = window(), counters()
        assert by_psn.get(1000) == by_psn.get(1001) == by_psn.get(1002) == security.NAK_REMOTE_ACCESS, acks
        assert by_psn.get(1003, 0xFF) < 0x20, acks  # the control frame ACKed
        assert after[:64] == before[:64]  # none of the refused frames wrote
        assert after[64:] == good  # the control frame did
        assert k1["access_naks_sent"] - k0["access_naks_sent"] == 3
        assert k1["rx_wrong_source"] - k0["rx_wrong_source"] == 1
        with capsys.disabled():
            print("\nforeign frames: 3 NAKed (Remote Access Error), 1 dropped (rx_wrong_source), window unchanged; "
                  "the control frame written and ACKed")
        _allreduce(fab)  # the fabric still runs collectives correctly
    finally:
        fab.down()


SOAK_SECONDS = 10


def _port_macs(fab, node, port):
    """(interface, its MAC, the MAC at the link's other end) of `node`'s fabric port `port`."""
    ifname = f"f{port}"
    mine = bytes.fromhex(fab.hosts[node].cmd(f"cat /sys/class/net/{ifname}/address").strip().replace(":", ""))
    link = next(l for l in fab.links if (l["a"], l["a_port"]) == (node, port) or (l["b"], l["b_port"]) == (node, port))
    peer, peer_port = (link["b"], link["b_port"]) if link["a"] == node else (link["a"], link["a_port"])
    theirs = fab.hosts[peer].cmd(f"cat /sys/class/net/f{peer_port}/address").strip().replace(":", "")
    return ifname, mine, bytes.fromhex(theirs)


def test_a_soak_of_malformed_and_random_frames_leaves_collectives_correct_and_daemons_serving(repo, tmp_path,
                                                                                             capsys):
    """For SOAK_SECONDS, GPU 7's namespace floods its switches (all four ports) and the switch's namespace floods
    GPU 1's hostd directly (the port facing it) with random, truncated, bit-flipped and valid-but-random RoCEv2
    frames, as fast as one process each sends them, while AllReduces run: each AllReduce correct, every daemon
    still serving, the drops counted."""
    import json
    fab = live.LiveFabric(repo / TOPO, log_dir=tmp_path / "logs", ready_timeout=90)
    fab.up(progress=lambda line: None)
    try:
        _, pb, _ = live._grpc()
        _allreduce(fab)

        def malformed():
            host = dict(fab.stub("gpu1").Counters(pb.Empty(), timeout=10).values)
            sw = sum(p.counters.values["switch_malformed_drops"]
                     for s in ("p0-sw", "p1-sw") for p in fab.stub(s).Status(pb.Empty(), timeout=10).ports)
            return host["rx_malformed"], sw
        before = malformed()
        sw_port = next(l["b_port"] if l["b"] == "p0-sw" else l["a_port"] for l in fab.links
                       if {l["a"], l["b"]} == {"gpu1", "p0-sw"})
        procs = [security.start_soak(fab, "gpu7", [_port_macs(fab, "gpu7", p) for p in range(4)], SOAK_SECONDS),
                 security.start_soak(fab, "p0-sw", [_port_macs(fab, "p0-sw", sw_port)], SOAK_SECONDS, seed=2)]
        runs = 0
        while any(p.poll() is None for p in procs):
            _allreduce(fab)  # correct, or the test fails here
            runs += 1
        sent = []
        for p in procs:
            out, err = p.communicate(timeout=30)
            assert p.returncode == 0, err.decode()[-500:]
            sent.append(json.loads(out))
        after = malformed()
        status = fab.status(timeout=10)
        assert all(s.get("ready") for s in status.values()), status
        _allreduce(fab)
        total = sum(sum(s["sent"].values()) for s in sent)
        rate = total / max(s["seconds"] for s in sent)
        kinds = ", ".join(f"{k} {sum(s['sent'][k] for s in sent)}" for k in security.SOAK_KINDS)
        with capsys.disabled():
            print(f"\nsoak: {total} frames in {SOAK_SECONDS} s ({rate / 1e3:.0f} k frames/s: {kinds}; "
                  f"{sum(s['refused'] for s in sent)} sends refused by the kernel); {runs} AllReduces during it, all "
                  f"correct; malformed frames dropped: gpu1's hostd {after[0] - before[0]}, the switches "
                  f"{after[1] - before[1]}; every daemon ready")
        assert runs >= 1 and total > 0
        assert after[0] > before[0] and after[1] > before[1]
    finally:
        fab.down()
