"""Blocking conveniences over ifec.Cluster's non-blocking transactions (C++ keeps the real work)."""

import numbers

from ifec import _args
from ifec._native import OpStatus

DEFAULT_LIMIT_NS = 1_000_000_000
_U64 = 2**64 - 1


class TransactionError(RuntimeError):
    """A transaction completed with an error status; the message names the status and the operation."""


def _check(cluster, handle, what, limit_ns):
    if not cluster.wait([handle], limit_ns):
        raise TimeoutError(f"{what} did not complete within {limit_ns} ns of simulated time")
    if handle.status != OpStatus.OK:
        raise TransactionError(f"{what}: {handle.status.name} {handle.error}")
    return handle


def _gpu(value, name):
    """A GPU index as an int (the cluster names one outside its GPUs, with their range)."""
    return _args.whole(value, name, -2**31, 2**31 - 1)


def _where(gpu, peer, window, offset, limit_ns):
    """The arguments every transaction takes, as the native layer's types, each refused naming it (pybind11 answered
    1.5, -1 or 2^64 with a bare 'incompatible function arguments')."""
    return (_gpu(gpu, "gpu"), _gpu(peer, "peer"),
            _args.whole(window, "window", 0, 65535), _args.whole(offset, "offset", 0, _U64),
            _args.whole(limit_ns, "limit_ns", 0, _U64))


def _data(data, name="data"):
    """The bytes to send: bytes-like, or a sequence of byte values (an int made that many zero bytes; a str failed
    without a name)."""
    if isinstance(data, (str, numbers.Number)):
        raise TypeError(f"{name}={data!r}: expected bytes (or a bytes-like object)")
    try:
        return bytes(data)
    except (TypeError, ValueError):  # bytes() named neither the argument nor the value ("must be in range(0, 256)")
        pass
    items = list(data) if isinstance(data, (list, tuple)) else []
    bad = next((v for v in items if not isinstance(v, numbers.Integral) or not 0 <= v <= 255), data)
    error = ValueError if isinstance(bad, numbers.Integral) else TypeError
    raise error(f"{name}: {bad!r} is not a byte value (expected bytes, or a sequence of whole numbers in 0..255)")


def store(cluster, gpu, peer, window, offset, data, limit_ns=DEFAULT_LIMIT_NS):
    gpu, peer, window, offset, limit_ns = _where(gpu, peer, window, offset, limit_ns)
    _check(cluster, cluster.store(gpu, peer, window, offset, _data(data)), f"store {gpu}->{peer}", limit_ns)


def load(cluster, gpu, peer, window, offset, length, limit_ns=DEFAULT_LIMIT_NS):
    gpu, peer, window, offset, limit_ns = _where(gpu, peer, window, offset, limit_ns)
    pending = cluster.load(gpu, peer, window, offset, _args.whole(length, "length", 0, _U64))
    _check(cluster, pending.handle, f"load {gpu}<-{peer}", limit_ns)
    return pending.data()


def fetch_add(cluster, gpu, peer, window, offset, add, limit_ns=DEFAULT_LIMIT_NS):
    gpu, peer, window, offset, limit_ns = _where(gpu, peer, window, offset, limit_ns)
    h = cluster.fetch_add(gpu, peer, window, offset, _args.whole(add, "add", 0, _U64))
    return _check(cluster, h, "fetch_add", limit_ns).result


def compare_swap(cluster, gpu, peer, window, offset, compare, swap, limit_ns=DEFAULT_LIMIT_NS):
    gpu, peer, window, offset, limit_ns = _where(gpu, peer, window, offset, limit_ns)
    h = cluster.compare_swap(gpu, peer, window, offset, _args.whole(compare, "compare", 0, _U64),
                             _args.whole(swap, "swap", 0, _U64))
    return _check(cluster, h, "compare_swap", limit_ns).result


def put_signal(cluster, gpu, peer, window, offset, data, sig_window, sig_offset, signal, add=False,
               limit_ns=DEFAULT_LIMIT_NS):
    gpu, peer, window, offset, limit_ns = _where(gpu, peer, window, offset, limit_ns)
    h = cluster.put_signal(gpu, peer, window, offset, _data(data), _args.whole(sig_window, "sig_window", 0, 65535),
                           _args.whole(sig_offset, "sig_offset", 0, _U64), _args.whole(signal, "signal", 0, _U64),
                           _args.flag(add, "add"))
    _check(cluster, h, f"put_signal {gpu}->{peer}", limit_ns)


def quiet(cluster, gpu, limit_ns=DEFAULT_LIMIT_NS):
    gpu, limit_ns = _gpu(gpu, "gpu"), _args.whole(limit_ns, "limit_ns", 0, _U64)
    _check(cluster, cluster.quiet(gpu), f"quiet on GPU {gpu}", limit_ns)
