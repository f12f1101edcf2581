"""Simulated-fabric runs from Python: the same engine and report as `./ifec sim`, as a dict."""

import json

from ifec import _args, _native


def run(topology, traffic="alltoall", bytes=1 << 20, lb="packet", pfc=True, seed=1, fail=(), restore=(),
        incast_target=0, payload="real", group=0, threads=1, leaf_groups=0):
    """Runs raw traffic over the simulated fabric and returns the report (see `./ifec sim --json`).

    topology: a path to a YAML file or an ifec.Topology (e.g. ifec.make_superpod(8, 2)).
    fail / restore: link events "SELECTOR@TIME", e.g. "gpu5:plane2:sub0@20us".
    incast_target: the GPU every other sends to, with traffic "incast" only (refused with the other patterns).
    payload: "real" (frames carry their bytes, every ICRC checked) or "elided" (headers and lengths only: the same
    times and bytes per link, for the largest fabrics).
    group: all-to-all or permutation within consecutive groups of that many GPUs (expert-parallel groups; it
    divides the GPUs); 0, the default, is one group of every GPU.
    threads: N >= 1 (default 1) runs one partition per plane on N threads, the same result for every N
    (report["partitions"] says how they were laid out); 0 runs the whole fabric on one event loop.
    leaf_groups: K >= 1 partitions each plane further, into K groups of consecutive leaf switches (its spines spread
    over them), for more threads than planes (a one-plane fabric on several cores): the same result for every
    K >= 1 and every N; every switch-to-switch link then goes through the partitions' mailboxes, so equal-time
    arrivals at a switch may run in another order than with 0 (one partition per plane). Needs threads >= 1.
    Times in the report are simulated-fabric times (report["driver"] == "sim").
    """
    if payload not in ("real", "elided"):
        raise ValueError(f"payload {payload!r}: expected 'real' or 'elided'")
    topo = _args.topology(topology, _native.load_topology)
    return json.loads(_native.run_sim_json(topo, traffic, _args.whole(bytes, "bytes", 1), lb, _args.flag(pfc, "pfc"),
                                           _args.whole(seed, "seed"), _args.items(fail, "fail"),
                                           _args.items(restore, "restore"),
                                           _args.whole(incast_target, "incast_target", 0, 2**20),
                                           payload == "elided", _args.whole(group, "group", 0, 2**20),
                                           _args.whole(threads, "threads", 0, 1024),
                                           _args.whole(leaf_groups, "leaf_groups", 0, 4096)))
