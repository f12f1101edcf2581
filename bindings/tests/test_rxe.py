"""The Soft-RoCE guest the interop suite builds on: Debian 12's own kernel under QEMU (software emulation here),
the rxe modules loaded from the initramfs, an rxe device on the guest's NIC with a RoCEv2 GID, and rdma-core's own
tools seeing it."""

import pytest

from ifec import rxe

pytestmark = [pytest.mark.skipif(bool(rxe.unavailable()), reason=rxe.unavailable() or "available"),
              pytest.mark.timeout(600, method="signal")]


def test_a_guest_brings_up_an_rxe_device_that_rdma_core_sees():
    status, out = rxe.boot("ibv_devices\nibv_devinfo -v | grep -E 'state|active_mtu|GID'\nexit 3\n",
                           ip="10.0.0.1/24")
    text = "\n".join(out)
    assert status == 3, text  # the script's own exit status comes back
    assert "IFEC-GUEST rxe0 up" in text, text
    assert "rxe0" in text and "PORT_ACTIVE" in text, text
    # RoCEv2 is GID index 1, ::ffff:<ip> (perftest -x 1, ibv_rc_pingpong -g 1).
    assert "::ffff:10.0.0.1" in text, text
