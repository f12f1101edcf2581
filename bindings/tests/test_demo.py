"""The demo's measurement script end to end on a small fabric: table, CSV/JSON and valid PNGs."""

import json

import pytest

from ifec import demo, reports


def test_demo_writes_tables_and_plots(tmp_path, capsys):
    demo.main([str(tmp_path), "--sizes", "64KiB", "--gpus", "4", "--planes", "2", "--amdahl-size", "1MiB",
               "--amdahl-gpus", "4"])
    out = capsys.readouterr().out
    assert "[driver: sim]" in out and "Amdahl point" in out
    rows = json.loads((tmp_path / "allreduce.json").read_text())
    assert {r["algo"] for r in rows} == {"ring", "ifec"}
    assert all(r["ok"] and r["wrong"] == 0 for r in rows)
    assert (tmp_path / "allreduce.csv").read_text().startswith("driver,")
    for png in ["amdahl.png", "allreduce_wire_bytes.png"]:
        assert reports.is_png(tmp_path / png), png


def test_demo_rejects_bad_sizes():
    with pytest.raises(ValueError, match="12parsecs"):
        demo.parse_size("12parsecs")
    assert demo.parse_size("4MiB") == 4 << 20
