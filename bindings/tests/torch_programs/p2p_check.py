"""Point-to-point transfers, checked against what each rank knows every other sent: blocking send/recv, a ring of
isends then irecvs (every rank sends first), batch_isend_irecv both ways round the ring, a pipeline that passes a
tensor down the ranks, dtypes and a non-contiguous tensor, transfers in a group, and, on the ifec backend, what it
refuses. An unmodified PyTorch program (any backend that has send and recv: ifec, gloo); prints one line per check
and exits non-zero at the first that fails."""
import argparse
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--backend", default="ifec")
args = p.parse_args()
dist.init_process_group(args.backend)
rank, n = dist.get_rank(), dist.get_world_size()
nxt, prv = (rank + 1) % n, (rank - 1) % n


def sent(src, dst, k=0, numel=1000, dtype=torch.float32):
    """What rank `src` sends rank `dst` as its k-th tensor: every rank can compute every other's."""
    g = torch.Generator().manual_seed(1000 * src + 10 * dst + k)
    x = torch.randn(numel, generator=g) * 100
    return x.to(dtype) if dtype.is_floating_point else x.long().to(dtype)


def check(name, got, want):
    assert torch.equal(got, want), f"{name}: got {got.flatten()[:6].tolist()} want {want.flatten()[:6].tolist()}"
    print(f"ok {name}")


# Blocking send and recv: even ranks send first, odd ranks receive first.
t = torch.empty(1000)
if rank % 2 == 0:
    dist.send(sent(rank, nxt), nxt)
    dist.recv(t, prv)
else:
    dist.recv(t, prv)
    dist.send(sent(rank, nxt), nxt)
check("send and recv round the ring", t, sent(prv, rank))

# Every rank sends first: isend, then irecv, then wait (a blocking send per rank would wait for a receiver forever).
t = torch.empty(1000)
works = [dist.isend(sent(rank, nxt, 1), nxt), dist.irecv(t, prv)]
for w in works:
    w.wait()
check("isend then irecv, every rank sending first", t, sent(prv, rank, 1))

# batch_isend_irecv both ways round the ring, of 256 KiB (several windows' worth of frames).
left, right = torch.empty(65536), torch.empty(65536)
ops = [dist.P2POp(dist.isend, sent(rank, nxt, 2, 65536), nxt), dist.P2POp(dist.isend, sent(rank, prv, 2, 65536), prv),
       dist.P2POp(dist.irecv, left, prv), dist.P2POp(dist.irecv, right, nxt)]
for w in dist.batch_isend_irecv(ops):
    w.wait()
check("batch_isend_irecv from the left", left, sent(prv, rank, 2, 65536))
check("batch_isend_irecv from the right", right, sent(nxt, rank, 2, 65536))

# A pipeline: rank 0 starts a tensor, each rank adds its own and passes it on; the last holds the sum.
x = sent(0, 0, 3)
if rank > 0:
    dist.recv(x, rank - 1)
    x += sent(rank, rank, 3)
if rank < n - 1:
    dist.send(x, rank + 1)
else:
    want = sent(0, 0, 3)
    for r in range(1, n):
        want += sent(r, r, 3)
    check("a pipeline down the ranks", x, want)

# Many small transfers in order on one channel; then dtypes, and (ifec) a non-contiguous tensor either side.
if rank == 0:
    for k in range(10):
        dist.send(sent(0, 1, 10 + k, 7), 1)
elif rank == 1:
    for k in range(10):
        t = torch.empty(7)
        dist.recv(t, 0)
        assert torch.equal(t, sent(0, 1, 10 + k, 7)), f"transfer {k} out of order"
    print("ok ten transfers in order")
for dtype in (torch.bfloat16, torch.int64, torch.uint8, torch.float64):
    t = torch.empty(333, dtype=dtype)
    works = [dist.isend(sent(rank, nxt, 4, 333, dtype), nxt), dist.irecv(t, prv)]
    for w in works:
        w.wait()
    check(f"isend and irecv of {dtype}", t, sent(prv, rank, 4, 333, dtype))
if args.backend == "ifec":  # (Gloo refuses tensors that are not contiguous)
    m = torch.empty(30, 20)  # its transpose, 20 x 30 and not contiguous, receives
    works = [dist.isend(sent(rank, nxt, 5, 600).view(30, 20).t(), nxt), dist.irecv(m.t(), prv)]
    for w in works:
        w.wait()
    check("non-contiguous tensors", m.t(), sent(prv, rank, 5, 600).view(30, 20).t())

# Transfers in a group: the odd ranks pass a tensor round their own ring (group ranks, global ranks to torch).
odd = dist.new_group([r for r in range(n) if r % 2 == 1])
if rank % 2 == 1:
    members = [r for r in range(n) if r % 2 == 1]
    i = members.index(rank)
    to, frm = members[(i + 1) % len(members)], members[(i - 1) % len(members)]
    t = torch.empty(100)
    works = [dist.isend(sent(rank, to, 6, 100), to, group=odd), dist.irecv(t, frm, group=odd)]
    for w in works:
        w.wait()
    check("isend and irecv in a group", t, sent(frm, rank, 6, 100))

if args.backend == "ifec":
    # Refused where the call is made: no source, this rank itself, a rank outside the group.
    for what, call in (("recv from any source", lambda: dist.recv(torch.empty(1))),
                       ("send to itself", lambda: dist.send(torch.empty(1), rank)),
                       ("send to rank n", lambda: dist.send(torch.empty(1), n))):
        try:
            call()
            raise AssertionError(f"{what} was not refused")
        except (RuntimeError, ValueError) as e:
            print(f"refused {what}: {str(e).splitlines()[0]}")
    # Sizes and tags that disagree fail both sides, naming the other's; the channel then goes on.
    for what, (mine, theirs) in (("sizes", ((10, 0), (20, 0))), ("tags", ((10, 1), (10, 2)))):
        numel, tag = mine if rank % 2 == 0 else theirs
        try:
            if rank % 2 == 0:
                dist.send(torch.ones(numel), nxt, tag=tag)
            else:
                dist.recv(torch.empty(numel), prv, tag=tag)
            raise AssertionError(f"disagreeing {what} were not refused")
        except RuntimeError as e:
            print(f"refused disagreeing {what}: {str(e).splitlines()[0]}")
    # A tensor this rank refuses (more than one request to hostd carries; never touched) fails its peer at once too.
    try:
        if rank % 2 == 0:
            dist.send(torch.empty((1 << 28) + (1 << 18)), nxt)
        else:
            dist.recv(torch.empty(10), prv)
        raise AssertionError("a refused transfer was not refused")
    except RuntimeError as e:
        print(f"refused a transfer too large: {str(e).splitlines()[0]}")
    t = torch.empty(1000)
    works = [dist.isend(sent(rank, nxt, 7), nxt), dist.irecv(t, prv)]
    for w in works:
        w.wait()
    check("isend and irecv after refusals", t, sent(prv, rank, 7))

t = torch.full((4,), float(rank))
dist.all_reduce(t)
check("all_reduce after the transfers", t, torch.full((4,), float(sum(range(n)))))
# A receiver waits for its sender as long as its timeout allows (a pipeline stage's recv while the stage before it
# computes), and the other ranks wait as long in the all_reduce that follows, past the hub's own 30 s (torch's
# backends wait up to the group's timeout; the ifec backend's is 120 s).
t0 = time.time()
if args.backend == "ifec" and rank in (0, 1):
    if rank == 0:
        time.sleep(33)
        dist.send(sent(0, 1, 8), 1)
    else:
        t = torch.empty(1000)
        dist.recv(t, 0)
        check(f"recv after {time.time() - t0:.0f} s", t, sent(0, 1, 8))
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
check(f"all_reduce after {time.time() - t0:.0f} s", t,
      torch.full((4,), float(sum(range(1, n + 1)))))
dist.destroy_process_group()
