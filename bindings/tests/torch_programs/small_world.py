"""A world of fewer ranks than the fabric has GPUs (init_process_group with world_size=4 where 8 GPUs run): refused at
once by every rank's hostd, naming both sizes, where its operations would wait for ranks that never come. Ranks 4..7
of the launch take no part. An unmodified PyTorch program; prints what it checked."""
import os
import time

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
if rank < 4:
    dist.init_process_group("ifec", world_size=4, rank=rank)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        raise AssertionError("a world of 4 ranks on 8 GPUs: no error")
    except RuntimeError as e:
        assert time.monotonic() - t0 < 10, f"refused after {time.monotonic() - t0:.1f} s"
        print(f"refused small world: {str(e).splitlines()[0]}")
    dist.destroy_process_group()
