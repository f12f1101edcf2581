"""The live fabric's fabric-port drivers: AF_PACKET (the default, which test_live.py and the other live suites run
on) and AF_XDP, asked for by name (--fabric-driver af_xdp: every daemon's fabric interfaces carry an XDP program
that hands the fabric's frames to an AF_XDP socket, testbed/live/include/ifec/live/xdp_port.h). On AF_XDP the
collectives and the MoE layer are checked against the reference, and BGP (the kernel's TCP, passed by the XDP
program) still converges FARE."""

from conftest import live_marks
from ifec import live

TOPO = "testbed/topologies/superpod-8x2.yaml"
pytestmark = live_marks(300)


def test_collectives_and_moe_on_af_xdp_ports_equal_the_reference(repo, tmp_path):
    fab = live.LiveFabric(repo / TOPO, log_dir=tmp_path / "logs", ready_timeout=90, fabric_driver="af_xdp")
    fab.up(progress=lambda line: None)
    try:
        status = fab.status()
        assert all(s["driver"].startswith("af_xdp (") for s in status.values()), status
        for algo in ("ifec", "ring"):
            row = fab.run("allreduce", algo=algo, bytes=1 << 20, seed=3)
            assert row["ok"] and row["wrong"] == 0 and row["ranks"] == 8, row.get("error")
        moe = fab.run("moe", algo="ifec", dtype="bf16", seed=4, moe=dict(tokens=24))
        assert moe["ok"] and moe["wrong"] == 0, moe.get("error")
    finally:
        fab.down()


def test_the_default_is_af_packet_whose_frames_the_kernel_still_sees(repo):
    """AF_XDP takes the fabric's frames before the kernel's packet taps: captures, a raw-socket injector's replies
    and a Soft-RoCE guest on a node's interface would see none of them."""
    assert live.LiveFabric(repo / TOPO).fabric_driver == "af_packet"


def test_a_bad_driver_name_is_refused_naming_it(repo):
    try:
        live.LiveFabric(repo / TOPO, fabric_driver="dpdk")
    except live.LiveError as e:
        assert "dpdk" in str(e) and "af_xdp" in str(e)
    else:
        raise AssertionError("no error")
