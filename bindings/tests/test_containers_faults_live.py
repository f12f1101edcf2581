"""The containerized testbed's bring-up under faults, on this machine's dockerd (started if none runs, and then
stopped), with a two-GPU, one-switch topology (quick to bring up): a daemon whose container fails at start is named
with its log within seconds and nothing is left behind; a project already up is refused and left running; down after
a container was removed by hand leaves nothing, and a second down finds nothing to do."""

import os
import subprocess
import time

import pytest

from conftest import docker_with_images
from ifec import _native, containers, live

pytestmark = pytest.mark.timeout(600, method="signal")

TINY = """name: tiny-faults
planes: 1
link_defaults: {rate_gbps: 100, subports: 1, delay_ns: 500}
gpus: 2
switches: [{name: sw, plane: 0}]
links: [{a: gpu0, b: sw}, {a: gpu1, b: sw}]
"""


@pytest.fixture(scope="module")
def docker(build_dir):
    with docker_with_images(build_dir):
        yield


def _compose_dir(tmp_path, fail=None):
    (tmp_path / "tiny.yaml").write_text(TINY)
    topo = _native.load_topology(str(tmp_path / "tiny.yaml"))
    containers.write_compose(topo, tmp_path / "compose")
    if fail:  # that node's container exits at once, saying why, as a daemon that cannot start does
        path = tmp_path / "compose" / containers.COMPOSE_FILE
        lines = path.read_text().splitlines()
        at = lines.index(f"  {fail}:") + 3
        assert lines[at].startswith("    command: ")
        lines[at] = '    command: ["bash", "-c", "echo ifec-test: cannot start >&2; exit 3"]'
        path.write_text("\n".join(lines) + "\n")
    return tmp_path / "compose"


def _left(project):
    label = f"label=com.docker.compose.project={project}"
    return [subprocess.run(["docker"] + what + ["-q", "--filter", label], capture_output=True, text=True).stdout.split()
            for what in (["ps", "-a"], ["network", "ls"])]


def test_a_daemon_failing_at_start_is_named_with_its_log_and_nothing_is_left(docker, tmp_path):
    project = f"ifecf{os.getpid()}"
    compose_dir = _compose_dir(tmp_path, fail="gpu1")
    fab = containers.ContainerFabric(tmp_path / "tiny.yaml", project=project, compose_dir=str(compose_dir))
    t0 = time.time()
    try:
        with pytest.raises(live.LiveError) as e:
            fab.up(progress=lambda line: None)
    finally:
        if fab.made:
            fab.down()
    assert "gpu1: container" in str(e.value) and "ifec-test: cannot start" in str(e.value), str(e.value)
    assert time.time() - t0 < 60, "named within seconds, not after the ready timeout"
    assert _left(project) == [[], []] and not fab.tls_dir.exists()


def test_a_project_up_is_refused_again_and_down_survives_a_container_removed_by_hand(docker, tmp_path):
    project = f"ifecg{os.getpid()}"
    compose_dir = _compose_dir(tmp_path)
    fab = containers.ContainerFabric(tmp_path / "tiny.yaml", project=project, compose_dir=str(compose_dir))
    try:
        fab.up(progress=lambda line: None)
        again = containers.ContainerFabric(tmp_path / "tiny.yaml", project=project, compose_dir=str(compose_dir))
        with pytest.raises(live.LiveError, match=f"project {project} already has 4 container"):
            again.up(progress=lambda line: None)
        assert all(s.get("ready") for s in fab.status().values())  # the first is left running
        subprocess.run(["docker", "rm", "-f", fab.container("gpu0")], capture_output=True, check=True)
    finally:
        fab.down()
    assert _left(project) == [[], []] and not fab.tls_dir.exists()
    fab.down()  # nothing left to take down is no error
