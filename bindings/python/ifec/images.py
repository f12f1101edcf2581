"""The containerized testbed's images, built here (no registry can be reached): a Debian 12 base made with
debootstrap and `docker import` (cached: rebuilt only when its package list changes), then

- ifec-testbed: the base plus the daemons (ifec-switchd, ifec-hostd) and ifec-ring with exactly their runtime
  libraries (the ldd closure of the binaries that the base lacks), and
- ifec-prometheus: the base plus Debian's prometheus package.

dockerd is started if none is running (and stopped only by whoever started it: `Dockerd.stop()`).

Settings: IFEC_IMAGE_CACHE (the debootstrap tarballs' folder), IFEC_DEBIAN_MIRROR (a URL), IFEC_DOCKER (the docker
program); each empty or unset is its default. preflight() checks them, and the daemons built, before anything runs.
"""

import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import time

# Empty is unset: an empty IFEC_IMAGE_CACHE put the cache in the current directory.
CACHE = pathlib.Path(os.environ.get("IFEC_IMAGE_CACHE") or "/var/cache/ifec/images")
MIRROR = os.environ.get("IFEC_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
SUITE = "bookworm"
BASE_PACKAGES = ("bash", "iproute2", "procps", "ca-certificates")
PROMETHEUS_PACKAGES = BASE_PACKAGES + ("prometheus",)
FRR_PACKAGES = BASE_PACKAGES + ("frr",)  # a node whose routing stack is FRR (./ifec testbed up FILE --frr NODE)
BINARIES = ("ifec-switchd", "ifec-hostd", "ifec-ring")
TESTBED_IMAGE = "ifec-testbed:latest"
PROMETHEUS_IMAGE = "ifec-prometheus:latest"
FRR_IMAGE = "ifec-frr:latest"
DOCKER = os.environ.get("IFEC_DOCKER") or "docker"


class ImageError(RuntimeError):
    pass


def _cannot_run(program, e):
    """The ImageError of a program that could not be started (missing, not executable), naming the setting."""
    setting = " (IFEC_DOCKER)" if program == DOCKER else ""
    return ImageError(f"{program!r}{setting}: cannot run it: {e.strerror or e}")


def _run(cmd, **kw):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    except OSError as e:
        raise _cannot_run(cmd[0], e) from None
    if p.returncode != 0:
        raise ImageError(f"{' '.join(map(str, cmd[:4]))}...: exit {p.returncode}: {(p.stderr or p.stdout).strip()[-800:]}")
    return p.stdout


def docker_running(timeout=30):
    """Whether a dockerd answers; ImageError for one that does not answer within `timeout` seconds (a wedged dockerd
    held every command that asked it, without a word)."""
    try:
        return subprocess.run([DOCKER, "info"], capture_output=True, timeout=timeout).returncode == 0
    except OSError as e:
        raise _cannot_run(DOCKER, e) from None
    except subprocess.TimeoutExpired:
        raise ImageError(f"{DOCKER} info: no answer in {timeout} s: dockerd does not respond (its log: "
                         "/tmp/ifec-dockerd.log where the testbed started it)") from None


def preflight(bin_dir):
    """ImageError naming what would fail minutes in (after dockerd was started, or debootstrap ran): a daemon not
    built in `bin_dir`, an IFEC_IMAGE_CACHE that is no folder, an IFEC_DEBIAN_MIRROR that is no URL."""
    missing = [str(pathlib.Path(bin_dir) / b) for b in BINARIES if not (pathlib.Path(bin_dir) / b).is_file()]
    if missing:
        raise ImageError(f"not built: {', '.join(missing)} (./ifec build)")
    if CACHE.exists() and not CACHE.is_dir():
        raise ImageError(f"IFEC_IMAGE_CACHE={str(CACHE)!r}: not a folder")
    if not re.fullmatch(r"[a-z][a-z0-9+.-]*://\S+", MIRROR):
        raise ImageError(f"IFEC_DEBIAN_MIRROR={MIRROR!r}: expected a URL such as http://deb.debian.org/debian")


class Dockerd:
    """Makes sure a dockerd answers; if this object started it, stop() ends it (by PID) and nothing else."""

    def __init__(self, progress=print, timeout=60):
        self.proc = None
        if docker_running():
            return
        if not shutil.which("dockerd"):
            raise ImageError("no dockerd: install docker.io (./ifec setup)")
        progress("testbed: starting dockerd")
        log = open("/tmp/ifec-dockerd.log", "ab")
        self.proc = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.time()
        while not docker_running():
            if self.proc.poll() is not None or time.time() - t0 > timeout:
                raise ImageError(f"dockerd did not start (see /tmp/ifec-dockerd.log): exit {self.proc.poll()}")
            time.sleep(0.5)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


def _image_exists(tag, timeout=60):
    try:
        return subprocess.run([DOCKER, "image", "inspect", tag], capture_output=True, timeout=timeout).returncode == 0
    except OSError as e:
        raise _cannot_run(DOCKER, e) from None
    except subprocess.TimeoutExpired:
        raise ImageError(f"{DOCKER} image inspect {tag}: no answer in {timeout} s: dockerd does not respond") from None


def base_image(packages=BASE_PACKAGES, progress=print):
    """The Debian base with `packages` as an image (ifec-base:<hash of the list>); debootstrap's rootfs tarball is
    cached in CACHE, so a fresh dockerd only re-imports it."""
    key = hashlib.sha256(" ".join((SUITE, MIRROR) + tuple(sorted(packages))).encode()).hexdigest()[:12]
    tag = f"ifec-base:{key}"
    if _image_exists(tag):
        return tag
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ImageError(f"IFEC_IMAGE_CACHE={str(CACHE)!r}: cannot make the folder: {e.strerror}") from None
    tarball = CACHE / f"base-{key}.tar"
    if not tarball.exists():
        progress(f"testbed: debootstrap {SUITE} minbase + {', '.join(packages)} (about 30 s to a few minutes)")
        with tempfile.TemporaryDirectory(dir=CACHE) as d:
            root = pathlib.Path(d) / "rootfs"
            _run(["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", SUITE, str(root), MIRROR])
            shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
            (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
            _run(["tar", "-C", str(root), "-cf", str(tarball) + ".part", "."])
            os.replace(str(tarball) + ".part", tarball)
    progress(f"testbed: docker import {tarball.name} as {tag}")
    _run([DOCKER, "import", "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
          "--change", 'CMD ["bash"]', str(tarball), tag])
    return tag


def _base_files(tag):
    """Every file path of an image (to leave out of the closure what the base already has)."""
    out = _run([DOCKER, "run", "--rm", "--network", "none", tag, "bash", "-c",
                "find / -xdev \\( -type f -o -type l \\) 2>/dev/null"])
    return set(out.split())


def library_closure(binaries):
    """Shared libraries the binaries load (ldd), as real paths plus the names they are loaded by."""
    libs = {}
    for b in binaries:
        for line in _run(["ldd", str(b)]).splitlines():
            parts = line.split("=>")
            if len(parts) == 2 and parts[1].strip().startswith("/"):
                path = parts[1].split("(")[0].strip()
                libs[path] = os.path.realpath(path)
            elif line.strip().startswith("/"):  # the loader itself
                path = line.split("(")[0].strip()
                libs[path] = os.path.realpath(path)
    return libs


def testbed_image(bin_dir, progress=print):
    """ifec-testbed:latest from the base and the built daemons; returns (tag, megabytes)."""
    base = base_image(BASE_PACKAGES, progress)
    bins = [pathlib.Path(bin_dir) / b for b in BINARIES]
    missing = [str(b) for b in bins if not b.exists()]
    if missing:
        raise ImageError(f"not built: {', '.join(missing)} (./ifec build)")
    have = _base_files(base)
    with tempfile.TemporaryDirectory() as ctx:
        root = pathlib.Path(ctx) / "rootfs"
        (root / "usr/local/bin").mkdir(parents=True)
        for b in bins:
            shutil.copy2(b, root / "usr/local/bin" / b.name)
        added = 0
        for path, real in sorted(library_closure(bins).items()):
            # Merged /usr: the base's /lib, /lib64 and /bin are links into /usr; a copy must not replace them.
            if path.startswith(("/lib/", "/lib64/", "/bin/", "/sbin/")):
                path = "/usr" + path
            if path in have:
                continue
            dest = root / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(real, dest)  # the file itself under the name the binaries load it by
            added += 1
        (pathlib.Path(ctx) / "Dockerfile").write_text(
            f"FROM {base}\nCOPY rootfs/ /\nRUN ldconfig\nCMD [\"bash\"]\n")
        progress(f"testbed: building {TESTBED_IMAGE} ({len(bins)} programs, {added} libraries the base lacks)")
        _run([DOCKER, "build", "-q", "--force-rm", "-t", TESTBED_IMAGE, ctx])
    return TESTBED_IMAGE, image_megabytes(TESTBED_IMAGE)


def prometheus_image(progress=print):
    base = base_image(PROMETHEUS_PACKAGES, progress)
    _run([DOCKER, "tag", base, PROMETHEUS_IMAGE])
    return PROMETHEUS_IMAGE, image_megabytes(PROMETHEUS_IMAGE)


def frr_image(progress=print):
    base = base_image(FRR_PACKAGES, progress)
    _run([DOCKER, "tag", base, FRR_IMAGE])
    return FRR_IMAGE, image_megabytes(FRR_IMAGE)


def image_megabytes(tag):
    return int(_run([DOCKER, "image", "inspect", "-f", "{{.Size}}", tag]).strip()) / 1e6


def build_all(bin_dir, progress=print, frr=False):
    """The testbed's and Prometheus' images (and FRR's when asked); returns [(tag, MB, seconds)]."""
    preflight(bin_dir)
    out = []
    makers = [lambda: testbed_image(bin_dir, progress), lambda: prometheus_image(progress)]
    for make in makers + ([lambda: frr_image(progress)] if frr else []):
        t0 = time.time()
        tag, mb = make()
        out.append((tag, mb, time.time() - t0))
    return out
