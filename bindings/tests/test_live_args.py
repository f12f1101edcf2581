"""./ifec live's arguments without a testbed: run and compare's --timeout refused naming the value before anything is
attached, and passed to Fabric.run for every operation; a deadline run past names itself and the flag. The fabric is
a fake (or an in-process gRPC server): nothing is brought up."""

import concurrent.futures
import io
import os
import pathlib
import sys
import time

import pytest

from ifec import collectives, live, moe


def _no_attach():
    raise AssertionError("attached to a testbed: the bad value was not refused first")


class _Topo:
    name, links, num_gpus = "fake-8x2", [], 8


class _FakeFabric:
    """Answers run() with a passing row and records the deadline of each operation."""
    driver = "fake"
    topo = _Topo()

    def __init__(self):
        self.timeouts = []

    def run(self, what, timeout, **kw):
        self.timeouts.append((what, timeout))
        row = dict(ok=True, ran=kw.get("algo", "ifec"), time_us=1.0, wrong=0, faults=[], variant=kw.get("algo"), ep=8,
                   tokens=32, max_rel_error=0.0)
        for k in ("dispatch_us", "dispatch_gbs", "combine_us", "combine_gbs", "compute_us", "dispatch_logical_bytes",
                  "dispatch_wire_bytes", "combine_logical_bytes", "combine_wire_bytes"):
            row[k] = 0.0
        return row


@pytest.fixture
def fake(monkeypatch):
    """live.attach gives a _FakeFabric; compare's simulated side and its text are stubbed (no native sim run)."""
    fab = _FakeFabric()
    monkeypatch.setattr(live, "attach", lambda: fab)
    monkeypatch.setattr(collectives, "measure", lambda *a, **kw: dict(ok=True))
    monkeypatch.setattr(moe, "measure", lambda *a, **kw: [dict(ok=True)])
    monkeypatch.setattr(live, "compare_text", lambda *a: "")
    monkeypatch.setattr(live, "moe_compare_text", lambda *a: "")
    return fab


@pytest.mark.parametrize("command", [["run", "allreduce"], ["run", "moe"], ["compare", "allreduce"],
                                     ["compare", "moe"]])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "x", "1e9", "86400.5"])
def test_a_bad_timeout_is_refused_naming_it_before_attaching(monkeypatch, capsys, command, value):
    monkeypatch.setattr(live, "attach", _no_attach)
    with pytest.raises(SystemExit) as e:
        live.main(command + [f"--timeout={value}"])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert f"argument --timeout: {value!r} is not a positive number of seconds up to 86400" in err, err


@pytest.mark.parametrize("command,what,default", [(["run", "allreduce", "--bytes", "4KiB,8KiB"], "allreduce", 120),
                                                  (["run", "moe", "--algo", "per_rank,ifec"], "moe", 300),
                                                  (["compare", "alltoall", "--bytes", "4KiB,8KiB"], "alltoall", 120),
                                                  (["compare", "moe", "--bytes", "16,32"], "moe", 300)])
def test_the_timeout_reaches_every_operation(fake, capsys, command, what, default):
    assert live.main(command + ["--timeout", "2.5"]) == 0, capsys.readouterr().err
    assert fake.timeouts == [(what, 2.5), (what, 2.5)]
    fake.timeouts.clear()
    assert live.main(command) == 0, capsys.readouterr().err
    assert fake.timeouts == [(what, default), (what, default)]


def test_compare_takes_a_timeout(fake):
    live.compare(fake, "allreduce", bytes=4096)
    live.compare(fake, "moe", "ifec", 16)
    live.compare(fake, "allreduce", bytes=4096, timeout=1e-3)
    assert fake.timeouts == [("allreduce", 120), ("moe", 300), ("allreduce", 1e-3)]
    for bad, error in ((0, ValueError), (-1, ValueError), (float("nan"), TypeError), (1e9, ValueError),
                       ("10", TypeError)):
        with pytest.raises(error, match=f"timeout={bad!r}"):
            live.compare(fake, "allreduce", timeout=bad)
    assert len(fake.timeouts) == 3, "a bad timeout ran nothing"


def test_a_deadline_run_past_names_itself_and_the_flag(repo):
    grpc, pb, rpc = live._grpc()

    class Host(rpc.HostServicer):
        def Run(self, request, context):
            while context.is_active():  # a hung rank: answers nothing until the caller gives up
                time.sleep(0.01)
            return pb.RunReply()

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(8))
    rpc.add_HostServicer_to_server(Host(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        fab = live.LiveFabric(repo / "testbed/topologies/superpod-8x2.yaml", insecure=True)
        fab.address = lambda nd: f"127.0.0.1:{port}"  # every GPU's daemon is this one server
        with pytest.raises(live.LiveError) as e:
            fab.run("allreduce", bytes=4096, timeout=0.25)
        assert "no rank answered: gpu0: did not answer within 0.25 s (--timeout)" in str(e.value), e.value
        with pytest.raises(ValueError, match="timeout=0: expected more than 0 s"):
            fab.run("allreduce", timeout=0)
    finally:
        server.stop(0)


def test_frr_flags_add_up_and_bad_ones_are_named(monkeypatch, tmp_path):
    """`live up --frr` repeated: every flag's nodes, each once (the last flag alone counted before); an empty name, a
    node the topology lacks, and a log folder with a space (FRR's `log file` line ends there) refused by name."""
    from ifec import frr
    monkeypatch.setattr(frr, "unavailable", lambda: "")
    topo = type("T", (), {"nodes": [dict(name="gpu0"), dict(name="p0-sw"), dict(name="p1-sw")]})()
    logs = tmp_path / "logs"
    assert live._frr_nodes([], topo, "t.yaml", logs) == []
    assert live._frr_nodes(["p0-sw,gpu0", "p1-sw", "gpu0"], topo, "t.yaml", logs) == ["p0-sw", "gpu0", "p1-sw"]
    for flags, named in ((["p0-sw,,gpu0"], "an empty node name"), (["gpu9"], "no node 'gpu9' in t.yaml")):
        with pytest.raises(live.LiveError, match=named):
            live._frr_nodes(flags, topo, "t.yaml", logs)
    with pytest.raises(live.LiveError, match="--logs '/tmp/my logs': FRR's log file line cannot hold a space"):
        live._frr_nodes(["p0-sw"], topo, "t.yaml", pathlib.Path("/tmp/my logs"))


def test_an_empty_trace_folder_is_refused(fake, capsys):
    assert live.main(["run", "allreduce", "--trace", ""]) == 1
    assert "--trace '': expected a folder" in capsys.readouterr().err
    assert fake.timeouts == []  # refused before any operation ran


@pytest.mark.parametrize("text,says", [("18446744073709551616", "more than a request holds"),
                                       ("17179869184GiB", "more than a request holds"), ("²", "is not a number of bytes"),
                                       ("-5", "is not a number of bytes")])
def test_a_size_past_what_a_request_holds_is_named(text, says):
    """Before, 2^64 reached protobuf, which said only "Value out of range: 18446744073709551616"; '²' (a digit to
    str.isdigit) was a ValueError from int()."""
    assert live.parse_size("18446744073709551615") == 2**64 - 1
    with pytest.raises(live.LiveError, match=f"size '{text}' .*{says}"):
        live.parse_size(text)


def test_status_exits_1_naming_the_daemons_down_or_not_ready(monkeypatch, capsys):
    """A script's `./ifec live status && ...` went on with every daemon DOWN (status said so and exited 0)."""
    class Fab:
        def __init__(self, statuses):
            self.statuses = statuses

        def status(self, timeout):
            return self.statuses

    up = dict(ready=True, ports=[dict(carrier=True, fare_heard=True)], fare_changes=3, uptime_ns=10**9)
    for statuses, code, says in [({"gpu0": up, "p0-sw": up}, 0, None),
                                 ({"gpu0": up, "p0-sw": dict(error="UNAVAILABLE")}, 1, "1 of 2 daemons down or "
                                  "not ready: p0-sw"),
                                 ({"gpu0": dict(up, ready=False), "p0-sw": up}, 1, "not ready: gpu0")]:
        monkeypatch.setattr(live, "attach", lambda: Fab(statuses))
        assert live.main(["status"]) == code
        out = capsys.readouterr().out
        assert (says in out) if says else "down or not ready" not in out, out


def test_a_reader_that_stops_early_ends_the_command_quietly(fake, monkeypatch):
    """`./ifec live ctl counters gpu0 | head -2`: the pipe's reader has gone; exit 141 as a Unix tool does, not a
    BrokenPipeError traceback."""
    r, w = os.pipe()

    class Gone(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self):
            return w

    monkeypatch.setattr(sys, "stdout", Gone())
    try:
        assert live.main(["run", "allreduce"]) == 141
    finally:
        os.close(r)
        os.close(w)
