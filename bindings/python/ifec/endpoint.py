"""Blocking conveniences over ifec.Cluster's non-blocking transactions (C++ keeps the real work)."""

from ifec._native import OpStatus

DEFAULT_LIMIT_NS = 1_000_000_000


class TransactionError(RuntimeError):
    """A transaction completed with an error status; the message names the status and the operation."""


def _check(cluster, handle, what, limit_ns):
    if not cluster.wait([handle], limit_ns):
        raise TimeoutError(f"{what} did not complete within {limit_ns} ns of simulated time")
    if handle.status != OpStatus.OK:
        raise TransactionError(f"{what}: {handle.status.name} {handle.error}")
    return handle


def store(cluster, gpu, peer, window, offset, data, limit_ns=DEFAULT_LIMIT_NS):
    _check(cluster, cluster.store(gpu, peer, window, offset, bytes(data)), f"store {gpu}->{peer}", limit_ns)


def load(cluster, gpu, peer, window, offset, length, limit_ns=DEFAULT_LIMIT_NS):
    pending = cluster.load(gpu, peer, window, offset, length)
    _check(cluster, pending.handle, f"load {gpu}<-{peer}", limit_ns)
    return pending.data()


def fetch_add(cluster, gpu, peer, window, offset, add, limit_ns=DEFAULT_LIMIT_NS):
    return _check(cluster, cluster.fetch_add(gpu, peer, window, offset, add), "fetch_add", limit_ns).result


def compare_swap(cluster, gpu, peer, window, offset, compare, swap, limit_ns=DEFAULT_LIMIT_NS):
    h = cluster.compare_swap(gpu, peer, window, offset, compare, swap)
    return _check(cluster, h, "compare_swap", limit_ns).result


def put_signal(cluster, gpu, peer, window, offset, data, sig_window, sig_offset, signal, add=False,
               limit_ns=DEFAULT_LIMIT_NS):
    h = cluster.put_signal(gpu, peer, window, offset, bytes(data), sig_window, sig_offset, signal, add)
    _check(cluster, h, f"put_signal {gpu}->{peer}", limit_ns)


def quiet(cluster, gpu, limit_ns=DEFAULT_LIMIT_NS):
    _check(cluster, cluster.quiet(gpu), f"quiet on GPU {gpu}", limit_ns)
