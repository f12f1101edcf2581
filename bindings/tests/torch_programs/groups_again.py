"""A second program's groups on a fabric an earlier program's groups used: its first new_group is of other ranks than
the earlier program's first (their numbers at the hostds must not meet), then a group of every rank. An unmodified
PyTorch program; prints one line per check and exits non-zero at the first that fails."""
import torch
import torch.distributed as dist

dist.init_process_group("ifec")
rank, n = dist.get_rank(), dist.get_world_size()
low = dist.new_group(list(range(n // 2)))  # collectives_check.py's first group is every rank
t = torch.full((6,), float(rank + 1))
if rank < n // 2:
    dist.all_reduce(t, group=low)
    want = float(sum(range(1, n // 2 + 1)))
    assert torch.equal(t, torch.full((6,), want)), f"first group: got {t.tolist()} want {want}"
    print("ok all_reduce in the first group, other ranks than the earlier program's")
every = dist.new_group(list(range(n)))
t = torch.full((6,), float(rank + 1))
dist.all_reduce(t, group=every)
assert torch.equal(t, torch.full((6,), float(sum(range(1, n + 1))))), f"second group: got {t.tolist()}"
print("ok all_reduce in a group of every rank")
dist.destroy_process_group()
