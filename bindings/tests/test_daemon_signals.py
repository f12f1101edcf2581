"""The daemons as processes: SIGTERM and SIGINT end each in a clean stop (exit 0, "stopped", hostd's frame ring
removed from /dev/shm), also in hostd, where LibTorch's thread pools exist before main could block the signals; and
bad command lines are refused naming the value. Each test makes its own namespace and veths and removes them."""

import os
import pathlib
import signal
import subprocess
import time

import pytest

from conftest import live_marks

pytestmark = live_marks(60)


@pytest.fixture
def netns(build_dir, tmp_path):
    """A namespace with veths f0..f3 (peers p0..p3) and a 2-GPU, 1-plane topology file."""
    from ifec import _native
    name = f"ifec-sig-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        for i in range(4):
            subprocess.run(["ip", "link", "add", f"f{i}", "netns", name, "type", "veth", "peer", "name", f"p{i}",
                            "netns", name], check=True)
            subprocess.run(["ip", "-n", name, "link", "set", f"f{i}", "up"], check=True)
        topo = tmp_path / "t.yaml"
        topo.write_text(_native.make_superpod(2, 1, 400, 1).to_yaml())
        yield name, topo
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _start(build_dir, prog, topo, node, ns, *extra):
    p = subprocess.Popen([str(build_dir / "bin" / prog), "--topo", str(topo), "--node", node, "--netns", ns,
                          "--loopback-mgmt", "--insecure", *extra], stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()  # plaintext here: a daemon that serves says so first
    if "WARNING: --insecure" in line:
        line = p.stderr.readline()  # "... NODE: running", or the error that ended it
    return p, line


@pytest.mark.parametrize("prog,node", [("ifec-hostd", "gpu0"), ("ifec-switchd", "p0-sw")])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_a_daemon_cleanly(build_dir, netns, prog, node, sig):
    ns, topo = netns
    p, first = _start(build_dir, prog, topo, node, ns)
    try:
        assert first.endswith(f"{node}: running\n"), first
        if prog == "ifec-hostd":
            assert pathlib.Path(f"/dev/shm/ifec-ring-{node}").exists()
        time.sleep(0.3)
        p.send_signal(sig)
        rest = p.stderr.read()
        assert p.wait(timeout=10) == 0, rest
        assert rest.endswith(f"{node}: stopped\n"), rest
        assert not pathlib.Path(f"/dev/shm/ifec-ring-{node}").exists()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize("listen,why", [("127.0.0.1:99999", "port 99999 outside 1..65535"),
                                        ("127.0.0.1", "expected HOST:PORT"), ("127.0.0.1:", "expected HOST:PORT")])
def test_a_bad_listen_address_is_refused_naming_it(build_dir, netns, listen, why):
    ns, topo = netns
    p, first = _start(build_dir, "ifec-switchd", topo, "p0-sw", ns, "--listen", listen)
    assert p.wait(timeout=10) == 1
    assert f"--listen '{listen}'" in first and why in first, first


def test_a_killed_hostds_ring_is_named_stale_at_once(build_dir, netns):
    """SIGKILL leaves the ring in /dev/shm; ifec-ring must say so, not post into it for two minutes."""
    ns, topo = netns
    p, first = _start(build_dir, "ifec-hostd", topo, "gpu0", ns)
    try:
        assert first.endswith("gpu0: running\n"), first
        p.kill()
        p.wait(timeout=10)
        assert pathlib.Path("/dev/shm/ifec-ring-gpu0").exists()
        t0 = time.time()
        r = subprocess.run([str(build_dir / "bin" / "ifec-ring"), "gpu0", "exercise", "5"], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode != 0 and f"a stale ring: the ifec-hostd that made it (pid {p.pid}) is not running" in \
            r.stderr, r.stderr
        assert time.time() - t0 < 5
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        pathlib.Path("/dev/shm/ifec-ring-gpu0").unlink(missing_ok=True)
