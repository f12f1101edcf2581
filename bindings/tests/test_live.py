"""The live testbed on superpod-8x2: 10 daemons in Mininet hosts, real frames on veths, gRPC control.

Every result is checked by the ranks themselves against the fp64 reference of every rank's input (the sim's check);
faults are real: a link taken down at its switch, a switchd killed. The fabric comes up once for the module and is
torn down even when a test fails; a test that breaks it restores what it broke.
"""

import time

import pytest

from ifec import live

TOPO = "testbed/topologies/superpod-8x2.yaml"

pytestmark = pytest.mark.skipif(bool(live.unavailable()), reason=live.unavailable() or "available")


@pytest.fixture(scope="module")
def fab(repo):
    f = live.LiveFabric(repo / TOPO, ready_timeout=90)
    f.up(progress=lambda line: None)
    try:
        yield f
    finally:
        f.down()


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


def test_a_control_plane_error_names_the_daemon_and_the_value(fab):
    with pytest.raises(live.LiveError, match="no link 'gpu9:0'"):
        fab.set_link("gpu9:0", False)
    row = fab.run("allreduce", algo="ifec", bytes=1000, dtype="fp32")  # 1000 B is 250 fp32 elements: fine
    _ok(row)
    with pytest.raises(live.LiveError, match="not a positive whole number"):
        fab.run("allreduce", algo="ifec", bytes=1001)


def test_a_killed_switchd_leaves_its_plane_and_the_operation_finishes_then_it_rejoins(fab):
    # Last but one: kills and restarts p1-sw. Its interfaces stay up; its neighbours stop hearing it, FARE takes
    # plane 1 out after the hold time, and the in-fabric AllReduce runs on plane 0 (or the endpoint path).
    fab.kill("p1-sw")
    try:
        gone = _wait_for(lambda: fab.plane_gbps(0, 1)[1] == 0, timeout=5)
        assert gone is not None, f"plane 1 still weighted {fab.plane_gbps(0, 1)} with its switch dead"
        row = _ok(fab.run("allreduce", algo="ifec", bytes=256 * 1024, seed=13))
        assert any("plane 1" in f for f in row["faults"]) or row["fell_back"], row["faults"]
    finally:
        fab.start("p1-sw")
    back = _wait_for(lambda: fab.status(timeout=1)["p1-sw"].get("ready") and fab.plane_gbps(0, 1)[1] > 0,
                     timeout=15)
    assert back is not None, "p1-sw did not rejoin"
    row = _ok(fab.run("allreduce", algo="ifec", bytes=256 * 1024, seed=14))
    assert not row["faults"], row["faults"]


def test_a_killed_hostd_is_named_within_a_bounded_time(fab):
    # Last: the fabric is not usable for more operations afterwards (a restarted rank would need a new bootstrap).
    fab.kill("gpu7")
    t0 = time.time()
    with pytest.raises(live.LiveError) as e:
        row = fab.run("allreduce", algo="ifec", bytes=64 * 1024, timeout=40)
        if not row["ok"]:
            raise live.LiveError(row.get("error"))
    assert "gpu7" in str(e.value)
    assert time.time() - t0 < 40
