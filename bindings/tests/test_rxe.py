"""The Soft-RoCE guest the interop suite builds on: Debian 12's own kernel under QEMU (software emulation here),
the rxe modules loaded from the initramfs, an rxe device on the guest's NIC with a RoCEv2 GID, and rdma-core's own
tools seeing it."""

import pytest

from ifec import rxe

pytestmark = [pytest.mark.skipif(bool(rxe.unavailable()), reason=rxe.unavailable() or "available"),
              pytest.mark.timeout(600, method="signal")]


@pytest.fixture(scope="module", autouse=True)
def a_guest_can_start():
    """The suite skips only where QEMU cannot start a guest at all, saying why."""
    try:
        status, out = rxe.boot("exit 0\n", timeout=120)
    except rxe.GuestError as e:
        pytest.skip(f"QEMU cannot start a Soft-RoCE guest here: {e}")
    assert status == 0, out


def test_a_guest_brings_up_an_rxe_device_that_rdma_core_sees():
    status, out = rxe.boot("ibv_devices\nibv_devinfo -v | grep -E 'state|active_mtu|GID'\nexit 3\n",
                           ip="10.0.0.1/24")
    text = "\n".join(out)
    assert status == 3, text  # the script's own exit status comes back
    assert "IFEC-GUEST rxe0 up" in text, text
    assert "rxe0" in text and "PORT_ACTIVE" in text, text
    # RoCEv2 is GID index 1, ::ffff:<ip> (perftest -x 1, ibv_rc_pingpong -g 1).
    assert "::ffff:10.0.0.1" in text, text


# ------------------------------------------------------------------------------------------ on the live testbed --
# Fabrics in turn (one at a time: the live testbed's management bridge is one), each class its own.

TOPO = "testbed/rxe/rxe-2x1.yaml"


def _all_pass(rows):
    bad = [r for r in rows if not r["ok"]]
    assert not bad, rxe.table(rows)


class TestThroughIfecSwitchd:
    @pytest.fixture(scope="class")
    def rf(self, repo):
        with rxe.RxeFabric(repo / TOPO) as f:
            yield f

    def test_rdma_core_tools_pass_and_every_frame_has_a_valid_icrc(self, rf, tmp_path):
        rows, facts = rxe.run_matrix(rf, "gpu1", "gpu0", capture_dir=tmp_path)
        _all_pass(rows)
        assert {r["tool"] for r in rows} == {t for t, _ in rxe.TOOLS}
        # Each tool printed a positive rate in the unit it resolves: an atomic's 8 bytes make perftest's MB/s (two
        # decimals) read 0.00 below 625 operations a second, which QEMU's software emulation reaches on a slow
        # machine, so the atomics' rate is their message rate (six decimals).
        rate = lambda r: r["mpps"] if r["tool"].startswith("ib_atomic_bw") else r["gbps"]
        no_rate = [(r["tool"], r["gbps"], r["mpps"], r["client_tail"]) for r in rows if not (rate(r) and rate(r) > 0)]
        assert not no_rate, (no_rate, facts["seconds"])  # (each such tool with the lines its rates were read from)
        # Every frame went through ifec-switchd (the guests share no other path) and both sides of it captured
        # them: every RoCEv2 frame's ICRC, recomputed here, is the one on the wire.
        assert facts["switch"]["switch_rx_frames"] > 10000, facts["switch"]
        assert len(facts["icrc"]) == 2
        for path, (n, bad) in facts["icrc"].items():
            assert n > 10000 and bad == 0, (path, n, bad)

    def test_with_one_percent_loss_at_the_switch_they_still_pass(self, rf, tmp_path):
        rows, facts = rxe.run_matrix(rf, "gpu1", "gpu0", loss=0.01, capture_dir=tmp_path)
        _all_pass(rows)
        assert facts["switch"]["injected_drops"] > 100, facts["switch"]  # rxe's own retransmissions repaired them
        for path, (n, bad) in facts["icrc"].items():  # retransmissions included
            assert n > 10000 and bad == 0, (path, n, bad)


class TestAgainstIfecHostd:
    @pytest.fixture(scope="class")
    def interop(self, repo):
        with rxe.RxeFabric(repo / TOPO, guests=["gpu1"]) as f:
            yield rxe.EndpointInterop(f, "gpu0", "gpu1")

    def test_perftest_writes_reads_and_atomics_land_in_hostd_memory_and_send_is_refused(self, interop, tmp_path):
        rows, facts = interop.guest_to_hostd(tmp_path)
        # Each row's check: hostd's memory against the captured frames (see EndpointInterop.check); the write after
        # ib_send_bw passing is hostd going on after the NAK.
        _all_pass(rows)
        assert facts["counters"]["invalid_naks_sent"] > 0 and facts["counters"]["rx_unsupported"] > 0
        for path, (n, bad) in facts["icrc"].items():  # hostd's frames too
            assert n > 1000 and bad == 0, (path, n, bad)

    def test_hostd_writes_reads_and_fetch_adds_into_a_guests_perftest_server(self, interop):
        _all_pass(interop.hostd_to_guest())


def test_pfc_pauses_from_the_switch_reach_the_guest_which_does_not_honour_them(repo, tmp_path):
    with rxe.RxeFabric(repo / "testbed/rxe/rxe-2x1-pfc.yaml") as f:
        p = rxe.pfc_probe(f, "gpu0", "gpu1", tmp_path)
    print(rxe.pfc_line(p))
    assert p["pauses_sent"] > 0 and p["pause_frames_on_link"] > 0, p
    assert p["transfer_ok"], p
    # QEMU's virtio-net and rxe implement no PFC: the guest keeps sending through the pauses. Said, not hidden: if
    # a later QEMU honours them this assertion says so.
    assert not p["honoured"] and p["frames_while_paused"] > p["frames_sent"] // 2, p
