"""The containerized testbed's descriptions (ifec.containers): the committed compose, swarm, Prometheus and Kubernetes
files for superpod-8x2 are what the generator writes, and what they say is right: a service per node attached to
exactly its links' networks, one network per sub-link in its own /29, capabilities and nothing more,
Prometheus scraping every daemon, a Pod and a NetworkAttachmentDefinition per node and link; the control plane's
certificates: each daemon given ca.pem and its own certificate and key (--tls-dir), never the CA's key, no private
key in a committed file, ports published on the host's loopback only (docker-compose)."""

import base64
import ipaddress
import json
import re

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
        "docker-stack.yml": containers.compose(topo, containers.header(topo, "compose"), swarm=True),
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
    # Reached from this host only: gRPC at 127.0.0.1:50100 + i, Prometheus at 127.0.0.1:9090.
    for n in topo.nodes:
        assert services[n["name"]]["ports"] == [f"127.0.0.1:{containers.GRPC_HOST_PORT + n['index']}:50051"]
    assert services["prometheus"]["ports"] == ["127.0.0.1:9090:9090"]
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


def _secret_files(doc, service):
    """The host files a compose service's secrets are (their paths relative to the file)."""
    return [doc["secrets"][name]["file"] for name in doc["services"][service].get("secrets", [])]


@pytest.mark.parametrize("name", ["docker-compose.yml", "docker-stack.yml"])
def test_each_daemon_gets_its_own_certificate_and_no_other_key(repo, topo, name):
    text = (repo / DIR / name).read_text()
    doc = yaml.safe_load(text)
    for n in topo.nodes:
        me = n["name"]
        cmd = doc["services"][me]["command"]
        assert cmd[cmd.index("--tls-dir") + 1] == containers.TLS_IN_CONTAINER and "--insecure" not in cmd
        # Secrets land in /run/secrets under their names: the daemon's --tls-dir holds exactly these three.
        assert doc["services"][me]["secrets"] == ["ca.pem", f"{me}.pem", f"{me}.key"]
        assert _secret_files(doc, me) == ["./tls/ca.pem", f"./tls/{me}.pem", f"./tls/{me}.key"]
    assert "secrets" not in doc["services"]["prometheus"]
    files = [s["file"] for s in doc["secrets"].values()]
    assert not any("ca.key" in f or f.endswith(("viewer.key", "operator.key", "rank.key")) for f in files)
    assert "ca.key" not in text and "BEGIN" not in text


def test_the_swarm_file_differs_only_in_how_ports_are_published(repo, topo):
    """A swarm binds no host address (docker stack deploy refuses host_ip, ignores one in the short form and then
    publishes through the ingress, which dnsrr services cannot use): its file publishes on the machine (mode host);
    everything else is the compose file's."""
    compose = yaml.safe_load((repo / DIR / "docker-compose.yml").read_text())
    stack = yaml.safe_load((repo / DIR / "docker-stack.yml").read_text())
    for name, s in stack["services"].items():
        for p in s["ports"]:
            assert p["mode"] == "host" and "host_ip" not in p
        assert {k: v for k, v in s.items() if k != "ports"} == \
            {k: v for k, v in compose["services"][name].items() if k != "ports"}
    assert {k: v for k, v in stack.items() if k != "services"} == {k: v for k, v in compose.items() if k != "services"}


def test_insecure_files_pass_insecure_and_no_certificates(topo):
    doc = yaml.safe_load(containers.compose(topo, insecure=True))
    assert "secrets" not in doc
    for n in topo.nodes:
        cmd = doc["services"][n["name"]]["command"]
        assert "--insecure" in cmd and "--tls-dir" not in cmd and "secrets" not in doc["services"][n["name"]]
    pods = [d for d in yaml.safe_load_all(containers.k8s(topo, insecure=True)) if d["kind"] == "Pod"]
    for pod in pods:
        assert "--insecure" in pod["spec"]["containers"][0]["command"]
        assert [v["name"] for v in pod["spec"]["volumes"]] == ["topology"]


def test_a_fabric_refuses_a_compose_file_written_for_the_other_mode(repo, tmp_path):
    from ifec import live
    with pytest.raises(live.LiveError, match="written for mutual TLS"):
        containers.ContainerFabric(repo / TOPO, compose_dir=str(repo / DIR), insecure=True)
    assert containers.ContainerFabric(repo / TOPO, compose_dir=str(repo / DIR)).tls_dir == repo / DIR / "tls"
    containers.write_compose(_native.load_topology(str(repo / TOPO)), tmp_path, insecure=True)
    assert containers.ContainerFabric(repo / TOPO, compose_dir=str(tmp_path), insecure=True).tls_dir is None
    with pytest.raises(live.LiveError, match="written with --insecure"):
        containers.SwarmFabric(repo / TOPO, compose_dir=str(tmp_path))


def test_kubernetes_pods_mount_their_secret_and_the_manifests_hold_no_key(repo, topo, tmp_path):
    text = (repo / DIR / "k8s.yaml").read_text()
    assert "kind: Secret" not in text and "PRIVATE KEY" not in text and "ca.key" not in text
    for pod in (d for d in yaml.safe_load_all(text) if d["kind"] == "Pod"):
        name = pod["metadata"]["name"]
        c = pod["spec"]["containers"][0]
        assert c["command"][c["command"].index("--tls-dir") + 1] == containers.TLS_IN_POD
        assert {"name": "tls", "mountPath": containers.TLS_IN_POD, "readOnly": True} in c["volumeMounts"]
        assert {"name": "tls", "secret": {"secretName": f"ifec-tls-{name}", "defaultMode": 0o400}} in \
            pod["spec"]["volumes"]
        assert pod["spec"]["automountServiceAccountToken"] is False
    # The Secrets come from a PKI made at bring-up: each holds ca.pem and its node's certificate and key only.
    path = containers.write_k8s_secrets(topo, tmp_path / "pki")
    assert path.stat().st_mode & 0o077 == 0
    secrets = list(yaml.safe_load_all(path.read_text()))
    assert [s["metadata"]["name"] for s in secrets] == [f"ifec-tls-{n['name']}" for n in topo.nodes]
    for s, n in zip(secrets, topo.nodes):
        assert sorted(s["data"]) == sorted(["ca.pem", f"{n['name']}.pem", f"{n['name']}.key"])
        key = base64.b64decode(s["data"][f"{n['name']}.key"])
        assert key == (tmp_path / "pki" / f"{n['name']}.key").read_bytes()
    assert (tmp_path / "pki" / "ca.key").read_bytes() not in path.read_bytes()


def test_certificates_name_how_each_daemon_is_reached(topo, tmp_path):
    """Other daemons dial NODE:50051 (--mgmt-names), this host 127.0.0.1:50100 + i: both in its certificate."""
    from cryptography import x509
    containers.make_pki(topo, tmp_path)
    for n in topo.nodes:
        cert = x509.load_pem_x509_certificate((tmp_path / f"{n['name']}.pem").read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == [n["name"]]
        assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


# ------------------------------------------------------------------------------------------------ bad input --

def _tiny(gpu0="gpu0", switch="sw"):
    """A two-GPU, one-switch topology whose first GPU and switch are named as given."""
    return _native.parse_topology(f"""name: tiny
planes: 1
link_defaults: {{rate_gbps: 800, subports: 1, delay_ns: 500}}
gpus: [{json.dumps(gpu0)}, gpu1]
switches: [{{name: {json.dumps(switch)}, plane: 0}}]
links: [{{a: {json.dumps(gpu0)}, b: {json.dumps(switch)}}}, {{a: gpu1, b: {json.dumps(switch)}}}]
""")


@pytest.mark.parametrize("gpu0,switch", [("../evil", "sw"), ("gpu 0", "sw"), ("g'; touch /tmp/x; echo '", "sw"),
                                         ("gpu0\nrouter bgp 1", "sw"), ("gpu0: {image: evil}", "sw"),
                                         ("gpu0", "a" * 64)])
def test_the_loader_refuses_a_node_name_that_could_escape_a_file(gpu0, switch):
    """Before, a name with '/' wrote its private key beside the PKI folder, and a quote, a colon or a newline wrote
    YAML, FRR configuration and shell of its own into the files: the topology loader refuses them now."""
    with pytest.raises(ValueError, match="node name '.*': expected up to 63 letters, digits"):
        _tiny(gpu0, switch)


@pytest.mark.parametrize("gpu0,switch", [("gpu0", "yes"), ("gpu0", "Null"), ("0gpu", "sw"), ("g.0", "sw")])
def test_a_node_name_that_cannot_name_a_container_or_file_is_named(gpu0, switch, tmp_path):
    """Names the loader takes that a compose file or a host cannot (a YAML word, a leading digit, a dot): nothing is
    written."""
    topo = _tiny(gpu0, switch)
    bad = gpu0 if gpu0 != "gpu0" else switch
    for make in (lambda: containers.write_compose(topo, tmp_path / "c"), lambda: containers.k8s(topo),
                 lambda: containers.make_pki(topo, tmp_path / "tls"), lambda: containers.k8s_secrets(topo, tmp_path)):
        with pytest.raises(ValueError, match="node name " + re.escape(repr(bad))):
            make()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_ordinary_node_names_still_make_files(tmp_path):
    topo = _tiny("GPU_0", "p0-sw")
    doc = yaml.safe_load(open(containers.write_compose(topo, tmp_path)[0]).read())
    assert {"GPU_0", "gpu1", "p0-sw", "prometheus"} == set(doc["services"])
    containers.make_pki(topo, tmp_path / "tls")
    assert (tmp_path / "tls" / "GPU_0.key").exists()


def _main(argv, capsys):
    code = containers.main(argv)
    out = capsys.readouterr()
    return code, out.out + out.err


def test_an_empty_out_is_refused_not_the_default_folder(repo, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("IFEC_ROOT", str(tmp_path))  # where the default would land
    for cmd in ("compose", "k8s", "pki"):
        with pytest.raises(SystemExit) as e:
            containers.main([cmd, str(repo / TOPO), "--out", ""])
        assert e.value.code == 2
        assert "argument --out: '': expected a folder" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_frr_given_twice_adds_and_a_node_named_twice_is_one(repo, capsys, tmp_path):
    """A second --frr replaced the first (while the file's header, which repeats --frr, said both), and gpu0,gpu0
    wrote its YAML anchor twice (a file docker-compose cannot read)."""
    code, out = _main(["compose", str(repo / TOPO), "--out", str(tmp_path), "--frr", "gpu0,gpu0", "--frr", "p1-sw"],
                      capsys)
    assert code == 0, out
    text = (tmp_path / "docker-compose.yml").read_text()
    doc = yaml.safe_load(text)
    assert "--frr gpu0 --frr p1-sw" in text.splitlines()[0]
    frr_services = {n for n, s in doc["services"].items() if s.get("image") == "ifec-frr:latest"}
    assert frr_services == {"gpu0", "p1-sw"}
    assert text.count("&bgpd-gpu0 ") == 1


def test_a_bad_state_file_is_named(monkeypatch, tmp_path, capsys):
    from ifec import live
    state = tmp_path / "state.json"
    monkeypatch.setattr(containers, "STATE", str(state))
    for text, says in (("{bad", "unreadable"), ("{}", "not a testbed's state"), ("[]", "not a testbed's state")):
        state.write_text(text)
        with pytest.raises(live.LiveError, match=f"{re.escape(str(state))}: {says}"):
            containers.attach()
        code, out = _main(["status"], capsys)
        assert code == 1 and str(state) in out and "Traceback" not in out


def test_a_bad_project_is_named_before_the_topology_is_read(monkeypatch):
    from ifec import live
    with pytest.raises(live.LiveError, match="project 'Bad name;x'"):
        containers.ContainerFabric("/no/such/topology.yaml", project="Bad name;x")


def test_image_and_up_name_a_missing_daemon_before_dockerd(repo, monkeypatch, tmp_path, capsys):
    """Before, up and image started dockerd (and image ran debootstrap, minutes) before finding no daemons built."""
    from ifec import images
    reached = []
    monkeypatch.setattr(images, "Dockerd", lambda *a, **k: reached.append("dockerd"))
    monkeypatch.setattr(images.subprocess, "run", lambda cmd, *a, **k: reached.append(cmd))
    monkeypatch.setenv("IFEC_BIN_DIR", str(tmp_path))
    for argv in (["image"], ["up", str(repo / TOPO)]):
        code, out = _main(argv, capsys)
        assert code == 1 and f"not built: {tmp_path / 'ifec-switchd'}" in out, out
    assert reached == []


def test_link_subnet_refuses_an_id_outside_the_plan():
    assert str(containers.link_subnet(3)) == "10.64.0.24/29"
    for bad in (-1, 2**29, 1.5, "3"):
        with pytest.raises((TypeError, ValueError), match="link_id"):
            containers.link_subnet(bad)
