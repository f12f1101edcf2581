"""`./ifec pcap FILE` decoded by tshark: RoCE fields as encoded, ECH through the project's Lua dissector, and every
frame's ICRC recomputed from the pcap bytes by the independent reference in roce_ref.py."""

import shutil
import subprocess

import pytest

import ifec
import roce_ref
from ifec.pcap import read_pcap

# What the project encodes for each sample frame (common/src/samples.cpp), written out by hand.
VA = 0x00007F0012340000
RKEY = 0x00ABCDEF
EXPECTED = [
    dict(opcode=0x06, qp=0x123, psn=100, va=VA, rkey=RKEY, dmalen=2560),
    dict(opcode=0x07, qp=0x123, psn=101),
    dict(opcode=0x08, qp=0x123, psn=102),
    dict(opcode=0x0A, qp=0x123, psn=103, va=VA + 0x1000, rkey=RKEY, dmalen=61),
    dict(opcode=0x0C, qp=0x123, psn=104, va=VA + 0x2000, rkey=RKEY, dmalen=256),
    dict(opcode=0x10, qp=0x456, psn=104, syndrome=0x1F, msn=7),
    dict(opcode=0x14, qp=0x123, psn=105, va=VA + 0x3000, rkey=RKEY, swap=5, cmp=0),
    dict(opcode=0x12, qp=0x456, psn=105, syndrome=0x1F, msn=8, orig=41),
    dict(opcode=0x13, qp=0x123, psn=106, va=VA + 0x3008, rkey=RKEY, swap=0x1111222233334444, cmp=0x5555666677778888),
    dict(opcode=0x12, qp=0x456, psn=106, syndrome=0x1F, msn=9, orig=0x5555666677778888),
    dict(opcode=0x11, qp=0x456, psn=103, syndrome=0x1F, msn=6),
    dict(opcode=0x11, qp=0x456, psn=101, syndrome=0x60, msn=5),
    dict(opcode=0x0A, qp=0x123, psn=107, va=0x8000, rkey=0, dmalen=128,
         ech=dict(version=1, format=0, op=1, source_id=1, window_id=3, dest_bitmap=(1 << 2) | (1 << 5) | (1 << 63))),
    dict(opcode=0x0A, qp=0x123, psn=108, va=9 * 128, rkey=0, dmalen=128,
         ech=dict(version=1, format=1, op=3, job_id=7, group_id=2, contributor_id=4, chunk_index=9, dtype=2, redop=0,
                  element_count=64, window_id=1)),
    dict(opcode=0x0A, qp=0x123, psn=109, va=0x9000, rkey=0, dmalen=128,
         ech=dict(version=2, format=0, op=1, source_id=300, window_id=3, bitmap_base=256, dest_bitmap=(1 << 0) | (1 << 7))),
]

FIELDS = {
    "opcode": "infiniband.bth.opcode",
    "qp": "infiniband.bth.destqp",
    "psn": "infiniband.bth.psn",
    "va": "infiniband.reth.va",
    "rkey": "infiniband.reth.r_key",
    "dmalen": "infiniband.reth.dmalen",
    "syndrome": "infiniband.aeth.syndrome",
    "msn": "infiniband.aeth.msn",
    "swap": "infiniband.atomiceth.swapdt",
    "cmp": "infiniband.atomiceth.cmpdt",
    "orig": "infiniband.atomicacketh.origremdt",
    "icrc": "infiniband.invariant.crc",
    "udp_dport": "udp.dstport",
}
ECH_FIELDS = ["version", "format", "op", "source_id", "window_id", "bitmap_base", "dest_bitmap", "job_id", "group_id",
              "contributor_id", "chunk_index", "dtype", "redop", "element_count"]


def as_int(text):
    return int(text, 16) if text.startswith("0x") else int(text)


def tshark_fields(pcap, lua=None):
    if shutil.which("tshark") is None:
        pytest.fail("tshark is not installed: ./ifec setup installs it")
    keys = list(FIELDS) + ([f"ech.{k}" for k in ECH_FIELDS] if lua else [])
    cmd = ["tshark", "-r", str(pcap), "-T", "fields", "-E", "separator=\t", "-E", "occurrence=f"]
    if lua:
        cmd[1:1] = ["-X", f"lua_script:{lua}"]
    for k in keys:
        cmd += ["-e", FIELDS.get(k, k)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.rstrip("\n").split("\n"):
        values = line.split("\t")
        rows.append({k: as_int(v) for k, v in zip(keys, values) if v != ""})
    return rows


@pytest.fixture(scope="module")
def pcap(tmp_path_factory, repo, build_dir):
    path = tmp_path_factory.mktemp("pcap") / "samples.pcap"
    # Through the launcher, as a user would run it (setup and build are no-ops on a built tree).
    res = subprocess.run([str(repo / "ifec"), "pcap", str(path)], capture_output=True, text=True, timeout=600,
                         env={"IFEC_BUILD_DIR": str(build_dir), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert res.returncode == 0, res.stdout + res.stderr
    return path


def test_pcap_has_one_frame_per_expected_kind(pcap):
    frames = read_pcap(pcap)
    assert len(frames) == len(EXPECTED)
    opcodes = {f[roce_ref.ETH_LEN + roce_ref.bth_offset_in_ip(f[roce_ref.ETH_LEN:])] for _, f in frames}
    assert {0x06, 0x07, 0x08, 0x0A, 0x0C, 0x10, 0x11, 0x12, 0x13, 0x14} <= opcodes


def test_tshark_decodes_roce_fields_as_encoded(pcap, repo):
    rows = tshark_fields(pcap, lua=repo / "testbed" / "wireshark" / "ech.lua")
    assert len(rows) == len(EXPECTED)
    for i, (row, want) in enumerate(zip(rows, EXPECTED)):
        assert row["udp_dport"] == (roce_ref.ECH_PORT if "ech" in want else roce_ref.ROCEV2_PORT), f"frame {i + 1}"
        for key in ["opcode", "qp", "psn", "va", "rkey", "dmalen", "syndrome", "msn", "swap", "cmp", "orig"]:
            if key in want:
                assert row.get(key) == want[key], f"frame {i + 1} field {FIELDS[key]}: {row.get(key)} != {want[key]}"
        for key, value in want.get("ech", {}).items():
            assert row.get(f"ech.{key}") == value, f"frame {i + 1} field ech.{key}: {row.get(f'ech.{key}')} != {value}"


def test_without_lua_roce_decodes_and_ech_does_not(pcap):
    rows = tshark_fields(pcap)
    for i, want in enumerate(EXPECTED):
        if "ech" in want:
            assert "opcode" not in rows[i], "ECH frames need the dissector: UDP 4793 is the project's own port"
        else:
            assert rows[i]["opcode"] == want["opcode"], f"frame {i + 1} decoded as InfiniBand over UDP 4791"


def test_every_icrc_recomputed_from_pcap_bytes(pcap, repo):
    frames = read_pcap(pcap)
    rows = tshark_fields(pcap, lua=repo / "testbed" / "wireshark" / "ech.lua")
    for i, ((_, frame), row) in enumerate(zip(frames, rows)):
        assert roce_ref.stored_icrc(frame) == roce_ref.icrc(frame), f"frame {i + 1} ICRC mismatch"
        # tshark shows the ICRC bytes as a big-endian number; it must show the bytes the frame carries.
        assert row["icrc"] == int.from_bytes(frame[-4:], "big"), f"frame {i + 1} tshark ICRC"


def cut_udp_payload(frame, k):
    """The frame with its UDP payload cut to k bytes and the IPv4 and UDP lengths made consistent (a datagram that
    really is that short, so the UDP dissector hands it on)."""
    f = bytearray(frame[:roce_ref.ETH_LEN + 20 + 8 + k])
    f[roce_ref.ETH_LEN + 2:roce_ref.ETH_LEN + 4] = (20 + 8 + k).to_bytes(2, "big")
    f[roce_ref.ETH_LEN + 24:roce_ref.ETH_LEN + 26] = (8 + k).to_bytes(2, "big")
    f[roce_ref.ETH_LEN + 26:roce_ref.ETH_LEN + 28] = b"\0\0"
    return bytes(f)


def test_truncated_ech_frames_are_marked_malformed_not_lua_errors(tmp_path, repo):
    import struct
    samples = {name: bytes(b) for name, b in ifec.sample_frames() if name.startswith("ech")}
    cuts = [1, 3, 4, 8, 15, 16, 17, 23, 24, 30, 36]
    data = bytearray(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    for frame in samples.values():
        for k in cuts:
            f = cut_udp_payload(frame, k)
            data += struct.pack("<IIII", 0, 0, len(f), len(f)) + f
    path = tmp_path / "truncated.pcap"
    path.write_bytes(bytes(data))
    out = subprocess.run(["tshark", "-X", f"lua_script:{repo / 'testbed' / 'wireshark' / 'ech.lua'}", "-r", str(path),
                          "-V"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Lua Error" not in out.stdout + out.stderr
    frames = out.stdout.split("\nFrame ")
    assert len(frames) == len(samples) * len(cuts)
    for i, text in enumerate(frames):
        assert "Error/Malformed" in text, f"truncated frame {i + 1} not marked malformed:\n{text[-600:]}"


# ------------------------------------------------------------------------------ read_pcap on malformed files --

def _pcap_header(magic=0xA1B23C4D, snaplen=65535, linktype=1):
    import struct
    return struct.pack("<IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype)


def _record(caplen, data=b""):
    import struct
    return struct.pack("<IIII", 1, 2, caplen, caplen) + data


@pytest.mark.parametrize("content, named", [
    (b"", "empty file, expected a pcap file"),
    (_pcap_header()[:10], "pcap header cut at byte 10 of 24"),  # the magic is right: it was called "not a pcap file"
    (bytes.fromhex("0a0d0d0a1c000000") + bytes(20), "a pcapng file, expected classic pcap"),
    (b"hello, not a capture at all\n", "not a pcap file (magic 68656c6c)"),
    (_pcap_header(linktype=101), "link type 101, expected 1"),
    (_pcap_header() + _record(4, b"abcd")[:10], "record header cut at byte 24"),
    (_pcap_header() + _record(0xFFFFFFFF, b"abcd"), "record of 4294967295 bytes cut at byte 40"),
])
def test_read_pcap_names_the_file_and_what_is_wrong(tmp_path, content, named):
    path = tmp_path / "bad.pcap"
    path.write_bytes(content)
    with pytest.raises(ValueError) as err:
        read_pcap(path)
    assert str(err.value).startswith(f"{path}: ") and named in str(err.value)


def test_read_pcap_refuses_an_endless_device_by_its_first_bytes():
    """/dev/zero was read whole: until memory ran out (MemoryError, or the machine swapping)."""
    with pytest.raises(ValueError, match=r"/dev/zero: not a pcap file \(magic 00000000\)"):
        read_pcap("/dev/zero")


@pytest.mark.parametrize("snaplen", [0, 0xFFFFFFFF])
def test_read_pcap_takes_any_snaplen_the_records_fit(tmp_path, snaplen):
    path = tmp_path / "snap.pcap"
    path.write_bytes(_pcap_header(snaplen=snaplen) + _record(4, b"abcd"))
    assert read_pcap(path) == [(1_000_000_002, b"abcd")]


@pytest.mark.parametrize("snaplen,records,says", [
    (64, [b"a" * 64, b"b" * 65], "record 2 of 65 bytes at byte 104, above the snaplen of 64"),
    (0, [b"c" * 262145], "record 1 of 262145 bytes at byte 24, above the snaplen of 262144 (libpcap's maximum for "
                         "Ethernet; the header says 0)"),
    (0xFFFFFFFF, [b"d" * 262145], "above the snaplen of 262144 (libpcap's maximum for Ethernet; the header says "
                                  "4294967295)"),
])
def test_read_pcap_refuses_a_record_longer_than_the_snaplen(tmp_path, snaplen, records, says):
    """A record past the header's snaplen (no writer makes one: a damaged length) was returned as a frame."""
    path = tmp_path / "oversize.pcap"
    path.write_bytes(_pcap_header(snaplen=snaplen) + b"".join(_record(len(r), r) for r in records))
    with pytest.raises(ValueError) as err:
        read_pcap(path)
    assert str(err.value).startswith(f"{path}: ") and says in str(err.value)


def test_a_written_pcap_reads_back_within_its_snaplen(tmp_path):
    """The project's writer (PcapWriter, snaplen 65535) never writes a record the reader refuses."""
    path = tmp_path / "samples.pcap"
    ifec.write_sample_pcap(str(path))
    frames = read_pcap(path)
    assert frames and all(len(f) <= 65535 for _, f in frames)
