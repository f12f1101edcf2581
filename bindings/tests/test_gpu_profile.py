"""The GPU profile tool (ifec.gpu_profile): its differentiable model is the C++ one (gpu_model.h) to the last bit,
its fit recovers a profile that reproduces every measured H100 row within 10% from a poor start, the file it
writes is what --gpu-profile reads. The gpu case, measuring a real GPU, is test_gpu_profile_on_gpu.py."""

import os
import subprocess
import sys

import pytest

from ifec import _native, gpu_profile as g, moe

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.skipif(not moe.available(), reason="built without LibTorch"),
              pytest.mark.timeout(300, method="signal")]

H100 = g.PEAKS["H100"]


@pytest.mark.parametrize("kind,per", [("grouped", g.even_spread(1024, 32)), ("grouped", [0, 5, 700, 3]),
                                      ("loop", g.even_spread(4096 * 8, 8)), ("loop", [1, 0, 130]),
                                      ("chain", [256]), ("chain", [4096])])
def test_the_python_model_is_the_cpp_model(kind, per, tmp_path):
    assert float(g.model_us(torch, dict(g.DEFAULTS), kind, per, H100)) == pytest.approx(
        _native.gpu_model_us("", kind, per), rel=1e-12)
    # A profile whose chain constants differ from the grouped ones (the file as the tool writes it, 4 digits).
    own = dict(mma_fraction=0.71, overlap_p=5.25, mma_fraction_chain=0.55, overlap_p_chain=2.5, loop_call_us=40)
    (tmp_path / "p.yaml").write_text(g.profile_yaml("test", H100, own, "written by a test"))
    assert float(g.model_us(torch, dict(g.DEFAULTS, **own), kind, per, H100)) == pytest.approx(
        _native.gpu_model_us(str(tmp_path / "p.yaml"), kind, per), rel=1e-12)


def test_the_fit_recovers_every_h100_row_within_ten_percent_from_a_poor_start():
    poor = dict(mma_fraction=0.5, mem_fraction_grouped=0.6, mem_fraction_chain=0.6, grouped_launch_us=10,
                loop_call_us=50, overlap_p=2, mma_fraction_chain=0.5, overlap_p_chain=2)
    const = g.fit(g.H100_TABLE, H100, steps=300, start=poor)
    rows, worst = g.report(g.H100_TABLE, const, H100)
    assert len(rows) == 36 and worst < 0.10, [r for r in rows if abs(r[5] - 1) >= 0.10]
    # Physically sensible: about two thirds of the tensor-core peak, small-M GEMMs stream slower than grouped ones.
    assert 0.6 < const["mma_fraction"] < 0.72
    assert const["mem_fraction_chain"] < const["mem_fraction_grouped"] <= 1


def test_the_written_profile_is_what_gpu_profile_reads(tmp_path):
    out = tmp_path / "h100-refit.yaml"
    assert g.main(["--fit-only", "h100", "--out", str(out), "--name", 'the "reference" H100']) == 0
    assert _native.gpu_profile_summary(str(out)).startswith('the "reference" H100: ')
    text = out.read_text()
    assert text.startswith("# GPU profile of") and "model/measured worst deviation" in text
    assert str(out) in _native.gpu_profile_summary(str(out))
    for ep, tokens, loop, grouped, shared in g.H100_TABLE:
        per = g.even_spread(tokens * 8, 256 // ep)
        assert _native.gpu_model_us(str(out), "grouped", per) == pytest.approx(grouped, rel=0.10)
        assert _native.gpu_model_us(str(out), "loop", per) == pytest.approx(loop, rel=0.10)
        assert _native.gpu_model_us(str(out), "chain", [tokens]) == pytest.approx(shared, rel=0.10)


def test_the_measurement_runs_small_on_the_cpu():
    """measure()'s own code (the per-expert loop, the shared expert, the timer, the grouped check where PyTorch has
    torch._grouped_mm) at toy sizes on the CPU, so a GPU run does not meet its bugs first."""
    lines = []
    rows = g.measure(eps=(128, 64), tokens=(2, 5), iters=2, warmup=1, progress=lines.append, device="cpu",
                     hidden=64, inter=32, dtype=torch.float32)
    assert [r[:2] for r in rows] == [(128, 2), (128, 5), (64, 2), (64, 5)]
    for ep, t, loop, grouped, shared in rows:
        assert loop > 0 and shared > 0 and (grouped is None or grouped > 0)
    assert len(lines) == 4 and lines[0].startswith("gpu_profile: EP 128, 2 tokens/GPU: loop ")


def test_a_grouped_kernel_that_computes_something_else_is_refused():
    loop = torch.ones(16, 8)
    g.same_as_loop(torch, loop * (1 + 1e-3), loop, "EP 8, 2 tokens")  # bf16-sized differences pass
    with pytest.raises(RuntimeError, match="at EP 8, 2 tokens torch._grouped_mm gave .* relative error"):
        g.same_as_loop(torch, loop.roll(1, 0) * 2, loop, "EP 8, 2 tokens")
    with pytest.raises(RuntimeError, match=r"gave \(8, 8\)"):
        g.same_as_loop(torch, loop[:8], loop, "EP 8, 2 tokens")


def test_it_runs_from_a_checkout_without_the_native_module(repo, tmp_path):
    """On a GPU machine with PyTorch only: the package's sources, no build; the native names fail saying so."""
    env = dict(os.environ, PYTHONPATH=str(repo / "bindings" / "python"))
    run = subprocess.run([sys.executable, "-m", "ifec.gpu_profile", "--fit-only", "h100", "--table-out",
                          str(tmp_path / "t.json"), "--out", str(tmp_path / "p.yaml")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "worst deviation" in run.stdout and (tmp_path / "p.yaml").read_text().startswith("# GPU profile of")
    assert g.read_table(str(tmp_path / "t.json")) == [tuple(r) for r in g.H100_TABLE]
    run = subprocess.run([sys.executable, "-c", "import ifec; ifec.Cluster"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "ifec._native is not importable" in run.stderr and "./ifec build" in run.stderr


@pytest.mark.parametrize("content,says", [("[[8, 128, 1, 2]]", "row 0 is [8, 128, 1, 2]"),
                                          ('{"a": 1}', "holds dict"), ("[[8, 128, 1, 2, -3]]", "positive"),
                                          ("not json", "cannot read the table"), ("3", "holds int"),
                                          ("[[8.5, 128, 1, 2, 3]]", "whole numbers"),
                                          ("[[true, 128, 1, 2, 3]]", "whole numbers"),
                                          ("[[8, 128, Infinity, 2, 3]]", "finite"),
                                          ("[[512, 128, 1, 2, 3]]", "EP 512 does not divide the 256 experts")])
def test_a_bad_table_is_named(tmp_path, capsys, content, says):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert g.main(["--fit-only", str(bad)]) == 2
    assert says in capsys.readouterr().err


def test_the_shipped_measured_h100_profile_is_its_tables_fit(repo):
    """testbed/gpu-profiles/h100-sxm-measured.yaml is the fit of the table beside it (a second H100, measured): read
    by the C++ loader, it reproduces that table's grouped times within 5% and its chains' within 16%, and a refit of
    the table lands on the same grouped-kernel constants."""
    profile = repo / "testbed" / "gpu-profiles" / "h100-sxm-measured.yaml"
    table = g.read_table(str(repo / "testbed" / "gpu-profiles" / "h100-sxm-measured.json"))
    assert len(table) == 12
    for ep, tokens, loop, grouped, shared in table:
        per = g.even_spread(tokens * g.TOPK, g.EXPERTS // ep)
        assert _native.gpu_model_us(str(profile), "grouped", per) == pytest.approx(grouped, rel=0.05)
        assert _native.gpu_model_us(str(profile), "loop", per) == pytest.approx(loop, rel=0.16)
        assert _native.gpu_model_us(str(profile), "chain", [tokens]) == pytest.approx(shared, rel=0.16)
    shipped = {k: float(v) for k, v in (line.split(": ") for line in profile.read_text().splitlines()
                                        if line.split(":")[0] in g.FITTED)}
    refit = g.fit(table, H100)
    for k in g.FITTED[:4]:
        assert refit[k] == pytest.approx(shipped[k], rel=0.02), k


def test_leaving_one_ep_out_predicts_the_grouped_kernel_within_ten_percent():
    """Validation out of sample on the reference table: fitted to two EP sizes, the model predicts the third's
    grouped-kernel times within 10% (measured 2.4-4%); the chains' worst is reported (up to 12.5%: the loop at EP 16,
    4096 tokens, reaches a tensor-core fraction the others do not), not asserted."""
    loo = g.leave_one_ep_out(g.H100_TABLE, H100, steps=200)
    assert sorted(loo) == [8, 16, 32] and all(sorted(w) == ["grouped", "loop", "shared"] for w in loo.values())
    assert max(w["grouped"] for w in loo.values()) <= 0.10, loo
    assert all(0 < w["loop"] < 0.5 and 0 < w["shared"] < 0.5 for w in loo.values()), loo
