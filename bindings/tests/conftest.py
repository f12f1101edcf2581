"""pytest set-up: import the staged package from the build tree and expose the repository paths."""

import contextlib
import os
import pathlib
import signal
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("IFEC_BUILD_DIR", REPO / "build"))
sys.path.insert(0, str(BUILD / "python"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (also ctest -L gpu); skips, saying why, without one")
    # SIGTERM (timeout(1), a CI limit) ends the run as Ctrl-C does: fixtures still take their fabrics, containers and
    # namespaces down (killed outright, the daemons were left for the next fabric's reap_leftovers).
    signal.signal(signal.SIGTERM, _interrupted)


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def repo():
    return REPO


@pytest.fixture(scope="session")
def build_dir():
    if not (BUILD / "bin" / "ifec-cli").exists():
        pytest.fail(f"no build at {BUILD}: run ./ifec build first (or set IFEC_BUILD_DIR)")
    return BUILD


def live_marks(timeout):
    """Marks of a live-testbed module: skip (saying why) where namespaces and daemons cannot run; bound every test
    (a hang raises in the test, so a module's fixture still takes the fabric down)."""
    from ifec import live
    return [pytest.mark.skipif(bool(live.unavailable()), reason=live.unavailable() or "available"),
            pytest.mark.timeout(timeout, method="signal")]


def live_fabric(topology, ready_timeout):
    """A module-scoped fixture: `topology` (relative to the repository) brought up once for the module and taken
    down after it, even when a test fails."""
    @pytest.fixture(scope="module")
    def fab(repo):
        from ifec import live
        f = live.LiveFabric(repo / topology, ready_timeout=ready_timeout)
        f.up(progress=lambda line: None)
        try:
            yield f
        finally:
            f.down()
    return fab


@contextlib.contextmanager
def docker_with_images(build_dir, frr=False):
    """dockerd answering (started here when none runs, and then stopped) and the testbed's images built (FRR's too
    when asked); skips, saying why, where Docker cannot run."""
    import shutil
    from ifec import images
    missing = [p for p in ("dockerd", "docker-compose", "debootstrap") if not shutil.which(p)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (./ifec setup installs docker.io, docker-compose, debootstrap)")
    if os.geteuid() != 0:
        pytest.skip("needs root (dockerd, debootstrap)")
    try:
        dockerd = images.Dockerd(progress=lambda line: None)
    except images.ImageError as e:
        pytest.skip(f"dockerd cannot start here: {e}")
    try:
        images.build_all(build_dir / "bin", progress=lambda line: None, frr=frr)
        yield
    finally:
        dockerd.stop()
