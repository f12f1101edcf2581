"""Reading classic pcap files (microsecond or nanosecond magic, either byte order) without third-party packages."""

import struct

_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1000),
    b"\xa1\xb2\xc3\xd4": (">", 1000),
    b"\x4d\x3c\xb2\xa1": ("<", 1),
    b"\xa1\xb2\x3c\x4d": (">", 1),
}
_PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
_HEADER_BYTES = 24
# libpcap's largest record for Ethernet (MAXIMUM_SNAPLEN): a header snaplen of 0 or above it reads as this one.
_MAX_SNAPLEN = 262144


def _check_header(path, head):
    """Raises ValueError naming the file and what its first bytes are when they are not a classic pcap header."""
    if not head:
        raise ValueError(f"{path}: empty file, expected a pcap file")
    if head[:4] == _PCAPNG_MAGIC:
        raise ValueError(f"{path}: a pcapng file, expected classic pcap (convert it: editcap -F pcap {path} OUT)")
    if head[:4] not in _MAGICS:
        raise ValueError(f"{path}: not a pcap file (magic {head[:4].hex()})")
    if len(head) < _HEADER_BYTES:
        raise ValueError(f"{path}: pcap header cut at byte {len(head)} of {_HEADER_BYTES}")


def _snaplen(header_snaplen):
    """The most bytes a record may hold: the header's snaplen, or libpcap's maximum where that is 0 or above it."""
    return header_snaplen if 0 < header_snaplen <= _MAX_SNAPLEN else _MAX_SNAPLEN


def read_pcap(path):
    """Returns [(timestamp_ns, frame_bytes)]; raises ValueError naming the file on a bad header, a cut record or a
    record longer than the snaplen. No writer makes such a record (PcapWriter cuts frames to its snaplen): it is a
    damaged length, which libpcap cuts to the snaplen or, past its maximum, refuses; here it is refused, named."""
    with open(path, "rb") as f:
        head = f.read(_HEADER_BYTES)
        _check_header(path, head)  # before the rest: /dev/zero or a large file that is no pcap is not read whole
        data = head + f.read()
    order, ns_per_unit = _MAGICS[data[:4]]
    snaplen, linktype = struct.unpack(order + "II", data[16:24])
    if linktype != 1:
        raise ValueError(f"{path}: link type {linktype}, expected 1 (Ethernet)")
    limit = _snaplen(snaplen)
    frames = []
    off = 24
    while off < len(data):
        if off + 16 > len(data):
            raise ValueError(f"{path}: record header cut at byte {off}")
        sec, frac, caplen, _ = struct.unpack(order + "IIII", data[off : off + 16])
        off += 16
        if off + caplen > len(data):
            raise ValueError(f"{path}: record of {caplen} bytes cut at byte {off}")
        if caplen > limit:
            why = "" if limit == snaplen else f" (libpcap's maximum for Ethernet; the header says {snaplen})"
            raise ValueError(f"{path}: record {len(frames) + 1} of {caplen} bytes at byte {off - 16}, above the "
                             f"snaplen of {limit}{why}")
        frames.append((sec * 1_000_000_000 + frac * ns_per_unit, data[off : off + caplen]))
        off += caplen
    return frames
