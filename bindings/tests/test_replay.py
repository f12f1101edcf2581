"""ifec.replay (./ifec sim --replay): a torch.distributed trace replayed on the simulated fabric, as recorded and
scaled out. The traces here are written by hand in the backend's format (docs/torch-backend.md); the live DDP trace's
replay is checked against its live bytes in test_torch_backend.py."""
import io
import json
import re

import pytest

from ifec import replay

TOPO = "testbed/topologies/superpod-8x2.yaml"


def _write_trace(folder, n=8):
    folder.mkdir()
    for r in range(n):
        ops = [dict(op="all_reduce", dtype="float32", bytes=65536, fabric_op="allreduce",
                    row=dict(size=65536, type="fp32", redop="sum", ran="ifec", time_us=900.0)),
               dict(op="broadcast", dtype="int64", bytes=1024, fabric_op="multicast",
                    row=dict(size=1024, type="int32", ran="ifec", time_us=300.0)),
               dict(op="all_to_all_single", dtype="float32", bytes=4096 * n, fabric_op="alltoall",
                    send_splits=[4096] * n, recv_splits=[4096] * n, row=dict(size=4096 * n, time_us=700.0))]
        lines = []
        t = 1_000_000
        for seq, op in enumerate(ops):
            lines.append(json.dumps(dict(op, rank=r, group=0, group_size=n, seq=seq, algo="ifec",
                                         issued_ns=t, start_ns=t, end_ns=t + 1000, ok=True)))
            t += 1000 + 50_000  # 50 us of compute between operations
        (folder / f"rank{r}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_replay_times_every_operation_and_takes_compute_from_the_gaps(repo, tmp_path):
    out = io.StringIO()
    res = replay.report(_write_trace(tmp_path / "t"), repo / TOPO, out=out)
    text = out.getvalue()
    assert res["operations"] == 3 and res["ranks"] == 8
    assert res["compute_us"] == pytest.approx(100.0)  # two gaps of 50 us
    assert res["comm_us"]["ifec"] < res["comm_us"]["best"]  # in-switch all_reduce and broadcast
    assert res["step_us"]["ifec"] == pytest.approx(res["compute_us"] + res["comm_us"]["ifec"])
    for name in ("all_reduce", "broadcast", "all_to_all_single"):
        assert name in text


def test_scaling_out_keeps_each_ranks_bytes(repo, tmp_path):
    trace = _write_trace(tmp_path / "t")
    ops = replay.operations(replay.load(trace))
    assert replay.scaled(ops[0], 64) == ("allreduce", 65536, 64, "")
    assert replay.scaled(ops[2], 64) == ("alltoall", 4096 * 8 // 64, 64, "")  # the rank's bytes over 64 peers
    out = io.StringIO()
    res = replay.report(trace, repo / "testbed/topologies/superpod-64x4.yaml", k=64, out=out)
    assert res["ranks"] == 64 and "with 64 ranks" in out.getvalue()


def test_a_groups_operations_replay_among_its_members(repo, tmp_path):
    """Ranks 0-3 all_reduce in group 1 (and broadcast from its rank 2) while 4-7 do not: the
    replay merges the group's records, simulates it on 4 GPUs (8 at twice the ranks) and counts its compute once per
    member."""
    trace = _write_trace(tmp_path / "t")
    for r in range(4):
        f = trace / f"rank{r}.jsonl"
        extra = [dict(op="all_reduce", dtype="float32", bytes=4096, fabric_op="allreduce", group=1, group_size=4,
                      members=[0, 1, 2, 3], seq=0, row=dict(size=4096, type="fp32", ran="ifec", time_us=50.0)),
                 dict(op="broadcast", dtype="float32", bytes=4096, fabric_op="multicast", group=1, group_size=4,
                      members=[0, 1, 2, 3], seq=1, root=2, row=dict(size=4096, type="int32", time_us=50.0))]
        t = 10_000_000
        for e in extra:
            f.write_text(f.read_text() + json.dumps(dict(e, rank=r, algo="ifec", issued_ns=t, start_ns=t,
                                                         end_ns=t + 1000, ok=True)) + "\n")
            t += 2000
    ops = replay.operations(replay.load(trace))
    grouped = [o for o in ops if o["group"] == 1]
    assert [o["n"] for o in grouped] == [4, 4] and grouped[1]["root"] == 2
    assert replay.scaled(grouped[0], 16) == ("allreduce", 4096, 8, "")
    res = replay.report(trace, repo / TOPO, out=io.StringIO())
    # Ranks 0-3's gaps before the group's operations (8897 us since their last world operation ended at 1.103 ms,
    # then 1 us) count half: half the ranks had them.
    assert res["compute_us"] == pytest.approx(100.0 + (8897 + 1) / 2)
    (trace / "rank5.jsonl").write_text((trace / "rank5.jsonl").read_text() + (trace / "rank3.jsonl").read_text()
                                       .splitlines()[-1].replace('"rank": 3', '"rank": 5') + "\n")
    with pytest.raises(replay.TraceError, match="group 1 has 4 ranks, 5 traced its operations"):
        replay.load(trace)


def test_the_simulators_own_trace_replays_to_the_same_bytes_on_every_sub_link(repo, tmp_path):
    """A trace the simulated driver wrote (collectives.measure(trace=...)) replayed on the same fabric: every
    operation runs again from the same state, so every sub-link carries exactly the traced bytes."""
    from ifec import _native, collectives
    topo = _native.load_topology(str(repo / TOPO))
    for kind, size, root in (("allreduce", 65536, 0), ("multicast", 4096, 3), ("reduce", 8192, 5),
                             ("all-gather", 8192, 0)):
        assert collectives.measure(topo, kind, "ifec", size, root=root, trace=tmp_path / "t")["ok"]
    out = io.StringIO()
    res = replay.report(tmp_path / "t", topo, out=out)
    assert res["operations"] == 4 and res["compute_us"] == 0  # back to back in simulated time
    assert res["sublink_deviation"] == 0 and res["port_deviation"] == 0, out.getvalue()
    assert "driver: sim" in out.getvalue()


def test_an_operation_starts_from_the_carried_state_it_is_given(repo):
    """The state a fabric carries between operations (the group counter, stripe rotors, multicast PSNs) decides
    which sub-link of a Y-cable each frame takes: started from other turns, the same operation moves the same bytes
    per GPU port but not per sub-link; the row says where it started, and starting there again repeats it exactly."""
    from ifec import _native, collectives
    topo = _native.load_topology(str(repo / TOPO))
    turns = dict(group=8, stripe=[3] * 8, multicast=[5] * 8)

    def links(row):
        return {lid: (u, d) for lid, u, d in zip(row["gpu_link_ids"], row["gpu_link_up_bytes"],
                                                 row["gpu_link_down_bytes"])}

    for kind, size in (("allreduce", 12288), ("multicast", 12288), ("all-gather", 8 * 6144)):
        algo = "ring" if kind == "all-gather" else "ifec"
        fresh = collectives.measure(topo, kind, algo, size)
        moved = collectives.measure(topo, kind, algo, size, turns=turns)
        assert fresh["ok"] and moved["ok"]
        assert fresh["turns"] == dict(group=1, stripe=[0] * 8, multicast=[0] * 8)
        assert moved["turns"] == turns
        assert links(fresh) != links(moved), kind
        for m, f in ((moved, fresh), (collectives.measure(topo, kind, algo, size, turns=moved["turns"]), moved)):
            assert sum(map(sum, links(m).values())) == sum(map(sum, links(f).values()))
        assert links(collectives.measure(topo, kind, algo, size, turns=moved["turns"])) == links(moved)


def test_bad_traces_are_named(repo, tmp_path):
    trace = _write_trace(tmp_path / "t")
    (trace / "rank3.jsonl").write_text('{"rank": 3, "seq": 0}\n')
    with pytest.raises(replay.TraceError, match=r"rank3.jsonl:1: not an operation record"):
        replay.load(trace)
    (trace / "rank3.jsonl").unlink()
    with pytest.raises(replay.TraceError, match=r"ranks \[0, 1, 2, 4, 5, 6, 7\]"):
        replay.load(trace)
    with pytest.raises(replay.TraceError, match="--ranks 9: topology superpod-8x2 has 8 GPUs"):
        replay.report(_write_trace(tmp_path / "u"), repo / TOPO, k=9, out=io.StringIO())
    assert replay.main(["--replay", str(tmp_path / "none"), "--topo", str(repo / TOPO)]) == 1
    # Fields only the replay reads: missing, of the wrong type or negative, each named at its line (tracebacks).
    for i, (edit, named) in enumerate([
            (lambda op: op.pop("op"), "KeyError: 'op'"),
            (lambda op: op.update(row="oops"), "row 'oops': expected an object"),
            (lambda op: op["row"].update(size=-4096), "row size -4096: expected a whole number >= 0"),
            (lambda op: op.update(bytes=1.5), "bytes 1.5: expected a whole number >= 0"),
            (lambda op: op.update(root="x"), "root 'x': expected a whole number >= 0"),
            (lambda op: op.update(issued_ns=-1), "issued_ns -1: expected a whole number >= 0"),
            (lambda op: op.update(send_splits="abc"), "send_splits 'abc': expected a list of whole numbers"),
            (lambda op: op.update(algo="fast"), "algo 'fast': expected one of ifec, best"),
            (lambda op: op.update(members=[0, 0, 1, 2, 3, 4, 5, 6]), "expected 8 distinct ranks"),
            (lambda op: op["row"].update(time_us="fast"), "row time_us 'fast': expected a time >= 0"),
            (lambda op: op["row"].update(driver=["a"]), "row driver ['a']: expected a string"),
            (lambda op: op["row"].update(gpu_link_ids=5), "row gpu_link_ids 5: expected a list of whole numbers"),
            (lambda op: op["row"].update(turns={"stripe": 5}), "row turns stripe 5: expected a list"),
            (lambda op: op["row"].update(turns="xyz"), "row turns 'xyz': expected an object")]):
        bad = _write_trace(tmp_path / f"b{i}")
        ops = [json.loads(line) for line in (bad / "rank0.jsonl").read_text().splitlines()]
        edit(ops[0])
        (bad / "rank0.jsonl").write_text("\n".join(json.dumps(op) for op in ops) + "\n")
        with pytest.raises(replay.TraceError, match=r"rank0.jsonl:1: not an operation record .*" + re.escape(named)):
            replay.load(bad)
    # What only the whole trace or the topology can say: members beyond the world, an operation number twice, link
    # ids another topology has, a dtype the simulator does not know (named with its operation), the same algorithm
    # twice on the command line; a file that is not text.
    def edited(name, edit, rank_files=range(8)):
        bad = _write_trace(tmp_path / name)
        for r in rank_files:
            ops = [json.loads(line) for line in (bad / f"rank{r}.jsonl").read_text().splitlines()]
            edit(ops)
            (bad / f"rank{r}.jsonl").write_text("\n".join(json.dumps(op) for op in ops) + "\n")
        return bad
    with pytest.raises(replay.TraceError, match=r"rank 0, operation 0: a group of 9 in a world of 8 ranks"):
        replay.load(edited("m", lambda ops: ops[0].update(group_size=9), [0]))
    with pytest.raises(replay.TraceError, match=r"group 0: rank 0 traced operation numbers \(seq\) more than once"):
        replay.load(edited("s", lambda ops: ops[1].update(seq=0)))
    with pytest.raises(replay.TraceError, match=r"operation 0 \(reduce_scatter\): 65540 B is not 8 equal blocks"):
        replay.load(edited("rs", lambda ops: ops[0].update(op="reduce_scatter", fabric_op="reduce-scatter", bytes=65540,
                                                            row=dict(ops[0]["row"], size=65540))))
    with pytest.raises(replay.TraceError, match=r"operation 0 \(all_reduce\): link ids \[99999\] outside superpod-8x2"):
        replay.report(edited("l", lambda ops: ops[0]["row"].update(gpu_link_ids=[99999], gpu_link_up_bytes=[1],
                                                                   gpu_link_down_bytes=[1]), [0]),
                      repo / TOPO, out=io.StringIO())
    with pytest.raises(replay.TraceError, match=r"operation 0 \(all_reduce, float32, 65536 B, group 0\) with ifec: "
                                                r"unknown dtype 'nonsense'"):
        replay.report(edited("d", lambda ops: ops[0]["row"].update(type="nonsense")), repo / TOPO, out=io.StringIO())
    assert replay.main(["--replay", str(_write_trace(tmp_path / "a")), "--topo", str(repo / TOPO),
                        "--algo", "ifec,ifec"]) == 1
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe")
    with pytest.raises(replay.TraceError, match="bin.jsonl: not a text file of JSON lines"):
        replay.load(tmp_path / "bin.jsonl")
    with pytest.raises(replay.TraceError, match="--ranks 0: topology"):  # was taken as "as recorded"
        replay.report(_write_trace(tmp_path / "z"), repo / TOPO, k=0, out=io.StringIO())


def test_a_traced_barrier_replays(repo, tmp_path):
    """The torch backend traces a barrier with 0 bytes; the replay simulates it (it once refused any size 0)."""
    folder = tmp_path / "b"
    folder.mkdir()
    for r in range(8):
        (folder / f"rank{r}.jsonl").write_text(json.dumps(dict(
            op="barrier", dtype="float32", bytes=0, fabric_op="barrier", rank=r, group=0, group_size=8, seq=0,
            algo="ifec", issued_ns=0, start_ns=0, end_ns=1000, ok=True,
            row=dict(size=0, type="fp32", ran="ifec", time_us=1.0))) + "\n")
    res = replay.report(folder, repo / TOPO, out=io.StringIO())
    assert res["operations"] == 1 and res["comm_us"]["ifec"] > 0 and res["comm_us"]["best"] > 0


def test_report_names_bad_ranks_and_algorithms(repo, tmp_path):
    """2.5 ranks ran (and said "with 2.5 ranks"), '8' failed comparing an int with a str; algos="ifec" replayed 'i',
    'f', 'e', 'c' and failed on 'i'; no algorithms, or one twice, ran and compared nothing."""
    trace = _write_trace(tmp_path / "t")
    for kwargs, named in [(dict(k=2.5), "--ranks=2.5: expected a whole number"),
                          (dict(k="8"), "--ranks='8': expected a whole number"),
                          (dict(algos=()), r"algos \[\]: expected distinct ones of ifec, best"),
                          (dict(algos=("ifec", "ifec")), r"algos \['ifec', 'ifec'\]: expected distinct ones")]:
        with pytest.raises(replay.TraceError, match=named):
            replay.report(trace, repo / TOPO, out=io.StringIO(), **kwargs)
    res = replay.report(trace, repo / TOPO, k=4.0, algos="ifec", out=io.StringIO())
    assert res["ranks"] == 4 and list(res["comm_us"]) == ["ifec"]


def test_a_root_or_member_outside_its_group_or_world_is_named(tmp_path):
    """A reduce's root 99 in a group of 8 replayed as root 99 mod 8 = 3; a member rank 99 in a world of 8 was taken."""
    def edited(name, edit):
        bad = _write_trace(tmp_path / name)
        for r in range(8):
            ops = [json.loads(line) for line in (bad / f"rank{r}.jsonl").read_text().splitlines()]
            edit(ops[0])
            (bad / f"rank{r}.jsonl").write_text("\n".join(json.dumps(op) for op in ops) + "\n")
        return bad
    with pytest.raises(replay.TraceError, match=r"rank 0, operation 0: root 99 outside the group's 0..7"):
        replay.load(edited("r", lambda op: op.update(op="reduce", fabric_op="reduce", root=99)))
    with pytest.raises(replay.TraceError, match=r"rank 0, operation 0: members \[99\] outside the world's ranks 0..7"):
        replay.load(edited("m", lambda op: op.update(members=[0, 1, 2, 3, 4, 5, 6, 99])))
