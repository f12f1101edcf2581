"""FRR in the containerized testbed: superpod-8x2's compose file with p1-sw run by FRR's bgpd and zebra (the
ifec-frr image) instead of ifec-switchd. Its sessions with every GPU's stub speaker come up, it learns every GPU's
loopback and installs them in its container's kernel with equal weights over each Y-cable's two sub-links, our GPUs
learn FRR's own loopback, and a ring AllReduce equals the reference with plane 1's frames forwarded by that kernel
(RoCEv2's ICRC leaves out the TTL and header checksum a router rewrites)."""

import os
import subprocess
import time

import pytest

from conftest import docker_with_images
from ifec import containers, frr, live

TOPO = "testbed/topologies/superpod-8x2.yaml"

pytestmark = [pytest.mark.timeout(900, method="signal"),
              pytest.mark.skipif(not os.path.exists("/usr/lib/frr/bgpd"), reason="FRR is not installed (./ifec setup)")]


def _forwarded(container):
    """IPv4 datagrams the container's kernel forwarded (/proc/net/snmp ForwDatagrams)."""
    lines = subprocess.run(["docker", "exec", container, "cat", "/proc/net/snmp"], capture_output=True,
                           text=True).stdout.splitlines()
    names, values = lines[0].split(), lines[1].split()
    return int(values[names.index("ForwDatagrams")])


def test_frr_as_a_switch_container_routes_and_forwards_its_plane(repo, build_dir):
    with docker_with_images(build_dir, frr=True):
        f = containers.ContainerFabric(repo / TOPO, project=f"ifecfrr{os.getpid()}", frr=["p1-sw"])
        try:
            f.up(progress=lambda line: None)
            node = f.frr["p1-sw"]
            sessions = node.sessions()
            assert len(sessions) == 16 and set(sessions.values()) == {"Established"}, sessions
            routes = node.kernel_routes()
            gpus = [n for n in f.nodes if n["kind"] == "gpu"]
            for g in gpus:
                hops = routes.get(f"{frr._ip(g['loopback'])}/32")
                assert hops and len(hops) == 2 and hops[0][1] == hops[1][1], (g["name"], hops)
            _, pb, _ = live._grpc()
            deadline = time.time() + 15  # FRR sends its own route in its next update run, within seconds
            while True:
                rib = f.stub("gpu0").BgpRib(pb.Empty(), timeout=5)
                if any(r.prefix == "10.255.1.1/32" for r in rib.routes) or time.time() > deadline:
                    break
                time.sleep(0.2)
            assert any(r.prefix == "10.255.1.1/32" for r in rib.routes), [r.prefix for r in rib.routes]
            before = _forwarded(f.container("p1-sw"))
            r = f.run("allreduce", algo="ring", bytes=256 << 10, seed=7)
            assert r["ok"] and r["wrong"] == 0, r.get("error")
            assert r["plane_tx_bytes"][1] > 0 and _forwarded(f.container("p1-sw")) - before > 100, r
        finally:
            f.down()
