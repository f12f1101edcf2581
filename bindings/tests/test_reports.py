"""ifec.reports: the Amdahl model against Hoefler et al. (Figure 5), the PNG plots, and the file helpers.

The module is loaded straight from bindings/python/ifec/reports.py so these tests do not depend on the
native build; when the source file is absent (e.g. an installed package) they use `ifec.reports`.
"""

import csv
import importlib
import importlib.util
import json
import os
import pathlib
import stat
import struct
import zlib

import numpy as np
import pytest

SOURCE = pathlib.Path(__file__).resolve().parents[1] / "python" / "ifec" / "reports.py"


def _load_reports():
    """The reports module: from its source file when present, else from the ifec package."""
    if SOURCE.exists():
        spec = importlib.util.spec_from_file_location("ifec_reports_under_test", SOURCE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return importlib.import_module("ifec.reports")


reports = _load_reports()

PAPER_SPEEDUP = 352 / 151  # ring 352 ms vs in-network 151 ms for the 8 GiB AllReduce


# --------------------------------------------------------------------------- the Amdahl model vs the paper


def test_hoefler_reference_holds_the_papers_inputs():
    ref = reports.hoefler_reference()
    assert ref["ring_time_s"] == pytest.approx(0.352)
    assert ref["inc_time_s"] == pytest.approx(0.151)
    assert ref["message_bytes"] == 8 * 2**30
    assert ref["comm_speedup"] == pytest.approx(PAPER_SPEEDUP)
    # The paper's "nearly 60% speedup" of the AllReduce itself is a 57% time saving.
    assert ref["comm_saving"] == pytest.approx(1 - 151 / 352)
    assert ref["comm_saving"] == pytest.approx(0.57, abs=0.005)


@pytest.mark.parametrize("share, paper_gain", [(0.20, 0.11), (0.60, 0.34)])
def test_overall_gain_matches_the_paper_within_one_point(share, paper_gain):
    ref = reports.hoefler_reference()
    gain = reports.amdahl_gain(share, ref["ring_time_s"] / ref["inc_time_s"])
    assert gain == pytest.approx(paper_gain, abs=0.01)
    assert ref[f"gain_at_{round(share * 100)}pct"] == pytest.approx(gain)


def test_gain_is_zero_without_communication_and_the_full_saving_with_only_communication():
    assert reports.amdahl_gain(0.0, PAPER_SPEEDUP) == 0.0
    assert reports.amdahl_gain(1.0, PAPER_SPEEDUP) == pytest.approx(1 - 151 / 352)


def test_gain_is_monotonic_in_the_share():
    gains = reports.amdahl_gain(np.linspace(0, 1, 201), PAPER_SPEEDUP)
    assert np.all(np.diff(gains) > 0)


def test_gain_is_vectorised_and_scalars_stay_scalars():
    shares = np.array([[0.1, 0.2], [0.4, 0.6]])
    gains = reports.amdahl_gain(shares, PAPER_SPEEDUP)
    assert isinstance(gains, np.ndarray) and gains.shape == shares.shape
    assert gains[0, 1] == pytest.approx(reports.amdahl_gain(0.2, PAPER_SPEEDUP))
    assert isinstance(reports.amdahl_gain(0.2, PAPER_SPEEDUP), float)
    # The communication speedup broadcasts too: one share, several speedups.
    assert reports.amdahl_gain(0.5, np.array([1.0, 2.0, 4.0])) == pytest.approx([0.0, 0.25, 0.375])


def test_speedup_factor_is_the_companion_of_the_gain():
    shares = np.linspace(0, 1, 11)
    speedups = reports.amdahl_speedup(shares, PAPER_SPEEDUP)
    assert speedups == pytest.approx(1 / (1 - reports.amdahl_gain(shares, PAPER_SPEEDUP)))
    assert reports.amdahl_speedup(0.0, PAPER_SPEEDUP) == 1.0
    assert reports.amdahl_speedup(1.0, PAPER_SPEEDUP) == pytest.approx(PAPER_SPEEDUP)


def test_a_slower_collective_gives_a_negative_gain():
    assert reports.amdahl_gain(0.5, 0.5) == pytest.approx(-0.5)


@pytest.mark.parametrize("share, shown", [(-0.1, "-0.1"), (1.5, "1.5"), (float("nan"), "nan"),
                                          ([0.2, 2.0], "2.0")])
def test_a_share_outside_zero_one_is_rejected_by_value(share, shown):
    with pytest.raises(ValueError, match=rf"comm_share.*{shown}"):
        reports.amdahl_gain(share, PAPER_SPEEDUP)


@pytest.mark.parametrize("speedup", [0.0, -2.0, float("inf")])
def test_a_non_positive_comm_speedup_is_rejected_by_value(speedup):
    with pytest.raises(ValueError, match=rf"comm_speedup.*{speedup}"):
        reports.amdahl_gain(0.2, speedup)


# --------------------------------------------------------------------------- plots


def assert_png(path, min_bytes=5000):
    path = pathlib.Path(path)
    assert reports.is_png(path), path
    assert path.stat().st_size > min_bytes  # a real plot, not an empty canvas


def test_plot_amdahl_writes_a_png(tmp_path):
    out = tmp_path / "figs" / "amdahl.png"  # the parent does not exist yet
    assert reports.plot_amdahl(out) == out
    assert_png(out)


def test_a_plot_is_written_in_the_format_its_suffix_names(tmp_path):
    pdf = reports.plot_amdahl(tmp_path / "amdahl.PDF")
    assert pdf.read_bytes().startswith(b"%PDF-") and not reports.is_png(pdf)
    svg = reports.plot_amdahl(tmp_path / "amdahl.svg")
    assert b"<svg" in svg.read_bytes()[:400]
    assert_png(reports.plot_amdahl(tmp_path / "amdahl"))  # no suffix: PNG


def test_a_plot_suffix_without_a_format_is_refused_before_writing(tmp_path):
    with pytest.raises(ValueError, match=r"'\.jpg', expected one of \.png, \.pdf, \.svg"):
        reports.plot_amdahl(tmp_path / "new" / "amdahl.jpg")
    assert not (tmp_path / "new").exists()


def test_plot_amdahl_with_measured_times(tmp_path):
    measured = dict(ring_time_s=0.020, ifec_time_s=0.011, label="IFEC sim, 8 GPUs")
    out = reports.plot_amdahl(str(tmp_path / "amdahl_measured.png"), measured=measured)
    assert_png(out)
    # The second curve adds pixels, so the file differs from the paper-only plot.
    alone = reports.plot_amdahl(tmp_path / "amdahl_alone.png")
    assert out.read_bytes() != alone.read_bytes()


def test_amdahl_legend_says_how_much_faster_and_covers_no_label():
    fig = reports.amdahl_figure(measured=dict(ring_time_s=327.7e-6, ifec_time_s=178.2e-6, label="sim"))
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    assert any("1.84x faster (46% less time)" in t for t in texts), texts  # not "46% faster"
    assert any("2.33x faster (57% less time)" in t for t in texts), texts
    renderer = fig.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    labels = [a for a in ax.texts if " at " in a.get_text()]
    assert {a.get_text() for a in labels} >= {"34.3% at 60%", "11.4% at 20%"}
    for a in labels:
        assert not box.overlaps(a.get_window_extent(renderer)), a.get_text()


def test_wire_bytes_legend_covers_no_bar():
    rows = [dict(variant="baseline (best: tree)", plane=p, bytes=129 * 2**20) for p in range(4)] + \
           [dict(variant="ifec", plane=p, bytes=67 * 2**20) for p in range(4)]
    fig = reports.wire_bytes_figure(rows, context="AllReduce of 4 MiB on 64 GPUs")
    fig.canvas.draw()
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    box = ax.get_legend().get_window_extent(renderer)
    bars = [p for p in ax.patches if p.get_height() > 0]
    assert len(bars) == 8
    for bar in bars:
        assert not box.overlaps(bar.get_window_extent(renderer)), bar


def test_wire_and_speedup_plots_say_what_was_measured():
    rows = [dict(variant="baseline (ring)", plane=p, bytes=2e6) for p in range(2)] + \
           [dict(variant="ifec", plane=p, bytes=1e6) for p in range(2)]
    fig = reports.wire_bytes_figure(rows, context="AllReduce of 4 MiB on 8 GPUs: frames sent; baseline = ring")
    title = fig.axes[0].get_title()
    assert "saves 50.0%" in title and "4 MiB on 8 GPUs" in title and "baseline = ring" in title
    speed = [dict(ep=8, topk=8, phase=ph, variant=v, time_us=t) for ph in ("dispatch", "combine")
             for v, t in (("per_rank", 10.0), ("ifec", 8.0))]
    fig = reports.dispatch_combine_figure(speed, context="64 tokens per rank; times simulated")
    assert "64 tokens per rank" in fig._suptitle.get_text() and "simulated" in fig._suptitle.get_text()


def test_plot_amdahl_measured_label_is_optional(tmp_path):
    assert_png(reports.plot_amdahl(tmp_path / "a.png", measured=dict(ring_time_s=2.0, ifec_time_s=1)))


@pytest.mark.parametrize("measured, named", [
    (dict(ring_time_s=0.02), "ifec_time_s"),
    (dict(ring_time_s=-0.02, ifec_time_s=0.01), "-0.02"),
    (dict(ring_time_s=0.02, ifec_time_s=0), "ifec_time_s"),
    (dict(ring_time_s="fast", ifec_time_s=0.01), "fast"),
    ([0.02, 0.01], r"\[0.02, 0.01\]"),
])
def test_plot_amdahl_rejects_bad_measured(tmp_path, measured, named):
    with pytest.raises(ValueError, match=named):
        reports.plot_amdahl(tmp_path / "bad.png", measured=measured)
    assert not (tmp_path / "bad.png").exists()


def moe_rows(eps=(8, 16, 32), topks=(1, 2, 4)):
    """Synthetic dispatch/combine times where per_rank wins at small EP and per_expert at large EP."""
    rows = []
    for phase in ("dispatch", "combine"):
        for topk in topks:
            for ep in eps:
                times = {"per_expert": 400.0 + 2 * ep * topk, "per_rank": 100.0 + 20 * ep * topk,
                         "ifec": 50.0 + ep * topk}
                rows += [dict(ep=ep, topk=topk, phase=phase, variant=v, time_us=t) for v, t in times.items()]
    return rows


def test_dispatch_combine_baseline_is_the_faster_variant():
    speedups = reports.dispatch_combine_speedups(moe_rows())
    assert len(speedups) == 2 * 3 * 3
    base, speedup = speedups[("dispatch", 1, 8)]  # per_rank 260 us < per_expert 416 us
    assert base == "per_rank" and speedup == pytest.approx(260 / 58)
    base, speedup = speedups[("combine", 4, 32)]  # per_expert 656 us < per_rank 2660 us
    assert base == "per_expert" and speedup == pytest.approx(656 / 178)


def test_dispatch_combine_accepts_a_single_baseline():
    rows = [dict(ep=8, topk=2, phase="combine", variant="per_expert", time_us=30),
            dict(ep=8, topk=2, phase="combine", variant="ifec", time_us=10)]
    assert reports.dispatch_combine_speedups(rows) == {("combine", 2, 8): ("per_expert", pytest.approx(3.0))}


def test_plot_dispatch_combine_writes_a_png(tmp_path):
    out = reports.plot_dispatch_combine(tmp_path / "moe" / "dispatch_combine.png", moe_rows())
    assert_png(out)


def test_plot_dispatch_combine_with_one_phase(tmp_path):
    rows = [r for r in moe_rows() if r["phase"] == "dispatch"]
    assert_png(reports.plot_dispatch_combine(tmp_path / "dispatch.png", rows))


def replace(rows, index, **changes):
    rows = [dict(r) for r in rows]
    rows[index].update(changes)
    return rows


@pytest.mark.parametrize("rows, named", [
    (replace(moe_rows(), 0, phase="scatter"), "scatter"),
    (replace(moe_rows(), 1, variant="nccl"), "nccl"),
    (replace(moe_rows(), 2, time_us=-5.0), "-5.0"),
    (replace(moe_rows(), 0, ep=0), r"ep .*0"),
    (replace(moe_rows(), 0, topk=1.5), "1.5"),
    ([{k: v for k, v in r.items() if k != "time_us"} for r in moe_rows()[:1]], "time_us"),
    ([r for r in moe_rows() if r["variant"] != "ifec"], "ifec"),
    ([r for r in moe_rows() if r["variant"] == "ifec"], "per_expert or per_rank"),
    (moe_rows() + moe_rows()[:1], "repeats"),
    ([], "empty"),
])
def test_plot_dispatch_combine_rejects_bad_rows(tmp_path, rows, named):
    with pytest.raises(ValueError, match=named):
        reports.plot_dispatch_combine(tmp_path / "bad.png", rows)


def wire_rows():
    base = {0: 64 << 20, 1: 64 << 20, 2: 96 << 20, 3: 32 << 20}
    return ([dict(variant="baseline", plane=p, bytes=b) for p, b in base.items()]
            + [dict(variant="ifec", plane=p, bytes=b // 2) for p, b in base.items()])


def test_plot_wire_bytes_writes_a_png(tmp_path):
    assert_png(reports.plot_wire_bytes(tmp_path / "wire" / "bytes.png", wire_rows()))


def test_plot_wire_bytes_takes_named_planes_and_numpy_counts(tmp_path):
    rows = [dict(variant=v, plane=p, bytes=np.int64(n)) for v, n in (("baseline", 1000), ("ifec", 0))
            for p in ("plane0", "plane1")]
    assert_png(reports.plot_wire_bytes(tmp_path / "w.png", rows))


@pytest.mark.parametrize("rows, named", [
    (replace(wire_rows(), 0, bytes=-1), "-1"),
    (replace(wire_rows(), 0, bytes=float("nan")), "nan"),
    (wire_rows()[:-1], "plane 3"),
    (wire_rows() + wire_rows()[:1], "repeats"),
    ([dict(variant="ifec", plane=0)], "bytes"),
    ([], "empty"),
])
def test_plot_wire_bytes_rejects_bad_rows(tmp_path, rows, named):
    with pytest.raises(ValueError, match=named):
        reports.plot_wire_bytes(tmp_path / "bad.png", rows)


# --------------------------------------------------------------------------- files


def test_write_csv_creates_parents_and_round_trips(tmp_path):
    rows = [dict(ep=8, topk=2, time_us=1.5), dict(ep=16, topk=2, time_us=2.5, note="x")]
    out = reports.write_csv(tmp_path / "a" / "b" / "rows.csv", rows)
    with open(out, newline="") as f:
        back = list(csv.DictReader(f))
    assert list(back[0]) == ["ep", "topk", "time_us", "note"]  # keys in first-seen order
    assert back[1] == {"ep": "16", "topk": "2", "time_us": "2.5", "note": "x"}
    assert back[0]["note"] == ""


def test_a_report_file_has_the_mode_a_file_written_in_place_would(tmp_path):
    """The temporary file's 0600 (mkstemp's) became the report's: nobody else could read a run's results."""
    old = os.umask(0o022)
    try:
        out = reports.write_csv(tmp_path / "new.csv", [dict(a=1)])
        assert stat.S_IMODE(out.stat().st_mode) == 0o644
        os.umask(0o077)
        assert stat.S_IMODE(reports.write_json(tmp_path / "private.json", {"a": 1}).stat().st_mode) == 0o600
        out.chmod(0o640)  # an existing file keeps its mode when rewritten
        assert stat.S_IMODE(reports.write_csv(out, [dict(a=2)]).stat().st_mode) == 0o640
    finally:
        os.umask(old)


def test_write_csv_with_explicit_fieldnames_rejects_unknown_keys(tmp_path):
    with pytest.raises(ValueError):
        reports.write_csv(tmp_path / "rows.csv", [dict(a=1, b=2)], fieldnames=["a"])


def test_write_json_creates_parents_and_encodes_numpy(tmp_path):
    obj = {"gain": np.float64(0.114), "eps": np.array([8, 16]), "ref": reports.hoefler_reference()}
    out = reports.write_json(tmp_path / "x" / "report.json", obj)
    back = json.loads(out.read_text())
    assert back["gain"] == pytest.approx(0.114) and back["eps"] == [8, 16]
    assert back["ref"]["message_bytes"] == 8 * 2**30
    assert [p.name for p in out.parent.iterdir()] == ["report.json"]  # no temp file left behind


def test_write_json_rejects_unencodable_objects(tmp_path):
    with pytest.raises(TypeError):
        reports.write_json(tmp_path / "bad.json", {"x": object()})


@pytest.mark.parametrize("obj, where", [
    ([{"time_us": float("nan")}], r"obj\[0\]\['time_us'\] is nan"),
    ({"a": {"b": np.float64("inf")}}, r"obj\['a'\]\['b'\] is inf"),
    ({"per_plane": np.array([1.0, -np.inf])}, r"obj\['per_plane'\]\[1\] is -inf"),
])
def test_write_json_refuses_nan_and_infinity_naming_where(tmp_path, obj, where):
    """They were written as NaN and Infinity: not JSON (jq, browsers and C++ parsers refuse the file)."""
    with pytest.raises(ValueError, match=where):
        reports.write_json(tmp_path / "bad.json", obj)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("rows, named", [
    (None, "rows must be a list of dicts, got None"),
    ("abc", "rows must be a list of dicts, got 'abc'"),
    ([dict(a=1), [1, 2]], r"row 1 must be a dict, got \[1, 2\]"),
])
def test_write_csv_refuses_rows_that_are_not_dicts(tmp_path, rows, named):
    with pytest.raises(ValueError, match=named):
        reports.write_csv(tmp_path / "bad.csv", rows)


def test_writers_refuse_a_directory_or_an_empty_path(tmp_path):
    for write in (lambda p: reports.write_csv(p, [dict(a=1)]), lambda p: reports.write_json(p, [1]),
                  lambda p: reports.plot_wire_bytes(p, wire_rows()), lambda p: reports.plot_amdahl(p)):
        with pytest.raises(ValueError, match=f"'{tmp_path}' is a directory"):
            write(tmp_path)
        with pytest.raises(ValueError, match="empty path"):
            write("")  # was '.' (a directory) or, for the CSV and JSON writers, a rename onto the working directory
    assert list(tmp_path.iterdir()) == []


def test_csv_and_json_writers_never_replace_a_device(tmp_path):
    """The write goes to a temporary file renamed onto the path: onto /dev/null, as root, the device node itself
    was replaced by a regular file. A symlink in tmp_path stands for it: its target is what is checked."""
    device = tmp_path / "null"
    device.symlink_to("/dev/null")
    for write in (lambda: reports.write_csv(device, [dict(a=1)]), lambda: reports.write_json(device, [1])):
        with pytest.raises(ValueError, match="a device or pipe, not a regular file"):
            write()
    assert device.is_symlink() and device.resolve() == pathlib.Path("/dev/null")


def test_a_plot_may_go_to_dev_null_and_a_full_device_is_named():
    assert reports.plot_wire_bytes("/dev/null", wire_rows()) == pathlib.Path("/dev/null")
    if pathlib.Path("/dev/full").exists():
        with pytest.raises(OSError, match="cannot write '/dev/full': No space left on device"):
            reports.plot_wire_bytes("/dev/full", wire_rows())


def test_a_folder_that_cannot_be_made_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError, match=f"cannot make the folder of '{tmp_path}/file/out.csv'"):
        reports.write_csv(tmp_path / "file" / "out.csv", [dict(a=1)])


def test_plots_take_rows_once_from_a_generator_and_refuse_an_empty_one(tmp_path):
    assert_png(reports.plot_wire_bytes(tmp_path / "w.png", (r for r in wire_rows())))
    assert_png(reports.plot_dispatch_combine(tmp_path / "d.png", (r for r in moe_rows())))
    with pytest.raises(ValueError, match="rows is empty"):  # matplotlib's "Number of columns must be ..." before
        reports.plot_dispatch_combine(tmp_path / "e.png", (r for r in []))


@pytest.mark.parametrize("plot, rows", [(reports.plot_wire_bytes, wire_rows()),
                                        (reports.plot_dispatch_combine, moe_rows())])
def test_a_plot_context_that_is_not_a_string_is_named(tmp_path, plot, rows):
    with pytest.raises(ValueError, match="context must be a string, got 5"):  # was AttributeError: expandtabs
        plot(tmp_path / "c.png", rows, context=5)


@pytest.mark.parametrize("plane", [float("nan"), [0], None])
def test_plot_wire_bytes_refuses_a_plane_that_is_no_number_or_name(tmp_path, plane):
    """NaN planes never matched each other (one bar each); a list raised TypeError: unhashable type."""
    with pytest.raises(ValueError, match=r"row 0 plane must be a number or a name"):
        reports.plot_wire_bytes(tmp_path / "p.png", [dict(variant="ifec", plane=plane, bytes=1)])


@pytest.mark.parametrize("ring, ifec", [(1e-320, 1e300), (1e300, 1e-300)])
def test_plot_amdahl_refuses_times_whose_ratio_is_not_finite(tmp_path, ring, ifec):
    """1e-320 / 1e300 gave ZeroDivisionError; 1e300 / 1e-300 an error about comm_speedup, which no one passed."""
    with pytest.raises(ValueError, match="ring_time_s / ifec_time_s = .* is not a finite ratio > 0"):
        reports.plot_amdahl(tmp_path / "a.png", measured=dict(ring_time_s=ring, ifec_time_s=ifec))


# --------------------------------------------------------------------------- is_png


def png_head(width=4, height=3, crc_ok=True):
    """The PNG signature plus an IHDR chunk, built by hand."""
    data = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    crc = zlib.crc32(b"IHDR" + data) ^ (0 if crc_ok else 1)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + data + struct.pack(">I", crc)


@pytest.mark.parametrize("content, expected", [
    (png_head(), True),
    (png_head(width=0), False),
    (png_head(height=0), False),
    (png_head(crc_ok=False), False),
    (png_head()[:-1], False),
    (b"GIF89a" + bytes(40), False),
    (png_head().replace(b"IHDR", b"IDAT"), False),
    (b"", False),
])
def test_is_png_checks_signature_and_ihdr(tmp_path, content, expected):
    path = tmp_path / "f.png"
    path.write_bytes(content)
    assert reports.is_png(path) is expected


def test_is_png_is_false_for_a_missing_file(tmp_path):
    assert reports.is_png(tmp_path / "nope.png") is False


# --------------------------------------------------------------------------- staged package


def test_staged_package_exposes_the_same_api():
    """When the build has staged reports.py next to the native module, it is this same code."""
    try:
        staged = importlib.import_module("ifec.reports")
    except ImportError as e:
        pytest.skip(f"ifec.reports is not importable here ({e})")
    for name in ("amdahl_gain", "amdahl_speedup", "hoefler_reference", "plot_amdahl", "plot_dispatch_combine",
                 "plot_wire_bytes", "write_csv", "write_json", "is_png"):
        assert callable(getattr(staged, name)), name
    assert staged.hoefler_reference() == reports.hoefler_reference()
