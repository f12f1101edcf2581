"""The same compose file on a Docker swarm: a single-node swarm here (initialised by the test when this dockerd is not
in one, and left again afterwards), `docker stack deploy` of superpod-8x2 with overlay (VXLAN) link networks, an
in-fabric AllReduce equal to the reference, and `docker stack rm` leaving no services, containers or networks."""

import os
import subprocess

import pytest

from ifec import containers, images

from test_containers_live import COMPOSE, TOPO, _unavailable

pytestmark = pytest.mark.timeout(600, method="signal")


def _swarm_state():
    return subprocess.run(["docker", "info", "-f", "{{.Swarm.LocalNodeState}}"], capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="module")
def stack(repo, build_dir):
    if why := _unavailable():
        pytest.skip(why)
    try:
        dockerd = images.Dockerd(progress=lambda line: None)
    except images.ImageError as e:
        pytest.skip(f"dockerd cannot start here: {e}")
    joined = False
    f = None
    try:
        images.build_all(build_dir / "bin", progress=lambda line: None)
        if _swarm_state() != "active":
            r = subprocess.run(["docker", "swarm", "init", "--advertise-addr", "127.0.0.1"], capture_output=True,
                               text=True)
            assert r.returncode == 0, f"docker swarm init: {r.stderr}"
            joined = True
        f = containers.SwarmFabric(repo / TOPO, project=f"ifecs{os.getpid()}", compose_dir=str(repo / COMPOSE))
        f.up(progress=lambda line: None)
        yield f
    finally:
        if f is not None:
            f.down()
        if joined:
            subprocess.run(["docker", "swarm", "leave", "--force"], capture_output=True)
        dockerd.stop()


def test_the_stack_runs_an_allreduce_and_is_removed(stack):
    assert all(s.get("ready") for s in stack.status().values())
    r = stack.run("allreduce", algo="ifec", bytes=256 << 10, seed=11)
    assert r["ok"] and r["wrong"] == 0 and r["ranks"] == 8, r.get("error")
    assert r["driver"] == "live (swarm)" and all(b > 256 << 10 for b in r["plane_tx_bytes"])
    stack.down()
    assert stack.leftovers() == ""
