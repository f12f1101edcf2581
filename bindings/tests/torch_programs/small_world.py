"""A world of fewer ranks than the fabric has GPUs (init_process_group with world_size=4 where 8 GPUs run): refused at
once by every rank's hostd, naming both sizes, where its operations would wait for ranks that never come. Ranks 4..7
of the launch take no part. An unmodified PyTorch program; prints what it checked.

Its rendezvous store is made here (torch's public TCPStore, on the launcher's MASTER_ADDR/MASTER_PORT) so that rank
0, which hosts it, stays until every rank has checked: the refusal is immediate, and a rank 0 gone at once took the
store with it while the others still polled it in init_process_group's barrier (Broken pipe)."""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
if rank < 4:
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 4, rank == 0,
                          timedelta(seconds=60))
    dist.init_process_group("ifec", store=store, world_size=4, rank=rank)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        raise AssertionError("a world of 4 ranks on 8 GPUs: no error")
    except RuntimeError as e:
        assert time.monotonic() - t0 < 10, f"refused after {time.monotonic() - t0:.1f} s"
        print(f"refused small world: {str(e).splitlines()[0]}")
    store.add("checked", 1)
    deadline = time.monotonic() + 60
    while rank == 0 and store.add("checked", 0) < 4:  # the store's host waits for every rank's check
        assert time.monotonic() < deadline, f"{store.add('checked', 0)} of 4 ranks checked in 60 s"
        time.sleep(0.01)
    dist.destroy_process_group()
