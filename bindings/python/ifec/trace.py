"""Each rank's communication as JSON lines, for the live and simulated drivers: the format the `ifec`
torch.distributed backend writes (docs/torch-backend.md, "The trace format"), so `./ifec sim --replay` takes any of
them. A driver's operation is its fabric operation (`op` and `fabric_op` alike), every rank a member of group 0.
"""
import json
import pathlib

TORCH_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int32": "int32"}


def _folder(folder):
    """The trace folder as a Path; ValueError for an empty one (it traced into the current directory)."""
    if str(folder) == "":
        raise ValueError("trace '': expected a folder")
    return pathlib.Path(folder)


def _file(folder, rank):
    return _folder(folder) / f"rank{rank}.jsonl"


def next_seq(folder):
    """The number the next operation traced in `folder` gets (its rank 0 file's operations so far)."""
    f = _file(folder, 0)
    if not f.exists():
        return 0
    with f.open("rb") as lines:  # counted as bytes: a file that is not UTF-8 is named where it is read (last_end_ns)
        return sum(1 for _ in lines)


def last_end_ns(folder):
    """When the last operation traced in `folder` ended (rank 0's), or 0. A folder that is a file, or a last record
    that is not one, is refused naming the path (before a driver runs the operation it would append)."""
    if _folder(folder).exists() and not pathlib.Path(folder).is_dir():
        raise NotADirectoryError(f"trace {str(folder)!r}: not a folder")
    f = _file(folder, 0)
    try:
        lines = f.read_text().splitlines() if f.exists() else []
    except UnicodeDecodeError as e:
        raise ValueError(f"{f}: not a trace (not UTF-8 text: {e.reason} at byte {e.start})") from None
    if not lines:
        return 0
    try:
        end = json.loads(lines[-1])["end_ns"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{f}:{len(lines)}: not a trace record with end_ns ({e})") from None
    # What the next operation's times start from: -5 or 1e300 were taken and written into its records.
    if isinstance(end, bool) or not isinstance(end, int) or end < 0:
        raise ValueError(f"{f}:{len(lines)}: end_ns {end!r}: expected a whole number of ns >= 0")
    return end


def append(folder, rows, what, algo, dtype, bytes, root, issued_ns, start_ns, end_ns):
    """Appends one operation: `rows` is rank -> that rank's row (the driver's row keys: ok, time_us, size, type,
    gpu_link_ids and the link bytes of that rank's own links)."""
    folder = _folder(folder)
    if not rows:  # no rank's part to append (an all-gather's block size divided by no ranks)
        return
    folder.mkdir(parents=True, exist_ok=True)
    seq = next_seq(folder)
    if what == "all-gather":  # the drivers' size is the gathered buffer; a rank's part is its block
        bytes = int(bytes) // len(rows)
    for rank, row in sorted(rows.items()):
        rec = dict(rank=rank, group=0, group_size=len(rows), seq=seq, op=what, dtype=TORCH_DTYPE.get(dtype, dtype),
                   bytes=int(bytes), fabric_op=what, algo=algo, issued_ns=int(issued_ns), start_ns=int(start_ns),
                   end_ns=int(end_ns), ok=bool(row.get("ok")), row=row)
        if what in ("reduce", "multicast"):
            rec["root"] = root
        if what == "alltoall":  # the drivers' all-to-all: `bytes` for every rank (its own block stays put)
            rec["send_splits"] = rec["recv_splits"] = [int(bytes)] * len(rows)
        with _file(folder, rank).open("a") as f:
            f.write(json.dumps(rec) + "\n")


def split_by_gpu(row, topo):
    """A merged row (every member's links) as rank -> the row with that GPU's own links only."""
    out = {}
    gpus = {n["name"]: n["gpu"] for n in topo.nodes if n["kind"] == "gpu"}
    for lid, up, down in zip(row["gpu_link_ids"], row["gpu_link_up_bytes"], row["gpu_link_down_bytes"]):
        g = gpus.get(topo.links[lid]["a"])
        if g is None:
            continue
        t = row.get("turns") or {}
        own = dict(t, stripe=t.get("stripe", [])[g:g + 1], multicast=t.get("multicast", [])[g:g + 1])
        r = out.setdefault(g, dict(row, gpu_link_ids=[], gpu_link_up_bytes=[], gpu_link_down_bytes=[], turns=own))
        r["gpu_link_ids"].append(lid)
        r["gpu_link_up_bytes"].append(up)
        r["gpu_link_down_bytes"].append(down)
    return out
