"""An expert-parallel MoE layer on all_to_all_single with split sizes: an unmodified PyTorch program.

Every rank routes its own tokens (top-1 of E experts, E/world per rank), tells each rank how many tokens it sends
it (all_to_all_single of counts), dispatches the tokens (all_to_all_single with those splits), runs its experts,
and combines the results back (the reverse split). Every rank knows every expert's weights (one seed), so it checks
its outputs against the same layer computed in this one process.
"""
import argparse
import json

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--backend", default="ifec")
p.add_argument("--tokens", type=int, default=48)
p.add_argument("--hidden", type=int, default=32)
p.add_argument("--out", help="a JSON file per rank: OUT.rank<R>")
args = p.parse_args()

dist.init_process_group(args.backend)
rank, world = dist.get_rank(), dist.get_world_size()
experts = 2 * world
torch.manual_seed(7)
gate = torch.randn(args.hidden, experts)
w1 = torch.randn(experts, args.hidden, 2 * args.hidden) / args.hidden ** 0.5
w2 = torch.randn(experts, 2 * args.hidden, args.hidden) / args.hidden ** 0.5
x = torch.randn(args.tokens, args.hidden, generator=torch.Generator().manual_seed(100 + rank))


def expert(e, rows):
    return torch.relu(rows @ w1[e]) @ w2[e]


probs = torch.softmax(x @ gate, dim=1)
weight, chosen = probs.max(dim=1)
order = torch.argsort(chosen, stable=True)  # tokens grouped by expert, so by owning rank
owner = chosen[order] // (experts // world)
send_counts = torch.bincount(owner, minlength=world)
recv_counts = torch.empty_like(send_counts)
dist.all_to_all_single(recv_counts, send_counts)  # the notify step: who sends me how many tokens
send = torch.cat([x[order], chosen[order].unsqueeze(1).float()], dim=1)  # each row carries its expert id
recv = torch.empty(int(recv_counts.sum()), args.hidden + 1)
dist.all_to_all_single(recv, send, recv_counts.tolist(), send_counts.tolist())
out_rows = torch.empty(recv.shape[0], args.hidden)
for e in recv[:, -1].long().unique().tolist():
    mask = recv[:, -1].long() == e
    out_rows[mask] = expert(e, recv[mask, :-1])
back = torch.empty(args.tokens, args.hidden)
dist.all_to_all_single(back, out_rows, send_counts.tolist(), recv_counts.tolist())  # combine: the reverse split
y = torch.empty_like(back)
y[order] = back * weight[order].unsqueeze(1)

reference = torch.stack([expert(int(chosen[t]), x[t:t + 1])[0] * weight[t] for t in range(args.tokens)])
err = (y - reference).abs().max().item()
print(f"rank {rank}: sent {send_counts.tolist()} received {recv_counts.tolist()} max |error| {err:.3g}")
if args.out:
    with open(f"{args.out}.rank{rank}", "w") as f:
        json.dump(dict(max_error=err, sent=send_counts.tolist(), received=recv_counts.tolist()), f)
assert torch.allclose(y, reference, rtol=1e-5, atol=1e-5), f"rank {rank}: MoE output differs by {err}"
dist.destroy_process_group()
