"""The `ifec` torch.distributed backend on the live superpod-8x2, its switches reducing reproducibly (in contributor
order): unmodified PyTorch programs (torch_programs/) launched as `./ifec live torchrun` launches them, checked
against Gloo, against the same computation in one process, and against each other. The fabric comes up once for the
module; the test that kills a hostd runs last.
"""
import io
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import pytest

from conftest import live_marks
from ifec import live, torchrun

PROGRAMS = pathlib.Path(__file__).resolve().parent / "torch_programs"
REPO = pathlib.Path(__file__).resolve().parents[2]
DDP_TOLERANCE = 1e-6  # max |parameter difference| against Gloo after 20 steps (the sums' order differs)


def _backend_missing():
    try:
        from ifec import _c10d  # noqa: F401
    except ImportError as e:
        return f"ifec._c10d not built (LibTorch and torch's Python library): {e}"
    return ""


pytestmark = live_marks(300) + [pytest.mark.skipif(bool(_backend_missing()), reason=_backend_missing() or "built")]


@pytest.fixture(scope="module")
def fab(repo, tmp_path_factory):
    src = (repo / "testbed/topologies/superpod-8x2.yaml").read_text()
    assert "reproducible: false" in src
    topo = tmp_path_factory.mktemp("topo") / "superpod-8x2.yaml"
    topo.write_text(src.replace("reproducible: false", "reproducible: true"))
    f = live.LiveFabric(topo, ready_timeout=90)
    f.up(progress=lambda line: None)
    try:
        yield f
    finally:
        f.down()


def _run(fab, program, *args, trace=None, timeout=None):
    out = io.StringIO()
    rc = torchrun.launch(fab, PROGRAMS / program, [str(a) for a in args], trace=trace, timeout=timeout, out=out,
                         grace_s=60)
    return rc, out.getvalue()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_gloo(program, *args, nproc=8):
    """The same program over Gloo on loopback, nproc local processes: the reference."""
    env = dict(os.environ, WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(PROGRAMS / program), "--backend", "gloo", *map(str, args)],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(nproc)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)


def test_every_operation_equals_the_same_computation_in_one_process(fab, tmp_path):
    rc, out = _run(fab, "collectives_check.py", trace=tmp_path / "trace")
    assert rc == 0, out[-3000:]
    # A reduction at the ranks (int64 sum): an all-to-all of one block per rank, then an all-gather of the folded
    # blocks, each rank's payload about the tensor's size (an all-gather of whole tensors moved 8 times its size).
    ops = [json.loads(line) for line in (tmp_path / "trace" / "rank0.jsonl").read_text().splitlines()]
    want = ("all_reduce", "int64", "sum")
    i = next(i for i, o in enumerate(ops) if (o["op"], o["dtype"], o.get("reduce_op")) == want)
    a, g = ops[i], ops[i + 1]
    assert (a["fabric_op"], g["fabric_op"], g["op"], g["seq"]) == ("alltoall", "all-gather", "all_reduce", a["seq"] + 1)
    assert a["send_splits"] == a["recv_splits"] == [16] * 8 and g["bytes"] == 16  # 12 int64 in blocks of 2
    for r in range(8):
        assert f"[rank {r}] ok all_to_all_single uneven" in out
        assert f"[rank {r}] ok all_reduce sum torch.int64" in out  # reduced at the ranks
        assert f"[rank {r}] ok async all_reduce x3" in out
        assert f"[rank {r}] ok future after wait 29" in out
        assert f"[rank {r}] ok reduce_scatter int64's Work holds its output" in out
        assert f"[rank {r}] ok broadcast of 0 elements" in out
        assert f"[rank {r}] ok all_reduce float64 into an nn.Parameter" in out
        assert f"[rank {r}] refused small all_to_all_single output: ifec: all_to_all_single: the input splits" in out
        assert f"[rank {r}] ok all_reduce after a refused operation" in out
        assert (f"[rank {r}] refused mismatched sizes: ifec: " in out and "rank 3 runs allreduce of 7 fp32 elements"
                in out.split(f"[rank {r}] refused mismatched sizes:")[1].splitlines()[0]), out[-3000:]
        assert f"[rank {r}] ok all_reduce after mismatched sizes" in out
        # every reduction of every dtype: the fabric's (fp32, bf16, fp16, int32: sum, avg, min, max), the rest at the
        # ranks (product, bitwise, bool, int8, uint8, int64, float64 were refused, or reduced with no root)
        for dtype in ("float32", "bfloat16", "float16", "int32", "int64", "float64", "bool", "uint8", "int8"):
            for op in ("sum", "product", "min", "max") + (("avg",) if "float" in dtype else ("band", "bor", "bxor")):
                assert f"[rank {r}] ok all_reduce {op} torch.{dtype}\n" in out, (op, dtype)
        assert (f"[rank {r}] refused bxor on torch.float16: ifec: all_reduce with bxor on float16 is not supported "
                "(bitwise reductions need an integer or bool dtype)") in out
        assert (f"[rank {r}] refused avg on torch.int8: ifec: all_reduce with avg on int8 is not supported (avg needs "
                "a floating-point dtype)") in out
        for what in ("reduce to rank n", "reduce of int64 to rank n"):
            assert f"[rank {r}] refused {what}: ifec: reduce with root rank 8: the group's ranks are 0..7" in out
        assert f"[rank {r}] refused broadcast from rank -1: ifec: broadcast with root rank -1" in out
        # one rank's empty tensor or refusal: every rank fails at once naming it, and the ranks stay in step
        for what in ("one rank's empty tensor", "one rank's short all_gather list"):
            line = out.split(f"[rank {r}] refused {what}: ")[1].splitlines()[0]
            assert ("rank 3 runs barrier of 0 fp32 elements" in line if r != 3 or "empty" in what else
                    "ifec: all_gather needs one list of 8 output tensors, not 7" in line), line
            assert f"[rank {r}] ok all_reduce after {what}" in out
        line = out.split(f"[rank {r}] refused disagreeing all_to_all_single splits: ")[1].splitlines()[0]
        assert "alltoall: rank 0 sends 8 B to rank 1, which expects 4 B (its recv splits)" in line, line
        for name in ("all_reduce after disagreeing all_to_all_single splits", "all_to_all_single with an idle rank",
                     "scatter int8 from 1", "all_to_all list", "all_reduce_coalesced max"):
            assert f"[rank {r}] ok {name}" in out
    assert "[rank 5] ok reduce to 5" in out
    assert "[rank 2] ok gather to 2" in out and "[rank 0] ok gather_object" in out
    assert "refused premul_sum: ifec: all_reduce with premul_sum on float32 is not supported" in out
    for r in range(8):
        for name in ("all_reduce in a group of half the ranks", "all_reduce of every rank after a group's",
                     "broadcast in a group", "all_to_all_single in a group"):
            assert f"[rank {r}] ok {name}" in out
    assert "[rank 0] refused one-rank group: ifec: new_group of one rank (0)" in out


def test_point_to_point_transfers_equal_what_each_sender_sent_and_gloo_runs_the_same(fab, tmp_path):
    """send/recv, isend/irecv with every rank sending first, batch_isend_irecv, a pipeline, dtypes, a group's ring;
    what the backend refuses is named at both ends and the channels go on. The same program runs on Gloo."""
    rc, out = _run(fab, "p2p_check.py", trace=tmp_path / "trace")
    assert rc == 0, out[-3000:]
    for r in range(8):
        for name in ("send and recv round the ring", "isend then irecv, every rank sending first",
                     "batch_isend_irecv from the left", "batch_isend_irecv from the right",
                     "isend and irecv of torch.bfloat16", "isend and irecv of torch.uint8", "non-contiguous tensors",
                     "isend and irecv after refusals", "all_reduce after the transfers"):
            assert f"[rank {r}] ok {name}" in out, (r, name, out[-3000:])
        assert (f"[rank {r}] ok isend and irecv in a group" in out) == (r % 2 == 1)
        assert f"[rank {r}] refused recv from any source: ifec: recv from any source is not supported" in out
        assert f"[rank {r}] refused send to itself: ifec: send to rank {r}, this rank itself" in out
        assert f"[rank {r}] refused send to rank n: ifec: send to rank 8: the group's ranks are 0..7" in out
        sizes = out.split(f"[rank {r}] refused disagreeing sizes: ")[1].splitlines()[0]
        mine, theirs = ("40", "80") if r % 2 == 0 else ("80", "40")
        assert f"runs send of {theirs} B with tag 0 where this" in sizes and f"runs send of {mine} B" in sizes, sizes
        tags = out.split(f"[rank {r}] refused disagreeing tags: ")[1].splitlines()[0]
        assert "with tag 1" in tags and "with tag 2" in tags, tags
        big = out.split(f"[rank {r}] refused a transfer too large: ")[1].splitlines()[0]
        assert ("ifec: send of 1074790400 B, where one request" in big if r % 2 == 0 else
                "the sender runs a transfer its rank refused where this receiver runs send of 40 B" in big), big
    assert "[rank 7] ok a pipeline down the ranks" in out and "[rank 1] ok ten transfers in order" in out
    assert "[rank 1] ok recv after 33 s" in out or "[rank 1] ok recv after 34 s" in out, out[-3000:]
    for r in range(2, 8):  # waited in the all_reduce for ranks 0 and 1, past the hub's own 30 s
        assert re.search(rf"\[rank {r}\] ok all_reduce after 3[3-9] s", out), (r, out[-3000:])
    ops = [json.loads(line) for line in (tmp_path / "trace" / "rank0.jsonl").read_text().splitlines()]
    sends = [o for o in ops if o["fabric_op"] == "send"]
    assert sends and all(o["row"]["collective"] == "send" for o in sends if o["ok"])
    assert {o["op"] for o in sends} == {"send", "recv"}
    _run_gloo("p2p_check.py")


def test_a_later_programs_groups_of_other_ranks_run(fab):
    """After collectives_check.py (its first group: every rank), a program whose first group is half the ranks: the
    hostds kept the earlier program's groups, and the new ones must not be taken for them."""
    rc, out = _run(fab, "groups_again.py")
    assert rc == 0, out[-3000:]
    for r in range(4):
        assert f"[rank {r}] ok all_reduce in the first group, other ranks than the earlier program's" in out
    for r in range(8):
        assert f"[rank {r}] ok all_reduce in a group of every rank" in out


def test_a_world_smaller_than_the_fabric_is_refused_at_once(fab):
    rc, out = _run(fab, "small_world.py")
    assert rc == 0, out[-3000:]
    for r in range(4):
        line = out.split(f"[rank {r}] refused small world: ")[1].splitlines()[0] if f"[rank {r}] refused" in out else ""
        assert "the program's world has 4 rank(s), the fabric 8" in line, out[-3000:]


def test_ddp_equals_gloo_and_repeats_bitwise(fab, tmp_path):
    import torch
    rc, out = _run(fab, "ddp_train.py", "--out", tmp_path / "a.pt", trace=tmp_path / "trace")
    assert rc == 0, out[-3000:]
    rc, out = _run(fab, "ddp_train.py", "--out", tmp_path / "b.pt")
    assert rc == 0, out[-3000:]
    _run_gloo("ddp_train.py", "--out", tmp_path / "gloo.pt")
    a, b, g = (torch.load(tmp_path / f) for f in ("a.pt", "b.pt", "gloo.pt"))
    assert a.keys() == g.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)  # the switches reduce in contributor order
    worst = max((a[k] - g[k]).abs().max().item() for k in a)
    assert worst <= DDP_TOLERANCE, f"parameters differ from Gloo's by {worst}"
    for r in range(8):  # every rank traced every operation: 20 steps' gradient all_reduces and DDP's own
        ops = [json.loads(line) for line in (tmp_path / "trace" / f"rank{r}.jsonl").read_text().splitlines()]
        # numbered from 0, an all_reduce taking two numbers (in the fabric it uses the first)
        steps = [b["seq"] - a["seq"] for a, b in zip(ops, ops[1:])]
        assert ops[0]["seq"] == 0 and steps == [1 + (a["op"] == "all_reduce") for a in ops[:-1]], steps
        assert sum(o["op"] == "all_reduce" for o in ops) >= 20
        assert ops[0]["op"] == "all_gather" and any(o["op"] == "broadcast" for o in ops)
        assert all(o["ok"] and o["end_ns"] >= o["start_ns"] >= o["issued_ns"] for o in ops)
        assert all(o["row"]["ran"] == "ifec" for o in ops if o["op"] == "all_reduce")
    # Replayed on the simulator with the same 8 GPUs (each operation from the state it found: the group counter and
    # stripe rotors): the same bytes on every link, each Y-cable's sub-links apart, within 5%; at 256 ranks the
    # in-switch all_reduce beats the best endpoint algorithm.
    from ifec import replay
    out = io.StringIO()
    res = replay.report(tmp_path / "trace", fab.topology_file, out=out)
    assert max(res[s + "_deviation"] for s in ("gpu", "port", "sublink")) <= 0.05, out.getvalue()
    text = io.StringIO()
    big = replay.report(tmp_path / "trace", REPO / "testbed/topologies/superpod-256x8.yaml", k=256, out=text)
    assert big["ranks"] == 256 and big["comm_us"]["ifec"] < big["comm_us"]["best"], text.getvalue()


def test_moe_layer_on_all_to_all_single_equals_the_single_process_layer(fab, tmp_path):
    rc, out = _run(fab, "moe_alltoall.py", "--out", tmp_path / "moe")
    assert rc == 0, out[-3000:]
    for r in range(8):
        res = json.loads((tmp_path / f"moe.rank{r}").read_text())
        assert res["max_error"] <= 1e-5
        assert sum(res["sent"]) == 48 and len(set(res["received"])) > 1  # uneven splits


def test_tensor_parallel_linear_equals_the_dense_layer(fab, tmp_path):
    rc, out = _run(fab, "tp_linear.py", "--out", tmp_path / "tp")
    assert rc == 0, out[-3000:]
    for r in range(8):
        err = json.loads((tmp_path / f"tp.rank{r}").read_text())
        assert err["row_parallel_fp32"] <= 1e-4 and err["column_parallel"] <= 1e-5
        assert err["row_parallel_bf16"] <= 3e-2


def test_the_live_drivers_trace_replays_to_the_same_bytes_per_sub_link(fab, tmp_path):
    """./ifec live run --trace: the driver's own operations (drawn inputs, checked) in the backend's trace format."""
    from ifec import replay
    for what, size in (("allreduce", 64 * 1024), ("multicast", 64 * 1024), ("alltoall", 16 * 1024)):
        assert fab.run(what, algo="ifec", bytes=size, root=2, trace=tmp_path / "t")["ok"]
    out = io.StringIO()
    res = replay.report(tmp_path / "t", fab.topology_file, out=out)
    assert res["operations"] == 3 and "driver: live" in out.getvalue()
    assert max(res[s + "_deviation"] for s in ("gpu", "port", "sublink")) <= 0.05, out.getvalue()


def test_a_dead_hostd_is_named_within_a_bounded_time(fab, tmp_path):
    """Last: gpu3's hostd killed, every rank's all_reduce fails with an error naming it, well within the bound."""
    program = tmp_path / "one_allreduce.py"
    program.write_text("import torch, torch.distributed as dist\n"
                       "dist.init_process_group('ifec')\n"
                       "try:\n"
                       "    dist.all_reduce(torch.ones(1024))\n"
                       "    print('no error')\n"
                       "except RuntimeError as e:\n"
                       "    print('error:', str(e).splitlines()[0])\n")
    fab.kill("gpu3")
    t0 = time.time()
    out = io.StringIO()
    rc = torchrun.launch(fab, program, timeout=40, out=out)
    took = time.time() - t0
    text = out.getvalue()
    assert rc == 0, text[-3000:]
    assert "no error" not in text
    assert "[rank 3] error: ifec: all_reduce of float32 (4096 B, sum) on rank 3: hostd gpu3" in text, text
    assert "does not answer" in text
    others = [line for line in text.splitlines() if line.startswith("[rank 0] error:")]
    # Rank 0's hub names the rank that never arrived: it asks that rank's hostd every 2 s and gives up on it after
    # 4 s of silence, well before the 36 s the program's timeout allows (15 s here, starting torch included).
    assert others and "rank 3 (gpu3): its hostd has not answered for" in others[0], text
    assert took < 30, f"{took:.0f} s"
