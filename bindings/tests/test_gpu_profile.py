"""The GPU profile tool (ifec.gpu_profile): its differentiable model is the C++ one (gpu_model.h) to the last bit,
its fit recovers a profile that reproduces every number of the built-in H100 table within 10% from a poor start,
leaving one EP size out predicts it (validation out of sample), the file it writes is what --gpu-profile reads.
The gpu case, measuring a real GPU, is test_gpu_profile_on_gpu.py."""

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
                                      ("grouped", [256]), ("grouped", [4096, 4096]), ("grouped", [300, 0, 0, 0]),
                                      ("loop", g.even_spread(4096 * 8, 8)), ("loop", [1, 0, 130]),
                                      ("chain", [256]), ("chain", [4096])])
def test_the_python_model_is_the_cpp_model(kind, per, tmp_path):
    assert float(g.model_us(torch, dict(g.DEFAULTS), kind, per, H100)) == pytest.approx(
        _native.gpu_model_us("", kind, per), rel=1e-12)
    # A profile whose chain constants differ from the grouped ones (the file as the tool writes it, 4 digits), on a
    # GPU with fewer SMs.
    own = dict(mma_fraction=0.71, overlap_p=5.25, mma_fraction_chain=0.55, overlap_p_chain=2.5, loop_call_us=40,
               sms=114, cta_gbs=19.5, cta_gbs_chain=41.25, mem_fraction=0.75, clock_boost=1.5)
    (tmp_path / "p.yaml").write_text(g.profile_yaml("test", H100, own, "written by a test"))
    assert float(g.model_us(torch, dict(g.DEFAULTS, **own), kind, per, H100)) == pytest.approx(
        _native.gpu_model_us(str(tmp_path / "p.yaml"), kind, per), rel=1e-12)


def test_the_fit_recovers_every_h100_row_within_ten_percent_from_a_poor_start():
    poor = dict(mma_fraction=0.5, clock_boost=1.05, mem_fraction=0.6, grouped_launch_us=40, overlap_p=2,
                mma_fraction_chain=0.5, chain_gemm_us=15, overlap_p_chain=5, loop_call_us=50)
    table = g.builtin_table()
    const = g.fit(table, H100, steps=300, start=poor)
    rows, worst = g.report(table, const, H100)
    assert len(rows) == 3 * 42 and worst < 0.10, [r for r in rows if abs(r[5] - 1) >= 0.10]
    # Physically sensible: about 0.6 of the tensor-core peak per SM under a full wave, its clock 1.1-1.5x higher
    # with few SMs busy (an H100 boosts to 1.98 GHz; a full wave is power-limited), 0.8-0.9 of HBM's peak.
    assert 0.55 < const["mma_fraction"] < 0.72 and 0.55 < const["mma_fraction_chain"] < 0.72
    assert 1.1 < const["clock_boost"] < 1.5 and 0.75 < const["mem_fraction"] <= 0.95


def test_the_written_profile_is_what_gpu_profile_reads(tmp_path):
    out = tmp_path / "h100-refit.yaml"
    assert g.main(["--fit-only", "h100", "--out", str(out), "--name", 'the "reference" H100', "--steps", "100"]) == 0
    assert _native.gpu_profile_summary(str(out)).startswith('the "reference" H100: ')
    text = out.read_text()
    assert text.startswith("# GPU profile of") and "model/measured worst deviation" in text
    assert str(out) in _native.gpu_profile_summary(str(out))
    for ep, tokens, kind, per, us in g.cases(g.builtin_table()):
        assert _native.gpu_model_us(str(out), kind, per) == pytest.approx(us, rel=0.10), (ep, tokens, kind)


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
    # Several runs, each starting at another EP: every cell the median of its runs, the rows in the grid's order.
    lines = []
    rows = g.measure(eps=(128, 64), tokens=(2, 5), iters=1, warmup=1, batches=1, progress=lines.append,
                     device="cpu", hidden=64, inter=32, dtype=torch.float32, runs=3)
    assert [r[:2] for r in rows] == [(128, 2), (128, 5), (64, 2), (64, 5)]
    assert len(lines) == 12
    assert [line.split(": ")[1] for line in lines[::4]] == ["run 1 of 3", "run 2 of 3", "run 3 of 3"]
    assert [line.split(": ")[2].split(",")[0] for line in lines[::4]] == ["EP 128", "EP 64", "EP 128"]
    assert all(r[2] > 0 and r[4] > 0 for r in rows)


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
    run = subprocess.run([sys.executable, "-m", "ifec.gpu_profile", "--fit-only", "h100", "--steps", "50",
                          "--table-out", str(tmp_path / "t.json"), "--out", str(tmp_path / "p.yaml")], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "worst deviation" in run.stdout and (tmp_path / "p.yaml").read_text().startswith("# GPU profile of")
    assert g.read_table(str(tmp_path / "t.json")) == g.builtin_table()
    run = subprocess.run([sys.executable, "-c", "import ifec; ifec.Cluster"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "ifec._native is not importable" in run.stderr and "./ifec build" in run.stderr


@pytest.mark.parametrize("content,says", [("[[8, 128, 1, 2]]", "row 0 is [8, 128, 1, 2]"),
                                          ('{"a": 1}', "holds dict"), ("[[8, 128, 1, 2, -3]]", "positive"),
                                          ("not json", "cannot read the table"), ("3", "holds int"),
                                          ("[[8.5, 128, 1, 2, 3]]", "whole numbers"),
                                          ("[[true, 128, 1, 2, 3]]", "whole numbers"),
                                          ("[[8, 128, Infinity, 2, 3]]", "finite"),
                                          ("[[8, 128, null, null, null]]", "or null where not measured"),
                                          ("[[512, 128, 1, 2, 3]]", "EP 512 does not divide the 256 experts")])
def test_a_bad_table_is_named(tmp_path, capsys, content, says):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert g.main(["--fit-only", str(bad)]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("argv,says", [
    (["--tflops", "nan"], "argument --tflops: 'nan': expected a positive, finite number"),  # a fit of NaN, no file
    (["--tflops", "0"], "argument --tflops: '0': expected"),  # the H100's peak, silently
    (["--hbm-gbs", "inf"], "argument --hbm-gbs: 'inf': expected"),  # a profile of hbm_gbs: inf
    (["--out", ""], "argument --out: '': expected a file name"),  # no file, silently
    (["--out", "."], "argument --out: '.': expected a file name"),  # a traceback after the fit (or the measuring)
    (["--table-out", "/no/such/folder/t.json"], "its folder '/no/such/folder' is not a writable folder")])
def test_a_bad_peak_or_output_is_named_before_anything_is_fitted(capsys, argv, says):
    with pytest.raises(SystemExit) as e:
        g.main(["--fit-only", "h100", "--steps", "10"] + argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("argv,says", [
    (["--fit-only", ""], "--fit-only '': expected a table file or h100"),  # it measured instead
    (["--fit-only", "h100", "--quick", "--runs", "3"], "--quick, --runs: options of measuring"),
    (["--fit-only", "ONE", "--leave-one-out"], "--leave-one-out: the table has one EP size (8)")])
def test_options_that_cannot_go_together_are_named(tmp_path, capsys, argv, says):
    one = tmp_path / "one.json"
    one.write_text("[[8, 128, 100, 50, 20], [8, 256, 200, 80, 30]]")
    assert g.main([str(one) if a == "ONE" else a for a in argv] + ["--steps", "10"]) == 2
    assert says in capsys.readouterr().err


def test_a_name_with_a_newline_stays_in_its_comment_and_name(tmp_path):
    """The comment line carried --name (or the table's path) as it was: a newline there began a YAML key."""
    text = g.profile_yaml("a\nsms: 7", g.PEAKS["H100"], {}, "GPU profile of a\nsms: 7, fitted")
    assert text.splitlines()[0] == "# GPU profile of a sms: 7, fitted"
    (tmp_path / "p.yaml").write_text(text)
    assert "132 SMs" in _native.gpu_profile_summary(str(tmp_path / "p.yaml"))


def test_the_shipped_measured_h100_profile_is_its_tables_fit(repo):
    """testbed/gpu-profiles/h100-sxm-measured.yaml is the fit of the table beside it (a second H100, measured
    eagerly): read by the C++ loader, it reproduces that table's grouped times within 5% and its chains' within 16%
    (host-bound at few tokens), and a refit of the table lands on the same grouped-kernel constants."""
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
    for k in g.FITTED[:6]:
        assert refit[k] == pytest.approx(shipped[k], rel=0.02), k


def test_leaving_one_ep_out_predicts_what_was_not_fitted():
    """Validation out of sample on the built-in table: fitted without one EP size's rows, the model predicts them.
    Measured at 400 steps: grouped 5.7-9.9% at every EP (8 to 256), loop 4.6-10.5%, shared 5.4-9.2% but 13.7% with
    EP 8 held out: the same shared-expert computation measured 176 us at 1024 tokens among EP 8's rows and 153-160 us
    among the other five EPs' (14% apart), which no model of the computation can predict."""
    loo = g.leave_one_ep_out(g.builtin_table(), H100, steps=150)
    assert sorted(loo) == [8, 16, 32, 64, 128, 256]
    assert all(sorted(w) == ["grouped", "loop", "shared"] for w in loo.values()), loo
    assert max(w["grouped"] for w in loo.values()) <= 0.10, loo
    assert max(loo[ep]["shared"] for ep in (16, 32, 64, 128, 256)) <= 0.10 and loo[8]["shared"] <= 0.15, loo
    assert max(w["loop"] for w in loo.values()) <= 0.12, loo
