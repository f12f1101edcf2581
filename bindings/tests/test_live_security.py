"""Mutual TLS and roles on the live testbed (superpod-8x2): the security matrix (every kind of caller against a
switchd and a hostd, as control.proto's roles table says), and an AllReduce with mTLS on equal to one without.

Each test brings its own fabric up and down (the second one plaintext): the two cannot be up at once."""

import numpy as np
import pytest

from conftest import live_marks
from ifec import live, security

TOPO = "testbed/topologies/superpod-8x2.yaml"
pytestmark = live_marks(300)
INPUTS = {g: np.random.default_rng(g).integers(-1 << 20, 1 << 20, 16384, dtype=np.int32).tobytes() for g in range(8)}
OUTPUTS = {}


def _allreduce(fab):
    row = fab.run("allreduce", algo="ifec", dtype="int32", inputs=INPUTS)
    assert row["ok"], row.get("error")
    want = sum(np.frombuffer(b, dtype=np.int32).astype(np.int64) for b in INPUTS.values()).astype(np.int32)
    for g, out in row["outputs"].items():
        assert np.array_equal(np.frombuffer(out, dtype=np.int32), want), f"GPU {g}"
    return row["outputs"]


def test_every_caller_is_refused_or_served_as_the_roles_table_says(repo, tmp_path):
    table = {s: live.rpc_roles(s) for s in ("Switch", "Host")}
    # The table itself: the rows.
    assert table["Switch"]["SetLoss"] == table["Switch"]["SetLink"] == {"operator"}
    assert "viewer" not in table["Switch"]["SetLoss"] and "rank" not in table["Host"]["SetLink"]
    assert table["Host"]["Run"] == {"rank"} and "viewer" in table["Switch"]["Routes"]
    fab = live.LiveFabric(repo / TOPO, log_dir=tmp_path / "logs", ready_timeout=90)
    fab.up(progress=lambda line: None)
    try:
        assert (fab.tls_dir / "ca.pem").exists() and oct((fab.tls_dir / "ca.key").stat().st_mode)[-3:] == "600"
        OUTPUTS["tls"] = _allreduce(fab)  # every rank's hostd over mutual TLS; it also makes window 1
        lines = []
        rows = security.matrix(fab, progress=lines.append)
        print(lines[0])
        cell = {(r["who"], r["rpc"]): r for r in rows}
        assert all(r["ok"] for r in rows), lines[0]
        for who in security.HANDSHAKE_REFUSED:
            assert cell[(who, "Switch.Status")]["got"] == "refused"
        assert cell[("viewer", "Switch.SetLoss")]["got"] == "denied"
        assert "role viewer" in cell[("viewer", "Switch.SetLoss")]["detail"]
        assert "Switch.SetLoss" in cell[("viewer", "Switch.SetLoss")]["detail"]
        assert cell[("rank", "Switch.SetLink")]["got"] == cell[("rank", "Host.SetLink")]["got"] == "denied"
        assert cell[("operator", "Switch.SetLoss")]["got"] == cell[("operator", "Switch.SetLink")]["got"] == "allowed"
        assert cell[("rank", "Host.ReadWindow")]["got"] == "allowed"
        assert cell[("rank of job 2", "Host.ReadWindow")]["got"] == "denied"
        assert cell[("no role", "Host.Status")]["got"] == "denied"
        assert cell[("daemon", "Switch.Reserve")]["got"] == "allowed"  # the handler refused the empty reservation
    finally:
        fab.down()


def test_an_allreduce_with_mtls_equals_one_without(repo, tmp_path):
    if "tls" not in OUTPUTS:
        pytest.skip("the mTLS run did not complete")
    fab = live.LiveFabric(repo / TOPO, log_dir=tmp_path / "logs", ready_timeout=90, insecure=True)
    fab.up(progress=lambda line: None)
    try:
        assert fab.tls_dir is None
        assert "WARNING: --insecure" in (tmp_path / "logs" / "p0-sw.log").read_text()
        assert _allreduce(fab) == OUTPUTS["tls"]
    finally:
        fab.down()
