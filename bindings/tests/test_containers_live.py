"""The containerized testbed end to end on this machine: dockerd (started if none runs, and then stopped), the images
built here (Debian base by debootstrap, cached outside the clone), superpod-8x2's committed compose file brought
up, an in-fabric AllReduce and an MoE layer equal to the reference, a switch container killed and restarted (the
operation finishes on the other plane, saying why; the restarted switch carries its plane again), and nothing left
behind."""

import os
import shutil
import subprocess
import time

import pytest

from ifec import containers, images, live

TOPO = "testbed/topologies/superpod-8x2.yaml"
COMPOSE = "testbed/compose/superpod-8x2"

pytestmark = pytest.mark.timeout(900, method="signal")


def _unavailable():
    missing = [p for p in ("dockerd", "docker-compose", "debootstrap") if not shutil.which(p)]
    if missing:
        return f"{', '.join(missing)} not installed (./ifec setup installs docker.io, docker-compose, debootstrap)"
    if os.geteuid() != 0:
        return "needs root (dockerd, debootstrap)"
    return ""


@pytest.fixture(scope="module")
def fab(repo, build_dir):
    if why := _unavailable():
        pytest.skip(why)
    try:
        dockerd = images.Dockerd(progress=lambda line: None)
    except images.ImageError as e:
        pytest.skip(f"dockerd cannot start here: {e}")
    f = None
    try:
        images.build_all(build_dir / "bin", progress=lambda line: None)
        f = containers.ContainerFabric(repo / TOPO, project=f"ifect{os.getpid()}", compose_dir=str(repo / COMPOSE))
        f.up(progress=lambda line: None)
        yield f
    finally:
        if f is not None:
            f.down()
        dockerd.stop()


def test_allreduce_and_moe_equal_the_reference(fab):
    r = fab.run("allreduce", algo="ifec", bytes=256 << 10, seed=5)
    assert r["ok"] and r["wrong"] == 0 and r["ranks"] == 8, r.get("error")
    assert r["driver"] == "live (containers)" and all(b > 256 << 10 for b in r["plane_tx_bytes"])
    m = fab.run("moe", algo="ifec", dtype="bf16", seed=3, moe=dict(tokens=16))
    assert m["ok"] and m["wrong"] == 0 and m["max_rel_error"] <= m["tolerance"], m.get("error")


def test_a_switch_container_killed_during_an_allreduce_and_an_moe_step_is_worked_around_and_rejoins(fab):
    import threading
    killer = threading.Timer(0.2, lambda: fab.kill("p1-sw"))  # the 4 MiB AllReduce takes seconds here
    killer.start()
    try:
        r = fab.run("allreduce", algo="ifec", bytes=4 << 20, seed=6, timeout=120)
    finally:
        killer.join()
    assert r["ok"] and r["wrong"] == 0, r.get("error")
    assert any("plane 1" in f for f in r["faults"]), r["faults"]  # the reason is reported
    m = fab.run("moe", algo="ifec", dtype="bf16", seed=4, moe=dict(tokens=16), timeout=120)
    assert m["ok"] and m["wrong"] == 0 and m["max_rel_error"] <= m["tolerance"], m.get("error")
    fab.start("p1-sw")

    def converged():  # every GPU sees plane 1 toward every other GPU again, as wide as plane 0
        try:
            return all(s.get("ready") for s in fab.status(timeout=2).values()) and all(
                len(set(fab.plane_gbps(g, d))) == 1 for g in range(8) for d in range(8) if d != g)
        except live.LiveError:
            return False
    t0 = time.time()
    while time.time() - t0 < 60 and not converged():
        time.sleep(0.5)
    assert converged(), f"FARE never gave plane 1 back: {fab.plane_gbps(0, 1)}"
    # The hostds' control channels to the switch come back within a few seconds (1 s reconnect back-off, names
    # resolved again after 1 s: the restarted container may have new addresses); until then an operation leaves
    # plane 1 out and says why.
    t0 = time.time()
    r = fab.run("allreduce", algo="ifec", bytes=256 << 10, seed=7)
    while r["faults"] and time.time() - t0 < 30:
        time.sleep(1)
        r = fab.run("allreduce", algo="ifec", bytes=256 << 10, seed=7)
    assert r["ok"] and not r["faults"], (r.get("error"), r["faults"])
    # Plane 1 carries its half of the contributions again (8 GPUs x 256 KiB over 2 planes, headers aside).
    assert r["plane_tx_bytes"][1] > 0.9 * 8 * (256 << 10) / 2, f"plane 1 idle: {r['plane_tx_bytes']}"


def test_a_link_taken_down_inside_a_container_reweights_like_the_simulator(fab):
    before = fab.plane_gbps(0, 5)
    assert before[0] == before[1] > 0
    fab.set_link("gpu5:2", False)  # one sub-link of GPU 5's plane-1 Y-cable, down inside the switch's container
    try:
        t0 = time.time()
        while time.time() - t0 < 10 and fab.plane_gbps(0, 5)[1] != before[1] / 2:
            time.sleep(0.1)
        assert fab.plane_gbps(0, 5) == [before[0], before[1] / 2], "half of plane 1's share toward GPU 5"
        r = fab.run("allreduce", algo="ifec", bytes=128 << 10, seed=8)
        assert r["ok"] and r["wrong"] == 0, r.get("error")
    finally:
        fab.set_link("gpu5:2", True)
    t0 = time.time()
    while time.time() - t0 < 10 and fab.plane_gbps(0, 5) != before:
        time.sleep(0.1)
    assert fab.plane_gbps(0, 5) == before


def test_a_host_container_killed_mid_operation_is_named_within_a_bounded_time(fab):
    # After this the fabric is not usable for more operations (a restarted rank would need a new bootstrap).
    import threading
    killer = threading.Timer(0.3, lambda: fab.kill("gpu7"))
    killer.start()
    t0 = time.time()
    try:
        with pytest.raises(live.LiveError) as e:
            row = fab.run("allreduce", algo="ifec", bytes=4 << 20, seed=9, timeout=60)
            if not row["ok"]:
                raise live.LiveError(row.get("error"))
    finally:
        killer.join()
    assert "gpu7" in str(e.value) or "peer 7" in str(e.value), str(e.value)
    assert time.time() - t0 < 90


def test_down_leaves_no_containers_or_networks(fab):
    fab.down()
    ps = subprocess.run(["docker", "ps", "-aq", "--filter", f"name={fab.project}_"], capture_output=True, text=True)
    nets = subprocess.run(["docker", "network", "ls", "-q", "--filter", f"name={fab.project}_"], capture_output=True,
                          text=True)
    assert ps.stdout.strip() == "" and nets.stdout.strip() == ""
