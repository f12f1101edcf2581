"""An independent reference for the wire formats, written from the specs in plain Python (struct + zlib).

Nothing here calls the project's C++ code: tests compare the two.
"""

import struct
import zlib

ROCEV2_PORT = 4791
ECH_PORT = 4793
ETH_LEN = 14


def ipv4_checksum(header: bytes) -> int:
    s = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def bth_offset_in_ip(ip: bytes) -> int:
    """Offset of the BTH from the start of the IPv4 header (skips the ECH on the ECH port)."""
    ihl = (ip[0] & 0x0F) * 4
    dport = struct.unpack("!H", ip[ihl + 2 : ihl + 4])[0]
    off = ihl + 8
    if dport == ECH_PORT:
        off += ip[off + 3] * 4
    elif dport != ROCEV2_PORT:
        raise ValueError(f"UDP destination port {dport} is neither RoCEv2 nor ECH")
    return off


def icrc(frame: bytes) -> int:
    """ICRC per IBTA Annex A17: CRC-32 over 8 bytes of 0xFF and the IP datagram up to the ICRC, with
    IPv4 TOS, TTL and header checksum, UDP checksum and BTH byte 4 (FECN/BECN/reserved) replaced by ones."""
    ip = bytearray(frame[ETH_LEN:-4])
    ihl = (ip[0] & 0x0F) * 4
    bth = bth_offset_in_ip(bytes(ip) + frame[-4:])
    ip[1] = 0xFF
    ip[8] = 0xFF
    ip[10:12] = b"\xff\xff"
    ip[ihl + 6 : ihl + 8] = b"\xff\xff"
    ip[bth + 4] = 0xFF
    return zlib.crc32(b"\xff" * 8 + bytes(ip)) & 0xFFFFFFFF


def stored_icrc(frame: bytes) -> int:
    return struct.unpack("<I", frame[-4:])[0]


def build_write_only(qp: int, psn: int, va: int, rkey: int, payload: bytes, src_port: int = 0xC000) -> bytes:
    """A complete RDMA WRITE ONLY frame, built field by field."""
    pad = (4 - len(payload) % 4) % 4
    bth = struct.pack("!BBHB3sB3s", 0x0A, 0x40 | (pad << 4), 0xFFFF, 0, qp.to_bytes(3, "big"), 0x80,
                      psn.to_bytes(3, "big"))
    reth = struct.pack("!QII", va, rkey, len(payload))
    body = bth + reth + payload + b"\x00" * pad
    udp_len = 8 + len(body) + 4
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, (26 << 2) | 2, 20 + udp_len, 0, 0x4000, 64, 17, 0,
                               bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])))
    ip[10:12] = struct.pack("!H", ipv4_checksum(bytes(ip)))
    udp = struct.pack("!HHHH", src_port, ROCEV2_PORT, udp_len, 0)
    eth = bytes.fromhex("020000000002" "020000000001" "0800")
    frame = eth + bytes(ip) + udp + body + b"\x00\x00\x00\x00"
    return frame[:-4] + struct.pack("<I", icrc(frame))
