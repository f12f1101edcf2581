"""The demo's measurement script end to end on a small fabric: table, CSV/JSON and valid PNGs."""

import json

import pytest

from ifec import demo, reports


def test_demo_writes_tables_and_plots(tmp_path, capsys):
    demo.main([str(tmp_path), "--sizes", "64KiB", "--gpus", "8", "--planes", "2", "--amdahl-size", "1MiB",
               "--amdahl-gpus", "4", "--moe-tokens", "8", "--moe-sweep-tokens", "4", "--moe-hidden", "256",
               "--deepep-tokens", "64"])
    out = capsys.readouterr().out
    assert "[driver: sim]" in out and "Amdahl point" in out
    rows = json.loads((tmp_path / "allreduce.json").read_text())
    assert {r["algo"] for r in rows} == {"best", "ifec"}
    # The baseline names the endpoint algorithm that ran, and the table prints it.
    assert all(r["ran"] in ("ring", "tree", "rd", "oneshot") for r in rows if r["algo"] == "best")
    assert "baseline: the best endpoint algorithm" in out
    assert all(r["ok"] and r["wrong"] == 0 for r in rows)
    assert (tmp_path / "allreduce.csv").read_text().startswith("driver,")
    for png in ["amdahl.png", "allreduce_wire_bytes.png", "moe_speedup.png", "moe_wire_bytes.png"]:
        assert reports.is_png(tmp_path / png), png
    # The MoE layer table: every variant, printed and written with the same numbers.
    layer = json.loads((tmp_path / "moe_layer.json").read_text())["layer"]
    assert [t["variant"] for t in layer] == ["per_expert", "per_rank", "ifec"]
    for t in layer:
        assert t["max_rel_error"] < 2e-2
        assert t["end_to_end_us"] == pytest.approx(t["allreduce_us"] + t["dispatch_us"] + t["compute_us"]
                                                   + t["combine_us"])
        assert f"{t['end_to_end_us']:.1f}" in out
        # Two overlapped micro-batches (the halves simulated on their own): the AllReduce, then the schedule's time,
        # which is never below the halves' experts alone (about the whole batch's, one launch more).
        row = next(r for r in json.loads((tmp_path / "moe_layer.json").read_text())["moe_rows"]
                   if r["variant"] == t["variant"])
        assert t["overlapped_end_to_end_us"] == pytest.approx(t["allreduce_us"] + row["overlap_us"])
        assert row["overlap_us"] >= 0.9 * t["compute_us"]
    assert "end to end, overlapped" in out
    deepep = json.loads((tmp_path / "moe_layer.json").read_text())["deepep_normal_rows"]
    assert [r["variant"] for r in deepep] == ["per_expert", "per_rank", "ifec"]
    assert all(r["tokens"] == 64 and r["fp8_dispatch"] and r["overlap_us"] >= 0.9 * r["compute_us"] for r in deepep)
    assert "DeepEP normal point" in out
    assert (tmp_path / "moe_layer.csv").read_text().startswith("variant,")
    sweep = json.loads((tmp_path / "moe_sweep.json").read_text())
    assert {r["topk"] for r in sweep} == {2, 4, 8}


def test_demo_rejects_bad_sizes():
    with pytest.raises(ValueError, match="12parsecs"):
        demo.parse_size("12parsecs")
    assert demo.parse_size("4MiB") == 4 << 20


SMALL = ["--sizes", "64KiB", "--gpus", "8", "--planes", "2", "--amdahl-size", "1MiB", "--amdahl-gpus", "4"]


@pytest.mark.parametrize("args, named", [
    (["--sizes", "1.5MiB"], "--sizes: size '1.5MiB'"),
    (["--sizes", "6B"], "--sizes '6B': 6 B is not a whole number of fp32 elements"),
    (["--amdahl-size", "0"], "--amdahl-size: size '0'"),
    (["--gpus", "1"], "--gpus 1: expected 2..64000"),
    (["--amdahl-gpus", "1"], "--amdahl-gpus 1: expected 2..64000"),  # was "members 1 outside 2..1"
    (["--planes", "0"], "--planes 0: expected 1..256"),
    (["--gpus", "3"], "--gpus 3: the MoE layer's EP size must divide its 256 experts"),
    (["--deepep-ep", "6"], "--deepep-ep 6: the MoE layer's EP size must divide"),
    (["--moe-tokens", "0"], "--moe-tokens 0: expected 1.."),
    (["--moe-sweep-tokens", "0"], "--moe-sweep-tokens 0: expected 1.."),
    (["--moe-hidden", "-128"], "--moe-hidden -128: expected 1.."),
    (["--deepep-tokens", "0"], "--deepep-tokens 0: expected 1.."),
    (["--gpu-profile", "/nonexistent/h100.yaml"], "--gpu-profile: /nonexistent/h100.yaml: cannot open"),
])
def test_demo_refuses_bad_options_before_it_runs(tmp_path, capsys, args, named):
    """Each was refused by a traceback, most after the AllReduce section had run (minutes at the defaults)."""
    if "--gpu-profile" in args and not demo.moe.available():
        pytest.skip("no MoE layer in this build: the profile is not read")
    with pytest.raises(SystemExit) as exit_:
        demo.main([str(tmp_path / "out"), *SMALL, *args])
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and named in captured.err, captured.err
    assert captured.out == ""


@pytest.mark.parametrize("make, named", [
    (lambda tmp: (tmp / "file").write_text("x") and str(tmp / "file"), "exists and is not a folder"),
    (lambda tmp: (tmp / "file").write_text("x") and str(tmp / "file" / "sub"), "cannot make it: Not a directory"),
    (lambda tmp: "", "OUT_DIR '': expected a folder"),  # the files went to /amdahl.png, /allreduce.csv, ...
])
def test_demo_makes_its_output_folder_first(tmp_path, capsys, make, named):
    with pytest.raises(SystemExit) as exit_:
        demo.main([make(tmp_path), *SMALL, "--no-moe"])
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and named in captured.err and captured.out == "", captured.err
