"""The same compose file on a Docker swarm: a single-node swarm here (initialised by the test when this dockerd is not
in one, and left again afterwards), `docker stack deploy` of superpod-8x2 with overlay (VXLAN) link networks, an
in-fabric AllReduce equal to the reference, and `docker stack rm` leaving no services, containers or networks."""

import os
import subprocess

import pytest

from conftest import docker_with_images
from ifec import containers
from test_containers_live import COMPOSE, TOPO

pytestmark = pytest.mark.timeout(600, method="signal")


def _swarm_state():
    return subprocess.run(["docker", "info", "-f", "{{.Swarm.LocalNodeState}}"], capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="module")
def stack(repo, build_dir):
    with docker_with_images(build_dir):
        joined = False
        f = None
        try:
            if _swarm_state() != "active":
                r = subprocess.run(["docker", "swarm", "init", "--advertise-addr", "127.0.0.1"], capture_output=True,
                                   text=True)
                assert r.returncode == 0, f"docker swarm init: {r.stderr}"
                joined = True
            f = containers.SwarmFabric(repo / TOPO, project=f"ifecs{os.getpid()}", compose_dir=str(repo / COMPOSE))
            f.up(progress=lambda line: None)
            yield f
        finally:
            if f is not None and f.leftovers():
                f.down()
            if joined:
                subprocess.run(["docker", "swarm", "leave", "--force"], capture_output=True)


def test_the_stack_runs_an_allreduce_and_is_removed(stack):
    assert all(s.get("ready") for s in stack.status().values())
    r = stack.run("allreduce", algo="ifec", bytes=256 << 10, seed=11)
    assert r["ok"] and r["wrong"] == 0 and r["ranks"] == 8, r.get("error")
    assert r["driver"] == "live (swarm)"
    # Both planes carried their share (about 1 MiB each over the eight GPUs); if not, say what the operation met.
    assert all(b > 256 << 10 for b in r["plane_tx_bytes"]), (r["plane_tx_bytes"], r.get("faults"), r.get("time_us"))
    stack.down()
    assert stack.leftovers() == ""
