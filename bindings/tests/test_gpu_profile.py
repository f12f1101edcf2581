"""The GPU profile tool (ifec.gpu_profile): its differentiable model is the C++ one (gpu_model.h) to the last bit,
its fit recovers a profile that reproduces every measured H100 row within 10% from a poor start, the file it
writes is what --gpu-profile reads, and on a machine with a CUDA GPU it measures that GPU (the gpu case; it skips,
saying why, elsewhere)."""

import pytest

from ifec import _native, gpu_profile as g, moe

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.skipif(not moe.available(), reason="built without LibTorch"),
              pytest.mark.timeout(300, method="signal")]

H100 = g.PEAKS["H100"]


@pytest.mark.parametrize("kind,per", [("grouped", g.even_spread(1024, 32)), ("grouped", [0, 5, 700, 3]),
                                      ("loop", g.even_spread(4096 * 8, 8)), ("loop", [1, 0, 130]),
                                      ("chain", [256]), ("chain", [4096])])
def test_the_python_model_is_the_cpp_model(kind, per):
    assert float(g.model_us(torch, dict(g.DEFAULTS), kind, per, H100)) == pytest.approx(
        _native.gpu_model_us("", kind, per), rel=1e-12)


def test_the_fit_recovers_every_h100_row_within_ten_percent_from_a_poor_start():
    poor = dict(mma_fraction=0.5, mem_fraction_grouped=0.6, mem_fraction_chain=0.6, grouped_launch_us=10,
                loop_call_us=50, overlap_p=2)
    const = g.fit(g.H100_TABLE, H100, steps=300, start=poor)
    rows, worst = g.report(g.H100_TABLE, const, H100)
    assert len(rows) == 36 and worst < 0.10, [r for r in rows if abs(r[5] - 1) >= 0.10]
    # Physically sensible: about two thirds of the tensor-core peak, small-M GEMMs stream slower than grouped ones.
    assert 0.6 < const["mma_fraction"] < 0.72
    assert const["mem_fraction_chain"] < const["mem_fraction_grouped"] <= 1


def test_the_written_profile_is_what_gpu_profile_reads(tmp_path):
    out = tmp_path / "h100-refit.yaml"
    assert g.main(["--fit-only", "h100", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# GPU profile of") and "worst model/measured deviation" in text
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


@pytest.mark.gpu
def test_on_a_cuda_gpu_it_measures_and_writes_that_gpus_profile(tmp_path, capsys):
    """The gpu case: the same kernels timed on this machine's GPU, fitted, written and readable."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here (torch.cuda.is_available() is False)")
    out = tmp_path / "this-gpu.yaml"
    assert g.main(["--quick", "--out", str(out)]) == 0
    assert torch.cuda.get_device_name(0) in out.read_text()
    assert "TFLOP/s" in _native.gpu_profile_summary(str(out))
