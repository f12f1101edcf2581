"""The containerized testbed's descriptions (ifec.containers): the committed compose, Prometheus and Kubernetes files
for superpod-8x2 are what the generator writes, and what they say is right: a service per node attached to
exactly its links' networks, one network per sub-link in its own /29, capabilities and nothing more,
Prometheus scraping every daemon, a Pod and a NetworkAttachmentDefinition per node and link."""

import ipaddress
import json

import pytest
import yaml

from ifec import _native, containers

TOPO = "testbed/topologies/superpod-8x2.yaml"
DIR = "testbed/compose/superpod-8x2"


@pytest.fixture(scope="module")
def topo(repo):
    return _native.load_topology(str(repo / TOPO))


def test_committed_files_are_what_the_generator_writes(repo, topo):
    stale = f"is stale: run ./ifec testbed compose {TOPO} and ./ifec testbed k8s {TOPO}"
    expected = {
        "docker-compose.yml": containers.compose(topo, containers.header(topo, "compose")),
        "k8s.yaml": containers.k8s(topo, containers.header(topo, "k8s")),
    }
    for name, text in expected.items():
        assert (repo / DIR / name).read_text() == text, f"{DIR}/{name} {stale}"


def test_every_node_is_a_service_on_exactly_its_links(repo, topo):
    doc = yaml.safe_load((repo / DIR / "docker-compose.yml").read_text())
    assert doc["version"] == "3.8"
    services = doc["services"]
    assert set(services) == {n["name"] for n in topo.nodes} | {"prometheus"}
    nets = doc["networks"]
    assert len(nets) == len(topo.links) + 1 == 33  # 16 Y-cables as 32 sub-links, and management
    subnets = []
    for l in topo.links:
        net = nets[containers.link_network(l)]
        assert "internal" not in net  # Docker would drop the fabric's frames (addresses outside the subnet)
        subnet = ipaddress.IPv4Network(net["ipam"]["config"][0]["subnet"])
        assert subnet == containers.link_subnet(l["id"]) and subnet.prefixlen == 29
        subnets.append(subnet)
    assert all(not a.overlaps(b) for i, a in enumerate(subnets) for b in subnets[i + 1:])
    for n in topo.nodes:
        s = services[n["name"]]
        mine = {containers.link_network(l) for l in topo.links if n["name"] in (l["a"], l["b"])}
        assert set(s["networks"]) == mine | {"mgmt"}
        assert len(mine) == (4 if n["kind"] == "gpu" else 16)
        assert "privileged" not in s and set(s["cap_add"]) == {"NET_ADMIN", "NET_RAW"}
        cmd = s["command"]
        assert cmd[0] == ("ifec-hostd" if n["kind"] == "gpu" else "ifec-switchd")
        assert cmd[cmd.index("--topo") + 1] == "env:IFEC_TOPOLOGY"
        assert s["environment"]["IFEC_TOPOLOGY"] == doc["x-ifec-topology"]
        assert cmd[cmd.index("--node") + 1] == n["name"] and "--mgmt-names" in cmd
        assert cmd[cmd.index("--links-by-subnet") + 1] == str(containers.LINKS_BASE)
        assert s["healthcheck"]["test"][0] == "CMD" and s["restart"] == "on-failure"
        assert s["deploy"]["restart_policy"]["condition"] == "on-failure"
    # The topology the daemons get is this one; Prometheus scrapes every daemon.
    carried = _native.parse_topology(doc["x-ifec-topology"])
    assert carried.to_yaml() == topo.to_yaml()
    prom = yaml.safe_load(services["prometheus"]["environment"]["PROMETHEUS_CONFIG"])
    assert "$$PROMETHEUS_CONFIG" in services["prometheus"]["command"][2]  # compose interpolation: a literal $
    targets = prom["scrape_configs"][0]["static_configs"][0]["targets"]
    assert sorted(targets) == sorted(f"{n['name']}:9400" for n in topo.nodes)


def test_kubernetes_manifests_parse_and_name_every_link(repo, topo):
    docs = list(yaml.safe_load_all((repo / DIR / "k8s.yaml").read_text()))
    kinds = [d["kind"] for d in docs]
    assert kinds.count("NetworkAttachmentDefinition") == len(topo.links)
    assert kinds.count("Pod") == kinds.count("Service") == len(topo.nodes)
    nads = {d["metadata"]["name"]: d for d in docs if d["kind"] == "NetworkAttachmentDefinition"}
    assert set(nads) == {containers.link_network(l) for l in topo.links}
    for d in nads.values():
        assert json.loads(d["spec"]["config"])["type"] == "bridge"
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert _native.parse_topology(cm["data"]["topology.yaml"]).num_links == len(topo.links)
    for pod in (d for d in docs if d["kind"] == "Pod"):
        name = pod["metadata"]["name"]
        attach = json.loads(pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"])
        mine = [l for l in topo.links if name in (l["a"], l["b"])]
        assert [a["name"] for a in attach] == [containers.link_network(l) for l in mine]
        for a, l in zip(attach, mine):
            assert ipaddress.IPv4Interface(a["ips"][0]).network == containers.link_subnet(l["id"])
        caps = pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"]
        assert set(caps) == {"NET_ADMIN", "NET_RAW"}
