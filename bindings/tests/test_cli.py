"""ifec-cli as a user meets it: the reproducers of issue 10 (wrong sums under loss, hangs, silent wrong values),
exit codes, errors that name the bad value, and --help for every command (kept in step with ./ifec help)."""

import json
import os
import re
import resource
import shutil
import signal
import subprocess

import pytest

TOPO_8x2 = "testbed/topologies/superpod-8x2.yaml"
TOPO_64x4 = "testbed/topologies/superpod-64x4.yaml"


def cli(build_dir, repo, *args, timeout=120):
    return subprocess.run([str(build_dir / "bin" / "ifec-cli"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=repo)


def rows(stdout):
    """The data rows of an nccl-tests table: size, count, type, redop, algo, time, algbw, busbw, wrong, ..."""
    return [line.split() for line in stdout.splitlines() if line.strip() and not line.lstrip().startswith("#")]


# ------------------------------------------------------------------------------------------- wrong results --

@pytest.mark.parametrize("topo,size,loss,seed", [
    (TOPO_8x2, "2MiB", "0.01", "2"),     # reported 2048 wrong elements
    (TOPO_8x2, "3000004", "0.03", "5"),  # not a power of two
    (TOPO_64x4, "4MiB", "0.02", "1"),    # reported 119,805 wrong
])
def test_in_fabric_allreduce_under_loss_is_right(build_dir, repo, topo, size, loss, seed):
    out = cli(build_dir, repo, "sim", "--topo", topo, "--collective", "allreduce", "--algo", "ifec", "--bytes", size,
              "--loss", loss, "--seed", seed)
    assert out.returncode == 0, out.stdout + out.stderr
    (row,) = rows(out.stdout)
    assert row[8] == "0", out.stdout  # #wrong
    assert "frames lost:" in out.stdout  # the faults it met are printed, not only counted


def test_a_sweep_on_two_workers_prints_the_serial_runs_rows(build_dir, repo):
    # Independent points of `bench collectives` run in parallel; the table must not depend on it.
    args = ("bench", "collectives", "--quick", "--max-sim", "64KiB", "--topo", TOPO_8x2)
    serial = cli(build_dir, repo, *args, "--jobs", "1")
    parallel = cli(build_dir, repo, *args, "--jobs", "2")
    assert serial.returncode == 0 and parallel.returncode == 0, parallel.stderr
    assert parallel.stdout == serial.stdout and len(rows(serial.stdout)) >= 5
    assert "runs done" in parallel.stderr  # progress, on stderr


def test_bench_moe_on_two_workers_prints_the_serial_runs_rows(build_dir, repo):
    if "bench moe" not in cli(build_dir, repo, "help").stdout:
        pytest.skip("built without LibTorch")
    args = ("bench", "moe", "--quick", "--ep", "8", "--topo", TOPO_8x2)
    serial = cli(build_dir, repo, *args, "--jobs", "1")
    parallel = cli(build_dir, repo, *args, "--jobs", "2")
    assert serial.returncode == 0 and parallel.returncode == 0, parallel.stderr
    assert parallel.stdout == serial.stdout and len(re.findall(r"^ (normal|ll) ", serial.stdout, re.M)) == 6
    assert "FP8" in serial.stdout and "6/6 runs done" in parallel.stderr
    bad = cli(build_dir, repo, *args, "--jobs", "0")
    assert bad.returncode != 0 and "--jobs 0 must be 1..256" in bad.stderr


def test_json_ok_is_false_exactly_when_something_is_wrong(build_dir, repo):
    out = cli(build_dir, repo, "sim", "--topo", TOPO_8x2, "--collective", "allreduce", "--algo", "ifec", "--bytes",
              "8MiB", "--loss", "0.05", "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["ok"] and r["wrong"] == 0 and r["faults"], r  # was "ok": true next to "wrong": 82943


# ------------------------------------------------------------------------------------------ fair baselines --

def test_best_names_the_algorithm_it_chose_and_the_in_fabric_speedup(build_dir, repo):
    out = cli(build_dir, repo, "sim", "--topo", TOPO_8x2, "--collective", "allreduce", "--algo", "best", "--bytes",
              "8,1MiB")
    assert out.returncode == 0, out.stdout + out.stderr
    table = rows(out.stdout)
    assert [r[4] for r in table if r[4] != "ifec"] == ["oneshot", "rd"]  # the cost model's choice per size
    times = {}
    for algo in ("ring", "tree", "rd", "oneshot"):
        run = cli(build_dir, repo, "sim", "--topo", TOPO_8x2, "--collective", "allreduce", "--algo", algo, "--bytes",
                  "8,1MiB")
        times[algo] = [float(r[5]) for r in rows(run.stdout)]
    # The choice is the fastest measured algorithm at both sizes (within 5%).
    for i, chosen in enumerate(["oneshot", "rd"]):
        assert times[chosen][i] <= 1.05 * min(t[i] for t in times.values()), times
    speedups = re.findall(r"best = (\w+) \(([\d.]+) us\), in-fabric ([\d.]+) us: ([\d.]+)x faster", out.stdout)
    assert [s[0] for s in speedups] == ["oneshot", "rd"], out.stdout
    for name, best_us, ifec_us, x in speedups:
        assert float(x) == pytest.approx(float(best_us) / float(ifec_us), rel=0.01)
        assert float(x) > 1


def test_a_lost_plane_costs_what_the_surviving_plane_needs(build_dir, repo):
    base = cli(build_dir, repo, "sim", "--topo", TOPO_8x2, "--collective", "allreduce", "--algo", "ifec", "--bytes",
               "1MiB")
    failed = cli(build_dir, repo, "sim", "--topo", TOPO_8x2, "--collective", "allreduce", "--algo", "ifec", "--bytes",
                 "1MiB", "--fail", "gpu5:plane1@2us")
    assert failed.returncode == 0, failed.stderr
    t0 = float(rows(base.stdout)[0][5])
    t1 = float(rows(failed.stdout)[0][5])
    assert rows(failed.stdout)[0][8] == "0"
    # One plane instead of two (2 x t0), plus FARE's convergence (10 us per hop): was 36,178 us.
    assert t1 < 2 * t0 + 12, (t0, t1)
    assert "plane 1 given up" in failed.stdout and "redone in the fabric on plane(s) 0" in failed.stdout


# ---------------------------------------------------------------------------------------------------- hangs --

def slow_topology(tmp_path, repo, old, new):
    text = (repo / TOPO_8x2).read_text().replace(old, new)
    assert text != (repo / TOPO_8x2).read_text()
    path = tmp_path / "t.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("extra", [
    ["--fail", "gpu5:plane1:sub0@1ms"],
    ["--fail", "gpu3:plane1@5us", "--restore", "gpu3:plane1@200us"],
    ["--fail", "gpu5:plane1@100000s"],  # ran empty time in 50 us slices: days of wall clock
])
def test_raw_traffic_with_far_events_ends(build_dir, repo, extra):
    out = cli(build_dir, repo, "sim", "--topo", TOPO_8x2, "--traffic", "alltoall", "--bytes", "64KiB", "--quiet",
              *extra, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "completion" in out.stdout


@pytest.mark.parametrize("old,new", [("delay_ns: 500}", "delay_ns: 60000}"),
                                     ("rate_gbps: 800", "rate_gbps: 1.2")])
def test_raw_traffic_on_slow_or_long_links_ends(build_dir, repo, tmp_path, old, new):
    out = cli(build_dir, repo, "sim", "--topo", slow_topology(tmp_path, repo, old, new), "--traffic", "alltoall",
              "--bytes", "64KiB", "--quiet", timeout=30)
    assert out.returncode == 0, out.stderr
    completion_us = float(re.search(r"completion\s+([0-9.]+) us", out.stdout).group(1))
    assert completion_us > 100  # 60 us per hop, or 0.6 Gb/s sub-links: time really passed


def test_incomplete_raw_traffic_exits_non_zero_and_says_why(build_dir, repo):
    out = cli(build_dir, repo, "sim", "--topo", TOPO_8x2, "--traffic", "alltoall", "--bytes", "4MiB", "--fail",
              "gpu3:plane1@5us", "--quiet")
    assert out.returncode == 3
    assert "INCOMPLETE" in out.stdout and "no retransmission" in out.stderr
    assert "cut off" not in out.stdout and "lost every fabric link" not in out.stderr  # gpu3 keeps plane 0


def test_a_gpu_cut_off_from_the_fabric_is_named(build_dir, repo):
    out = cli(build_dir, repo, "sim", "--topo", TOPO_8x2, "--traffic", "alltoall", "--bytes", "64KiB", "--fail",
              "gpu3:plane1@1us", "--fail", "gpu3:p0-sw@2us", "--quiet")
    assert out.returncode == 3
    assert "GPU 3 lost every fabric link at 2000 ns" in out.stderr
    assert "cut off           GPU 3 lost every fabric link at 2000 ns" in out.stdout
    out = cli(build_dir, repo, "sim", "--topo", TOPO_8x2, "--collective", "allreduce", "--algo", "ring", "--bytes",
              "64KiB", "--fail", "gpu3:plane1@1us", "--fail", "gpu3:plane0@1us", timeout=60)
    assert out.returncode != 0
    assert "FAILED" in out.stdout and "(GPU 3 lost every fabric link at 1000 ns)" in out.stdout


# ------------------------------------------------------------------------------- errors naming the value --

@pytest.mark.parametrize("args,message", [
    (["--bytes", "-1"], "--bytes '-1' is not a size"),
    (["--bytes", "17179869185G"], "'17179869185G' is too large"),
    (["--bytes", "1MiB", "--seed", "abc"], "--seed 'abc' is not a whole number"),
    (["--bytes", "1MiB", "--seed", "-1"], "--seed '-1' is not a whole number"),
    (["--bytes", "1MiB", "--members", "abc"], "--members 'abc' is not a whole number"),
    (["--bytes", "1MiB", "--members", "0"], "--members '0' outside 2.."),
    (["--bytes", "1MiB", "--members", "-2"], "--members '-2' is not a whole number"),
    (["--bytes", "1MiB", "--members", "9"], "members 9 outside 2..8"),
    (["--bytes", "1MiB", "--slot-pool", "-1"], "--slot-pool '-1' is not a whole number"),
    (["--bytes", "1MiB", "--loss", "1.5"], "--loss '1.5'"),
    (["--bytes", "1MiB", "--lb", "flow"], "--lb does not apply to --collective"),
    (["--bytes", "6B"], "not a whole number of fp32 elements"),
    (["--bytes", "64KiB", "--threads", "9", "--gpu-groups", "1"], "--threads 9 outside 1..3"),
    (["--bytes", "64KiB", "--gpu-groups", "2"], "--gpu-groups 2 needs a partitioned run"),
    (["--bytes", "64KiB", "--threads", "2", "--gpu-groups", "9"], "GPU groups 9 outside 1..8"),
])
def test_collective_arguments_are_checked(build_dir, repo, args, message):
    out = cli(build_dir, repo, "sim", "--topo", TOPO_8x2, "--collective", "allreduce", "--algo", "ifec", *args)
    assert out.returncode == 1, out.stdout
    assert message in out.stderr, out.stderr
    assert out.stdout == ""  # no table header above the error


@pytest.mark.parametrize("args,message", [
    (["sim", "--topo", TOPO_8x2, "--collective", "barrier", "--algo", "ifec", "--bytes", "1MiB"],
     "does not apply to a barrier"),
    (["sim", "--topo", "testbed", "--traffic", "alltoall", "--bytes", "1MiB"], "testbed: is a directory"),
    (["sim", "--topo", TOPO_8x2, "--traffic", "alltoall", "--bytes", "0"], "--bytes '0' must be > 0"),
    (["sim", "--topo", TOPO_8x2, "--bytes", "1MiB"], "give exactly one of --traffic"),
    (["sim", "--topo", TOPO_8x2, "--traffic", "alltoall", "--bytes", "1", "--frobnicate"],
     "unknown option '--frobnicate'"),
    (["bench", "collectives", "--max-sim", "abc"], "--max-sim 'abc' is not a size"),
    (["bench", "collectives", "--max-sim", "8B"], "--max-sim '8B' below 64 KiB"),
    (["sim", "--topo", TOPO_8x2, "--collective", "multicast", "--algo", "ifec", "--bytes", "1MiB", "--op", "max"],
     "--op does not apply to --collective multicast"),
    (["bench", "property", "--cases", "0"], "--cases '0' outside 1.."),
    (["bench", "sim", "--runs", "0"], "--runs '0' outside 1.."),
    (["pcap"], "expected 1 argument(s), got 0"),
    (["pcap", "a.pcap", "b.pcap"], "expected 1 argument(s), got 2: 'b.pcap' is one too many"),
    (["frames", "extra"], "expected 0 argument(s), got 1: 'extra' is one too many"),
    (["sim", "--topo", TOPO_8x2, "--traffic", "alltoall", "--bytes", "1.5GiB"], "'1.5GiB' is not a whole number"),
    (["sim", "--topo", TOPO_8x2, "--traffic", "alltoall", "--bytes", "18446744073709551615"],
     "--bytes 18446744073709551615 outside 1..1099511627776"),
    (["sim", "--topo", TOPO_8x2, "--traffic", "alltoall", "--bytes", "1", "--fail", "gpu5:plane1@1e19ns"],
     "time '1e19ns' outside 0..1000000 s"),
    (["sim", "--topo", TOPO_8x2, "--traffic", "alltoall", "--bytes", "1", "--fail", "gpu5:plane1@nanus"],
     "bad time 'nanus'"),
    (["sim", "--topo", TOPO_8x2, "--traffic", "alltoall", "--bytes", "1", "--incast-target", "3"],
     "--incast-target does not apply to --traffic alltoall"),
    (["bench", "moe", "--jobs", "4294967297"], "--jobs 4294967297 must be 1..256"),
    (["pcap", "-x"], "'-x' looks like an option, not a file name"),
    (["sim", "--topo", TOPO_8x2, "--collective", "allreduce", "--algo", "ring", "--bytes", "64KiB", "--reproducible"],
     "--reproducible applies to --algo ifec"),
    (["sim", "--topo", TOPO_8x2, "--collective", "barrier", "--algo", "ifec", "--dtype", "int32"],
     "--dtype does not apply to --collective barrier"),
    (["sim", "--topo", TOPO_8x2, "--traffic", "alltoall", "--bytes", "8KiB", "--fail", "gpu5:plane1@5us",
      "--restore", "gpu5:plane1@2us"], "restore 'gpu5:plane1@2us': its links are up at 2000 ns"),
])
def test_other_arguments_are_checked(build_dir, repo, args, message):
    out = cli(build_dir, repo, *args)
    assert out.returncode == 1, out.stdout
    assert message in out.stderr, out.stderr


@pytest.mark.parametrize("args,message", [
    (["bench", "moe", "--quick", "--ep", "8", "--threads", "1", "--gpu-groups", "100"], "GPU groups 100 outside 1..64"),
    (["bench", "moe", "--quick", "--ep", "8,8"], "--ep 8 given twice"),
    (["bench", "collectives", "--jobs", "0"], "--jobs 0 must be 1..256"),
    # ran points for minutes (the smaller ones on 64 GPUs) before the 256 MiB points' refusal showed
    (["bench", "collectives", "--max-sim", "256MiB", "--topo", TOPO_64x4],
     "size 268435456 B on 64 GPUs needs 16640 MiB of host memory for the simulated windows"),
])
def test_a_bench_checks_every_point_before_its_table(build_dir, repo, args, message):
    """Options only a run would have refused were found after every run (or under the table's header)."""
    out = cli(build_dir, repo, *args)
    assert out.returncode == 1 and message in out.stderr, out.stderr
    assert "#" not in out.stdout, out.stdout


@pytest.mark.parametrize("bench,message", [
    ("endpoint", "1 GPUs, the descriptor rate needs 8"),
    ("collectives", "1 GPU, an AllReduce needs 2 or more"),
])
def test_a_bench_refuses_a_fabric_too_small_before_its_table(build_dir, repo, tmp_path, bench, message):
    """bench endpoint printed its CPU rows, and bench collectives ran every point, before the fabric was refused."""
    topo = tmp_path / "one.yaml"
    topo.write_text("name: one-gpu\nplanes: 1\ngpus: 1\nswitches:\n  - {name: p0-sw, plane: 0}\n"
                    "links:\n  - {a: gpu0, b: p0-sw}\n")
    out = cli(build_dir, repo, "bench", bench, "--quick", "--topo", str(topo))
    assert out.returncode == 1 and f"--topo {topo}: {message}" in out.stderr, out.stderr
    assert out.stdout == "" and "runs done" not in out.stderr


@pytest.mark.parametrize("flag,value", [("--cases", "5"), ("--seed", "2"), ("--seconds", "9")])
def test_bench_property_refuses_sweep_options_beside_one_case(build_dir, repo, flag, value):
    out = cli(build_dir, repo, "bench", "property", "--case", "3", flag, value)
    assert out.returncode == 1 and f"{flag} '{value}' does not apply with --case" in out.stderr, out.stderr
    assert out.stdout == ""


def _file_size_limit(limit):
    def set_limit():  # in the child: a write past `limit` bytes fails with EFBIG instead of killing it (SIGXFSZ)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return set_limit


def test_pcap_cut_short_by_a_full_disk_fails_naming_the_file(build_dir, repo, tmp_path):
    """The last records stayed in the buffer and were lost at close, silently: 'wrote 15 frames' over 4096 bytes."""
    path = tmp_path / "cut.pcap"
    out = subprocess.run([str(build_dir / "bin" / "ifec-cli"), "pcap", str(path)], capture_output=True, text=True,
                         timeout=60, preexec_fn=_file_size_limit(4096))
    assert out.returncode == 1, out.stdout
    assert re.search(rf"short write to pcap file '{re.escape(str(path))}' at frame \d+: File too large", out.stderr), \
        out.stderr
    assert "wrote" not in out.stdout
    whole = tmp_path / "whole.pcap"
    assert cli(build_dir, repo, "pcap", str(whole)).returncode == 0 and whole.stat().st_size > 4096


def test_pcap_to_a_full_device_names_it(build_dir, repo):
    if not os.access("/dev/full", os.W_OK):
        pytest.skip("no writable /dev/full here")
    out = cli(build_dir, repo, "pcap", "/dev/full")
    assert out.returncode == 1 and "cannot write pcap file '/dev/full': No space left on device" in out.stderr


def test_an_algorithm_that_does_not_run_the_collective_names_the_ring_that_ran(build_dir, repo):
    out = cli(build_dir, repo, "sim", "--topo", TOPO_8x2, "--collective", "reduce", "--algo", "rd", "--bytes", "4KiB")
    assert out.returncode == 0, out.stdout + out.stderr  # its scratch was sized for rd, not for the ring
    (row,) = rows(out.stdout)
    assert row[4] == "ring"
    assert "rd does not run reduce: ring ran instead" in out.stdout


def test_huge_delays_and_timers_in_a_topology_name_file_and_line(build_dir, repo, tmp_path):
    text = (repo / TOPO_8x2).read_text()
    for old, new, message in [("delay_ns: 500}", "delay_ns: 18446744073709551615}", "exceeds 1000000000"),
                              ("control_plane_delay_ns: 10000", "control_plane_delay_ns: 99999999999999",
                               "exceeds 60000000000")]:
        assert old in text
        path = tmp_path / "t.yaml"
        path.write_text(text.replace(old, new, 1))
        out = cli(build_dir, repo, "sim", "--topo", str(path), "--traffic", "alltoall", "--bytes", "4KiB")
        assert out.returncode == 1 and message in out.stderr and "t.yaml:" in out.stderr, out.stderr


def test_a_rate_beyond_the_link_model_names_file_and_line(build_dir, repo, tmp_path):
    topo = slow_topology(tmp_path, repo, "rate_gbps: 800", "rate_gbps: 1e300")
    out = cli(build_dir, repo, "sim", "--topo", topo, "--traffic", "alltoall", "--bytes", "1KiB")
    assert out.returncode == 1 and re.search(r"t\.yaml:\d+: rate_gbps 1e300 outside", out.stderr), out.stderr


def test_bench_moe_creates_its_output_directory_first(build_dir, repo, tmp_path):
    if "bench moe" not in cli(build_dir, repo, "help").stdout:
        pytest.skip("built without LibTorch")
    out_dir = tmp_path / "not" / "yet"
    out = cli(build_dir, repo, "bench", "moe", "--ep", "8", "--mode", "ll", "--token-cap", "4", "--out", str(out_dir),
              "--topo", TOPO_8x2)
    assert out.returncode == 0, out.stderr
    assert (out_dir / "moe_bench.csv").exists() and (out_dir / "moe_bench.json").exists()
    assert all(r["ok"] for r in json.loads((out_dir / "moe_bench.json").read_text()))
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = cli(build_dir, repo, "bench", "moe", "--ep", "8", "--out", str(blocker / "x"), timeout=10)
    assert out.returncode == 1 and "is not a directory" in out.stderr  # refused before any point runs


def test_bench_moe_refuses_a_bad_ep_before_any_point_runs(build_dir, repo):
    if "bench moe" not in cli(build_dir, repo, "help").stdout:
        pytest.skip("built without LibTorch")
    out = cli(build_dir, repo, "bench", "moe", "--ep", "8,6", "--mode", "ll", "--topo", TOPO_8x2, timeout=10)
    assert out.returncode == 1 and "EP size 6 does not divide 256 experts" in out.stderr, out.stderr
    assert "runs done" not in out.stderr  # EP 8's runs did not go first


def test_only_the_moe_build_loads_libtorch_and_a_missing_one_is_named(build_dir, repo, tmp_path):
    """ifec-cli starts without LibTorch and hands `bench moe` to ifec-cli-moe beside it."""
    if "bench moe" not in cli(build_dir, repo, "help").stdout:
        pytest.skip("built without LibTorch")
    libs = {name: subprocess.run(["ldd", str(build_dir / "bin" / name)], capture_output=True, text=True).stdout
            for name in ("ifec-cli", "ifec-cli-moe")}
    assert "libtorch" not in libs["ifec-cli"] and "libtorch" in libs["ifec-cli-moe"]
    alone = tmp_path / "ifec-cli"
    alone.write_bytes((build_dir / "bin" / "ifec-cli").read_bytes())
    alone.chmod(0o755)
    out = subprocess.run([str(alone), "bench", "moe", "--ep", "8"], capture_output=True, text=True, timeout=10,
                         cwd=repo)
    assert out.returncode == 1 and f"cannot run {tmp_path}/ifec-cli-moe" in out.stderr, out.stderr


# ------------------------------------------------------------------------------------------------ help --

def commands(build_dir, repo):
    listing = cli(build_dir, repo, "help").stdout
    return [m.group(1) for m in re.finditer(r"^  ([\w-]+(?: [\w-]+)?)\s", listing, re.M)]


def test_every_command_answers_help_with_its_options(build_dir, repo):
    names = commands(build_dir, repo)
    assert {"pcap", "frames", "sim", "netns-plan", "bench endpoint", "bench collectives", "bench property"} <= set(names)
    for name in names:
        out = cli(build_dir, repo, *name.split(), "--help")
        assert out.returncode == 0 and out.stdout.startswith(f"usage: ifec {name}"), (name, out.stderr)


def test_launcher_help_lists_every_option(build_dir, repo):
    launcher = subprocess.run([str(repo / "ifec"), "help"], capture_output=True, text=True, timeout=30).stdout
    for name in commands(build_dir, repo):
        assert re.search(rf"^  {name}\b", launcher, re.M), f"./ifec help omits the command {name}"
        text = cli(build_dir, repo, *name.split(), "--help").stdout
        for option in re.findall(r"^  (--[\w-]+)", text, re.M):
            if option != "--help":
                assert option in launcher, f"./ifec help omits {name} {option}"


def test_every_launcher_command_answers_help_without_running(repo):
    """`./ifec CMD --help` prints CMD's part of ./ifec help for the commands that run scripts of their own (it once
    ran them: test the whole suite, fuzz failed on SECONDS, gpu-bundle took --help for a folder)."""
    launcher = subprocess.run([str(repo / "ifec"), "help"], capture_output=True, text=True, timeout=30).stdout
    for cmd in ["setup", "build", "test", "demo", "fuzz", "gpu-bundle", "format", "bench", "interop"]:
        out = subprocess.run([str(repo / "ifec"), cmd, "--help"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, (cmd, out.stderr)
        starts = re.findall(r"^  ([\w-]+)", out.stdout, re.M)
        assert starts and set(starts) == {cmd}, (cmd, out.stdout)  # its sections and no other command's
        assert all(line in launcher for line in out.stdout.splitlines()), cmd
    assert len(re.findall(r"^  bench ", subprocess.run([str(repo / "ifec"), "bench", "-h"], capture_output=True,
                                                       text=True, timeout=30).stdout, re.M)) >= 7


def test_interop_names_an_unknown_suite_before_setting_anything_up(repo):
    for args in (["interop", "bogus"], ["interop"]):
        out = subprocess.run([str(repo / "ifec"), *args], capture_output=True, text=True, timeout=30)
        assert out.returncode == 2, out.stderr
        assert "is not one of: frr, rxe" in out.stderr and "setup" not in out.stdout


# ------------------------------------------------------------------------------------------------- reports --

def test_bench_moe_files_follow_the_one_report_rule(build_dir, repo, tmp_path):
    """The CLI's CSV is what the Python package's reports.write_csv writes from the CLI's own JSON rows, byte for
    byte: one report format for the benches and the package (scalar fields, true/false, 10 significant digits)."""
    from ifec import reports
    r = cli(build_dir, repo, "bench", "moe", "--quick", "--ep", "8", "--mode", "ll", "--out", str(tmp_path / "cli"))
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "cli" / "moe_bench.json").read_text())
    assert [row["variant"] for row in rows] == ["per_expert", "per_rank", "ifec"]
    assert all(isinstance(row["dispatch_wire_per_plane"], list) for row in rows)  # JSON-only fields exist
    ours = reports.write_csv(tmp_path / "py" / "moe_bench.csv", rows)
    cli_csv = (tmp_path / "cli" / "moe_bench.csv").read_text()
    assert ours.read_text() == cli_csv
    assert "dispatch_wire_per_plane" not in cli_csv.splitlines()[0] and ",true," in cli_csv


def test_bench_endpoint_has_a_gpu_row_or_says_why_not(build_dir, repo):
    out = cli(build_dir, repo, "bench", "endpoint", "--quick")
    assert out.returncode == 0, out.stderr
    gpu = [l for l in out.stdout.splitlines() if l.startswith("gpu-kernel")]
    assert gpu, out.stdout
    cuda_build = re.search(r"^CMAKE_CUDA_COMPILER:\w+=/", (build_dir / "CMakeCache.txt").read_text(), re.M)
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout if shutil.which(
        "nvidia-smi") else ""
    if cuda_build and "GPU 0" in listed:  # a GPU here and kernels built: the rows must be measured
        assert all(l.split()[1] != "not" for l in gpu), gpu
    for line in gpu:  # a measured row (threads, descriptors, seconds, rate, the device) or the reason
        f = line.split()
        assert (f[1] == "not" and f[2] == "run:" and len(f) > 3) or (int(f[2]) > 0 and float(f[4]) > 0), line
