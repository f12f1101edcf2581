"""`./ifec sim --replay TRACE`: a program's communication, as the ifec torch.distributed backend traced it, replayed
on the simulated fabric, as recorded or scaled out to K ranks.

A trace is a folder of rank<R>.jsonl files (or one such file), one JSON line per operation a rank issued
(docs/torch-backend.md): torch's operation, dtype, bytes, splits, the fabric operation hostd ran (`fabric_op`, and
in `row` its size, dtype, algorithm, time and bytes per link), and when the program issued it, when it started and
when it ended. Every operation is simulated in-fabric and with the best endpoint algorithm (each distinct shape once);
the GPU compute between operations is the trace's gaps (a rank's issue time less its previous operation's end,
averaged over the ranks); the totals are communication, compute and their sum per algorithm.

Scaling to K ranks keeps what each rank holds: an all_reduce or broadcast keeps its size (data parallel), an
all_gather or reduce_scatter its block per rank, an all_to_all its bytes per rank, spread over its peers (expert
parallel); a group of m of the trace's n ranks becomes one of m K / n (simulated as GPUs 0..m K / n - 1).
All-to-all is simulated as raw RoCEv2 flows of the ranks' mean bytes per peer (uneven splits averaged, marked so).
"""
import argparse
import json
import pathlib
import sys

from . import collectives, sim

FABRIC_OPS = ("allreduce", "reduce", "multicast", "all-gather", "reduce-scatter", "alltoall", "barrier")


class TraceError(ValueError):
    pass


ALGOS = ("ifec", "best", "ring", "tree", "rd", "oneshot")


def _whole(v, what):
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{what} {v!r}: expected a whole number >= 0")
    return v


def _wholes(v, what):
    if not isinstance(v, list):
        raise ValueError(f"{what} {v!r}: expected a list of whole numbers")
    return [_whole(x, what) for x in v]


def _text(v, what):
    if not isinstance(v, str):
        raise ValueError(f"{what} {v!r}: expected a string")
    return v


def _check_record(op):
    """Every field a replay reads, its type and range (ValueError naming the field and value)."""
    _text(op["op"], "op"), _text(op["dtype"], "dtype")
    for key in ("rank", "group", "seq", "issued_ns", "end_ns", "bytes") + tuple(
            k for k in ("start_ns", "root") if k in op):
        _whole(op[key], key)
    if _whole(op["group_size"], "group_size") < 1:
        raise ValueError(f"group_size {op['group_size']}: expected at least 1")
    if op.get("members") is not None:
        members = _wholes(op["members"], "members")
        if len(set(members)) != len(members) or len(members) != op["group_size"]:
            raise ValueError(f"members {members}: expected {op['group_size']} distinct ranks (group_size)")
        if op.get("root", 0) >= len(members):
            raise ValueError(f"root {op['root']}: expected a place among the {len(members)} members")
    for key in ("send_splits", "recv_splits"):
        if key in op:
            _wholes(op[key], key)
    if op.get("algo", "ifec") not in ALGOS + ("stores",):  # an all-to-all's: point-to-point stores
        raise ValueError(f"algo {op.get('algo')!r}: expected one of {', '.join(ALGOS)} or stores")
    row = op.get("row") or {}
    if not isinstance(row, dict):
        raise ValueError(f"row {row!r}: expected an object")
    _whole(row.get("size", 0), "row size")
    for key in ("type", "redop", "ran", "driver"):
        _text(row.get(key, ""), "row " + key)
    t = row.get("time_us", 0.0)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < float("inf"):
        raise ValueError(f"row time_us {t!r}: expected a time >= 0")
    lists = [_wholes(row.get(k, []), "row " + k) for k in ("gpu_link_ids", "gpu_link_up_bytes", "gpu_link_down_bytes")]
    if len({len(x) for x in lists}) > 1:
        raise ValueError("row gpu_link_ids, gpu_link_up_bytes and gpu_link_down_bytes: lengths "
                         f"{[len(x) for x in lists]}")
    turns = row.get("turns") or {}
    if not isinstance(turns, dict):
        raise ValueError(f"row turns {turns!r}: expected an object (group, stripe, multicast)")
    for key in ("stripe", "multicast"):  # a member's own: a list of one
        if key in turns:
            _wholes(turns[key], "row turns " + key)
    if turns.get("group") is not None:
        _whole(turns["group"], "row turns group")


def load(path, transfers=None):
    """rank -> [its operation records in the order it issued them]; raises TraceError naming the file and line of a
    bad record, or the rank whose operations in a group differ from the group's other members'. Point-to-point
    transfers (fabric_op send: torch's send and recv) are not collective operations and are left out (appended to
    `transfers` where given)."""
    path = pathlib.Path(path)
    files = sorted(path.glob("rank*.jsonl")) if path.is_dir() else [path]
    if not files:
        raise TraceError(f"{path}: no rank<R>.jsonl files")
    ranks = {}
    for f in files:
        try:
            lines = f.read_text().splitlines()
        except UnicodeDecodeError as e:
            raise TraceError(f"{f}: not a text file of JSON lines ({e})") from None
        for i, line in enumerate(lines, 1):
            try:
                op = json.loads(line)
                rank, fop = int(op["rank"]), op["fabric_op"]
                int(op["group"]), int(op["group_size"]), int(op["seq"])
                int(op["issued_ns"]), int(op["end_ns"])
                _check_record(op)
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise TraceError(f"{f}:{i}: not an operation record ({type(e).__name__}: {e})") from None
            if fop == "send":
                ranks.setdefault(rank, [])
                if transfers is not None:
                    transfers.append(op)
                continue
            if fop not in FABRIC_OPS:
                raise TraceError(f"{f}:{i}: fabric_op {fop!r} is not one of {', '.join(FABRIC_OPS)}")
            ranks.setdefault(rank, []).append(op)
    n = len(ranks)
    if sorted(ranks) != list(range(n)):
        raise TraceError(f"{path}: ranks {sorted(ranks)}: expected 0..{n - 1}, one file each")
    for r, ops in ranks.items():
        for op in ops:
            if op["group_size"] > n:
                raise TraceError(f"{path}: rank {r}, operation {op['seq']}: a group of {op['group_size']} in a "
                                 f"world of {n} ranks")
            # A root is a place in the group (the replay took 99 in a group of 8 as 99 mod 8); members are ranks.
            if op.get("root", 0) >= op["group_size"]:
                raise TraceError(f"{path}: rank {r}, operation {op['seq']}: root {op['root']} outside the group's "
                                 f"0..{op['group_size'] - 1}")
            outside = [m for m in op.get("members") or [] if m >= n]
            if outside:
                raise TraceError(f"{path}: rank {r}, operation {op['seq']}: members {outside} outside the world's "
                                 f"ranks 0..{n - 1}")
    for g, members in _groups(ranks).items():
        first = members[min(members)]
        size = first[0]["group_size"]
        if len(members) != size:
            raise TraceError(f"{path}: group {g} has {size} ranks, {len(members)} traced its operations")
        seqs = [op["seq"] for op in first]
        if len(set(seqs)) != len(seqs):
            raise TraceError(f"{path}: group {g}: rank {min(members)} traced operation numbers (seq) more than once")
        for r, ops in members.items():
            if len(ops) != len(first):
                raise TraceError(f"{path}: group {g}: rank {r} traced {len(ops)} operations, rank {min(members)} "
                                 f"{len(first)}")
            for a, b in zip(first, ops):
                if (a["op"], a["fabric_op"]) != (b["op"], b["fabric_op"]):
                    raise TraceError(f"{path}: group {g}, operation {a['seq']}: rank {min(members)} traced "
                                     f"{a['op']}, rank {r} {b['op']}")
        for a in first:  # the backend refuses uneven blocks: a trace that has them was not written by it
            whole = (a.get("row") or {}).get("size", a["bytes"])
            if a["fabric_op"] in ("all-gather", "reduce-scatter") and whole % size:
                raise TraceError(f"{path}: group {g}, operation {a['seq']} ({a['op']}): {whole} B is not {size} "
                                 f"equal blocks, one per rank")
    return ranks


def _groups(ranks):
    """group -> rank -> that rank's operations in the group, in seq order."""
    out = {}
    for r, ops in ranks.items():
        for op in ops:
            out.setdefault(op["group"], {}).setdefault(r, []).append(op)
    for members in out.values():
        for ops in members.values():
            ops.sort(key=lambda o: o["seq"])
    return out


def merged_turns(turns):
    """The members' recorded turns (each its own rotor and PSN) as one operation's: the first member's group counter,
    the others per member; None where a member's row has none (a trace from before they were recorded)."""
    if not all(t.get("stripe") and t.get("multicast") for t in turns):
        return None
    return dict(group=turns[0].get("group"), stripe=[t["stripe"][0] for t in turns],
                multicast=[t["multicast"][0] for t in turns])


def operations(ranks):
    """The trace's operations in the order they were issued, each merged from its group's members' records: what
    ran, its traced time and bytes per link, and the compute before it (the members' mean gap since each one's
    previous operation ended)."""
    gap = {}
    for r, ops in ranks.items():  # a rank's file is in issue order (one operation at a time)
        for prev, op in zip([None] + ops[:-1], ops):
            gap[(r, op["group"], op["seq"])] = 0.0 if prev is None else max(0, op["issued_ns"] - prev["end_ns"]) / 1e3
    out = []
    for g, members in _groups(ranks).items():
        order = sorted(members)
        for i, rec in enumerate(members[order[0]]):
            per = [members[r][i] for r in order]
            rows = [p.get("row") or {} for p in per]
            turns = [row.get("turns") or {} for row in rows]
            links = {}
            for row in rows:
                for lid, up, down in zip(row.get("gpu_link_ids", []), row.get("gpu_link_up_bytes", []),
                                         row.get("gpu_link_down_bytes", [])):
                    a = links.setdefault(lid, [0, 0])
                    a[0] += up
                    a[1] += down
            out.append(dict(group=g, seq=rec["seq"], op=rec["op"], dtype=rec["dtype"], bytes=rec["bytes"],
                            n=len(order), world=len(ranks), fabric_op=rec["fabric_op"], algo=rec.get("algo", "ifec"),
                            size=rows[0].get("size", rec["bytes"]), type=rows[0].get("type", "fp32"),
                            redop=rows[0].get("redop", "sum"), ran=rows[0].get("ran", ""),
                            traced_us=max(row.get("time_us", 0.0) for row in rows), driver=rows[0].get("driver", "?"),
                            compute_us=sum(gap[(r, g, p["seq"])] for r, p in zip(order, per)) / len(order),
                            issued_ns=min(p["issued_ns"] for p in per), members=rec.get("members"),
                            root=rec.get("root", 0), turns=merged_turns(turns),
                            sent=[sum(p.get("send_splits", [])) for p in per], links=links))
    return sorted(out, key=lambda o: o["issued_ns"])


def scaled(op, k):
    """(fabric operation, bytes, ranks, note) of `op` with k ranks in the world: its group scaled with the world
    (see the module's note on scaling)."""
    n, fop, size = op["n"], op["fabric_op"], op["size"]
    m = n if op["world"] == k else max(2, round(n * k / op["world"]))
    if fop in ("all-gather", "reduce-scatter"):
        return fop, size // n * m, m, ""
    if fop == "alltoall":
        per_peer = max(1, round(sum(op["sent"]) / n / m))
        return fop, per_peer, m, "splits averaged" if len(set(op["sent"])) > 1 else ""
    return fop, size, m, ""


class Replay:
    """Simulates each distinct (operation, bytes, algorithm) once on `topology` with k ranks, each from a fresh
    fabric; as_traced, at the recorded scale, each operation from the state the trace says it found."""

    def __init__(self, topology, k):
        self.topo = topology
        self.k = k
        self._memo = {}

    def as_traced(self, op):
        """`op` with its recorded algorithm, started where the traced one started: the state a fabric carries from
        one operation to the next that decides which sub-link each frame takes (testbed::Turns), where the trace
        has it."""
        return self.run(op, op["algo"], turns=op.get("turns"))

    def run(self, op, algo, turns=None):
        fop, size, m, note = scaled(op, self.k)
        root = op["root"] % m
        key = (fop, size, m, root, op["type"], op["redop"], algo, json.dumps(turns, sort_keys=True))
        if key not in self._memo:
            if fop == "alltoall":
                r = sim.run(self.topo, traffic="alltoall", bytes=size, group=m if m < self.topo.num_gpus else 0)
                row = dict(time_us=r["completion_ns"] / 1e3, ran="stores", ok=r["complete"], links={})
            else:
                r = collectives.measure(self.topo, kind=fop, algo=algo, bytes=size, dtype=op["type"],
                                        op=op["redop"] if op["redop"] in ("sum", "min", "max") else "sum",
                                        members=None if m == self.topo.num_gpus else m, root=root,
                                        turns=turns)
                links = {lid: [u, d] for lid, u, d in zip(r["gpu_link_ids"], r["gpu_link_up_bytes"],
                                                          r["gpu_link_down_bytes"])}
                row = dict(time_us=r["time_us"], ran=r["ran"], ok=r["ok"], links=links, error=r.get("error"))
            row["note"] = note
            self._memo[key] = row
        return self._memo[key]


LINK_SCOPES = {"gpu": "GPU (its ports summed)", "port": "GPU port (a Y-cable's sub-links summed)",
               "sublink": "sub-link"}


def link_deviation(ops, rep, topo, scope="port"):
    """Bytes per GPU link and direction over the whole trace (all-to-alls aside), replayed with the recorded algorithm
    vs the trace's: the largest relative difference and the directions compared, per GPU, per port (a Y-cable) or per
    sub-link. Each operation is replayed from the state the trace recorded at its start (Replay.as_traced, the row's
    `turns`: the group counter, stripe rotors and multicast PSNs that decide which sub-link each frame takes)."""
    traced, simulated = {}, {}
    key = {"gpu": lambda lid: topo.links[lid]["a"], "port": lambda lid: (topo.links[lid]["a"], topo.links[lid]["plane"]),
           "sublink": lambda lid: lid}[scope]
    for op in ops:  # all-to-alls are raw flows; a group other than GPUs 0..m-1 is simulated on those
        if op["fabric_op"] == "alltoall" or op["members"] not in (None, list(range(op["n"]))):
            continue
        bad = [lid for lid in op["links"] if lid >= len(topo.links)]
        if bad:
            raise TraceError(f"operation {op['seq']} ({op['op']}): link ids {bad[:4]} outside {topo.name}'s "
                             f"0..{len(topo.links) - 1}: traced on another topology?")
        for table, links in ((traced, op["links"]), (simulated, rep.as_traced(op)["links"])):
            for lid, (up, down) in links.items():
                a = table.setdefault(key(lid), [0, 0])
                a[0] += up
                a[1] += down
    devs = [abs(s - t) / t for k in traced if k in simulated for s, t in zip(simulated[k], traced[k]) if t]
    return (max(devs) if devs else None), len(devs)


def report(trace, topology, k=None, algos=("ifec", "best"), out=sys.stdout):
    """Replays `trace` (a path) on `topology` (path or Topology) at k ranks (default: as recorded); prints the table
    and returns a dict of the totals (and the link comparison where k is the recorded rank count)."""
    from . import _args, _native
    if k is not None:
        try:
            k = _args.whole(k, "ranks", -2**63)  # 2.5 ranks ran, '8' failed in a comparison (the range: below)
        except (TypeError, ValueError) as e:
            raise TraceError(f"--{e}") from None
    try:
        algos = tuple(_args.items(algos, "algos"))  # one name is one algorithm, not its letters
    except TypeError as e:
        raise TraceError(str(e)) from None
    bad = [a for a in algos if a not in ALGOS]
    if bad or not algos or len(set(algos)) != len(algos):
        raise TraceError(f"algos {list(algos)}: expected distinct ones of {', '.join(ALGOS)}")
    topo = _native.load_topology(str(topology)) if not hasattr(topology, "num_gpus") else topology
    transfers = []
    ranks = load(trace, transfers)
    ops = operations(ranks)
    n = len(ranks)
    if not ops:
        raise TraceError(f"{trace}: no operations traced")
    if k is not None and not 2 <= k <= topo.num_gpus:
        raise TraceError(f"--ranks {k}: topology {topo.name} has {topo.num_gpus} GPUs (2..{topo.num_gpus})")
    k = n if k is None else k
    if not 2 <= k <= topo.num_gpus:
        raise TraceError(f"--ranks {k}: topology {topo.name} has {topo.num_gpus} GPUs (2..{topo.num_gpus})")
    rep = Replay(topo, k)
    drivers = ", ".join(sorted({op["driver"] for op in ops}))
    out.write(f"# replay of {trace}: {len(ops)} operations traced by {n} ranks (driver: {drivers}), simulated on "
              f"{topo.name} with {k} ranks; the sim columns are simulated time, 'traced us' what the trace recorded "
              f"(wall clock through software switches where the driver is live)\n")
    if transfers:
        out.write(f"# {len(transfers)} point-to-point transfers (send, recv) traced are not replayed\n")
    groups = {}
    for i, op in enumerate(ops):
        fop, size, m, note = scaled(op, k)
        g = groups.setdefault((op["op"], op["dtype"], op["bytes"], m, fop, size), dict(count=0, traced=0.0, note=note))
        g["count"] += 1
        g["traced"] += op["traced_us"]
        for a in algos:
            try:
                row = rep.run(op, a)
            except (ValueError, RuntimeError) as e:
                raise TraceError(f"operation {op['seq']} ({op['op']}, {op['dtype']}, {size} B, group {op['group']}) "
                                 f"with {a}: {e}") from None
            if not row["ok"]:
                raise TraceError(f"operation {op['seq']} ({op['op']}, {size} B) failed on the simulator with {a}: "
                                 f"{row.get('error')}")
            g[a] = g.get(a, 0.0) + row["time_us"]
            g[a + "_ran"] = row["ran"]
        if (i + 1) % 50 == 0:
            print(f"replay: {i + 1} of {len(ops)} operations", file=sys.stderr)
    head = f"{'operation':<24} {'dtype':>9} {'B/rank':>9} {'ranks':>6} {'sim B':>9} {'count':>6} {'traced us':>10}"
    head += "".join(f" {a + ' us':>12} {'(ran)':>8}" for a in algos)
    head += f" {'speedup':>8}" if len(algos) == 2 else ""
    out.write(head + "\n")
    totals = {a: 0.0 for a in algos}
    for (name, dtype, b, m, fop, size), g in groups.items():
        line = f"{name:<24} {dtype:>9} {b:>9} {m:>6} {size:>9} {g['count']:>6} {g['traced']:>10.1f}"
        for a in algos:
            line += f" {g[a]:>12.2f} {g[a + '_ran']:>8}"
            totals[a] += g[a]
        if len(algos) == 2:
            line += f" {g[algos[1]] / g[algos[0]] if g[algos[0]] else float('nan'):>7.2f}x"
        out.write(line + (f"  ({g['note']})" if g["note"] else "") + "\n")
    compute = sum(op["compute_us"] * op["n"] / n for op in ops)  # a rank's gaps, averaged over the ranks
    result = dict(ranks=k, operations=len(ops), compute_us=compute, traced_us=sum(op["traced_us"] for op in ops),
                  comm_us=totals, step_us={a: compute + t for a, t in totals.items()})
    for a in algos:
        out.write(f"total {a:>5}: communication {totals[a]:.1f} us + compute (the trace's gaps) {compute:.1f} us = "
                  f"{compute + totals[a]:.1f} us\n")
    if len(algos) == 2 and totals[algos[0]]:
        out.write(f"in-fabric speedup: communication {totals[algos[1]] / totals[algos[0]]:.2f}x, end to end "
                  f"{(compute + totals[algos[1]]) / (compute + totals[algos[0]]):.3f}x\n")
    if k == n:
        for scope, what in LINK_SCOPES.items():
            dev, count = link_deviation(ops, rep, topo, scope)
            result[scope + "_deviation"] = dev
            if dev is not None:
                out.write(f"bytes per {what}, replay ({ops[0]['algo']}) vs the trace: largest difference {dev:.2%} over "
                          f"{count} directions\n")
    return result


def main(argv=None):
    p = argparse.ArgumentParser(prog="./ifec sim --replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--replay", required=True, help="a trace folder (rank<R>.jsonl) or one rank's file")
    p.add_argument("--topo", required=True, help="the topology to replay on")
    p.add_argument("--algo", default="ifec,best", help="algorithms to compare (default ifec,best)")
    p.add_argument("--ranks", type=int, help="scale out to K ranks (default: as recorded)")
    p.add_argument("--json", action="store_true", help="print the totals as JSON too")
    a = p.parse_args(argv)
    algos = tuple(x for x in a.algo.split(",") if x)
    bad = [x for x in algos if x not in ALGOS]
    try:
        if bad or not algos or len(set(algos)) != len(algos):
            raise TraceError(f"--algo {a.algo!r}: expected distinct ones of {', '.join(ALGOS)} (comma-separated)")
        res = report(a.replay, a.topo, a.ranks, algos)
    except (TraceError, ValueError, OSError) as e:
        print(f"sim --replay: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
