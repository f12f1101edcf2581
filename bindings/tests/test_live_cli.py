"""./ifec live as a user meets it: up, status, run, fail, restore, capture, down, in separate processes, and nothing
left behind (no management bridge, no daemons). Bounded in time; down runs even when a step fails."""

import json
import os
import re
import socket
import subprocess
import sys
import time

from conftest import live_marks
from ifec import live

pytestmark = live_marks(180)


def _cli(repo, build_dir, tmp_path):
    """`./ifec live ARGS` in its own process, its state under tmp_path."""
    env = dict(os.environ, PYTHONPATH=str(build_dir / "python"), IFEC_BIN_DIR=str(build_dir / "bin"),
               IFEC_LIVE_STATE=str(tmp_path / "state"))

    def cli(*args, ok=True):
        r = subprocess.run([sys.executable, "-m", "ifec.live", *args], capture_output=True, text=True, env=env,
                           cwd=repo, timeout=120)
        if ok:
            assert r.returncode == 0, r.stdout + r.stderr
        return r
    return cli


def test_up_run_fail_restore_capture_down(repo, build_dir, tmp_path):
    cli = _cli(repo, build_dir, tmp_path)
    topo = tmp_path / "superpod-8x2.yaml"  # a copy: edited below, as a user might while it is up
    topo.write_text((repo / "testbed/topologies/superpod-8x2.yaml").read_text())

    try:
        up = cli("up", str(topo), "--logs", str(tmp_path / "logs"))
        assert "every daemon ready" in up.stdout
        status = cli("status").stdout
        assert status.count("ready") == 10, status
        run = cli("run", "allreduce", "--algo", "best", "--bytes", "64KiB,256KiB").stdout
        rows = [l.split() for l in run.splitlines() if l and not l.startswith("#")]
        assert [r[0] for r in rows] == ["65536", "262144"] and all(r[4] == "0" for r in rows), run
        assert all(r[1] != "best" for r in rows), "the row names the algorithm best chose"
        cmp = cli("compare", "allreduce", "--algo", "ring", "--bytes", "256KiB").stdout
        row = [l.split() for l in cmp.splitlines() if l and not l.startswith("#")][0]
        assert row[0] == "262144" and float(row[2]) > 0 and float(row[3]) > 0, cmp
        assert "down" in cli("fail", "gpu5:2").stdout
        assert "up" in cli("restore", "gpu5:2").stdout
        # The sim's selectors mean the same here: GPU:planeP is the GPU's whole Y-cable on that plane.
        both = cli("fail", "gpu5:plane1").stdout
        assert "gpu5:2 - p1-sw:10" in both and "gpu5:3 - p1-sw:11" in both, both
        cli("restore", "gpu5:plane1")
        for args, why in ((("fail", "gpu5:plane1:sub"), "expected 'subN', got 'sub'"),
                          (("ctl", "link", "gpu5:plane1:sub0"), "expected up or down, got None"),
                          (("ctl", "weights", "gpu0", "x"), "expected a whole number, got 'x'"),
                          (("run", "moe", "--tokens", "0"), "'0' is not a whole number >= 1"),
                          (("capture", "gpu5:plane1", str(tmp_path / "x.pcap")), "names 2 links (22, 23)"),
                          (("ctl", "groups", "gpu0"), "ctl groups gpu0: only switches hold in-fabric groups")):
            r = cli(*args, ok=False)
            assert r.returncode != 0 and why in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        counters = cli("ctl", "counters", "p0-sw").stdout
        assert "reservations" in counters and "port0.rx_frames" in counters, counters
        assert "plane 1) down" in cli("ctl", "link", "gpu5:plane1:sub0", "down").stdout
        for _ in range(50):  # FARE halves plane 1's share toward GPU 5 (its sub-link 0 is down)
            weights = cli("ctl", "weights", "gpu0", "5").stdout
            if "plane 1: 400 Gb/s" in weights:
                break
            time.sleep(0.1)
        assert "plane 0: 800 Gb/s" in weights and "plane 1: 400 Gb/s" in weights, weights
        cli("ctl", "link", "gpu5:plane1:sub0", "up")
        cli("ctl", "groups", "p1-sw")
        routes = cli("ctl", "routes", "p1-sw").stdout
        assert re.search(r"10\.0\.0\.6/32 +port \d+ +gpu5 +via \d+\.\d+\.\d+\.\d+ ", routes), routes  # GPU 5's loopback
        events = cli("ctl", "events", "p1-sw", "1").stdout
        assert "link" in events, events
        nosuch = cli("ctl", "counters", "p9-sw", ok=False)
        assert nosuch.returncode != 0 and "p9-sw" in nosuch.stderr
        cap = cli("capture", "p0-sw:0", str(tmp_path / "p0.pcap"), "--seconds", "1").stdout
        assert (tmp_path / "p0.pcap").stat().st_size > 24, cap  # at least FARE advertisements
        bad = cli("run", "allreduce", "--bytes", "1.5MB", ok=False)
        assert bad.returncode != 0 and "1.5MB" in bad.stderr
        # A switch daemon killed and started again from other processes (the supervisor holds the hosts); requests
        # it cannot read are answered, and it serves on.
        for bad in (b"[1]\n", b'{"op": "kill", "node": {}}\n', b"not json\n", b'{"op": "reboot", "node": "p1-sw"}\n'):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(10)
                s.connect(str(tmp_path / "state" / "supervisor.sock"))
                s.sendall(bad)
                reply = json.loads(s.makefile().readline())
            assert reply["ok"] is False and reply["error"], (bad, reply)
        def plane1_toward_gpu5(dead):  # FARE's share of plane 1 at gpu0, until it says the switch is (not) heard
            for _ in range(100):
                weights = cli("ctl", "weights", "gpu0", "5").stdout
                if ("plane 1: 0 Gb/s" in weights) == dead:
                    return weights
                time.sleep(0.1)
            raise AssertionError(f"plane 1 {'still' if dead else 'not yet'} weighted: {weights}")

        assert "p1-sw killed" in cli("kill", "p1-sw").stdout
        status = cli("status", ok=False)  # exit 1: a daemon is down
        assert status.returncode == 1 and re.search(r"^p1-sw\s+DOWN", status.stdout, re.M), status.stdout
        plane1_toward_gpu5(dead=True)  # its neighbours stop hearing it: FARE's 2 s hold time
        for args, why in ((("kill", "p1-sw"), "p1-sw: its daemon is not running"),
                          (("kill", "p9-sw"), "no node 'p9-sw' in superpod-8x2"),
                          (("start", "gpu3"), "gpu3: a GPU's daemon rejoins only with a new bootstrap"),
                          (("start", "p1-sw", "--timeout", "0"), "'0' is not a positive number of seconds")):
            r = cli(*args, ok=False)
            assert r.returncode != 0 and why in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert "p1-sw started, ready after" in cli("start", "p1-sw").stdout
        again = cli("start", "p1-sw", ok=False)
        assert "p1-sw: its daemon is still running (pid" in again.stderr, again.stderr
        plane1_toward_gpu5(dead=False)  # heard again: weighted again
        run = cli("run", "allreduce", "--bytes", "64KiB").stdout
        assert [l.split()[4] for l in run.splitlines() if l and not l.startswith("#")] == ["0"], run
        topo.write_text(topo.read_text() + "# edited while up\n")  # its daemons still run the file as it was
        edited = cli("status", ok=False)
        assert edited.returncode == 1 and "changed since ./ifec live up" in edited.stderr, edited.stderr
    finally:
        down = cli("down", ok=False)
    assert down.returncode == 0, down.stdout + down.stderr
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert live.MGMT_BRIDGE not in links and not (tmp_path / "state" / "supervisor.sock").exists()
    assert "nothing is up" in cli("down").stdout


def test_a_bad_file_is_named_and_an_up_that_times_out_is_taken_down_again(repo, build_dir, tmp_path):
    cli = _cli(repo, build_dir, tmp_path)
    # Values refused before anything is attached or started (hostd's token limit; a port TCP cannot have).
    moe = cli("compare", "moe", "--bytes", "100000", ok=False)
    assert moe.returncode == 1 and "--bytes 100000: tokens per rank for moe, 1..65536" in moe.stderr, moe.stderr
    port = cli("torchrun", "--master-port", "70000", "script.py", ok=False)
    assert port.returncode == 2 and "70000: expected a TCP port in 1..65535" in port.stderr, port.stderr
    missing = cli("up", str(tmp_path / "no.yaml"), ok=False)
    assert missing.returncode == 1 and f"{tmp_path}/no.yaml: cannot open the topology file" in missing.stderr
    try:
        slow = cli("up", "testbed/topologies/superpod-8x2.yaml", "--logs", str(tmp_path / "logs"), "--timeout", "3",
                   ok=False)
        assert slow.returncode == 1 and "not up after 3 s (taken down again" in slow.stderr, slow.stderr
        assert not (tmp_path / "state" / "state.json").exists()
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        assert live.MGMT_BRIDGE not in links
    finally:
        cli("down", ok=False)
