"""The simulated fabric from Python and from the CLI: report fields, analytic checks, FARE shares, bad input."""

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

import ifec


def test_run_report_has_the_documented_fields():
    rep = ifec.sim.run(ifec.make_superpod(4, 2), traffic="alltoall", bytes=64 * 1024)
    for key in ["completion_ns", "goodput_gbps", "line_rate_gbps", "plane_bytes", "drops", "ecn_marks", "pfc_pauses"]:
        assert key in rep, key
    assert rep["driver"] == "sim"
    assert rep["complete"] and rep["drops"] == 0
    assert len(rep["plane_bytes"]) == 2
    # 4 GPUs x 3.2 Tb/s... here 2 planes x 800G: 1.6 Tb/s each.
    assert rep["line_rate_gbps"] == pytest.approx(4 * 1600)
    assert rep["goodput_gbps"] <= rep["line_rate_gbps"] * rep["payload_efficiency"] + 1e-6
    # Planes are symmetric with all links up: equal bytes.
    assert rep["plane_bytes"][0] == rep["plane_bytes"][1]
    assert rep["payload_bytes_delivered"] == 4 * 3 * 64 * 1024
    ports = rep["switch_ports"]
    assert sum(q["tx_frames"] for p in ports for q in p["queues"]) == rep["packets_sent"], \
        "every frame crossed exactly one switch queue in a one-tier SuperPoD"


def test_fare_weights_follow_path_bandwidth():
    topo = ifec.make_superpod(4, 2)
    healthy = ifec.fare_plane_gbps(topo)
    assert healthy[0][1] == [800, 800]
    rep = ifec.sim.run(topo, traffic="alltoall", bytes=256 * 1024, fail=["gpu1:plane1:sub0@0"])
    # GPU 1 lost one of its two plane-1 sub-links at t=0: plane 1 carries 400 of 1200 Gb/s for its traffic, so
    # the fabric as a whole carries less on plane 1 than on plane 0.
    assert rep["plane_bytes"][1] < rep["plane_bytes"][0]
    assert rep["fare_rounds"] >= 2


def test_incast_with_and_without_pfc():
    topo = ifec.make_superpod(16, 2)
    # 4 MiB per sender is 1 MiB per sender sub-link: above the 256 KiB XOFF threshold.
    lossless = ifec.sim.run(topo, traffic="incast", bytes=4 << 20, pfc=True)
    assert lossless["drops"] == 0 and lossless["pfc_pauses"] > 0 and lossless["complete"]
    lossy = ifec.sim.run(topo, traffic="incast", bytes=4 << 20, pfc=False)
    assert lossy["drops"] > 0 and lossy["pfc_pauses"] == 0


def test_bad_arguments_name_the_bad_value():
    topo = ifec.make_superpod(4, 2)
    with pytest.raises(ValueError, match="broadcast"):
        ifec.sim.run(topo, traffic="broadcast")
    with pytest.raises(ValueError, match="gpu9"):
        ifec.sim.run(topo, fail=["gpu9:plane0@1us"])
    with pytest.raises(ValueError, match="lightyears"):
        ifec.sim.run(topo, fail=["gpu1:plane0@3lightyears"])


def test_cli_json_and_errors(repo, build_dir, tmp_path):
    topo = repo / "testbed" / "topologies" / "superpod-8x2.yaml"
    out = subprocess.run([str(build_dir / "bin" / "ifec-cli"), "sim", "--topo", str(topo), "--traffic", "permutation",
                          "--bytes", "128KiB", "--json", "--quiet"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["traffic"] == "permutation" and rep["flows"] == 8 and rep["complete"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nplanes: 1\ngpus: 2\nswitches:\n  - {name: s0, plane: 0}\nlinks:\n"
                   "  - {a: gpu0, b: s0}\n  - {a: gpu7, b: s0}\n")
    out = subprocess.run([str(build_dir / "bin" / "ifec-cli"), "sim", "--topo", str(bad), "--traffic", "alltoall",
                          "--bytes", "1KiB"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "bad.yaml:8" in out.stderr and "gpu7" in out.stderr, out.stderr
    out = subprocess.run([str(build_dir / "bin" / "ifec-cli"), "sim", "--topo", str(topo), "--traffic", "alltoall",
                          "--bytes", "12parsecs"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "parsecs" in out.stderr


def test_far_link_events_do_not_hang():
    topo = ifec.make_superpod(8, 2)
    rep = ifec.sim.run(topo, bytes=64 * 1024, fail=["gpu5:plane1:sub0@1ms"])
    assert rep["complete"]
    rep = ifec.sim.run(topo, bytes=64 * 1024, fail=["gpu3:plane1@5us"], restore=["gpu3:plane1@200us"])
    assert rep["fare_rounds"] >= 2


def test_ctrl_c_stops_a_long_run(repo, build_dir):
    """SIGINT during a long simulation raises KeyboardInterrupt within seconds; the interpreter stays usable."""
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"sys.path.insert(0, {str(build_dir / 'python')!r})\n"
        "import ifec\n"
        "print('started', flush=True)\n"
        "try:\n"
        "    ifec.sim.run(ifec.make_superpod(64, 4), bytes=64 << 20)\n"
        "    print('finished')\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', ifec.sim.run(ifec.make_superpod(4, 2), bytes=4096)['complete'])\n")
    p = subprocess.Popen(["/usr/bin/python3", "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "started"
        time.sleep(1.5)
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=20)
    finally:
        p.kill()
    assert out.strip() == "interrupted True"


def test_elided_payloads_give_the_real_run_and_say_so():
    topo = ifec.make_superpod(8, 2)
    real = ifec.sim.run(topo, traffic="alltoall", bytes=64 * 1024, fail=["gpu3:plane1:sub0@2us"])
    elided = ifec.sim.run(topo, traffic="alltoall", bytes=64 * 1024, fail=["gpu3:plane1:sub0@2us"], payload="elided")
    assert real["payload"] == "real" and elided["payload"] == "elided"
    for key in ["completion_ns", "frame_bytes_sent", "wire_bytes_sent", "packets_delivered", "plane_bytes",
                "link_utilization", "sim_events", "frame_hops", "event_gpus"]:
        assert elided[key] == real[key], key
    with pytest.raises(ValueError, match="'fake'"):
        ifec.sim.run(topo, payload="fake")


def test_expert_parallel_groups(repo, build_dir):
    topo = ifec.make_superpod(8, 2)
    grouped = ifec.sim.run(topo, traffic="alltoall", bytes=64 * 1024, group=4)
    assert grouped["complete"] and grouped["group"] == 4
    assert grouped["flows"] == 8 * 3
    assert grouped["payload_bytes_delivered"] == 8 * 3 * 64 * 1024
    assert "group" not in ifec.sim.run(topo, traffic="alltoall", bytes=4096)
    with pytest.raises(ValueError, match="--group 3"):
        ifec.sim.run(topo, traffic="alltoall", group=3)
    out = subprocess.run([str(build_dir / "bin" / "ifec-cli"), "sim", "--topo",
                          str(repo / "testbed/topologies/superpod-8x2.yaml"), "--traffic", "permutation",
                          "--bytes", "64KiB", "--group", "4", "--quiet"], capture_output=True, text=True, check=True)
    assert "permutation within groups of 4 GPUs" in out.stdout


def test_threads_give_the_same_run():
    topo = ifec.make_superpod(8, 4)
    runs = [ifec.sim.run(topo, traffic="alltoall", bytes=20000, threads=t, fail=["gpu2:plane1:sub0@3us"])
            for t in (1, 2, 4)]
    for r in runs:
        assert r.pop("wall_seconds") >= 0
        assert "one per plane" in r.pop("partitions")
        r.pop("threads")
        r.pop("setup_seconds")
        r.pop("sim_seconds")
        r.pop("sim_page_faults")
    assert runs[0] == runs[1] == runs[2]
    with pytest.raises(ValueError, match=r"--threads 5 outside 1..4 \(one partition per plane, 4 planes; "
                                         r"--leaf-groups K splits each plane into K\)"):
        ifec.sim.run(topo, threads=5)


def _without_wall_clock(r):
    for key in ("wall_seconds", "threads", "setup_seconds", "sim_seconds", "sim_page_faults"):
        r.pop(key)
    return r.pop("partitions"), r


@pytest.mark.parametrize("topo,traffic,most", [
    (ifec.make_fat_tree(64, 1, 8, 4), "alltoall", (2, 8)),  # one plane: one partition per plane is one partition
    (ifec.make_deepseek_fabric(8, 4, 2, 2), "alltoall", (3, 2)),  # in-node links between planes' leaf groups
])
def test_leaf_groups_give_the_same_run_whatever_the_groups_and_threads(topo, traffic, most):
    runs = [_without_wall_clock(ifec.sim.run(topo, traffic=traffic, bytes=12000, threads=t, leaf_groups=k))
            for t, k in ((1, 1), (2, 2), (1, 2), most)]
    assert runs[1][0].startswith("%d partitions (one per plane and leaf group) on 2 threads: p0 leaves 0"
                                 % (2 * topo.num_planes)), runs[1][0]
    assert runs[0][1]["complete"]
    assert all(r[1] == runs[0][1] for r in runs)
    by_plane = ifec.sim.run(topo, traffic=traffic, bytes=12000)
    assert by_plane["payload_bytes_delivered"] == runs[0][1]["payload_bytes_delivered"]


def test_bad_leaf_groups_are_named():
    topo = ifec.make_fat_tree(64, 1, 8, 4)
    with pytest.raises(ValueError, match="--leaf-groups 9: plane 0 of topology .* has 8 leaf switches"):
        ifec.sim.run(topo, leaf_groups=9)
    with pytest.raises(ValueError, match="--leaf-groups 2: needs a partitioned run"):
        ifec.sim.run(topo, leaf_groups=2, threads=0)
    with pytest.raises(ValueError, match="leaf_groups=-1 outside 0..4096"):
        ifec.sim.run(topo, leaf_groups=-1)


def test_deepseek_fabric_forwards_inside_servers_and_gives_the_same_run_on_any_threads():
    topo = ifec.make_deepseek_fabric(8, 4, 2, 2)  # 32 GPUs, GPU i of each server on plane i
    assert [n["plane"] for n in topo.nodes[:8]] == [0, 1, 2, 3, 0, 1, 2, 3]
    runs = [ifec.sim.run(topo, traffic="alltoall", bytes=8192, threads=t) for t in (1, 2)]
    for r in runs:
        for key in ("wall_seconds", "threads", "setup_seconds", "sim_seconds", "sim_page_faults", "partitions"):
            r.pop(key)
    assert runs[0] == runs[1]
    r = runs[0]
    assert r["complete"] and r["incomplete_flows"] == 0
    # 2 packets per flow; a flow between server peers rides NVLink, one to another plane's GPU off-server is
    # forwarded there once: 8 servers x 12 peer flows, 32 x 21 forwarded flows.
    assert r["relayed_frames"] == 32 * 21 * 2
    frame = r["frame_bytes_sent"] // r["packets_sent"]
    assert r["nvlink_bytes"] == (8 * 12 + 32 * 21) * 2 * frame
    with pytest.raises(ValueError, match="needs every GPU on every plane"):
        ifec.Cluster(topo)


def _sim_json(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 3), out.stderr  # 3: incomplete (raw flows lose what failed links held)
    rep = json.loads(out.stdout)
    for key in ("wall_seconds", "setup_seconds", "sim_seconds", "sim_page_faults"):
        rep.pop(key)
    return rep.pop("partitions"), rep.pop("threads"), rep


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed (./ifec setup)")
def test_mpirun_two_processes_give_the_one_process_run(repo, build_dir, tmp_path):
    topo = tmp_path / "ft32.yaml"
    topo.write_text("name: ft32\ngenerator: {kind: fat_tree, gpus: 32, planes: 4, leaves: 4, spines: 4}\n")
    args = ["sim", "--topo", str(topo), "--traffic", "permutation", "--bytes", "300000", "--quiet", "--json",
            "--fail", "p1-leaf0:p1-spine2@2us", "--restore", "p1-leaf0:p1-spine2@9us", "--fail", "gpu5:plane3@3us"]
    cli = str(build_dir / "bin" / "ifec-cli")
    _, _, one = _sim_json([cli] + args + ["--threads", "1"])
    mpirun = ["mpirun", "--oversubscribe", "-np", "2"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    parts, threads, two = _sim_json(mpirun + [cli] + args)
    assert parts == "4 partitions (one per plane) on 2 processes x 1 thread: rank 0 planes 0 2 | rank 1 planes 1 3"
    assert threads == 1
    assert one["fare_rounds"] > 0 and one["frame_hops"] > 0
    assert two == one


def _collective_json(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    for r in rows:
        for key in ("wall_seconds", "sim_seconds", "partitions"):
            r.pop(key, None)
    return rows


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed (./ifec setup)")
def test_mpirun_two_processes_give_the_threads_collective_run(repo, build_dir):
    """Rank 0 runs the GPUs (in three groups), rank 1 the planes: frames, switch calls and their answers cross the
    processes, and the rows (times, bytes per link, frame-hops, events, faults) are the one-process partitioned
    run's (one GPU group)."""
    cli = str(build_dir / "bin" / "ifec-cli")
    mpirun = ["mpirun", "--oversubscribe", "-np", "2"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    for topo, algo, size, fail in [("superpod-8x2.yaml", "ring", "1MiB", "gpu5:plane1:sub0@3us"),
                                   ("superpod-8x2.yaml", "ifec", "1MiB", "gpu5:plane1@2us"),
                                   ("superpod-64x4.yaml", "ifec", "256KiB", "gpu3:plane1@5us")]:
        args = ["sim", "--topo", str(repo / "testbed" / "topologies" / topo), "--collective", "allreduce", "--algo",
                algo, "--bytes", size, "--loss", "0.01", "--fail", fail, "--json", "--threads", "1"]
        one = _collective_json([cli] + args)
        two = _collective_json(mpirun + [cli] + args + ["--gpu-groups", "3"])
        assert len(one) == 1 and one[0]["ok"] and one[0]["wrong"] == 0, one
        assert any("frames lost" in f for f in one[0]["faults"])
        assert two == one, (topo, algo)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed (./ifec setup)")
def test_mpirun_gives_the_threads_collective_and_moe_rows_in_leaf_groups(repo, build_dir):
    """The switches in leaf groups too: rank 0 runs the GPUs, ranks 1 and 2 the 32 leaf groups of a two-tier fat
    tree; the AllReduce (1% loss, a leaf-spine link failing) and the MoE rows are the one-thread run's."""
    cli = str(build_dir / "bin" / "ifec-cli")
    topo = str(repo / "testbed" / "topologies" / "fat-tree-64x4.yaml")
    mpirun = ["mpirun", "--oversubscribe", "-np", "3"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    args = ["sim", "--topo", topo, "--collective", "allreduce", "--algo", "ifec", "--bytes", "256KiB", "--loss",
            "0.01", "--fail", "p2-leaf3:p2-spine1@2us", "--json", "--threads", "1"]
    one = _collective_json([cli] + args + ["--leaf-groups", "1"])
    spread = _collective_json(mpirun + [cli] + args + ["--leaf-groups", "8", "--gpu-groups", "2"])
    assert len(one) == 1 and one[0]["ok"] and one[0]["wrong"] == 0, one
    assert any("frames lost" in f for f in one[0]["faults"])
    assert spread == one
    by_plane = _collective_json([cli] + args)
    assert by_plane[0]["ok"] and by_plane[0]["plane_tx_bytes"] != one[0]["plane_tx_bytes"]  # another run: loss
    if not (build_dir / "bin" / "ifec-cli-moe").exists():
        return  # built without LibTorch: no bench moe

    def rows(cmd):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return [line for line in out.stdout.splitlines() if line.startswith(" normal")]

    args = ["bench", "moe", "--ep", "16", "--mode", "normal", "--token-cap", "8", "--jobs", "1", "--threads", "1",
            "--topo", topo]
    one = rows([cli] + args + ["--leaf-groups", "1"])
    assert len(one) == 3
    assert rows(mpirun + [cli] + args + ["--leaf-groups", "4"]) == one
    bad = subprocess.run(mpirun + [cli] + args + ["--leaf-groups", "9"], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "--leaf-groups 9: plane 0 of topology 'fat-tree-64x4' has 8 leaf" in bad.stderr


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed (./ifec setup)")
def test_mpirun_two_processes_give_the_threads_moe_rows(repo, build_dir):
    """bench moe under mpirun: every variant's fabric (and the two micro-batches') spread over two processes, the
    GPUs in two groups, gives the rows of the one-process partitioned run (one group)."""
    cli = str(build_dir / "bin" / "ifec-cli")
    if not (build_dir / "bin" / "ifec-cli-moe").exists():
        pytest.skip("built without LibTorch: no bench moe")
    mpirun = ["mpirun", "--oversubscribe", "-np", "2"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])

    def rows(cmd):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return [line for line in out.stdout.splitlines() if line.startswith(" normal")]

    for topo in ("superpod-8x2.yaml", "superpod-64x4.yaml"):
        args = ["bench", "moe", "--ep", "8", "--mode", "normal", "--token-cap", "8", "--jobs", "1", "--threads", "1",
                "--overlap", "--topo", str(repo / "testbed" / "topologies" / topo)]
        one = rows([cli] + args)
        assert len(one) == 3
        assert rows(mpirun + [cli] + args + ["--gpu-groups", "2"]) == one, topo


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed (./ifec setup)")
def test_mpirun_two_processes_give_the_one_process_deepseek_run(build_dir, tmp_path):
    """DeepSeek-V3's fabric over two processes: frames on in-node links between GPUs of planes that run in
    different processes cross in the windows' exchanges; the run is the one-process run."""
    topo = tmp_path / "ds32.yaml"
    topo.write_text("name: ds32\ngenerator: {kind: deepseek, nodes: 8, gpus_per_node: 4, leaves: 2, spines: 2}\n")
    cli = str(build_dir / "bin" / "ifec-cli")
    args = ["sim", "--topo", str(topo), "--traffic", "alltoall", "--bytes", "8192", "--quiet", "--json"]
    _, _, one = _sim_json([cli] + args + ["--threads", "1"])
    mpirun = ["mpirun", "--oversubscribe", "-np", "2"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    parts, _, two = _sim_json(mpirun + [cli] + args)
    assert parts == "4 partitions (one per plane) on 2 processes x 1 thread: rank 0 planes 0 2 | rank 1 planes 1 3"
    assert one["complete"] and one["relayed_frames"] > 0 and one["nvlink_bytes"] > 0
    assert two == one


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed (./ifec setup)")
def test_mpirun_two_processes_give_the_leaf_groups_run(build_dir, tmp_path):
    """A one-plane fat tree over two processes, by leaf group: frames between a leaf and a spine of the other
    process cross in the windows' exchanges, through a link failure; the run is the one-thread run's."""
    topo = tmp_path / "ft64x1.yaml"
    topo.write_text("name: ft64x1\ngenerator: {kind: fat_tree, gpus: 64, planes: 1, leaves: 8, spines: 4}\n")
    cli = str(build_dir / "bin" / "ifec-cli")
    args = ["sim", "--topo", str(topo), "--traffic", "permutation", "--bytes", "300000", "--quiet", "--json",
            "--fail", "p0-leaf1:p0-spine2@2us", "--restore", "p0-leaf1:p0-spine2@9us"]
    _, _, one = _sim_json([cli] + args + ["--threads", "1", "--leaf-groups", "1"])
    mpirun = ["mpirun", "--oversubscribe", "-np", "2"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    parts, _, two = _sim_json(mpirun + [cli] + args + ["--leaf-groups", "4"])
    assert parts == ("4 partitions (one per plane and leaf group) on 2 processes x 1 thread: "
                     "rank 0 p0 leaves 0-1, p0 leaves 4-5 | rank 1 p0 leaves 2-3, p0 leaves 6-7")
    assert one["fare_rounds"] > 0 and one["frame_hops"] > 0
    assert two == one


@pytest.mark.parametrize("kwargs,named", [
    (dict(pfc="off"), "pfc='off': expected True or False"),  # bool('off') is True: PFC stayed on
    (dict(bytes=2.7), "bytes=2.7: expected a whole number"),  # ran 2 bytes per flow
    (dict(bytes=-1), "bytes=-1 outside 1.."),
    (dict(fail=3), "fail=3: expected a string or a list of strings"),
])
def test_python_arguments_are_named(repo, kwargs, named):
    with pytest.raises((TypeError, ValueError)) as e:
        ifec.sim.run(str(repo / "testbed/topologies/superpod-8x2.yaml"), traffic="incast", **kwargs)
    assert named in str(e.value)


def test_one_link_event_string_is_one_event_and_a_path_object_a_topology(repo):
    topo = repo / "testbed/topologies/superpod-8x2.yaml"  # a pathlib.Path, not a str
    r = ifec.sim.run(topo, bytes=4096, fail="gpu5:plane1@1us")  # was split into its characters
    assert r["fare_rounds"] > 0 and [g["gpu"] for g in r["event_gpus"]] == [5]
    from ifec import collectives
    import numpy as np
    assert collectives.measure(topo, "allreduce", "ifec", bytes=4096)["ok"]
    c = ifec.Cluster(ifec.make_superpod(4, 2))
    collectives.prepare(c, 4, "bf16")
    with pytest.raises(ValueError, match="uint16 bit patterns"):  # floats were cast to garbage bit patterns, ok=True
        collectives.allreduce(c, [np.array([1.5, 2, -3, .25], np.float32)] * 4, algo="ring", dtype="bf16")


def test_live_operation_numbers_rise_with_time_and_keep_the_windows_turn():
    """hostd takes an operation's windows by its number mod 3: a driver's numbers must keep turning (three pairs in
    turn), never fall behind the clock (another driver's later numbers would make its operations stale), and start
    at a multiple of 3 (its first operation has windows 1 and 2)."""
    from ifec.live import _next_run_id
    prev, seen = None, []
    for now in [1000, 1000, 1001, 5000, 5000, 9999, 10_000]:
        prev = _next_run_id(prev, now)
        assert prev >= now and (not seen or prev > seen[-1])
        seen.append(prev)
    assert [s % 3 for s in seen] == [0, 1, 2, 0, 1, 2, 0]


def test_an_incast_target_given_to_other_traffic_is_refused():
    """It was ignored: an all-to-all ran as if no target had been given (the CLI refused --incast-target there)."""
    with pytest.raises(ifec.IfecError, match="incast target GPU 5 does not apply to alltoall traffic"):
        ifec.sim.run(ifec.make_superpod(8, 2), traffic="alltoall", incast_target=5, bytes=4096)
    assert ifec.sim.run(ifec.make_superpod(8, 2), traffic="incast", incast_target=5, bytes=4096)["complete"]


def test_a_fare_table_too_large_for_python_is_refused_before_it_is_built():
    """2897 GPUs on 2 planes took 25 s and 2 GB; 20000 GPUs ran for minutes toward tens of GB."""
    with pytest.raises(ifec.IfecError, match="fare_plane_gbps: 2897 GPUs on 2 planes make 16779424 path bandwidths; "
                                             "at most 16777216"):
        ifec.fare_plane_gbps(ifec.make_superpod(2897, 2, 800, 1))
