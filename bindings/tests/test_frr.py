"""FARE over BGP against FRR (Debian's bgpd and zebra): the configuration FRR is given, then the whole interop matrix
of `./ifec interop frr` on the live fabric (FRR as a switch and as a GPU; healthy, half-failed Y-cable, failed
plane, FRR killed and started again; malformed UPDATEs both ways; captures decoded by tshark), every row passing."""

import pytest

from ifec import _native, frr, frr_interop, live

TOPO = "testbed/topologies/superpod-8x2.yaml"


def test_frrs_configuration_peers_on_every_link_with_our_numbering(repo):
    topo = _native.load_topology(str(repo / TOPO))
    gpu = frr.bgpd_config(topo, "gpu3", "/tmp/x.log")
    # AS 4200000000 + node index, loopback as router id, a neighbour per sub-link at the /29 plan's far end.
    assert "router bgp 4200000003" in gpu and "bgp router-id 10.0.0.4" in gpu, gpu
    links = [l for l in topo.links if "gpu3" in (l["a"], l["b"])]
    for l in links:
        peer = l["b"] if l["a"] == "gpu3" else l["a"]
        idx = next(n["index"] for n in topo.nodes if n["name"] == peer)
        assert f"neighbor {frr.link_address(l, peer)} remote-as {4200000000 + idx}" in gpu, gpu
    # A stub: only its loopback goes out, with its bundle's bandwidth (800 Gb/s written as FRR's 800 Mb/s).
    assert "set extcommunity bandwidth 800" in gpu and "match ip address prefix-list OWN" in gpu, gpu
    assert gpu.count("route-map STUB-800 out") == len(links), gpu
    switch = frr.bgpd_config(topo, "p1-sw", "/tmp/x.log")
    assert "route-map" not in switch and "bgp bestpath as-path multipath-relax" in switch, switch
    assert switch.count("remote-as") == sum(1 for l in topo.links if "p1-sw" in (l["a"], l["b"])), switch


def test_a_bundle_frr_cannot_express_is_named(repo):
    paced = _native.load_topology(str(repo / "testbed/topologies/paced-4x2.yaml"))  # 20 Mb/s bundles
    with pytest.raises(ValueError, match="gpu0: a bundle of 0.02 Gb/s is not a bandwidth FRR"):
        frr.bgpd_config(paced, "gpu0", "/tmp/x.log")


def test_a_node_not_there_or_a_name_that_would_write_configuration_is_named(repo):
    """A missing node raised a bare StopIteration; a name with a newline or a quote wrote bgpd lines and shell of its
    own (container_command runs under bash in the FRR container)."""
    topo = _native.load_topology(str(repo / TOPO))
    for make in (frr.bgpd_config, frr.container_command):
        with pytest.raises(ValueError, match="no node 'gpu99' in topology superpod-8x2"):
            make(topo, "gpu99")
    def tiny(name):
        return _native.parse_topology(f"""name: tiny
planes: 1
link_defaults: {{rate_gbps: 800, subports: 1, delay_ns: 500}}
gpus: [gpu0, "{name}"]
switches: [{{name: sw, plane: 0}}]
links: [{{a: gpu0, b: sw}}, {{a: "{name}", b: sw}}]
""")
    with pytest.raises(ValueError, match="node name 'g'; touch"):  # the loader refuses it first
        tiny("g'; touch /tmp/x; echo '")
    for make in (frr.bgpd_config, frr.container_command):
        for node in ("gpu0", "0gpu"):  # its own name, or a neighbour's (the session's description)
            with pytest.raises(ValueError, match="node name '0gpu'"):
                make(tiny("0gpu"), node)


@pytest.mark.skipif(bool(frr.unavailable()), reason=frr.unavailable() or "available")
@pytest.mark.skipif(bool(live.unavailable()), reason=live.unavailable() or "available")
@pytest.mark.timeout(400, method="signal")
def test_the_interop_matrix_passes_every_row():
    rows, seconds = frr_interop.interop(progress=print)
    bad = [r for r in rows if not r["ok"]]
    assert not bad, frr_interop.table(rows)
    roles = {r["role"] for r in rows}
    assert {"FRR as switch (p1-sw)", "FRR as gpu (gpu7)", "malformed UPDATE -> ifec (gpu0)",
            "malformed UPDATE -> ifec (p0-sw)"} <= roles, roles
    assert sum(1 for r in rows if r["role"].startswith("capture")) == 4, frr_interop.table(rows)
