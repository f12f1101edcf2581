"""Reporting helpers: the Amdahl model of in-network collectives, plots (PNG, PDF, SVG), CSV/JSON writers.

Pure Python (standard library, numpy, matplotlib); nothing here touches ifec._native, so the module
can be loaded on its own, e.g. on a machine without the native build.

The Amdahl model follows Hoefler et al., "In-Network Collective Operations: Game Changer or
Challenge for AI Workloads?" (Figure 5): an iteration spends a share `s` of its time in an
AllReduce; in-network computing (INC) shortens that AllReduce from T_ring to T_inc, i.e. by the
factor k = T_ring / T_inc, and leaves the rest of the iteration alone. The new iteration time,
relative to the old one, is

    (1 - s) + s / k

so the overall time saving (what the paper calls "speedup") is s * (1 - 1/k), and the overall
speedup factor is 1 / (1 - s * (1 - 1/k)).
"""

import csv
import io
import json
import textwrap
import math
import os
import pathlib
import stat
import struct
import tempfile
import zlib

import numpy as np
# Figure + FigureCanvasAgg instead of pyplot: no global backend switch and no pyplot state, so
# importing this module never disturbs an interactive session or another module's plots.
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

# Figure 5 inputs from the paper: a fixed 8 GiB AllReduce, 352 ms by ring, 151 ms in-network.
HOEFLER_RING_TIME_S = 0.352
HOEFLER_INC_TIME_S = 0.151
HOEFLER_MESSAGE_BYTES = 8 * 2**30

# Communication shares the Amdahl plot spans, and the ones it annotates.
AMDAHL_SHARE_RANGE = (0.10, 0.60)
AMDAHL_ANNOTATED_SHARES = (0.20, 0.60)

DISPATCH_PHASES = ("dispatch", "combine")
DISPATCH_BASELINES = ("per_expert", "per_rank")
DISPATCH_VARIANTS = DISPATCH_BASELINES + ("ifec",)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- Amdahl model


def _check_shares(comm_share):
    """Returns comm_share as a float array, or raises ValueError naming the first value outside [0, 1]."""
    shares = np.asarray(comm_share, dtype=float)
    bad = ~np.isfinite(shares) | (shares < 0.0) | (shares > 1.0)
    if np.any(bad):
        raise ValueError(f"comm_share must lie in [0, 1], got {shares[bad].flat[0]!r}")
    return shares


def _check_speedup(comm_speedup):
    """Returns comm_speedup as a float array, or raises ValueError naming the first value that is not > 0."""
    speedups = np.asarray(comm_speedup, dtype=float)
    bad = ~np.isfinite(speedups) | (speedups <= 0.0)
    if np.any(bad):
        raise ValueError(f"comm_speedup must be a finite number > 0, got {speedups[bad].flat[0]!r}")
    return speedups


def _scalar_or_array(values, *inputs):
    """Gives a plain float back when every input was a scalar, so scalar calls stay scalar."""
    if all(np.ndim(x) == 0 for x in inputs):
        return float(values)
    return values


def amdahl_gain(comm_share, comm_speedup):
    """Overall fraction of iteration time saved when communication gets `comm_speedup` times faster.

    comm_share: fraction of the (baseline) iteration spent communicating, in [0, 1]; scalar or array.
    comm_speedup: T_baseline / T_accelerated of the communication alone (> 0; < 1 means a slowdown,
        which gives a negative gain). Broadcasts against comm_share.
    Returns s * (1 - 1/k): a float for scalar inputs, else a numpy array.
    """
    shares = _check_shares(comm_share)
    speedups = _check_speedup(comm_speedup)
    gain = shares * (1.0 - 1.0 / speedups)
    return _scalar_or_array(gain, comm_share, comm_speedup)


def amdahl_speedup(comm_share, comm_speedup):
    """Overall speedup factor (old iteration time / new iteration time); companion to amdahl_gain.

    Same arguments as amdahl_gain; returns 1 / (1 - amdahl_gain(...)), which is 1 at 0% communication
    and comm_speedup at 100%.
    """
    gain = np.asarray(amdahl_gain(comm_share, comm_speedup), dtype=float)
    return _scalar_or_array(1.0 / (1.0 - gain), comm_share, comm_speedup)


def _time_ratio(ring_time_s, ifec_time_s, what):
    """Checks two positive times and returns ring / ifec (the communication speedup)."""
    for name, value in (("ring_time_s", ring_time_s), ("ifec_time_s", ifec_time_s)):
        if not isinstance(value, (int, float, np.number)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{what}: {name} must be a finite time > 0, got {value!r}")
    ratio = float(ring_time_s) / float(ifec_time_s)
    if not math.isfinite(ratio) or ratio <= 0:  # 1e300 / 1e-300 overflows, 1e-320 / 1e300 underflows
        raise ValueError(f"{what}: ring_time_s / ifec_time_s = {ring_time_s!r} / {ifec_time_s!r} is not a finite "
                         f"ratio > 0")
    return ratio


def hoefler_reference():
    """The paper's Figure 5 inputs and what the model derives from them.

    Returns a dict: ring_time_s (0.352), inc_time_s (0.151), message_bytes (8 GiB), comm_speedup
    (352/151), comm_saving (1 - 151/352, about 57%), and the overall gain at the annotated shares
    (gain_at_20pct, gain_at_60pct), all computed from the model rather than copied from the text.
    """
    speedup = _time_ratio(HOEFLER_RING_TIME_S, HOEFLER_INC_TIME_S, "hoefler_reference")
    ref = {
        "ring_time_s": HOEFLER_RING_TIME_S,
        "inc_time_s": HOEFLER_INC_TIME_S,
        "message_bytes": HOEFLER_MESSAGE_BYTES,
        "comm_speedup": speedup,
        "comm_saving": 1.0 - HOEFLER_INC_TIME_S / HOEFLER_RING_TIME_S,
    }
    for share in AMDAHL_ANNOTATED_SHARES:
        ref[f"gain_at_{round(share * 100)}pct"] = amdahl_gain(share, speedup)
    return ref


# --------------------------------------------------------------------------- plotting plumbing


def _new_figure(width=7.0, height=4.5, ncols=1):
    """A standalone Agg figure (not registered with pyplot) and its axes."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, axes


def _output_path(path, what, devices=False):
    """path as a Path whose folder exists (made here); ValueError naming it when it is empty, a directory or (unless
    devices) anything else but a regular file, OSError naming it when its folder cannot be made."""
    if os.fspath(path) in ("", b""):
        raise ValueError(f"{what}: empty path, expected a file name")
    path = pathlib.Path(path)
    if path.is_dir() or (path.exists() and not path.is_file() and not devices):
        kind = "a directory" if path.is_dir() else "a device or pipe, not a regular file"
        raise ValueError(f"{what}: {str(path)!r} is {kind}, expected a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, f"{what}: cannot make the folder of {str(path)!r}: {e.strerror}") from e
    return path


_PLOT_FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}


def _save_figure(fig, path):
    """Writes the figure in the format its suffix names (.png, .pdf, .svg; PNG without a suffix, as for /dev/null),
    creating parent directories, and returns the path as a Path; ValueError naming any other suffix."""
    suffix = pathlib.Path(os.fspath(path)).suffix.lower() if os.fspath(path) not in ("", b"") else ""
    if suffix and suffix not in _PLOT_FORMATS:
        raise ValueError(f"plot: {str(path)!r} ends in {suffix!r}, expected one of {', '.join(_PLOT_FORMATS)}")
    path = _output_path(path, "plot", devices=True)  # /dev/null: written through, as before
    try:
        fig.savefig(path, format=_PLOT_FORMATS.get(suffix, "png"), dpi=120)
    except OSError as e:  # a full disk's error names no file
        raise OSError(e.errno, f"plot: cannot write {str(path)!r}: {e.strerror or e}") from e
    return path


def _rows(rows, what):
    """rows as a list (a generator is read once), ValueError when there is none or it is not a list of rows."""
    try:
        rows = list(rows if rows is not None else ())
    except TypeError:
        raise ValueError(f"{what}: rows must be a list of dicts, got {rows!r}") from None
    if not rows:
        raise ValueError(f"{what}: rows is empty")
    return rows


def _context(context, what):
    """The one-line context of a plot: a string or None."""
    if context is not None and not isinstance(context, str):
        raise ValueError(f"{what}: context must be a string, got {context!r}")
    return context


def _require_keys(row, keys, what, index):
    """Raises ValueError naming the row and the missing keys if row is not a mapping holding `keys`."""
    if not isinstance(row, dict):
        raise ValueError(f"{what}: row {index} must be a dict, got {row!r}")
    missing = [k for k in keys if k not in row]
    if missing:
        raise ValueError(f"{what}: row {index} lacks {', '.join(missing)}: {row!r}")


def _positive_int(value, name, what, index):
    """Checks an integer > 0 (bools excluded: True is not an EP size)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{what}: row {index} {name} must be an integer > 0, got {value!r}")
    return int(value)


def _positive_number(value, name, what, index, allow_zero=False):
    """Checks a finite number > 0 (or >= 0 with allow_zero)."""
    ok = isinstance(value, (int, float, np.number)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{what}: row {index} {name} must be a finite number {bound}, got {value!r}")
    return float(value)


# --------------------------------------------------------------------------- Amdahl plot


def _check_measured(measured):
    """Validates plot_amdahl's `measured` dict and returns (comm_speedup, label)."""
    if not isinstance(measured, dict):
        raise ValueError(f"plot_amdahl: measured must be a dict, got {measured!r}")
    missing = [k for k in ("ring_time_s", "ifec_time_s") if k not in measured]
    if missing:
        raise ValueError(f"plot_amdahl: measured lacks {', '.join(missing)}: {measured!r}")
    speedup = _time_ratio(measured["ring_time_s"], measured["ifec_time_s"], "plot_amdahl measured")
    label = measured.get("label") or "IFEC simulated (ring vs in-switch)"
    return speedup, str(label)


def _annotate_shares(ax, speedup, color):
    """Marks and labels the curve's value at each annotated share (20%, 60%)."""
    for share in AMDAHL_ANNOTATED_SHARES:
        gain_pct = 100.0 * amdahl_gain(share, speedup)
        ax.plot([100 * share], [gain_pct], "o", color=color)
        ax.annotate(f"{gain_pct:.1f}% at {100 * share:.0f}%", (100 * share, gain_pct),
                    textcoords="offset points", xytext=(-10, 10), ha="right", color=color)


def plot_amdahl(path, measured=None):
    """Plots overall time saving vs communication share (10%..60%) and returns its Path (PNG; PDF or SVG by suffix).

    Draws the paper's curve from its inputs (352 ms ring, 151 ms in-network) and, when `measured` is
    dict(ring_time_s=..., ifec_time_s=..., label=...), the project's own simulated ring vs in-switch
    AllReduce times as a second curve; the values at 20% and 60% are annotated on each curve.
    """
    return _save_figure(amdahl_figure(measured), path)


def amdahl_figure(measured=None):
    """The figure plot_amdahl writes (a matplotlib Figure, for inspection)."""
    curves = [(hoefler_reference()["comm_speedup"], "Hoefler et al.: ring 352 ms vs INC 151 ms (8 GiB)")]
    if measured is not None:
        curves.append(_check_measured(measured))
    shares = np.linspace(*AMDAHL_SHARE_RANGE, 101)

    fig, (ax,) = _new_figure(height=5.5)
    for (speedup, label), color in zip(curves, ("tab:blue", "tab:orange")):
        saving = 100.0 * (1.0 - 1.0 / speedup)
        ax.plot(100 * shares, 100 * amdahl_gain(shares, speedup), color=color,
                label=f"{label}\nAllReduce {speedup:.2f}x faster ({saving:.0f}% less time)")
        _annotate_shares(ax, speedup, color)
    ax.set_xlim(100 * AMDAHL_SHARE_RANGE[0], 100 * AMDAHL_SHARE_RANGE[1])
    # Headroom above the highest curve so the 60% labels are not clipped by the frame.
    top = max(100 * amdahl_gain(AMDAHL_SHARE_RANGE[1], k) for k, _ in curves)
    ax.set_ylim(min(0.0, 1.2 * top), max(1.0, 1.2 * top))
    ax.text(0.02, 0.97, "saving = share x (1 - T_in-network / T_ring)", transform=ax.transAxes,
            ha="left", va="top", fontsize="small", color="dimgrey")
    ax.set_xlabel("communication share of iteration time (%)")
    ax.set_ylabel("overall iteration time saved (%)")
    ax.set_title("Amdahl limit on in-network AllReduce gains")
    ax.grid(True, alpha=0.3)
    # Below the axes: inside, the legend would cover the curves' labels at 60%.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize="small", frameon=False)
    return fig


# --------------------------------------------------------------------------- MoE dispatch / combine


def _dispatch_rows(rows):
    """Validates dispatch/combine rows and groups them as {(phase, topk, ep): {variant: time_us}}."""
    what = "plot_dispatch_combine"
    rows = _rows(rows, what)
    points = {}
    for i, row in enumerate(rows):
        _require_keys(row, ("ep", "topk", "phase", "variant", "time_us"), what, i)
        if row["phase"] not in DISPATCH_PHASES:
            raise ValueError(f"{what}: row {i} has unknown phase {row['phase']!r} (want one of {DISPATCH_PHASES})")
        if row["variant"] not in DISPATCH_VARIANTS:
            raise ValueError(f"{what}: row {i} has unknown variant {row['variant']!r} "
                             f"(want one of {DISPATCH_VARIANTS})")
        key = (row["phase"], _positive_int(row["topk"], "topk", what, i), _positive_int(row["ep"], "ep", what, i))
        point = points.setdefault(key, {})
        if row["variant"] in point:
            raise ValueError(f"{what}: row {i} repeats variant {row['variant']!r} for phase/topk/ep {key}")
        point[row["variant"]] = _positive_number(row["time_us"], "time_us", what, i)
    return points


def dispatch_combine_speedups(rows):
    """Speedup of IFEC over the faster baseline for each (phase, topk, ep).

    rows: dicts with ep, topk, phase ("dispatch"/"combine"), variant ("per_expert"/"per_rank"/"ifec"),
    time_us. Each point needs the ifec time and at least one baseline; the baseline is the faster
    (smaller time) of per_expert and per_rank, so IFEC is never credited against a weak baseline.
    Returns {(phase, topk, ep): (baseline_variant, speedup)}, raising ValueError on bad rows.
    """
    speedups = {}
    for key, times in sorted(_dispatch_rows(rows).items()):
        baselines = {v: t for v, t in times.items() if v in DISPATCH_BASELINES}
        if "ifec" not in times or not baselines:
            need = "an ifec time" if "ifec" not in times else "a per_expert or per_rank time"
            raise ValueError(f"plot_dispatch_combine: phase/topk/ep {key} has no {need}")
        best = min(baselines, key=baselines.get)
        speedups[key] = (best, baselines[best] / times["ifec"])
    return speedups


def plot_dispatch_combine(path, rows, context=None):
    """Plots dispatch and combine speedup (faster baseline / IFEC) vs EP size, one line per top-k.

    rows: see dispatch_combine_speedups. context: one line saying how the times were obtained (tokens per rank,
    hidden size, simulated or measured), shown above the panels. One panel per phase present; returns the Path.
    """
    return _save_figure(dispatch_combine_figure(rows, context), path)


def dispatch_combine_figure(rows, context=None):
    """The figure plot_dispatch_combine writes."""
    speedups = dispatch_combine_speedups(rows)
    context = _context(context, "plot_dispatch_combine")
    phases = [p for p in DISPATCH_PHASES if any(k[0] == p for k in speedups)]
    fig, axes = _new_figure(width=5.5 * len(phases), ncols=len(phases))
    for ax, phase in zip(axes, phases):
        topks = sorted({k[1] for k in speedups if k[0] == phase})
        for topk in topks:
            eps = sorted(k[2] for k in speedups if k[:2] == (phase, topk))
            ax.plot(eps, [speedups[(phase, topk, ep)][1] for ep in eps], "o-",
                    label=f"top-{topk}")
        ep_values = sorted({k[2] for k in speedups if k[0] == phase})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ep_values, [str(ep) for ep in ep_values])
        # Speedup 1 is the break-even line: points below it mean IFEC lost to the baseline.
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("EP size (ranks)")
        ax.set_ylabel("speedup (baseline time / IFEC time)")
        ax.set_title(f"MoE {phase}: IFEC speedup")
        ax.grid(True, alpha=0.3)
        ax.legend(title="baseline = faster of per_expert / per_rank", fontsize="small", title_fontsize="small")
    if context:
        fig.suptitle(textwrap.fill(context, 50 * len(phases)), fontsize="medium")
    return fig


# --------------------------------------------------------------------------- wire bytes


def _wire_table(rows):
    """Validates wire-byte rows; returns (variants, planes, {(variant, plane): bytes}) in first-seen order."""
    what = "plot_wire_bytes"
    table, variants, planes = {}, [], []
    for i, row in enumerate(_rows(rows, what)):
        _require_keys(row, ("variant", "plane", "bytes"), what, i)
        variant, plane = str(row["variant"]), row["plane"]
        if not variant:
            raise ValueError(f"{what}: row {i} has an empty variant")
        if isinstance(plane, bool) or not isinstance(plane, (str, int, np.integer)):
            raise ValueError(f"{what}: row {i} plane must be a number or a name, got {plane!r}")
        if (variant, plane) in table:
            raise ValueError(f"{what}: row {i} repeats variant {variant!r} plane {plane!r}")
        table[(variant, plane)] = _positive_number(row["bytes"], "bytes", what, i, allow_zero=True)
        variants += [variant] if variant not in variants else []
        planes += [plane] if plane not in planes else []
    # A missing bar would read as "zero bytes", so demand every variant on every plane.
    for variant in variants:
        for plane in planes:
            if (variant, plane) not in table:
                raise ValueError(f"{what}: variant {variant!r} has no bytes for plane {plane!r}")
    return variants, planes, table


def plot_wire_bytes(path, rows, context=None):
    """Grouped bars of wire bytes per plane, one bar per variant (e.g. baseline vs ifec); returns the Path.

    rows: dicts with variant, plane, bytes (>= 0). Every variant must report every plane. context: one line saying
    what was measured (operation, size, GPUs, direction, operating point, which baseline), under the title.
    """
    return _save_figure(wire_bytes_figure(rows, context), path)


def wire_bytes_figure(rows, context=None):
    """The figure plot_wire_bytes writes."""
    variants, planes, table = _wire_table(rows)
    context = _context(context, "plot_wire_bytes")
    x = np.arange(len(planes))
    width = 0.8 / len(variants)
    fig, (ax,) = _new_figure(width=max(6.0, 1.2 * len(planes) + 3))
    for j, variant in enumerate(variants):
        heights = [table[(variant, plane)] / 2**20 for plane in planes]
        ax.bar(x + (j - (len(variants) - 1) / 2) * width, heights, width, label=variant)
    ax.set_xticks(x, [str(p) for p in planes])
    ax.set_xlabel("plane")
    ax.set_ylabel("wire bytes (MiB)")
    ax.set_title(_wire_title(variants, planes, table) + ("\n" + textwrap.fill(context, 90) if context else ""),
                 fontsize="medium")
    ax.grid(True, axis="y", alpha=0.3)
    # The legend in a band of headroom above the tallest bar, one row, so it covers no bar.
    tallest = max(table.values()) / 2**20
    ax.set_ylim(0, max(1e-9, 1.25 * tallest))
    ax.legend(loc="upper center", ncol=len(variants), fontsize="small")
    return fig


def _wire_title(variants, planes, table):
    """Title with IFEC's total saving over the baseline when both variants are present."""
    baseline = next((v for v in variants if v.startswith("baseline")), None)
    if baseline is not None and "ifec" in variants:
        base = sum(table[(baseline, p)] for p in planes)
        ifec = sum(table[("ifec", p)] for p in planes)
        if base > 0:
            return f"Wire bytes per plane (IFEC saves {100 * (1 - ifec / base):.1f}% in total)"
    return "Wire bytes per plane"


# --------------------------------------------------------------------------- files


def _new_file_mode(path):
    """The mode a file written in place would have: the one it has, or 0666 less the process's umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mask = os.umask(0o22)
        os.umask(mask)
        return 0o666 & ~mask


def _atomic_write_text(path, text, what):
    """Writes text via a temp file + rename so a concurrent reader never sees a half-written file. Only to a regular
    file: the rename would replace a device (/dev/null) or a pipe with the file."""
    path = _output_path(path, what)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise OSError(e.errno, f"{what}: cannot write in the folder of {str(path)!r}: {e.strerror}") from e
    try:
        os.fchmod(fd, _new_file_mode(path))  # mkstemp's 0600 would hide the report from everyone else
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise OSError(e.errno, f"{what}: cannot write {str(path)!r}: {e.strerror or e}") from e
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def _csv_value(v):
    """A value as report CSVs write it (the C++ common::JsonObject's rule): true/false, numbers as C++ writes them
    with 10 significant digits, strings as they are (the csv module quotes them when needed)."""
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (float, np.floating)):
        return "%.10g" % v
    return v


def write_csv(path, rows, fieldnames=None):
    """Writes a list of dicts as CSV (header = fieldnames, or keys in first-seen order); returns the Path.

    The one rule of every report CSV, shared with the CLI benches (common::JsonObject::csv_row): the scalar
    fields only (list and dict values stay in the JSON), booleans as true/false, floats to 10 significant digits.
    Parent directories are created. Rows may lack columns (left empty); a key outside an explicit fieldnames
    raises ValueError.
    """
    if rows is None or isinstance(rows, (str, bytes, dict)):
        raise ValueError(f"write_csv: rows must be a list of dicts, got {rows!r}")
    rows = list(rows)
    for i, row in enumerate(rows):
        _require_keys(row, (), "write_csv", i)
    rows = [{k: _csv_value(v) for k, v in row.items() if not isinstance(v, (list, tuple, dict, np.ndarray))}
            for row in rows]
    if fieldnames is None:
        fieldnames = list(dict.fromkeys(k for row in rows for k in row))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fieldnames, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return _atomic_write_text(path, buf.getvalue(), "write_csv")


def _json_default(obj):
    """Lets json encode numpy scalars/arrays and paths, which simulation results often contain."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"write_json: cannot encode {type(obj).__name__} {obj!r}")


def _non_finite(obj, where):
    """(where, value) of the first NaN or infinity in obj (e.g. "obj[3]['time_us']", nan), or None."""
    if isinstance(obj, (float, np.floating)):
        return None if math.isfinite(obj) else (where, obj)
    if isinstance(obj, np.ndarray):
        obj = obj.tolist()
    if isinstance(obj, dict):
        parts = ((f"{where}[{k!r}]", v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        parts = ((f"{where}[{i}]", v) for i, v in enumerate(obj))
    else:
        return None
    return next((found for w, v in parts if (found := _non_finite(v, w)) is not None), None)


def write_json(path, obj):
    """Writes obj as indented JSON (numpy values allowed), creating parent directories; returns the Path.

    NaN and infinity are refused (ValueError naming where they are): JSON has neither, and Python's NaN token is
    one that jq, browsers and C++ parsers reject."""
    bad = _non_finite(obj, "obj")
    if bad is not None:
        raise ValueError(f"write_json {os.fspath(path)!r}: {bad[0]} is {bad[1]!r}; JSON has no NaN or infinity")
    text = json.dumps(obj, indent=2, default=_json_default, allow_nan=False)
    return _atomic_write_text(path, text + "\n", "write_json")


def is_png(path):
    """True when the file starts with the PNG signature and a well-formed IHDR (CRC ok, width/height > 0).

    Reads only the first 33 bytes; a missing or unreadable file is simply not a PNG.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(33)
    except OSError:
        return False
    if len(head) < 33 or head[:8] != PNG_SIGNATURE:
        return False
    length, ctype = struct.unpack(">I4s", head[8:16])
    if length != 13 or ctype != b"IHDR":
        return False
    width, height = struct.unpack(">II", head[16:24])
    (crc,) = struct.unpack(">I", head[29:33])
    return width > 0 and height > 0 and zlib.crc32(head[12:29]) == crc
