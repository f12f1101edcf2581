"""A tensor-parallel linear layer on all_reduce (row-parallel) and all_gather (column-parallel): an unmodified
PyTorch program. Each rank holds its shard of the weight; the results must equal the dense layer's.
"""
import argparse
import json

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--backend", default="ifec")
p.add_argument("--out", help="a JSON file per rank: OUT.rank<R>")
args = p.parse_args()

dist.init_process_group(args.backend)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(3)
x = torch.randn(64, 128)
w = torch.randn(96, 128) / 128 ** 0.5
dense = x @ w.t()
errors = {}

# Row-parallel: rank r holds input features [r*k, (r+1)*k) of x and w; the partial products are summed.
k = 128 // world
y = x[:, rank * k:(rank + 1) * k] @ w[:, rank * k:(rank + 1) * k].t()
dist.all_reduce(y)
errors["row_parallel_fp32"] = (y - dense).abs().max().item()
assert torch.allclose(y, dense, rtol=1e-4, atol=1e-4), f"row-parallel differs by {errors['row_parallel_fp32']}"

# The same in bf16 (summed in the switch in fp32 and rounded once).
yb = (x[:, rank * k:(rank + 1) * k] @ w[:, rank * k:(rank + 1) * k].t()).bfloat16()
dist.all_reduce(yb)
errors["row_parallel_bf16"] = (yb.float() - dense).abs().max().item()
assert torch.allclose(yb.float(), dense, rtol=3e-2, atol=3e-2), f"bf16 differs by {errors['row_parallel_bf16']}"

# Column-parallel: rank r holds output features [r*m, (r+1)*m); the outputs are gathered.
m = 96 // world
part = x @ w[rank * m:(rank + 1) * m].t()
parts = [torch.empty_like(part) for _ in range(world)]
dist.all_gather(parts, part)
errors["column_parallel"] = (torch.cat(parts, dim=1) - dense).abs().max().item()
assert errors["column_parallel"] < 1e-5, f"column-parallel differs by {errors['column_parallel']}"

print(f"rank {rank}: " + ", ".join(f"{n} max |error| {e:.3g}" for n, e in errors.items()))
if args.out:
    with open(f"{args.out}.rank{rank}", "w") as f:
        json.dump(errors, f)
dist.destroy_process_group()
