"""Transactions from Python over the simulated SuperPoD, checked against numpy references, under loss."""

import numpy as np
import pytest

import ifec
from ifec import endpoint as ep

DATA, COUNTERS = 1, 2


def make(ordering, loss=0.0, lb="packet"):
    c = ifec.Cluster(ifec.make_superpod(4, 2), ordering=ordering, loss=loss, lb=lb, seed=3)
    c.allocate_window(DATA, 1 << 20)
    c.allocate_window(COUNTERS, 4096)
    return c


@pytest.mark.parametrize("ordering", ["weak", "partial", "strong"])
@pytest.mark.parametrize("loss", [0.0, 0.01, 0.05])
def test_store_load_atomics_match_numpy(ordering, loss):
    c = make(ordering, loss)
    rng = np.random.default_rng(7)
    arr = rng.standard_normal(40_000).astype(np.float32)  # 160 KB: 40 packets over several QPs
    ep.store(c, 0, 3, DATA, 1024, arr.tobytes())
    assert c.window_bytes(3, DATA, 1024, arr.nbytes) == arr.tobytes()
    back = np.frombuffer(ep.load(c, 1, 3, DATA, 1024, arr.nbytes), dtype=np.float32)
    np.testing.assert_array_equal(back, arr)
    handles = [c.fetch_add(src, 2, COUNTERS, 0, src + 1) for src in range(4) for _ in range(10)]
    assert c.wait(handles)
    assert all(h.ok for h in handles)
    total = int.from_bytes(c.window_bytes(2, COUNTERS, 0, 8), "little")
    assert total == 10 * (1 + 2 + 3 + 4)
    assert sorted(h.result for h in handles if True)[0] == 0
    assert ep.compare_swap(c, 1, 2, COUNTERS, 0, total, 99) == total
    assert int.from_bytes(c.window_bytes(2, COUNTERS, 0, 8), "little") == 99
    ep.put_signal(c, 0, 1, DATA, 0, b"x" * 9000, COUNTERS, 8, 5, add=True)
    assert int.from_bytes(c.window_bytes(1, COUNTERS, 8, 8), "little") == 5
    assert c.barrier()
    if loss > 0:
        assert sum(c.counters(g)["retransmits"] + c.counters(g)["timeouts"] for g in range(4)) > 0


def test_protection_violation_reported_and_memory_unchanged():
    c = make("partial")
    va, rkey, size = c.window_va_rkey(1, DATA)
    before = c.window_bytes(1, DATA, 0, 4096)
    h = c.store_raw(0, 1, 0, va + size - 10, rkey, b"y" * 100)  # runs 90 bytes past the window
    assert c.wait([h])
    assert h.status == ifec.OpStatus.REMOTE_ACCESS_ERROR
    assert c.window_bytes(1, DATA, 0, 4096) == before
    assert c.counters(1)["access_naks_sent"] >= 1


def test_bad_arguments_raise_or_fail_with_the_value_named():
    c = make("weak")
    h = c.store(0, 1, DATA, (1 << 20) - 4, b"12345678")
    assert h.status == ifec.OpStatus.INVALID_ARGUMENT and "out of bounds" in h.error
    # A load its window cannot hold fails at once, its buffer never made (2^40 bytes: std::bad_alloc before).
    for peer, window, named in [(1, DATA, "out of bounds"), (99, DATA, "peer 99 outside"), (1, 77, "not registered")]:
        p = c.load(0, peer, window, 0, 1 << 40)
        assert c.wait([p.handle]) and p.handle.status == ifec.OpStatus.INVALID_ARGUMENT and named in p.handle.error
        assert len(p.data()) == 0
    with pytest.raises(ep.TransactionError, match="aligned"):
        ep.fetch_add(c, 0, 1, COUNTERS, 3, 1)
    with pytest.raises(ValueError, match="GPU 9"):
        c.store(9, 1, DATA, 0, b"x")
    with pytest.raises(ValueError, match="sideways"):
        ifec.Cluster(ifec.make_superpod(4, 2), ordering="sideways")


def test_binding_arguments_are_checked_not_dereferenced():
    c = make("weak")
    with pytest.raises(ValueError, match=r"handles\[1\] is None"):
        c.wait([c.quiet(0), None])  # was a segmentation fault
    with pytest.raises(ValueError, match="planes -1 outside 0..2"):
        ifec.Cluster(ifec.make_superpod(4, 2), planes=-1)
    with pytest.raises(ValueError, match="planes 3 outside 0..2"):
        ifec.Cluster(ifec.make_superpod(4, 2), planes=3)
    with pytest.raises(ValueError, match="member GPU 7"):
        c.run_endpoint_collective("allreduce", [0, 7], 0, DATA, 0, 4, "fp32", "sum", COUNTERS)
    with pytest.raises(TypeError):
        c.store(0, 1, DATA, -1, b"x")  # a negative offset is not a uint64: refused before C++ sees it


def test_transaction_arguments_are_named_not_taken_for_something_else():
    """An int as data stored that many zero bytes, and a str, 1.5, -1, 2^64 or a NaN limit failed in pybind11 naming
    none of them; add=2 was taken for True."""
    c = make("weak")
    with pytest.raises(TypeError, match="data=5: expected bytes"):
        ep.store(c, 0, 1, DATA, 0, 5)
    with pytest.raises(TypeError, match="data='abc': expected bytes"):
        ep.store(c, 0, 1, DATA, 0, "abc")
    assert c.window_bytes(1, DATA, 0, 5) == bytes(5)  # nothing stored
    for call, named in [(lambda: ep.store(c, 0, 1, DATA, 0, b"x", limit_ns=float("nan")), "limit_ns=nan"),
                        (lambda: ep.store(c, 1.5, 1, DATA, 0, b"x"), "gpu=1.5"),
                        (lambda: ep.store(c, 0, 1, 70000, 0, b"x"), "window=70000 outside 0..65535"),
                        (lambda: ep.load(c, 0, 1, DATA, -1, 8), "offset=-1"),
                        (lambda: ep.load(c, 0, 1, DATA, 0, -8), "length=-8"),
                        (lambda: ep.fetch_add(c, 0, 1, COUNTERS, 0, 2**64), "add=18446744073709551616"),
                        (lambda: ep.compare_swap(c, 0, 1, COUNTERS, 0, 0, -1), "swap=-1"),
                        (lambda: ep.put_signal(c, 0, 1, DATA, 0, b"x", COUNTERS, 8, 5, add=2), "add=2"),
                        (lambda: ep.quiet(c, 0, limit_ns=True), "limit_ns=True")]:
        with pytest.raises((TypeError, ValueError), match=named):
            call()
    # Valid input as before: bytes-like data of any kind, an integral float limit, the cluster naming a bad GPU.
    ep.store(c, 0, 1, DATA, 0, np.arange(4, dtype=np.uint8))
    ep.store(c, 0, 1, DATA, 4, [5, 6], limit_ns=1e9)
    assert ep.load(c, 2, 1, DATA, 0, 6) == bytes([0, 1, 2, 3, 5, 6])
    with pytest.raises(ValueError, match="GPU 9 outside 0..3"):
        ep.quiet(c, 9)


def test_a_fence_on_a_negative_peer_other_than_every_peer_is_named():
    """-5 was taken for -1 (every peer)."""
    c = make("weak")
    c.fence(0, -1)
    with pytest.raises(ifec.IfecError, match=r"fence: peer -5 outside 0..3 \(-1: every peer\)"):
        c.fence(0, -5)


def test_the_runtimes_own_windows_cannot_be_allocated_from_python():
    """Re-allocating the harness's barrier window (0xFFF0) as 1 byte made every later barrier time out."""
    c = make("weak")
    with pytest.raises(ifec.IfecError, match="allocate_window: window id 65520 is reserved for the runtime"):
        c.allocate_window(0xFFF0, 1)
    assert c.barrier()
    c.allocate_window(0xFEFF, 64)  # the last free id


def test_scratch_bytes_names_a_member_outside_the_cluster():
    """A member 9 (or -1) of 4 GPUs was sized as if it were one."""
    c = make("weak")
    for member in (9, -1):
        with pytest.raises(ifec.IfecError, match=f"member GPU {member} outside 0..3"):
            c.scratch_bytes("allreduce", [0, member], 16, "fp32")


def test_data_of_values_that_are_not_bytes_is_named():
    """bytes([1, 2, 300]) said only 'bytes must be in range(0, 256)': neither the argument nor the value."""
    c = make("weak")
    with pytest.raises(ValueError, match=r"data: 300 is not a byte value \(expected bytes, or a sequence"):
        ep.store(c, 0, 1, DATA, 0, [1, 2, 300])
    with pytest.raises(TypeError, match="data: 2.5 is not a byte value"):
        ep.store(c, 0, 1, DATA, 0, [1, 2.5])
