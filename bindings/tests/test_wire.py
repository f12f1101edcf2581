"""The native frame parser against frames built independently in Python, and its handling of bad input."""

import struct

import pytest

import ifec
import roce_ref


def test_parse_hand_built_write_only():
    payload = bytes(range(37))
    frame = roce_ref.build_write_only(qp=0xABCDE, psn=0x123456, va=0x7F00_0000_1000, rkey=0x55AA, payload=payload)
    d = ifec.parse_frame(frame)
    assert d["opcode_name"] == "RDMA_WRITE_ONLY"
    assert d["dest_qp"] == 0xABCDE
    assert d["psn"] == 0x123456
    assert d["va"] == 0x7F00_0000_1000
    assert d["rkey"] == 0x55AA
    assert d["dma_length"] == 37
    assert d["payload_size"] == 37
    assert d["pad_count"] == 3
    assert d["icrc"] == roce_ref.icrc(frame)


@pytest.mark.parametrize("name,frame", ifec.sample_frames())
def test_native_icrc_equals_reference(name, frame):
    assert roce_ref.stored_icrc(frame) == roce_ref.icrc(frame), name
    ip = frame[14:-4]
    assert ifec.compute_icrc(ip, roce_ref.bth_offset_in_ip(frame[14:])) == roce_ref.icrc(frame), name
    assert roce_ref.ipv4_checksum(frame[14:34]) == 0, f"{name}: IPv4 header checksum"


def test_every_kind_is_sampled():
    names = {n for n, _ in ifec.sample_frames()}
    for needed in ["rdma_write_first", "rdma_write_middle", "rdma_write_last", "rdma_write_only",
                   "rdma_read_request", "rdma_read_response_only", "fetch_add", "fetch_add_ack", "compare_swap",
                   "compare_swap_ack", "ack", "nak_psn_sequence_error", "ech_compact_multicast",
                   "ech_standard_allreduce"]:
        assert needed in names


@pytest.mark.parametrize(
    "edit,error",
    [
        (lambda f: f[:30], "truncated"),
        (lambda f: f[:12] + b"\x86\xdd" + f[14:], "bad_ethertype"),
        (lambda f: f[:-1] + bytes([f[-1] ^ 1]), "bad_icrc"),
        (lambda f: f[:24] + bytes([f[24] ^ 0xFF]) + f[25:], "bad_ip_checksum"),
        (lambda f: b"", "truncated"),
        (lambda f: f + b"\x00" * 10000, "oversized"),
    ],
)
def test_malformed_frames_raise_value_error_naming_the_problem(edit, error):
    frame = roce_ref.build_write_only(qp=1, psn=2, va=3, rkey=4, payload=b"x" * 64)
    with pytest.raises(ValueError, match=error):
        ifec.parse_frame(edit(frame))


def test_ech_fields_decoded():
    frames = dict(ifec.sample_frames())
    compact = ifec.parse_frame(frames["ech_compact_multicast"])["ech"]
    assert compact == {"format": "compact", "op": "multicast", "flags": 0, "window_id": 3, "source_id": 1,
                       "dest_bitmap": (1 << 2) | (1 << 5) | (1 << 63)}
    std = ifec.parse_frame(frames["ech_standard_allreduce"])
    assert std["udp_dst_port"] == ifec.ECH_PORT
    assert std["ech"]["job_id"] == 7 and std["ech"]["group_id"] == 2 and std["ech"]["chunk_index"] == 9
    assert std["ech"]["dtype"] == "bf16" and std["ech"]["element_count"] * 2 == std["payload_size"]
    raw = frames["ech_standard_allreduce"]
    assert struct.unpack("!H", raw[36:38])[0] == ifec.ECH_PORT


def test_protocol_helpers_refuse_values_outside_their_fields():
    """A job beyond the 15-bit P_Key or a QP beyond 24 bits was folded into a valid-looking number."""
    from ifec import _native as native
    assert native.pkey_of_job(5) == 0x8005 and native.rc_qpn(3, 1) == 0x100 + 3 * 64 + 1
    for call, named in [(lambda: native.pkey_of_job(1 << 20), "job 1048576 does not fit the 15-bit P_Key"),
                        (lambda: native.rc_qpn(1 << 24, 0), "peer 16777216 outside"),
                        (lambda: native.rc_qpn(3, 64), "index 64 outside 0..63"),
                        (lambda: native.window_va_rkey(-1, 0), "endpoint -1 outside")]:
        with pytest.raises(ifec.IfecError, match=named):
            call()


def test_an_icrc_offset_that_wraps_is_refused():
    """bth_offset + 12 wrapped past 2^64 and passed the check: a value was computed from outside the buffer."""
    from ifec import _native as native
    with pytest.raises(ifec.IfecError, match="compute_icrc: bth_offset 18446744073709551615 with 300 bytes"):
        native.compute_icrc(b"\x45" + bytes(299), 2**64 - 1)
