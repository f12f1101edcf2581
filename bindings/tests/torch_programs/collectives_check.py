"""Every operation the ifec backend offers, checked against the same computation in this process: an unmodified
PyTorch program. Prints one line per check; exits non-zero at the first that fails."""
import time

import torch
import torch.distributed as dist

dist.init_process_group("ifec")
rank, n = dist.get_rank(), dist.get_world_size()
every = [torch.arange(12, dtype=torch.float32) * (r + 1) - r for r in range(n)]  # rank r's input
mine = every[rank]


def check(name, got, want, exact=True):
    ok = torch.equal(got, want) if exact else torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert ok, f"{name}: got {got.tolist()} want {want.tolist()}"
    print(f"ok {name}")


FOLD = {"sum": torch.add, "avg": torch.add, "product": torch.mul, "min": torch.minimum, "max": torch.maximum,
        "band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}


def fold(ins, op):
    """The ranks' inputs reduced in rank order in their dtype (bool: add is or, mul and): what the ranks compute for
    what the fabric does not reduce, and within rounding what it does."""
    r = ins[0].clone()
    for x in ins[1:]:
        r = FOLD[op](r, x)
    return r / len(ins) if op == "avg" else r


# Every reduction on every dtype: fp32, bf16, fp16, int32 sum/avg/min/max in the fabric, the rest at the ranks;
# bitwise reductions of floating-point dtypes and avg of integers are refused naming both.
for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.float64, torch.bool,
              torch.uint8, torch.int8):
    if dtype == torch.bool:
        ins = [e.long() % (r + 2) == 0 for r, e in enumerate(every)]
    else:
        ins = [e.to(dtype) if dtype.is_floating_point else e.long().to(dtype) for e in every]
    for name in FOLD:
        t = ins[rank].clone()
        try:
            dist.all_reduce(t, op=getattr(dist.ReduceOp, name.upper()))
        except RuntimeError as e:
            if (name in ("band", "bor", "bxor")) if dtype.is_floating_point else name == "avg":
                print(f"refused {name} on {dtype}: {str(e).splitlines()[0]}")
                continue
            raise
        # the fabric's sums round once (bf16, fp16), not at every step
        floats = dtype.is_floating_point and name in ("sum", "avg")
        want = fold([i.double() for i in ins], name).to(dtype) if floats else fold(ins, name)
        check(f"all_reduce {name} {dtype}", t, want, exact=dtype not in (torch.bfloat16, torch.float16))
t = torch.complex(mine, -mine)  # torch sums a complex tensor as its float view
dist.all_reduce(t)
check("all_reduce sum complex64", t, torch.complex(sum(every), -sum(every)))
t = mine.clone()
dist.all_reduce(t, op=dist.ReduceOp.AVG)
check("all_reduce avg float32", t, sum(every) / n, exact=False)
t = mine.clone()
dist.reduce(t, dst=5)
if rank == 5:
    check("reduce to 5", t, sum(every))
t = mine.to(torch.int8).clone()
dist.broadcast(t, src=3)  # 12 bytes of int8: moved, not reduced
check("broadcast int8 from 3", t, every[3].to(torch.int8))
outs = [torch.empty(5, dtype=torch.uint8) for _ in range(n)]  # 5 B per rank: padded on the wire, not in the result
dist.all_gather(outs, torch.full((5,), rank, dtype=torch.uint8))
check("all_gather uint8 list", torch.stack(outs), torch.arange(n, dtype=torch.uint8).repeat_interleave(5).view(n, 5))
big = torch.empty(n * 12)
dist.all_gather_into_tensor(big, mine)
check("all_gather into one tensor", big, torch.cat(every))
rs_in = torch.arange(n * 3, dtype=torch.float32) + rank
rs_out = torch.empty(3)
dist.reduce_scatter(rs_out, list(rs_in.chunk(n)))
check("reduce_scatter", rs_out,
      sum(torch.arange(n * 3, dtype=torch.float32) + r for r in range(n))[rank * 3:rank * 3 + 3])
# all_to_all_single with uneven splits: rank r sends (r + d) % 3 rows of 2 to rank d.
send = [(rank + d) % 3 for d in range(n)]
recv = [(s + rank) % 3 for s in range(n)]
x = torch.cat([torch.full((c, 2), 100.0 * rank + d) for d, c in enumerate(send)])
y = torch.empty(sum(recv), 2)
dist.all_to_all_single(y, x, recv, send)
check("all_to_all_single uneven", y, torch.cat([torch.full((c, 2), 100.0 * s + rank) for s, c in enumerate(recv)]))
works = [dist.all_reduce(torch.full((4,), float(rank + k)), async_op=True) for k in range(3)]
for w in works:
    w.wait()
check("async all_reduce x3", torch.stack([w.result()[0] for w in works]),
      torch.stack([torch.full((4,), float(sum(range(n)) + n * k)) for k in range(3)]))
g = dist.new_group(list(range(n)))
t = mine.clone()
dist.all_reduce(t, group=g)
check("new_group of every rank", t, sum(every))
# Groups of half the ranks (every rank creates both, in the same order), their operations interleaved with the
# world's: each has a communicator of its own at its members' hostds.
evens, odds = dist.new_group(list(range(0, n, 2))), dist.new_group(list(range(1, n, 2)))
mine_g, members = (evens, list(range(0, n, 2))) if rank % 2 == 0 else (odds, list(range(1, n, 2)))
t = mine.clone()
dist.all_reduce(t, group=mine_g)
check("all_reduce in a group of half the ranks", t, sum(every[m] for m in members))
t = mine.clone()
dist.all_reduce(t)
check("all_reduce of every rank after a group's", t, sum(every))
t = mine.clone()
dist.broadcast(t, src=members[1], group=mine_g)
check("broadcast in a group", t, every[members[1]])
y = torch.empty(len(members))
dist.all_to_all_single(y, torch.full((len(members),), float(rank)), group=mine_g)
check("all_to_all_single in a group", y, torch.tensor([float(m) for m in members]))
dist.barrier()
print("ok barrier")
# A Work's future is complete once wait() returns (its value was read before it was marked, now and then).
for k in range(30):
    w = dist.all_reduce(torch.full((4,), float(rank)), async_op=True)
    w.wait()
    check(f"future after wait {k}", w.get_future().value()[0], torch.full((4,), float(sum(range(n)))))
rs64 = torch.empty(2, dtype=torch.int64)
w = dist.reduce_scatter_tensor(rs64, torch.arange(n * 2, dtype=torch.int64) + rank, async_op=True)
w.wait()
check("reduce_scatter int64's Work holds its output", w.result()[0], rs64)
for name, t in (("all_reduce", torch.empty(0)), ("broadcast", torch.empty(0, 3))):  # as Gloo: nothing to do
    (dist.all_reduce if name == "all_reduce" else lambda x: dist.broadcast(x, src=0))(t)
    print(f"ok {name} of 0 elements")
# Results land in place also in a parameter that requires grad (an optimizer's own step), as NCCL's and Gloo's do.
p = torch.nn.Parameter(torch.full((4,), float(rank)))
dist.all_reduce(p, op=dist.ReduceOp.AVG)
check("all_reduce avg into an nn.Parameter", p.detach(), torch.full((4,), sum(range(n)) / n), exact=False)
p = torch.nn.Parameter(torch.full((4,), float(rank), dtype=torch.float64))
dist.all_reduce(p)
check("all_reduce float64 into an nn.Parameter", p.detach(),
      torch.full((4,), float(sum(range(n))), dtype=torch.float64))
try:  # an output too small for the splits: refused on every rank before anything moves, not truncated
    dist.all_to_all_single(torch.empty(n - 1, 2), torch.ones(n, 2), [1] * n, [1] * n)
    raise AssertionError("all_to_all_single into too small an output: no error")
except RuntimeError as e:
    print(f"refused small all_to_all_single output: {str(e).splitlines()[0]}")
t = mine.clone()
dist.all_reduce(t)
check("all_reduce after a refused operation", t, sum(every))
t0 = time.monotonic()
try:  # rank 3 gives one element more: named at every rank at once (the entry barrier compares), not a timeout
    dist.all_reduce(torch.ones(7 if rank == 3 else 6))
    raise AssertionError("all_reduce of mismatched sizes: no error")
except RuntimeError as e:
    assert time.monotonic() - t0 < 10, f"mismatched sizes took {time.monotonic() - t0:.1f} s to fail"
    print(f"refused mismatched sizes: {str(e).splitlines()[0]}")
t = mine.clone()
dist.all_reduce(t)
check("all_reduce after mismatched sizes", t, sum(every))
for what, call in (("premul_sum", lambda: dist.all_reduce(mine.clone(), op=dist._make_nccl_premul_sum(2.0))),
                   ("reduce to rank n", lambda: dist.reduce(mine.clone(), dst=n)),  # reduced at the ranks: no root
                   ("reduce of int64 to rank n", lambda: dist.reduce(torch.ones(2, dtype=torch.int64), dst=n)),
                   ("broadcast from rank -1", lambda: dist.broadcast(mine.clone(), src=-1))):
    try:
        call()
        raise AssertionError(f"{what}: no error")
    except RuntimeError as e:
        print(f"refused {what}: {str(e).splitlines()[0]}")
dist.barrier()
# One rank's refusals and empty tensors keep their operation's place (its number on every rank): the others' operation
# fails at once naming it, not after the hub's 30 s, and the ranks stay in step (a rank that skipped it met the
# others' next operation with this one, and every later one, out of step).
for what, call in (("one rank's empty tensor", lambda: dist.all_reduce(torch.ones(0 if rank == 3 else 6))),
                   ("one rank's short all_gather list",
                    lambda: dist.all_gather([torch.empty(3) for _ in range(n - 1 if rank == 3 else n)], torch.ones(3))),
                   # rank 0 sends rank 1 two rows (it expects one) and rank n-1 none: every rank names the pair at once
                   # (rank 2, not concerned, waited for stores that never came)
                   ("disagreeing all_to_all_single splits",
                    lambda: dist.all_to_all_single(torch.empty(n), torch.ones(n), [1] * n,
                                                   [1, 2] + [1] * (n - 3) + [0] if rank == 0 else [1] * n))):
    t0 = time.monotonic()
    try:
        call()
        raise AssertionError(f"{what}: no error")
    except RuntimeError as e:
        assert time.monotonic() - t0 < 10, f"{what} took {time.monotonic() - t0:.1f} s to fail"
        print(f"refused {what}: {str(e).splitlines()[0]}")
    t = mine.clone()
    dist.all_reduce(t)
    check(f"all_reduce after {what}", t, sum(every))
# An all_to_all_single that one rank takes no part in (it sends and receives nothing) still meets it at hostd.
send = [0] * n if rank == 0 else [0] + [1] * (n - 1)
y = torch.empty(sum(send), 2)
dist.all_to_all_single(y, torch.full((sum(send), 2), float(rank)), send, send)
check("all_to_all_single with an idle rank", y,
      torch.cat([torch.full((1, 2), float(s)) for s in range(1, n)]) if rank else torch.empty(0, 2))
# gather, scatter, all_to_all (lists, uneven sizes) and all_reduce_coalesced, on the all-to-all with splits
gl = [torch.empty(r + 1) for r in range(n)] if rank == 2 else None
dist.gather(torch.full((rank + 1,), float(rank)), gl, dst=2)
if rank == 2:
    check("gather to 2", torch.cat(gl), torch.cat([torch.full((r + 1,), float(r)) for r in range(n)]))
t = torch.empty(2, rank + 1, dtype=torch.int8)
dist.scatter(t, [torch.full((2, r + 1), r, dtype=torch.int8) for r in range(n)] if rank == 1 else None, src=1)
check("scatter int8 from 1", t, torch.full((2, rank + 1), rank, dtype=torch.int8))
outs = [torch.empty(s + rank + 1) for s in range(n)]
dist.all_to_all(outs, [torch.full((rank + d + 1,), 100.0 * rank + d) for d in range(n)])
check("all_to_all list", torch.cat(outs), torch.cat([torch.full((s + rank + 1,), 100.0 * s + rank) for s in range(n)]))
ts = [mine.clone(), torch.full((2, 2), float(rank))]
dist.all_reduce_coalesced(ts, op=dist.ReduceOp.MAX)
check("all_reduce_coalesced max", torch.cat([ts[0], ts[1].flatten()]),
      torch.cat([torch.stack(every).max(0).values, torch.full((4,), float(n - 1))]))
out = [None] * n if rank == 0 else None
dist.gather_object({"rank": rank}, out, dst=0)
if rank == 0:
    assert out == [{"rank": r} for r in range(n)], out
    print("ok gather_object")
dist.barrier()
# Last: a group of one rank is refused at its member (the others wait in new_group's store barrier until rank 0,
# having been refused, ends and takes the store with it).
try:
    dist.new_group([0])
except RuntimeError as e:
    if rank == 0:
        print(f"refused one-rank group: {str(e).splitlines()[0]}")
