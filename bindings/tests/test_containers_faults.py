"""The containerized testbed's driver under faults and bad input, without Docker: a fake docker (ifec.containers'
_docker, _run_tool and _compose replaced) shows what up, down and the fabric commands do when a port is taken, the
project is already up, a daemon's container fails at start, Ctrl-C comes during the bring-up, the compose file is gone,
or a name, a topology or a capture's file is wrong: an error naming the value, nothing left behind, no traceback."""

import json
import pathlib
import socket
import subprocess
import time
import types

import pytest

from ifec import _native, containers, images, live

TOPO = "testbed/topologies/superpod-8x2.yaml"


class FakeDocker:
    """What the driver asked of docker and docker-compose, and what they answer: `containers` (service -> (state,
    exit code, restarts)) once `up -d` ran, `logs` each container's log."""

    def __init__(self, monkeypatch, existing="", containers_after_up=None, logs="", compose_up=None):
        self.calls = []
        self.existing = existing
        self.after_up = containers_after_up or {}
        self.logs = logs
        self.compose_up = compose_up  # an exception `up -d` raises (KeyboardInterrupt: Ctrl-C)
        self.up = False
        monkeypatch.setattr(containers, "_docker", self.docker)
        monkeypatch.setattr(containers, "_run_tool", self.run_tool)
        monkeypatch.setattr(containers.ContainerFabric, "_compose", lambda fab, args, timeout=300: self.compose(args))

    def compose(self, args):
        self.calls.append(["docker-compose"] + args)
        if args[0] == "up":
            self.up = True
            if self.compose_up is not None:
                raise self.compose_up
        if args[0] == "down":
            self.up = False
        return ""

    def docker(self, args, timeout=120):
        self.calls.append(["docker"] + args)
        if args[:2] == ["ps", "-a"] and "--format" in args:
            return self.existing
        if args[:2] == ["ps", "-aq"]:
            return " ".join(f"id-{s}" for s in self.after_up) if self.up else ""
        if args[0] == "inspect":
            return "".join(f"{s}|{st}|{code}|{n}|id-{s}\n" for s, (st, code, n) in self.after_up.items())
        return ""

    def run_tool(self, cmd, timeout):
        self.calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", self.logs)


@pytest.fixture
def compose_dir(repo, tmp_path):
    topo = _native.load_topology(str(repo / TOPO))
    containers.write_compose(topo, tmp_path / "compose")
    return tmp_path / "compose"


_NO_SLEEP = types.SimpleNamespace(time=time.time, sleep=lambda s: None)  # containers' clock, without its waits


def _fabric(repo, compose_dir, monkeypatch, ports=()):
    fab = containers.ContainerFabric(repo / TOPO, project="ifecfault", compose_dir=str(compose_dir), ready_timeout=30)
    monkeypatch.setattr(fab, "published_ports", lambda: list(ports))
    monkeypatch.setattr(fab, "status", lambda timeout=5: {n["name"]: dict(ready=False, error="UNAVAILABLE: no")
                                                          for n in fab.nodes})
    monkeypatch.setattr(containers, "time", _NO_SLEEP)
    return fab


def test_a_taken_port_is_named_before_anything_is_made(repo, compose_dir, monkeypatch):
    """Before, docker-compose failed midway (some containers made) with docker's words, naming neither the node nor
    the port's holder; now nothing is made and the port, its node and how to find the holder are named."""
    fake = FakeDocker(monkeypatch)
    with socket.socket() as holder:
        try:
            holder.bind(("127.0.0.1", 0))
        except OSError as e:
            pytest.skip(f"no loopback port to hold: {e}")
        holder.listen()
        port = holder.getsockname()[1]
        fab = _fabric(repo, compose_dir, monkeypatch, ports=[("127.0.0.1", port, "gpu3's gRPC")])
        with pytest.raises(live.LiveError, match=rf"127\.0\.0\.1:{port} \(gpu3's gRPC: .*ss -ltnp 'sport = :{port}'"):
            fab.up(progress=lambda line: None)
    assert not any(c[0] == "docker-compose" for c in fake.calls), fake.calls
    assert not fab.tls_dir.exists() and not fab.made


def test_a_compose_folder_the_fabric_made_itself_is_removed_by_down_and_made_again_by_up(repo, monkeypatch):
    """ContainerFabric without compose_dir writes its files into a temporary folder: down() left it in /tmp."""
    FakeDocker(monkeypatch)
    fab = containers.ContainerFabric(repo / TOPO, project="ifecfault", insecure=True)
    first = pathlib.Path(fab.compose_dir)
    assert (first / containers.COMPOSE_FILE).exists()
    fab.down()
    assert not first.exists()
    monkeypatch.setattr(fab, "_deploy", lambda: None)
    monkeypatch.setattr(fab, "_wait_ready", lambda t0, progress: None)
    monkeypatch.setattr(fab, "published_ports", lambda: [])
    fab.up(progress=lambda line: None)
    assert (pathlib.Path(fab.compose_dir) / containers.COMPOSE_FILE).exists()
    fab.down()
    assert not pathlib.Path(fab.compose_dir).exists()


def test_the_published_ports_are_every_daemons_and_prometheus(repo, compose_dir):
    fab = containers.ContainerFabric(repo / TOPO, project="ifecfault", compose_dir=str(compose_dir))
    ports = fab.published_ports()
    assert [p for _, p, _ in ports] == [50100 + i for i in range(10)] + [9090]
    assert {h for h, _, _ in ports} == {"127.0.0.1"}
    swarm = containers.SwarmFabric(repo / TOPO, project="ifecfault", compose_dir=str(compose_dir))
    assert {h for h, _, _ in swarm.published_ports()} == {"0.0.0.0"}  # a swarm publishes on every interface


def test_a_project_already_up_is_refused_and_left_alone(repo, compose_dir, monkeypatch):
    """Before, up went on: docker-compose recreated the running project's containers, and a failure then took them
    down as its own."""
    fake = FakeDocker(monkeypatch, existing="ifecfault_gpu0_1\nifecfault_p0-sw_1\n")
    fab = _fabric(repo, compose_dir, monkeypatch)
    with pytest.raises(live.LiveError, match="project ifecfault already has 2 container.*ifecfault_gpu0_1.*"
                                             "another --project"):
        fab.up(progress=lambda line: None)
    assert not any(c[0] == "docker-compose" for c in fake.calls), fake.calls  # neither up nor down
    assert not fab.tls_dir.exists()


def test_a_daemon_failing_at_start_is_named_with_its_log_and_taken_down(repo, compose_dir, monkeypatch):
    """Before, up waited out its whole ready timeout (120 s) while restart: on-failure restarted the daemon, and then
    named every node not ready, not which failed or why."""
    fake = FakeDocker(monkeypatch, containers_after_up={"p0-sw": ("running", 0, 0), "gpu3": ("restarting", 3, 2),
                                                        "gpu5": ("running", 0, 1)},
                      logs="starting\nifec-hostd: gpu3: no interface in 10.64.0.24/29\n")
    fab = _fabric(repo, compose_dir, monkeypatch)
    with pytest.raises(live.LiveError) as e:
        fab.up(progress=lambda line: None)
    assert "gpu3: container restarting, exit 3, restarted 2 time(s); its log: starting | ifec-hostd: gpu3: no " \
           "interface" in str(e.value)
    assert "gpu5" not in str(e.value) and "p0-sw" not in str(e.value)  # one restart is not yet a failure
    assert fake.calls[-1][:2] == ["docker-compose", "down"] and not fake.up  # taken down again
    assert not fab.tls_dir.exists() and not fab.made


def test_not_ready_in_time_names_each_node_and_why(repo, compose_dir, monkeypatch):
    fake = FakeDocker(monkeypatch, containers_after_up={"gpu0": ("running", 0, 0)})
    fab = _fabric(repo, compose_dir, monkeypatch)
    fab.ready_timeout = 1e-9
    with pytest.raises(live.LiveError, match=r"not ready after 0 s: gpu0: UNAVAILABLE: no; gpu1: UNAVAILABLE"):
        fab.up(progress=lambda line: None)
    assert not fake.up and not fab.tls_dir.exists()


def test_a_swarm_service_failing_at_start_is_named(repo, compose_dir, monkeypatch):
    fab = containers.SwarmFabric(repo / TOPO, project="ifecs1", compose_dir=str(compose_dir))
    tasks = ("ifecs1_gpu2.1|Failed 2 seconds ago|task: non-zero exit (3)\n"
             "\\_ ifecs1_gpu2.1|Failed 4 seconds ago|task: non-zero exit (3)\n"
             "ifecs1_gpu4.1|Failed 1 second ago|task: non-zero exit (1)\n"  # once: may be a race at start
             "ifecs1_p0-sw.1|Running 5 seconds ago|\n")

    def run_tool(cmd, timeout):
        out = tasks if cmd[1:3] == ["stack", "ps"] else ""
        return subprocess.CompletedProcess(cmd, 0, out, "ifec-hostd: boom" if cmd[1] == "service" else "")
    monkeypatch.setattr(containers, "_run_tool", run_tool)
    with pytest.raises(live.LiveError, match=r"gpu2: 2 task\(s\) failed \(task: non-zero exit \(3\)\); its log: "
                                             r"ifec-hostd: boom$"):
        fab._check_containers()


# ---------------------------------------------------------------------------------------------- the CLI --

def _main(argv, capsys):
    code = containers.main(argv)
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.fixture
def cli(monkeypatch, tmp_path):
    """The CLI with its state in tmp_path, up's temporary folders in tmp_path/tmp, and images and dockerd taken as
    ready."""
    monkeypatch.setattr(containers, "STATE", str(tmp_path / "run" / "state.json"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(containers.tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(images, "preflight", lambda bin_dir: None)
    monkeypatch.setattr(images, "Dockerd", lambda *a, **k: None)
    monkeypatch.setattr(images, "build_all", lambda *a, **k: [])
    monkeypatch.setattr(containers.ContainerFabric, "published_ports", lambda fab: [], raising=False)
    monkeypatch.setattr(containers, "time", _NO_SLEEP)
    return tmp_path


def test_ctrl_c_during_up_takes_down_what_it_made_and_says_so(repo, cli, monkeypatch, capsys):
    """Before, Ctrl-C printed a KeyboardInterrupt traceback and left the compose folder under /tmp."""
    fake = FakeDocker(monkeypatch, compose_up=KeyboardInterrupt())
    code, out = _main(["up", str(repo / TOPO)], capsys)
    assert code == 130 and "testbed: interrupted (anything up made is taken down again)" in out, out
    assert "Traceback" not in out
    assert ["docker-compose", "down", "-v", "--remove-orphans"] in fake.calls
    assert list((cli / "tmp").iterdir()) == [] and not (cli / "run" / "state.json").exists()


def test_a_bring_up_that_cannot_be_taken_down_is_left_to_down(repo, cli, monkeypatch, capsys):
    """Ctrl-C, then dockerd gone (docker-compose down and the labels' removal fail): the state stays, so ./ifec
    testbed down can find the project later."""
    fake = FakeDocker(monkeypatch, compose_up=KeyboardInterrupt())

    def compose(fab, args, timeout=300):
        fake.calls.append(args)
        if args[0] == "up":
            raise KeyboardInterrupt()
        raise live.LiveError("docker-compose down: Couldn't connect to Docker daemon")
    monkeypatch.setattr(containers.ContainerFabric, "_compose", compose)

    def docker(args, timeout=120):  # dockerd gone after the pre-checks: the labels cannot be asked either
        if args[:2] == ["ps", "-aq"]:
            raise live.LiveError("docker ps -aq --filter: Cannot connect to the Docker daemon")
        return ""
    monkeypatch.setattr(containers, "_docker", docker)
    code, out = _main(["up", str(repo / TOPO), "--project", "ifecleft"], capsys)
    assert code == 1 and "left containers or networks of project ifecleft: ./ifec testbed down removes them" in out
    st = json.loads((cli / "run" / "state.json").read_text())
    assert st["project"] == "ifecleft" and (cli / "tmp" / st["compose_dir"].split("/")[-1]).is_dir()


def test_up_while_a_testbed_is_up_is_refused_before_docker(repo, cli, monkeypatch, capsys):
    fake = FakeDocker(monkeypatch)
    (cli / "run").mkdir()
    (cli / "run" / "state.json").write_text(json.dumps(dict(topology="/x/t.yaml", project="ifec", compose_dir="/x",
                                                            source="/x/superpod.yaml")))
    code, out = _main(["up", str(repo / TOPO)], capsys)
    assert code == 1 and "already up (project ifec, /x/superpod.yaml): ./ifec testbed down first" in out, out
    assert fake.calls == [] and list((cli / "tmp").iterdir()) == []


@pytest.mark.parametrize("text,says", [(None, "No such file"), ("name: [unclosed", ""), ("planes: 1\n", "")])
def test_up_names_a_bad_topology_file_without_a_traceback(cli, monkeypatch, capsys, text, says):
    fake = FakeDocker(monkeypatch)
    path = cli / "topo.yaml"
    if text is not None:
        path.write_text(text)
    code, out = _main(["up", str(path)], capsys)
    assert code == 1 and str(path) in out and says in out and "Traceback" not in out, out
    assert fake.calls == [] and list((cli / "tmp").iterdir()) == []


def test_up_then_down_leaves_nothing_and_down_again_says_nothing_is_up(repo, cli, monkeypatch, capsys):
    fake = FakeDocker(monkeypatch, containers_after_up={"gpu0": ("running", 0, 0)})
    monkeypatch.setattr(containers.ContainerFabric, "status",
                        lambda fab, timeout=5: {n["name"]: dict(ready=True) for n in fab.nodes})
    code, out = _main(["up", str(repo / TOPO)], capsys)
    assert code == 0, out
    st = json.loads((cli / "run" / "state.json").read_text())
    assert (cli / "tmp" / st["compose_dir"].split("/")[-1] / "tls" / "ca.key").exists()
    code, out = _main(["down"], capsys)
    assert code == 0 and "testbed: down" in out and fake.calls[-1][:2] == ["docker-compose", "down"]
    assert list((cli / "tmp").iterdir()) == [] and not (cli / "run").joinpath("state.json").exists()  # tls/ too
    code, out = _main(["down"], capsys)
    assert code == 0 and "testbed: nothing is up" in out


def test_down_without_its_compose_folder_removes_the_project_by_its_labels(cli, monkeypatch, capsys):
    """Before, a compose folder removed from /tmp left down failing for ever (the state named a file that was gone)."""
    calls = []

    def docker(args, timeout=120):
        calls.append(args)
        return {"ps": "c1 c2", "network": "n1"}.get(args[0], "") if args[-1].endswith("=ifecgone") else ""
    monkeypatch.setattr(containers, "_docker", docker)
    (cli / "run").mkdir()
    (cli / "run" / "state.json").write_text(json.dumps(dict(topology=str(cli / "gone" / "topology.yaml"),
                                                            project="ifecgone", compose_dir=str(cli / "gone"),
                                                            own_dir=True)))
    code, out = _main(["down"], capsys)
    assert code == 0 and "removed project ifecgone's 2 container(s) and 1 network(s) by their labels" in out, out
    assert ["rm", "-f", "-v", "c1", "c2"] in calls and ["network", "rm", "n1"] in calls
    assert not (cli / "run" / "state.json").exists()


@pytest.fixture
def attached(repo, cli, compose_dir, monkeypatch):
    """A state naming superpod-8x2's compose folder; docker must not be asked."""
    (cli / "run").mkdir()
    (cli / "run" / "state.json").write_text(json.dumps(dict(topology=str(repo / TOPO), project="ifecbad",
                                                            compose_dir=str(compose_dir))))

    def docker(args, timeout=120):
        raise AssertionError(f"docker asked: {args}")
    monkeypatch.setattr(containers, "_docker", docker)
    return cli


@pytest.mark.parametrize("argv,says", [
    (["kill", "gpu99"], "no node 'gpu99' in superpod-8x2 (nodes: gpu0"),
    (["start", "sw9"], "no node 'sw9'"),
    (["fail", "gpu0:99"], "link selector 'gpu0:99': gpu0 has no link on port 99"),
    (["restore", "nobody:1"], "unknown node 'nobody'"),
    (["fail", "999"], "999"),
    (["capture", "gpu9:plane0", "/tmp/x.pcap"], "gpu9"),
    (["ctl", "status", "gpu42"], "no node 'gpu42'"),
])
def test_a_bad_node_or_link_is_named_without_asking_docker(attached, capsys, argv, says):
    code, out = _main(argv, capsys)
    assert code == 1 and says in out and "Traceback" not in out, out


def test_a_capture_into_a_folder_that_is_not_there_is_named_before_dumpcap(repo, compose_dir, monkeypatch, tmp_path):
    fab = containers.ContainerFabric(repo / TOPO, project="ifecfault", compose_dir=str(compose_dir))
    calls = []
    monkeypatch.setattr(containers, "_docker", lambda args, timeout=120: calls.append(args) or "0123456789abcdef\n")
    monkeypatch.setattr(containers, "_run_tool", lambda cmd, timeout: calls.append(cmd))
    with pytest.raises(live.LiveError, match=f"capture file {tmp_path}/no/x.pcap: {tmp_path}/no is no folder"):
        fab.capture("gpu0:plane0:sub0", tmp_path / "no" / "x.pcap")
    assert not any(c[0] == "dumpcap" for c in calls)


def test_a_dockerd_that_does_not_answer_is_named_not_waited_for(monkeypatch, tmp_path):
    """Before, `docker info` had no deadline: a wedged dockerd held up and image without a word."""
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setattr(images, "DOCKER", str(fake))
    t0 = time.time()
    with pytest.raises(images.ImageError, match=f"{fake} info: no answer in 0.5 s: dockerd does not respond"):
        images.docker_running(timeout=0.5)
    assert time.time() - t0 < 10


def test_a_container_made_after_down_listed_the_project_is_removed_by_its_label(repo, compose_dir, monkeypatch):
    """Ctrl-C during `up -d`: dockerd still made a container the interrupted docker-compose had asked for, after
    `down` had listed the project's, and `down` failed on its network ("has active endpoints"), leaving both."""
    fab = _fabric(repo, compose_dir, monkeypatch)
    calls = []

    def compose(args, timeout=300):
        raise live.LiveError("docker-compose down -v: error while removing network: network ifecfault_mgmt id d0 has "
                             "active endpoints")
    monkeypatch.setattr(fab, "_compose", compose)
    monkeypatch.setattr(containers, "_docker", lambda args, timeout=120: calls.append(args) or (
        "late" if args[:2] == ["ps", "-aq"] else "net1" if args[:2] == ["network", "ls"] else ""))
    fab.made = True
    fab.down()
    assert ["rm", "-f", "-v", "late"] in calls and ["network", "rm", "net1"] in calls and not fab.made
