"""testbed/live/bare-up.sh, the live testbed without Mininet or Python (for a GPU machine that has only the
daemons): it brings superpod-8x2 up from the binaries, runs a command on it, passes the command's exit status on,
and leaves no namespace, bridge or daemon behind, whatever the command did."""

import json
import subprocess

from conftest import live_marks

pytestmark = live_marks(240)


def _bare(repo, build_dir, *command, logs):
    return subprocess.run([str(repo / "testbed" / "live" / "bare-up.sh"), "testbed/topologies/superpod-8x2.yaml",
                           str(build_dir / "bin"), *command], cwd=repo, capture_output=True, text=True, timeout=200,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "IFEC_BARE_LOGS": str(logs)})


def _left_behind():
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [l.split()[0] for l in ns.splitlines() if l.startswith("ifec-")] + \
        (["ifecbare0"] if "ifecbare0" in links else [])


def test_a_ring_exercise_on_the_bare_testbed_and_nothing_left(repo, build_dir, tmp_path):
    r = _bare(repo, build_dir, "ifec-ring", "gpu0", "exercise", "5", "--puts", "8", "--fetch-adds", "500",
              logs=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "10 namespaces, 32 links, 10 daemons" in r.stdout and "every hostd ready" in r.stdout
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert row["completed"] and row["errors"] == 0 and row["wrong_bytes"] == 0 and row["fetched_consecutive"]
    assert "gpu0: running" in (tmp_path / "gpu0.log").read_text()
    assert _left_behind() == []


def test_the_commands_status_is_passed_on_and_bad_arguments_are_named(repo, build_dir, tmp_path):
    r = _bare(repo, build_dir, "sh", "-c", "exit 7", logs=tmp_path)
    assert r.returncode == 7 and _left_behind() == [], r.stderr
    r = _bare(repo, tmp_path, logs=tmp_path)
    assert r.returncode == 2 and "ifec-cli: missing" in r.stderr
    r = subprocess.run([str(repo / "testbed" / "live" / "bare-up.sh"), str(tmp_path / "no.yaml"),
                        str(build_dir / "bin")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "no.yaml: cannot open topology file" in r.stderr
    assert _left_behind() == []
