"""DistributedDataParallel training of a small MLP (19,204 parameters, 77 KB of gradients a step): an unmodified
PyTorch program (any backend).

    ./ifec live torchrun bindings/tests/torch_programs/ddp_train.py --out params.pt

Each rank starts from its own perturbed weights (DDP's broadcast from rank 0 must replace them), trains on its own
batches, and the ranks must end with the same parameters (checked here through all_gather); rank 0 saves them.
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--backend", default="ifec")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--out", help="rank 0 saves the final parameters here (torch.save)")
args = p.parse_args()

dist.init_process_group(args.backend)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 4))
with torch.no_grad():
    for param in model.parameters():
        param.add_(0.01 * rank)
ddp = DDP(model, bucket_cap_mb=0.01)  # a few buckets: several all_reduce calls per step, overlapping backward
opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
data = torch.Generator().manual_seed(1000 + rank)
for step in range(args.steps):
    x = torch.randn(32, 16, generator=data)
    y = torch.sin(x[:, :4]) + 0.1 * torch.randn(32, 4, generator=data)
    loss = nn.functional.mse_loss(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step in (0, args.steps - 1):
        print(f"step {step} loss {loss.item():.6f}")

flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
everyone = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(everyone, flat)
assert all(torch.equal(everyone[0], e) for e in everyone), "ranks ended with different parameters"
if rank == 0 and args.out:
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, args.out)
print(f"rank {rank}: {flat.numel()} parameters equal on every rank")
dist.destroy_process_group()
