"""Soft-RoCE guests: QEMU (KVM when it works, software emulation otherwise) booting Debian 12's own kernel with the
rxe modules from a small initramfs (testbed/rxe/build_guest.sh), an rxe device on the guest's NIC, a script run in
the guest, its output and exit status back. The real RDMA stack the project's RoCEv2 is checked against."""

import base64
import os
import pathlib
import re
import shutil
import subprocess

HERE = pathlib.Path(__file__).resolve()


def _repo():
    for p in HERE.parents:
        if (p / "testbed" / "rxe" / "build_guest.sh").exists():
            return p
    raise RuntimeError("testbed/rxe/build_guest.sh not found above " + str(HERE))


class GuestError(RuntimeError):
    pass


def unavailable():
    """Why guests cannot run here ("" when they can)."""
    missing = [p for p in ("qemu-system-x86_64", "busybox", "cpio", "modinfo", "apt-get") if not shutil.which(p)]
    if missing:
        return f"{', '.join(missing)} not found (./ifec setup installs qemu-system-x86, busybox-static, cpio, kmod)"
    return ""


def build():
    """(kernel, initramfs) paths, built or taken from the cache."""
    p = subprocess.run([str(_repo() / "testbed" / "rxe" / "build_guest.sh")], capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        raise GuestError(f"build_guest.sh: {p.stderr.strip()[-800:]}")
    kernel, initrd = p.stdout.split()[-2:]
    return kernel, initrd


def kvm_works():
    return os.access("/dev/kvm", os.R_OK | os.W_OK) and os.environ.get("IFEC_RXE_KVM", "0") == "1"


def boot(script, ip="10.0.0.1/24", nic=("-nic", "user,model=virtio-net-pci"), memory_mb=256, timeout=120):
    """Boots a guest, runs `script` (sh) in it after rxe0 is up on eth0; returns (exit status, output lines of the
    script). Raises GuestError when the guest never reports (QEMU failed, or it hung past `timeout`)."""
    kernel, initrd = build()
    run = base64.b64encode(script.encode()).decode()
    cmd = ["qemu-system-x86_64", "-m", str(memory_mb), "-smp", "1", "-nographic", "-no-reboot", "-kernel", kernel,
           "-initrd", initrd, "-append", f"console=ttyS0 quiet panic=-1 ifec.ip={ip} ifec.run={run}", *nic]
    if kvm_works():
        cmd[1:1] = ["-enable-kvm", "-cpu", "host"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise GuestError(f"the guest did not finish in {timeout} s")
    out = p.stdout.replace("\r", "")
    m = re.search(r"IFEC-GUEST exit (\d+)", out)
    if m is None:
        raise GuestError(f"no report from the guest (qemu exit {p.returncode}): {(p.stderr or out).strip()[-600:]}")
    lines = out.splitlines()
    start = next((i for i, l in enumerate(lines) if "IFEC-GUEST" in l), 0)
    body = [l for l in lines[start:] if l.strip() and not l.startswith("IFEC-GUEST exit")]
    return int(m.group(1)), body
