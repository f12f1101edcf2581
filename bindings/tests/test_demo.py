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
