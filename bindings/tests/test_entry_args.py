"""Bad input at the entry points whose own test files need a testbed, QEMU or containers (ifec.pki, images, rxe,
torchrun, torch_backend, trace, and the private entries of security and frr_interop): each refused naming the value,
before anything is started, made or written; nothing here starts a daemon, a guest, dockerd or a rank."""

import argparse
import datetime
import os
import re
import subprocess
import sys

import pytest

from ifec import frr_interop, images, live, pki, rxe, security, trace, torchrun

# ------------------------------------------------------------------------------------------------------ pki --


@pytest.mark.parametrize("name", ["../evil", "a/b", "..", "", "x\0y"])
def test_a_certificate_name_that_is_no_plain_file_name_is_named(tmp_path, name):
    """A node named '../evil' wrote evil.key beside the PKI folder."""
    pki.make_ca(tmp_path / "ca")
    with pytest.raises(pki.PkiError, match="certificate file name"):
        pki.issue(tmp_path / "ca", name, "viewer")
    with pytest.raises(pki.PkiError, match="certificate file name"):
        pki.make(tmp_path / "pki", {name: []})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca"]
    assert sorted(p.name for p in (tmp_path / "ca").iterdir()) == ["ca.key", "ca.pem"]


@pytest.mark.parametrize("days", [0, -5, 1.5, float("nan"), float("inf"), 10**9, "30", True])
def test_days_outside_a_century_or_not_whole_are_named(tmp_path, days):
    """0 made a CA expired at birth; NaN, inf and 10^9 raised from datetime naming nothing."""
    for make in (lambda: pki.make_ca(tmp_path / "ca", days=days), lambda: pki.make(tmp_path, {"gpu0": []}, days=days)):
        with pytest.raises((TypeError, ValueError), match="days="):
            make()
    assert list(tmp_path.iterdir()) == []


def test_a_pki_is_still_made_for_ordinary_names(tmp_path):
    pki.make(tmp_path, {"gpu0": ["127.0.0.1"], "p0-sw": []}, days=1)
    assert {"ca.pem", "gpu0.pem", "gpu0.key", "p0-sw.key", "rank.pem"} <= {p.name for p in tmp_path.iterdir()}


@pytest.mark.parametrize("name", ["gpu 0", "", "-gpu0", "gpu0-", "a..b", "gpu0.", ".gpu0", "*.fabric", "gpu*",
                                  "a" * 64, ".".join(["a" * 63] * 4), "g\u00e9", "gpu0\n", "10.0.0.256", "10.0.0"])
def test_an_address_that_is_no_ip_or_dns_host_name_is_named_before_any_file(tmp_path, name):
    """They went into the certificate as DNS names as they came: a space, an empty label, a wildcard no daemon
    answers for, a 64-character label, a 255-character name, a mistyped IP address."""
    pki.make_ca(tmp_path / "ca")
    ca = {p.name: p.read_bytes() for p in (tmp_path / "ca").iterdir()}
    with pytest.raises(pki.PkiError, match=f"address {re.escape(repr(name))}: expected an IP address or a DNS host"):
        pki.issue(tmp_path / "ca", "gpu0", "daemon:gpu0", ["127.0.0.1", name])
    assert {p.name: p.read_bytes() for p in (tmp_path / "ca").iterdir()} == ca
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "old.pem").write_text("kept")
    with pytest.raises(pki.PkiError, match=re.escape(repr(name))):
        pki.make(tmp_path / "pki", {"gpu0": ["127.0.0.1", name]})
    assert [p.name for p in (tmp_path / "pki").iterdir()] == ["old.pem"]  # nothing removed, nothing made


def test_host_names_and_addresses_that_are_fine_make_their_sans(tmp_path):
    """RFC 1123 names (a leading digit, 63-character labels, 253 in all), '_' as node names carry it, IPv6; one
    address given as a string is that address, not its characters."""
    from cryptography import x509
    long = ".".join(["a" * 63] * 3 + ["b" * 61])
    pki.make_ca(tmp_path)
    cert, _ = pki.issue(tmp_path, "gpu0", "daemon:gpu0", ["3x", "GPU_0", "p0-sw.fabric", long, "::1", "10.0.0.1"])
    sans = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["3x", "GPU_0", "p0-sw.fabric", long]
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["::1", "10.0.0.1"]
    cert, _ = pki.issue(tmp_path, "one", "daemon:one", "10.0.0.2")
    sans = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert [str(a.value) for a in sans] == ["10.0.0.2"]


# --------------------------------------------------------------------------------------------------- images --

def _env_python(code, **env):
    path = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=path, **env),
                          capture_output=True, text=True, timeout=60)


def test_empty_image_settings_are_their_defaults():
    """An empty IFEC_IMAGE_CACHE put debootstrap's tree and tarball in the current directory."""
    run = _env_python("from ifec import images as i; print(i.CACHE, i.MIRROR, i.DOCKER)", IFEC_IMAGE_CACHE="",
                      IFEC_DEBIAN_MIRROR="", IFEC_DOCKER="")
    assert run.stdout.split() == ["/var/cache/ifec/images", "http://deb.debian.org/debian", "docker"], run.stderr


def test_a_docker_that_cannot_run_is_named_not_a_traceback(monkeypatch, tmp_path):
    for docker, says in (("/no/such/docker", "No such file"), (str(tmp_path), "Permission denied")):
        monkeypatch.setattr(images, "DOCKER", docker)
        with pytest.raises(images.ImageError, match=f"'{docker}' \\(IFEC_DOCKER\\): cannot run it: {says}"):
            images.docker_running()
        with pytest.raises(images.ImageError, match="IFEC_DOCKER"):
            images.image_megabytes("ifec-testbed:latest")


def test_preflight_names_what_would_fail_minutes_in(monkeypatch, tmp_path):
    bins = tmp_path / "bin"
    bins.mkdir()
    with pytest.raises(images.ImageError, match=f"not built: {bins / 'ifec-switchd'}"):
        images.preflight(bins)
    for b in images.BINARIES:
        (bins / b).write_text("")
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(images, "CACHE", tmp_path / "file")
    with pytest.raises(images.ImageError, match="IFEC_IMAGE_CACHE='.*/file': not a folder"):
        images.preflight(bins)
    monkeypatch.setattr(images, "CACHE", tmp_path / "cache")
    for mirror in ("--help", "deb.debian.org", "http://a b"):
        monkeypatch.setattr(images, "MIRROR", mirror)
        with pytest.raises(images.ImageError, match=f"IFEC_DEBIAN_MIRROR='{mirror}': expected a URL"):
            images.preflight(bins)
    monkeypatch.setattr(images, "MIRROR", "http://deb.debian.org/debian")
    images.preflight(bins)
    # build_all checks first: nothing runs (no docker, no debootstrap) for a folder without the daemons.
    monkeypatch.setattr(images.subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a[0]}"))
    with pytest.raises(images.ImageError, match="not built"):
        images.build_all(tmp_path)


# ------------------------------------------------------------------------------------------------------ rxe --

def _no_interop(*a, **k):
    pytest.fail("interop started (a fabric and guests would come up)")


@pytest.mark.parametrize("captures,says", [("", "--captures '': expected a folder"),  # 300 MB in the current folder
                                           ("FILE", "not a folder"), ("FILE/sub", "Not a directory")])
def test_a_captures_folder_that_cannot_be_is_named_before_any_guest(monkeypatch, tmp_path, capsys, captures, says):
    (tmp_path / "FILE").write_text("")
    monkeypatch.setattr(rxe, "unavailable", lambda: "")
    monkeypatch.setattr(rxe, "interop", _no_interop)
    arg = captures and str(tmp_path / captures)
    assert rxe.main(["rxe", "--captures", arg]) == 2
    assert says in capsys.readouterr().err
    with pytest.raises(rxe.GuestError, match="--captures"):
        rxe.captures_folder(arg)


@pytest.mark.parametrize("kwargs,error,says", [
    (dict(memory_mb=0), ValueError, "memory_mb=0 outside 64..65536"),
    (dict(memory_mb=-256), ValueError, "memory_mb=-256 outside 64..65536"),
    (dict(memory_mb=10**6), ValueError, "memory_mb=1000000 outside 64..65536"),
    (dict(memory_mb=True), TypeError, "memory_mb=True: expected a whole number"),
    (dict(memory_mb="256"), TypeError, "memory_mb='256': expected a whole number"),
    (dict(memory_mb=256.5), TypeError, "memory_mb=256.5: expected a whole number"),
    (dict(timeout=0), ValueError, "timeout=0: expected a finite number of seconds above 0"),
    (dict(timeout=-1), ValueError, "timeout=-1: expected a finite number"),
    (dict(timeout=float("nan")), ValueError, "timeout=nan: expected a finite number"),
    (dict(timeout=float("inf")), ValueError, "timeout=inf: expected a finite number"),
    (dict(timeout=10**400), ValueError, "expected a finite number of seconds above 0"),
    (dict(timeout=True), TypeError, "timeout=True: expected a number of seconds"),
    (dict(timeout="120"), TypeError, "timeout='120': expected a number of seconds"),
    (dict(timeout=None), TypeError, "timeout=None: expected a number of seconds"),
])
def test_a_guest_memory_or_timeout_that_cannot_be_is_named_before_anything_starts(monkeypatch, kwargs, error, says):
    """memory_mb=0 or -1 reached QEMU after the guest's build; timeout=0 or NaN ended the guest at once or never."""
    monkeypatch.setattr(rxe, "build", lambda: pytest.fail("the guest was built"))
    monkeypatch.setattr(rxe.subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a[0]}"))
    with pytest.raises(error, match=re.escape(says)):
        rxe.boot("true", **kwargs)


def test_a_guest_with_fine_memory_and_timeout_reaches_qemu(monkeypatch):
    ran = []
    monkeypatch.setattr(rxe, "build", lambda: ("KERNEL", "INITRD"))
    monkeypatch.setattr(rxe, "kvm_works", lambda *a: False)
    monkeypatch.setattr(rxe.subprocess, "run", lambda cmd, **k: ran.append((cmd, k["timeout"])) or
                        subprocess.CompletedProcess(cmd, 0, "IFEC-GUEST exit 0\n", ""))
    assert rxe.boot("true", memory_mb=64.0, timeout=0.5) == (0, [])
    assert ran[0][0][1:3] == ["-m", "64"] and ran[0][1] == 0.5


@pytest.mark.parametrize("value,want", [("", None), ("0", False), ("1", True), ("yes", "error"), ("2", "error")])
def test_ifec_rxe_kvm_is_0_1_or_unset(monkeypatch, capsys, value, want):
    """'yes' or 'off' was taken for unset: KVM tried, whatever was meant."""
    monkeypatch.setenv("IFEC_RXE_KVM", value)
    if want == "error":
        monkeypatch.setattr(rxe, "unavailable", lambda: "")
        monkeypatch.setattr(rxe, "interop", _no_interop)
        assert rxe.main(["rxe"]) == 2
        assert f"IFEC_RXE_KVM='{value}': expected 0 or 1" in capsys.readouterr().err
    else:
        assert rxe.kvm_setting() is want


# ------------------------------------------------------------------------------------------------- torchrun --

def _torchrun(argv, attach):
    p = argparse.ArgumentParser(prog="./ifec live")
    handler = torchrun.add_command(p.add_subparsers(dest="cmd"))
    args = p.parse_args(["torchrun"] + argv)
    args.attach = attach
    return handler(args)


def test_an_unknown_algo_is_refused_by_the_parser_not_by_every_rank(capsys):
    with pytest.raises(SystemExit) as e:
        _torchrun(["--algo", "ringg", "x.py"], lambda: pytest.fail("attached"))
    assert e.value.code == 2 and "invalid choice: 'ringg'" in capsys.readouterr().err
    with pytest.raises(live.LiveError, match="--algo 'ringg': expected one of ifec, best"):
        torchrun.launch(type("Fab", (), {"nodes": []})(), __file__, algo="ringg", nproc=0)


@pytest.mark.parametrize("folder,says", [("", "--trace '': expected a folder"),  # no trace, silently
                                         ("FILE", "File exists"), ("FILE/sub", "Not a directory")])
def test_a_trace_folder_that_cannot_be_is_named_before_any_rank(monkeypatch, tmp_path, folder, says):
    (tmp_path / "FILE").write_text("")
    monkeypatch.setattr(torchrun, "launch", lambda *a, **k: pytest.fail("ranks launched"))
    arg = folder and str(tmp_path / folder)
    with pytest.raises(live.LiveError, match=f"--trace {arg}.*{says}" if arg else says):
        _torchrun(["--trace", arg, "x.py"], lambda: object())


@pytest.mark.parametrize("env,says", [({"IFEC_LAUNCHER_PID": "abc"}, "IFEC_LAUNCHER_PID='abc': expected"),
                                      ({}, "'/no/such/script.py': no such script")])
def test_a_rank_entry_names_a_bad_launcher_or_script(env, says):
    run = _env_python("import sys; from ifec import torchrun; torchrun._rank_entry(['/no/such/script.py'])", **env)
    assert run.returncode == 1 and says in run.stderr and "Traceback" not in run.stderr, run.stderr


# -------------------------------------------------------------------------------------------- torch_backend --

@pytest.fixture
def backend(monkeypatch):
    """ifec.torch_backend with its process group's constructor recording its arguments (no hostd is asked)."""
    tb = pytest.importorskip("ifec.torch_backend")
    try:
        from ifec import _c10d
    except ImportError:
        pytest.skip("built without LibTorch (no ifec._c10d)")
    calls = []
    monkeypatch.setattr(_c10d, "create", lambda *a: calls.append(a) or "group")
    for k in [k for k in os.environ if k.startswith("IFEC_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("IFEC_HOSTD", "127.0.0.1:1")
    return tb, calls


@pytest.mark.parametrize("env,says", [({"IFEC_HOSTD": ""}, "IFEC_HOSTD='': expected"),
                                      ({"IFEC_GPU": "-1"}, "IFEC_GPU='-1' is not a GPU index"),
                                      ({"IFEC_GPU": str(2**40)}, f"IFEC_GPU='{2**40}' is not a GPU index"),
                                      ({"IFEC_TRACE": "FILE"}, "IFEC_TRACE='.*FILE': not a folder"),
                                      ({"IFEC_TRACE": "FILE/sub"}, "IFEC_TRACE='.*FILE/sub': Not a directory")])
def test_a_bad_setting_is_named_when_the_group_is_made(backend, monkeypatch, tmp_path, env, says):
    import torch.distributed as dist
    tb, calls = backend
    (tmp_path / "FILE").write_text("")
    for k, v in env.items():
        monkeypatch.setenv(k, v.replace("FILE", str(tmp_path / "FILE")))
    with pytest.raises(RuntimeError, match=says):
        tb._create(dist.HashStore(), 0, 2, None)
    assert calls == []


@pytest.mark.parametrize("timeout", [datetime.timedelta(seconds=-5), datetime.timedelta(microseconds=1)])
def test_a_group_timeout_below_a_millisecond_is_named(backend, timeout):
    """It reached hostd as 0 or -5000 ms: every operation failed at once."""
    import torch.distributed as dist
    tb, calls = backend
    with pytest.raises(RuntimeError, match="process group's timeout .*: expected 1 ms or more"):
        tb._create(dist.HashStore(), 0, 2, timeout)
    store = dist.HashStore()
    store.set("ifec_gpu_1", "6")  # rank 1's GPU (every rank tells the others its own: the channels' ends)
    tb._create(store, 0, 2, datetime.timedelta(seconds=5))
    assert calls[0][5] == 5.0  # timeout_s: the group's, shorter than IFEC_TIMEOUT's default
    assert calls[0][-1] == [0, 6]  # the world's GPUs in rank order (IFEC_GPU unset: rank 0's is its rank)


# ---------------------------------------------------------------------------------------------------- trace --

def test_an_empty_trace_folder_is_named_not_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for call in (lambda: trace.append("", {0: {"ok": True}}, "allreduce", "ifec", "fp32", 8, 0, 0, 0, 0),
                 lambda: trace.last_end_ns(""), lambda: trace.next_seq("")):
        with pytest.raises(ValueError, match="trace '': expected a folder"):
            call()
    assert list(tmp_path.iterdir()) == []


def test_a_trace_that_is_not_text_is_named(tmp_path):
    (tmp_path / "rank0.jsonl").write_bytes(b"\xff\xfe\n")
    with pytest.raises(ValueError, match="rank0.jsonl: not a trace \\(not UTF-8"):
        trace.last_end_ns(tmp_path)
    assert trace.next_seq(tmp_path) == 1


def test_an_operation_of_no_ranks_appends_nothing(tmp_path):
    """An all-gather of no rows divided by zero."""
    trace.append(tmp_path / "t", {}, "all-gather", "ring", "fp32", 64, 0, 0, 0, 0)
    assert not (tmp_path / "t").exists()
    trace.append(tmp_path / "t", {0: {"ok": True}, 1: {"ok": True}}, "all-gather", "ring", "fp32", 64, 0, 0, 0, 7)
    assert trace.next_seq(tmp_path / "t") == 1 and trace.last_end_ns(tmp_path / "t") == 7


def test_a_last_end_time_that_is_not_a_whole_number_of_ns_is_named(tmp_path):
    """-5 (or 1e300) was returned, and the next operation's records written starting there."""
    for end in ("-5", "1e300", '"7"', "true"):
        (tmp_path / "rank0.jsonl").write_text('{"end_ns": 3}\n{"end_ns": ' + end + "}\n")
        with pytest.raises(ValueError, match=r"rank0.jsonl:2: end_ns .*: expected a whole number of ns >= 0"):
            trace.last_end_ns(tmp_path)


# ----------------------------------------------------------------------------- private entries: security, frr --
#
# What inject(), start_soak() and malformed() start in a node's namespace: bad arguments got an IndexError or a
# ValueError traceback (after a raw socket was opened, for _inject); now a usage line naming what is wrong, exit 2.

_RAW_OK = ["10.0.0.1", "10.0.0.2", "65001", "10.1.0.7", "10.1.0.7"]
_SOAK_OK = dict(ports=[["f0", "02" * 6, "04" * 6]], gpu_ips=[167837703], seconds=1, seed=1)


def _soak(**change):
    import json
    return json.dumps(dict(_SOAK_OK, **change))


@pytest.mark.parametrize("module,argv,says", [
    (security, ["_inject"], "_inject: INTERFACE and LISTEN_S missing"),
    (security, ["_inject", "f0"], "_inject: LISTEN_S missing"),
    (security, ["_inject", "", "1"], "_inject: INTERFACE '': expected an interface name"),
    (security, ["_inject", "f0", "soon"], "_inject: LISTEN_S 'soon': expected a finite number of seconds"),
    (security, ["_inject", "f0", "nan"], "_inject: LISTEN_S 'nan': expected a finite number of seconds"),
    (security, ["_inject", "f0", "-1"], "_inject: LISTEN_S '-1': expected a finite number of seconds"),
    (security, ["_inject", "f0", "1", "00ff", "zz"], "_inject: FRAME_HEX 2 'zz': expected a frame's bytes in hex"),
    (security, ["_soak"], "_soak: CONFIG_JSON missing"),
    (security, ["_soak", "{", "x"], "_soak: unexpected 'x'"),
    (security, ["_soak", "{"], "_soak: CONFIG_JSON: not JSON"),
    (security, ["_soak", "[]"], "_soak: CONFIG_JSON: expected an object with ports, gpu_ips, seconds and seed"),
    (security, ["_soak", _soak(ports=[])], "_soak: ports []: expected [[interface, source MAC hex"),
    (security, ["_soak", _soak(ports=[["f0", "02", "04" * 6]])], "_soak: ports [['f0', '02', "),
    (security, ["_soak", _soak(gpu_ips=["10.0.0.1"])], "_soak: gpu_ips ['10.0.0.1']: expected the GPUs' IPv4"),
    (security, ["_soak", _soak(seconds="5")], "_soak: seconds '5': expected a finite number of seconds"),
    (security, ["_soak", _soak(seconds=float("nan"))], "_soak: seconds nan: expected a finite number"),
    (security, ["_soak", _soak(seed=1.5)], "_soak: seed 1.5: expected a whole number"),
    (frr_interop, ["_raw"], "_raw: LOCAL, PEER, ASN, ROUTER_ID, PREFIX missing"),
    (frr_interop, ["_raw", *_RAW_OK[:3]], "_raw: ROUTER_ID, PREFIX missing"),
    (frr_interop, ["_raw", *_RAW_OK, "more"], "_raw: unexpected 'more'"),
    (frr_interop, ["_raw", *_RAW_OK[:2], "AS65001", *_RAW_OK[3:]], "_raw: ASN 'AS65001': expected a whole number"),
    (frr_interop, ["_raw", *_RAW_OK[:2], "0", *_RAW_OK[3:]], "_raw: ASN '0': expected a whole number in 1..4294967295"),
    (frr_interop, ["_raw", *_RAW_OK[:2], "4294967296", *_RAW_OK[3:]], "_raw: ASN '4294967296': expected"),
    (frr_interop, ["_raw", *_RAW_OK[:2], "9" * 5000, *_RAW_OK[3:]], "_raw: ASN '999"),
    (frr_interop, ["_raw", "gpu0", *_RAW_OK[1:]], "_raw: LOCAL 'gpu0': expected an IPv4 address"),
    (frr_interop, ["_raw", *_RAW_OK[:4], "10.1.0.256"], "_raw: PREFIX '10.1.0.256': expected an IPv4 address"),
])
def test_a_private_entry_names_what_is_missing_or_bad_and_exits_2(monkeypatch, capsys, module, argv, says):
    for started in ("_inject_main", "_soak_main", "raw_speaker"):
        if hasattr(module, started):
            monkeypatch.setattr(module, started, lambda *a: pytest.fail(f"{started} started"))
    assert module.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: python -m {module.__name__} {argv[0]} ") and says in err, err


def test_a_private_entry_with_fine_arguments_starts(monkeypatch):
    calls = []
    monkeypatch.setattr(security, "_inject_main", lambda *a: calls.append(a) or 0)
    monkeypatch.setattr(security, "_soak_main", lambda *a: calls.append(a) or 0)
    monkeypatch.setattr(frr_interop, "raw_speaker", lambda *a: calls.append(a))
    assert security.main(["_inject", "f0", "1.0", "00ff"]) == 0 and security.main(["_inject", "f0", "0"]) == 0
    assert security.main(["_soak", _soak()]) == 0 and frr_interop.main(["_raw", *_RAW_OK]) == 0
    assert calls == [("f0", "1.0", ["00ff"]), ("f0", "0", []), (_soak(),),
                     ("10.0.0.1", "10.0.0.2", 65001, "10.1.0.7", "10.1.0.7")]


@pytest.mark.parametrize("module,argv", [("ifec.security", ["_inject", "f0"]), ("ifec.frr_interop", ["_raw", "x"])])
def test_a_private_entry_run_as_a_module_exits_2_without_a_traceback(module, argv):
    path = os.pathsep.join(p for p in sys.path if p)
    run = subprocess.run([sys.executable, "-m", module, *argv], env=dict(os.environ, PYTHONPATH=path),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "missing" in run.stderr and "Traceback" not in run.stderr, run.stderr
