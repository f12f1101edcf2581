"""testbed/live/bare-up.sh, the live testbed without Mininet or Python (for a GPU machine that has only the
daemons): it brings superpod-8x2 up from the binaries, runs a command on it, passes the command's exit status on
(128 + N when signal N ended it), and leaves no namespace, bridge, daemon or firewall rule behind; after a run that
was killed, --down removes what it left."""

import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

pytestmark = [pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"),
                                 reason="needs root and iproute2 (namespaces, veths)"),
              pytest.mark.timeout(300, method="signal")]


@pytest.fixture
def bare(repo, build_dir, tmp_path):
    script = str(repo / "testbed" / "live" / "bare-up.sh")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "IFEC_BARE_LOGS": str(tmp_path)}

    started = []

    def start(*command, bin_dir=None):
        started.append(subprocess.Popen([script, "testbed/topologies/superpod-8x2.yaml",
                                          str(bin_dir or build_dir / "bin"), *command], cwd=repo,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                         start_new_session=True))
        return started[-1]

    def finish(p, timeout=200):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGTERM)  # the script takes down what it made
            out, err = p.communicate(timeout=60)
        return p.returncode, out, err
    yield start, finish
    for p in started:  # a run a failed test left going: it takes down what it made
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
    subprocess.run([script, "--down"], capture_output=True, timeout=60)  # and whatever a killed one left


def _left_behind(out):
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    left = [l.split()[0] for l in ns.splitlines() if l.startswith("ifec-")]
    left += ["bridge ifecbare0"] if "ifecbare0" in links else []
    pids = re.search(r"daemons \(pids ([\d ]+);", out)
    for pid in (pids.group(1).split() if pids else []):
        if os.path.exists(f"/proc/{pid}") and "ifec-" in open(f"/proc/{pid}/cmdline").read():
            left.append(f"daemon {pid}")
    if shutil.which("iptables") and subprocess.run(["iptables", "-C", "FORWARD", "-i", "ifecbare0", "-o", "ifecbare0",
                                                    "-j", "ACCEPT"], capture_output=True).returncode == 0:
        left.append("iptables rule")
    return left


def test_a_ring_exercise_on_the_bare_testbed_and_nothing_left(bare, tmp_path):
    start, finish = bare
    rc, out, err = finish(start("ifec-ring", "gpu0", "exercise", "5", "--puts", "8", "--fetch-adds", "500"))
    assert rc == 0, out + err
    assert "10 namespaces, 32 links, 10 daemons" in out and "every hostd ready" in out
    row = json.loads(out.strip().splitlines()[-1])
    assert row["completed"] and row["errors"] == 0 and row["wrong_bytes"] == 0 and row["fetched_consecutive"]
    assert "gpu0: running" in (tmp_path / "gpu0.log").read_text()
    assert _left_behind(out) == []


def test_status_signals_and_bad_arguments(bare, repo, tmp_path):
    start, finish = bare
    rc, out, err = finish(start("sh", "-c", "exit 7"))
    assert rc == 7 and _left_behind(out) == [], err
    p = start("sleep", "100")
    line = ""
    while "every hostd ready" not in line:  # readline returns "" once the script has exited
        line = p.stdout.readline()
        assert line or p.poll() is None, p.stderr.read()
    from ifec import live  # the Mininet testbed would share 172.31.0.1/16 with it: refused, saying how to end it
    with pytest.raises(live.LiveError, match="a bare testbed is up here .*bare-up.sh --down"):
        live.LiveFabric(repo / "testbed" / "topologies" / "superpod-8x2.yaml").up(progress=lambda line: None)
    p.send_signal(signal.SIGTERM)
    rc, out, err = finish(p, timeout=60)
    assert rc == 128 + signal.SIGTERM and _left_behind(out) == [], err
    rc, out, err = finish(start(bin_dir=tmp_path))
    assert rc == 2 and "ifec-cli: missing" in err
    r = subprocess.run([str(repo / "testbed" / "live" / "bare-up.sh"), str(tmp_path / "no.yaml"), "build/bin"],
                       cwd=repo, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "no.yaml: cannot open the topology file" in r.stderr


def test_down_removes_what_a_killed_run_left(bare, repo):
    start, finish = bare
    script = str(repo / "testbed" / "live" / "bare-up.sh")
    p = start("sleep", "100")
    try:
        line = ""
        while "daemons (pids" not in line:
            line = p.stdout.readline()
            assert line or p.poll() is None, p.stderr.read()
        time.sleep(3)
        os.kill(p.pid, signal.SIGKILL)  # the script alone: no take-down runs, its daemons and command live on
        p.wait(10)
        assert [x for x in _left_behind(line) if x.startswith("daemon")], "the daemons did not outlive the script"
        again = subprocess.run([script, "testbed/topologies/superpod-8x2.yaml", "build/bin", "true"], cwd=repo,
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 2 and "--down" in again.stderr, again.stderr
        down = subprocess.run([script, "--down"], capture_output=True, text=True, timeout=60)
        assert down.returncode == 0 and "removed bridge ifecbare0" in down.stdout, down.stderr
        assert _left_behind(line) == []
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # what is left of its process group: the command (sleep)
