"""The live testbed as containers: a docker-compose file (also for `docker stack deploy` on a swarm), the Prometheus
configuration that scrapes it, and Kubernetes manifests, all generated from a topology file.

One container per switch (ifec-switchd) and per GPU (ifec-hostd); one internal network per link (each Y-cable
sub-link its own, on its own bridge), with the /29 subnet LINKS_BASE + 8 * link id, so a daemon finds its end of link L by address
(`--links-by-subnet`), whatever Docker names the interface; a management network where daemons reach each other
by node name (`--mgmt-names`) and Prometheus scrapes :9400. Containers get NET_ADMIN and NET_RAW (AF_PACKET
sockets, link admin state) and nothing more. The text is written deterministically, so a committed file can be
checked against the generator.

The control plane is mutual TLS (ifec.pki): bring-up makes a fresh CA and certificates in COMPOSE_DIR/tls, and each
daemon's container gets only ca.pem and its own NODE.pem and NODE.key, as compose secrets (docker-compose: read-only
bind mounts of those files; a swarm: docker secrets), at /run/secrets, which is its --tls-dir; a Pod gets them from
a Secret of its own. The CA's key and the clients' certificates stay with the bring-up.
"""

import argparse
import base64
import ipaddress
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from ifec import _args, _native, images, live

IMAGE = "ifec-testbed:latest"
PROMETHEUS_IMAGE = "ifec-prometheus:latest"
LINKS_BASE = ipaddress.IPv4Address("10.64.0.0")
TOPOLOGY_IN_CONTAINER = "/etc/ifec/topology.yaml"
CAPABILITIES = ("NET_ADMIN", "NET_RAW")
GRPC_HOST_PORT = 50100  # node i's gRPC is published on the host at GRPC_HOST_PORT + i (compose and swarm alike)
FABRIC_MTU = 9216
TLS_FOLDER = "tls"  # the certificates, beside the compose file that names them (git-ignored under testbed/compose)
TLS_IN_CONTAINER = "/run/secrets"  # where compose secrets land (docker-compose and swarm alike): the --tls-dir
# Not under /run/secrets in a Pod: /var/run is /run in the image, and the kubelet mounts the service account there.
TLS_IN_POD = "/run/ifec/tls"
COMPOSE_FILE = "docker-compose.yml"  # docker-compose: published ports on 127.0.0.1 only
STACK_FILE = "docker-stack.yml"  # docker stack deploy: the same, ports as a swarm publishes them (every interface)


def link_subnet(link_id):
    """Link `link_id`'s network: the /29 at LINKS_BASE + 8 * id."""
    link_id = _args.whole(link_id, "link_id", 0, (2**32 - int(LINKS_BASE)) // 8 - 1)
    return ipaddress.IPv4Network((int(LINKS_BASE) + 8 * link_id, 29))


# What YAML 1.1 (docker-compose's PyYAML) reads as a boolean or null, not as the string.
_YAML_WORDS = ("true", "false", "yes", "no", "on", "off", "null")
# A node's name becomes a container's, service's and host's name, a file's (NODE.pem), a YAML key and a word of FRR's
# configuration and of a shell command: letters, digits, '-' and '_', from a letter (never a number to YAML).
_NODE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,62}")


def check_node_names(topo):
    """ValueError naming the first node whose name cannot name a container, host or file. The topology loader refuses
    what could break out of a file or command ('/', a space, a quote, a newline); this also refuses what a compose
    file or a host name cannot take (a YAML word such as 'yes', a leading digit, a dot)."""
    for n in topo.nodes:
        name = n["name"]
        if not _NODE_NAME.fullmatch(name) or name.lower() in _YAML_WORDS:
            raise ValueError(f"node name {name!r} in topology {topo.name}: expected letters, digits, '-' or '_', "
                             "starting with a letter, at most 63 (it names containers, hosts and files)")


def link_network(link):
    """The compose network name of a link (from bindings' Topology.links): l<id>-<a>-<b>."""
    return f"l{link['id']}-{link['a']}-{link['b']}"


def _links_of(topo, node):
    return [l for l in topo.links if node in (l["a"], l["b"])]


def _daemon_command(topo, node, topology=TOPOLOGY_IN_CONTAINER, tls_dir=TLS_IN_CONTAINER):
    """A daemon's command line; tls_dir None: --insecure (plaintext control plane)."""
    prog = "ifec-hostd" if node["kind"] == "gpu" else "ifec-switchd"
    return [prog, "--topo", topology, "--node", node["name"], "--mgmt-names", "--links-by-subnet", str(LINKS_BASE),
            *(["--insecure"] if tls_dir is None else ["--tls-dir", tls_dir])]


def tls_files(name):
    """The files of node `name`'s daemon in a PKI folder (ifec.pki.make): what its container gets, and nothing else
    (never ca.key, nor another node's key)."""
    return ("ca.pem", f"{name}.pem", f"{name}.key")


def _daemons(topo, frr=()):
    """The nodes that run an ifec daemon (not FRR): those with a certificate."""
    return [n for n in topo.nodes if n["name"] not in frr]


def _block(text, indent="  "):
    """Text as the body of a YAML literal block."""
    return [indent + line if line else "" for line in text.rstrip("\n").splitlines()]


def _q(s):
    """A YAML scalar, quoted when it would not read back as the same string."""
    s = str(s)
    plain = s and all(c.isalnum() or c in "-_./:" for c in s) and not s[0].isdigit() and s not in _YAML_WORDS
    return s if plain else '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _list(items):
    return "[" + ", ".join(_q(i) for i in items) + "]"


def _frr_service(topo, node):
    """A node run by FRR (ifec-frr image): bgpd's configuration in the file, zebra and bgpd started by the command;
    a switch forwards in its kernel (ip_forward)."""
    from . import frr
    name = node["name"]
    out = [f"  {name}:",
           f"    image: {images.FRR_IMAGE}",
           f"    hostname: {name}",
           f"    command: {_list(['bash', '-c', frr.container_command(topo, name)])}",
           f"    environment: {{BGPD_CONF: *bgpd-{name}}}",
           f"    cap_add: {_list(CAPABILITIES + ('SYS_ADMIN',))}"]  # zebra's privileges ask for it at start
    if node["kind"] == "switch":
        out.append("    sysctls: {net.ipv4.ip_forward: 1}")
    return out


def compose(topo, header="", frr=(), insecure=False, swarm=False):
    """docker-compose file (format 3.8: Debian's docker-compose 1.29 and `docker stack deploy` both read it) for
    `topo`. The topology and Prometheus' configuration travel in the file itself (environment variables from two
    YAML anchors), so it deploys as it is on one machine or a swarm. Nodes named in `frr` run FRR's zebra and bgpd
    (their configuration in the file too); every interface then gets the address plan's fixed address (FRR is
    configured with its neighbours' addresses; docker-compose only, swarm ignores fixed addresses).

    Each daemon gets ca.pem and its own certificate and key as secrets from ./tls beside the file (--tls-dir
    /run/secrets), or `insecure`: --insecure and no secrets. Ports: docker-compose publishes on 127.0.0.1 only;
    `swarm` (the file for `docker stack deploy`) publishes on its machine's every interface (`mode: host`: a swarm
    has no host address to bind, and ingress publishing cannot serve dnsrr services)."""
    from . import frr as frr_mod
    check_node_names(topo)
    frr = list(dict.fromkeys(_args.items(frr, "frr")))  # a node named twice is one FRR node (one YAML anchor)
    for name in frr:
        if not any(n["name"] == name for n in topo.nodes):
            raise ValueError(f"--frr {','.join(frr)}: no node '{name}' in topology {topo.name}")
    out = [f"# {header}" if header else "# Generated by ifec.containers", "version: \"3.8\"", "",
           "# The topology every daemon runs from (--topo env:IFEC_TOPOLOGY) and what Prometheus scrapes.",
           "x-ifec-topology: &topology |"] + _block(topo.to_yaml()) + [
           "x-ifec-prometheus: &prometheus |"] + _block(prometheus_config(topo, frr))
    for name in frr:
        out += [f"x-ifec-bgpd-{name}: &bgpd-{name} |"] + _block(frr_mod.bgpd_config(topo, name))
    out += ["", "services:"]
    tls = None if insecure else TLS_IN_CONTAINER
    frr_gpus = [n for n in frr if next(x for x in topo.nodes if x["name"] == n)["kind"] == "gpu"]
    for node in topo.nodes:
        name = node["name"]
        if name in frr:
            out += _frr_service(topo, node)
        else:
            extra = ["--external-peers", ",".join(frr_gpus)] if frr_gpus and node["kind"] == "gpu" else []
            out += [f"  {name}:",
                    f"    image: {IMAGE}",
                    f"    hostname: {name}",
                    f"    command: {_list(_daemon_command(topo, node, 'env:IFEC_TOPOLOGY', tls) + extra)}",
                    "    environment: {IFEC_TOPOLOGY: *topology}",
                    f"    cap_add: {_list(CAPABILITIES)}"]
            if not insecure:
                out.append(f"    secrets: {_list(tls_files(name))}")
        out += ["    networks:", "      mgmt: {}"]
        if frr:
            out += [f"      {link_network(l)}: {{ipv4_address: {frr_mod.link_address(l, name)}}}"
                    for l in _links_of(topo, name)]
        else:
            out += [f"      {link_network(l)}: {{}}" for l in _links_of(topo, name)]
        if name in frr:
            out += ["    healthcheck:",
                    "      test: [\"CMD\", \"bash\", \"-c\", \"vtysh -c 'show bgp summary' >/dev/null 2>&1\"]"]
        else:
            out += [f"    ports: {_ports(GRPC_HOST_PORT + node['index'], 50051, swarm)}",
                    "    healthcheck:",
                    "      test: [\"CMD\", \"bash\", \"-c\", \"exec 3<>/dev/tcp/127.0.0.1/9400\"]"]
        out += ["      interval: 5s",
                "      timeout: 3s",
                "      retries: 24",
                "    restart: on-failure",
                "    deploy:",
                "      endpoint_mode: dnsrr",
                "      restart_policy: {condition: on-failure}"]
    out += ["  prometheus:",
            f"    image: {PROMETHEUS_IMAGE}",
            "    command: [\"bash\", \"-c\", \"printf '%s' \\\"$$PROMETHEUS_CONFIG\\\" > /tmp/prometheus.yml && exec prometheus "
            "--config.file=/tmp/prometheus.yml --storage.tsdb.path=/tmp/prometheus-data --web.listen-address=:9090\"]",
            "    environment: {PROMETHEUS_CONFIG: *prometheus}",
            "    networks:",
            "      mgmt: {}",
            f"    ports: {_ports(9090, 9090, swarm)}",
            "    restart: on-failure",
            "    deploy:",
            "      endpoint_mode: dnsrr",
            "      restart_policy: {condition: on-failure}"]
    if not insecure:
        # Paths relative to the file: docker-compose and docker stack deploy both read them from beside it.
        out += ["", "secrets:"] + [f"  {f}: {{file: ./{TLS_FOLDER}/{f}}}"
                                   for f in dict.fromkeys(f for n in _daemons(topo, frr) for f in tls_files(n["name"]))]
    out += ["",
            "networks:",
            "  mgmt: {}"]
    for l in topo.links:
        # Not `internal: true`: Docker then drops bridged IP packets whose addresses lie outside the network's
        # subnet (br_netfilter + its isolation rules), and fabric frames carry the GPUs' loopback addresses.
        out += [f"  {link_network(l)}:",
                f"    driver_opts: {{com.docker.network.driver.mtu: \"{FABRIC_MTU}\"}}",
                f"    ipam: {{config: [{{subnet: {link_subnet(l['id'])}}}]}}"]
    return "\n".join(out) + "\n"


def _ports(published, target, swarm):
    """A service's published port: on the host's loopback only (docker-compose), or on its machine (a swarm)."""
    if swarm:
        return f"[{{target: {target}, published: {published}, mode: host}}]"
    return _list([f"127.0.0.1:{published}:{target}"])


def prometheus_config(topo, frr=()):
    """Prometheus scraping every daemon's /metrics by node name on the management network, every second (not the
    nodes FRR runs: it serves none)."""
    out = ["global: {scrape_interval: 1s, evaluation_interval: 5s}",
           "scrape_configs:",
           "  - job_name: ifec",
           "    static_configs:",
           "      - targets: " + _list(f"{n['name']}:9400" for n in topo.nodes if n["name"] not in frr)]
    return "\n".join(out) + "\n"


def k8s(topo, header="", insecure=False):
    """Kubernetes manifests: a ConfigMap with the topology, one Multus NetworkAttachmentDefinition per link (a
    bridge CNI on the node, static IPAM in the link's /29), and one Pod per node attached to its links, with the
    same addresses the compose file gives (so --links-by-subnet finds them), and a headless Service per node so its
    name resolves to it. Each Pod mounts the Secret ifec-tls-NODE (k8s_secrets, `./ifec testbed pki`; made from a
    PKI folder, never part of these manifests) as its --tls-dir, or `insecure`: --insecure and no Secret."""
    check_node_names(topo)
    docs = []
    addrs = {}  # (link id, node) -> address in the link's /29
    for l in topo.links:
        net = link_subnet(l["id"])
        hosts = list(net.hosts())
        cfg = ('{"cniVersion": "0.3.1", "type": "bridge", "bridge": "ifl%d", "mtu": %d, '
               '"ipam": {"type": "static"}}' % (l["id"], FABRIC_MTU))
        docs.append("\n".join([
            "apiVersion: k8s.cni.cncf.io/v1",
            "kind: NetworkAttachmentDefinition",
            "metadata:",
            f"  name: {link_network(l)}",
            "  annotations:",
            f"    ifec/link: \"{l['id']}\"",
            f"    ifec/ends: \"{l['a']}:{l['a_port']} {l['b']}:{l['b_port']}\"",
            "spec:",
            f"  config: '{cfg}'"]))
        addrs[(l["id"], l["a"])] = f"{hosts[1]}/29"
        addrs[(l["id"], l["b"])] = f"{hosts[2]}/29"
    for node in topo.nodes:
        name = node["name"]
        attach = ", ".join('{"name": "%s", "ips": ["%s"]}' % (link_network(l), addrs[(l["id"], name)])
                           for l in _links_of(topo, name))
        mounts = ["{name: topology, mountPath: /etc/ifec}"]
        volumes = ["{name: topology, configMap: {name: ifec-topology}}"]
        if not insecure:
            mounts.append(f"{{name: tls, mountPath: {TLS_IN_POD}, readOnly: true}}")
            volumes.append(f"{{name: tls, secret: {{secretName: {k8s_secret_name(name)}, defaultMode: 0400}}}}")
        docs.append("\n".join([
            "apiVersion: v1",
            "kind: Pod",
            "metadata:",
            f"  name: {name}",
            f"  labels: {{app: ifec-testbed, ifec/node: {name}}}",
            "  annotations:",
            f"    k8s.v1.cni.cncf.io/networks: '[{attach}]'",
            "spec:",
            f"  hostname: {name}",
            "  automountServiceAccountToken: false",  # the daemons never call the API server
            "  containers:",
            f"    - name: {'hostd' if node['kind'] == 'gpu' else 'switchd'}",
            f"      image: {IMAGE}",
            f"      command: {_list(_daemon_command(topo, node, tls_dir=None if insecure else TLS_IN_POD))}",
            "      securityContext:",
            f"        capabilities: {{add: {_list(CAPABILITIES)}}}",
            f"      volumeMounts: [{', '.join(mounts)}]",
            "      readinessProbe: {tcpSocket: {port: 9400}, periodSeconds: 5}",
            f"  volumes: [{', '.join(volumes)}]"]))
        # Its name resolves to it, as the daemons' --mgmt-names expects (and Prometheus scrapes it there).
        docs.append("\n".join([
            "apiVersion: v1",
            "kind: Service",
            f"metadata: {{name: {name}}}",
            f"spec: {{clusterIP: None, selector: {{ifec/node: {name}}}, "
            "ports: [{name: grpc, port: 50051}, {name: metrics, port: 9400}]}"]))
    topo_text = topo.to_yaml()
    docs.insert(0, "\n".join(["apiVersion: v1", "kind: ConfigMap", "metadata: {name: ifec-topology}", "data:",
                              "  topology.yaml: |"] + ["    " + line for line in topo_text.splitlines()]))
    head = f"# {header}\n" if header else "# Generated by ifec.containers\n"
    return head + "\n---\n".join(docs) + "\n"


def k8s_secret_name(node):
    """The Secret a node's Pod takes its certificate from."""
    return f"ifec-tls-{node}"


def k8s_secrets(topo, tls_dir):
    """Secret manifests, one per daemon, from a PKI folder (ifec.pki.make): each holds ca.pem and that node's .pem
    and .key, nothing else. They carry private keys: written beside the PKI, never committed (`kubectl create secret
    generic ifec-tls-NODE --from-file=DIR/ca.pem --from-file=DIR/NODE.pem --from-file=DIR/NODE.key` is the same)."""
    check_node_names(topo)
    tls_dir = pathlib.Path(tls_dir)
    docs = []
    for node in _daemons(topo):
        name = node["name"]
        data = []
        for f in tls_files(name):
            try:
                data.append(f"  {f}: {base64.b64encode((tls_dir / f).read_bytes()).decode()}")
            except OSError as e:
                raise ValueError(f"{tls_dir}: no {f} ({e.strerror}): expected a PKI made for {topo.name}")
        docs.append("\n".join(["apiVersion: v1", "kind: Secret", "type: Opaque",
                               f"metadata: {{name: {k8s_secret_name(name)}, labels: {{app: ifec-testbed}}}}",
                               "data:"] + data))
    return "# The testbed's certificates for kubectl apply -f: private keys, keep out of the repository\n" + \
        "\n---\n".join(docs) + "\n"


def make_pki(topo, folder, frr=(), progress=None):
    """A fresh CA and certificates (ifec.pki.make) in `folder` for `topo`'s daemons: each for its node name (how the
    other daemons reach it: --mgmt-names) and 127.0.0.1 (where the host reaches its published port)."""
    from . import pki
    check_node_names(topo)
    return pki.make(folder, {n["name"]: ["127.0.0.1"] for n in _daemons(topo, frr)}, progress=progress)


def header(topo, cmd):
    """The first line of a generated file."""
    return f"Generated by ifec.containers from {topo.name} (./ifec testbed {cmd}); do not edit"


def write_compose(topo, out_dir, frr=(), insecure=False):
    """Writes OUT_DIR/docker-compose.yml and OUT_DIR/docker-stack.yml (the swarm's) for a topology; returns their
    paths."""
    frr = list(dict.fromkeys(_args.items(frr, "frr")))
    head = header(topo, "compose" + "".join(f" --frr {n}" for n in frr) + (" --insecure" if insecure else ""))
    texts = {name: compose(topo, head, frr, insecure, swarm) for name, swarm in ((COMPOSE_FILE, False),
                                                                                 (STACK_FILE, True))}
    os.makedirs(out_dir, exist_ok=True)  # once the files can be written: a bad name or --frr leaves no folder
    paths = []
    for name, text in texts.items():
        paths.append(os.path.join(out_dir, name))
        with open(paths[-1], "w") as f:
            f.write(text)
    return paths


def _project_name(text):
    """docker-compose 1.29 lowercases a project name and drops other characters: the containers would not be found."""
    if not (isinstance(text, str) and re.fullmatch(r"[a-z0-9][a-z0-9_-]*", text)):
        raise argparse.ArgumentTypeError(f"{text!r}: expected lowercase letters, digits, '_' or '-' (a compose project)")
    return text


def _folder_arg(text):
    """An argparse type: --out DIR, not empty (an empty one fell back to the default, in the repository)."""
    if not text:
        raise argparse.ArgumentTypeError("'': expected a folder")
    return text


def _frr_names(values):
    """--frr NODE[,NODE...], as often as given: the nodes in order, each once (a second --frr replaced the first)."""
    return list(dict.fromkeys(n for v in values or () for n in v.split(",") if n))


def _load_topology(path):
    """The topology file `path`, or a LiveError naming it and what is wrong (a missing file was a traceback)."""
    try:
        return _native.load_topology(str(path))
    except (OSError, RuntimeError, ValueError) as e:
        text = str(e)
        raise live.LiveError(text if str(path) in text else f"{path}: {text}") from None


def _write_state(**state):
    pathlib.Path(STATE).parent.mkdir(parents=True, exist_ok=True)
    with open(STATE + ".tmp", "w") as f:
        json.dump(state, f)
    os.replace(STATE + ".tmp", STATE)


def _cmd_up(a):
    st = _read_state()
    if st is not None:  # its down is the only record of what it made (and its ports would be taken)
        raise live.LiveError(f"a containerized testbed is already up (project {st['project']}, "
                             f"{st.get('source', st['topology'])}): ./ifec testbed down first")
    topo = _load_topology(a.file)
    if any(n["kind"] == "gpu" and n["plane"] >= 0 for n in topo.nodes):
        raise live.LiveError(f"{a.file}: its GPUs sit on one plane each (in-node NVLink forwarding): the live "
                             "testbed gives every GPU a port on every plane; run it on the simulator (./ifec sim)")
    frr = _frr_names(a.frr)
    compose(topo, frr=frr, insecure=a.insecure)  # a bad --frr or node name is named before anything is made,
    images.preflight(live._bin_dir())  # and a missing daemon or a bad IFEC_* setting before dockerd is started
    out = pathlib.Path(tempfile.mkdtemp(prefix=f"ifec-compose-{topo.name}-"))
    fab, recorded = None, False
    try:
        write_compose(topo, out, frr, a.insecure)
        # The fabric is driven from the topology its containers run, not from a.file (which may change meanwhile).
        (out / "topology.yaml").write_text(topo.to_yaml())
        fab = ContainerFabric(out / "topology.yaml", a.project, str(out), frr=frr, insecure=a.insecure)
        images.Dockerd()
        fab._check_free()  # a project already up or a port taken: named before the images are built
        images.build_all(live._bin_dir(), frr=bool(frr))
        # Recorded before the bring-up: if this process is killed, ./ifec testbed down still finds what it made.
        _write_state(topology=str(out / "topology.yaml"), project=a.project, compose_dir=str(out), frr=frr,
                     insecure=a.insecure, own_dir=True, source=str(pathlib.Path(a.file).resolve()))
        recorded = True
        fab.up()
    except BaseException:
        if fab is not None and fab.made:  # fab.up could not take it all down again: down is how
            print(f"testbed: the failed bring-up left containers or networks of project {a.project}: "
                  "./ifec testbed down removes them", file=sys.stderr)
        else:
            if recorded:
                os.remove(STATE)
            shutil.rmtree(out, ignore_errors=True)
        raise
    print("testbed: Prometheus at http://127.0.0.1:9090; bytes per plane the GPUs send: "
          "sum by (plane) (rate(ifec_port_bytes_total{dir=\"tx\",node=~\"gpu.*\"}[10s]))")
    if fab.tls_dir:
        print(f"testbed: control plane mutual TLS; the CA and the client roles' certificates (viewer, operator, rank) "
              f"in {fab.tls_dir}")
    print("testbed: ./ifec testbed status | run | fail | restore | kill | start | capture | ctl | down")
    return 0


def remove_project(project):
    """docker-compose down without its file: the containers and networks docker-compose labelled with the project's
    name. Returns how many of each it removed."""
    label = f"label=com.docker.compose.project={project}"
    ids = _docker(["ps", "-aq", "--filter", label]).split()
    if ids:
        _docker(["rm", "-f", "-v"] + ids)
    nets = _docker(["network", "ls", "-q", "--filter", label]).split()
    if nets:
        _docker(["network", "rm"] + nets)
    return len(ids), len(nets)


def _cmd_down():
    st = _read_state()
    if st is None:
        print("testbed: nothing is up")
        return 0
    try:
        fab = attach()
    except (live.LiveError, ValueError, OSError) as e:  # its compose file or topology gone: found by the labels
        n, m = remove_project(st["project"])
        print(f"testbed: {e}; removed project {st['project']}'s {n} container(s) and {m} network(s) by their labels")
        tls = pathlib.Path(st["compose_dir"]) / TLS_FOLDER
        shutil.rmtree(tls, ignore_errors=True)
    else:
        fab.down()
    if st.get("own_dir"):  # the folder up made under /tmp, not one of the user's
        shutil.rmtree(st["compose_dir"], ignore_errors=True)
    os.remove(STATE)
    print("testbed: down (no containers, networks or volumes left)")
    return 0


def _cmd_image():
    t0 = time.time()
    try:
        images.preflight(live._bin_dir())
        images.Dockerd()  # left running: the testbed's containers need it (./ifec testbed down stops nothing else)
        rows = images.build_all(live._bin_dir())
    except images.ImageError as e:
        print(f"testbed: {e}", file=sys.stderr)
        return 1
    for tag, mb, secs in rows:
        print(f"{tag:<26} {mb:8.0f} MB  built in {secs:5.1f} s")
    print(f"testbed: images ready in {time.time() - t0:.1f} s")
    return 0


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(prog="./ifec testbed", description="The live testbed as containers.")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, what in (("compose", "docker-compose file (and docker-stack.yml, its swarm twin) and Prometheus "
                                    "configuration"),
                       ("k8s", "Kubernetes manifests (Multus NetworkAttachmentDefinitions, one Pod per node)")):
        s = sub.add_parser(name, help=f"write the {what} of a topology")
        s.add_argument("file")
        s.add_argument("--out", type=_folder_arg, help="directory (default testbed/compose/<topology name>)")
        s.add_argument("--insecure", action="store_true", help="daemons with --insecure: a plaintext control plane, "
                                                               "no certificates")
        if name == "compose":
            s.add_argument("--frr", action="append", help="NODE[,NODE...]: these nodes run FRR (ifec-frr image)")
    s = sub.add_parser("pki", help="make a fresh CA and certificates for a topology's daemons and the client roles, "
                                   "and DIR/k8s-secrets.yaml (the Pods' Secrets): what up makes itself, for "
                                   "docker-compose, docker stack deploy or kubectl by hand")
    s.add_argument("file")
    s.add_argument("--out", metavar="DIR", type=_folder_arg,
                   help="default testbed/compose/<topology name>/tls (git-ignored), where the compose files look")
    sub.add_parser("image", help="build the images (ifec-testbed, ifec-prometheus) here: Debian base by debootstrap, "
                                  "cached; the daemons with their runtime libraries")
    up = sub.add_parser("up", help="build the images if needed, bring a topology up as containers, wait for it")
    up.add_argument("file")
    up.add_argument("--project", default="ifec", type=_project_name)
    up.add_argument("--frr", action="append", help="NODE[,NODE...]: these nodes run FRR's bgpd and zebra (ifec-frr "
                                                   "image) instead of an ifec daemon")
    up.add_argument("--insecure", action="store_true",
                    help="no certificates: daemons with --insecure, a plaintext control plane anyone who reaches a "
                         "published port may call (default: mutual TLS, a fresh CA in the compose folder's tls/)")
    sub.add_parser("down", help="take the containers, networks and volumes down")
    handlers = live.add_fabric_commands(sub, "live (containers)")
    a = p.parse_args(argv)
    a.attach = attach
    if a.cmd == "up":  # a SIGTERM (timeout(1), a CI limit) unwinds the bring-up as Ctrl-C does
        signal.signal(signal.SIGTERM, _interrupted)
    try:
        if a.cmd == "image":
            return _cmd_image()
        if a.cmd == "up":
            return _cmd_up(a)
        if a.cmd == "down":
            return _cmd_down()
        if a.cmd in handlers:
            return handlers[a.cmd](a)
    except (live.LiveError, images.ImageError, RuntimeError, ValueError) as e:
        print(f"testbed: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the state's folder, a capture's file
        print(f"testbed {a.cmd}: {e.strerror or e}: {e.filename or ''}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        left = a.cmd == "up" and os.path.exists(STATE)
        print("testbed: interrupted" + ("; what the bring-up made may be left: ./ifec testbed down" if left else
                                        " (anything up made is taken down again)" if a.cmd == "up" else ""),
              file=sys.stderr)
        return 130
    try:
        topo = _native.load_topology(a.file)
    except Exception as e:  # a bad topology file: say which and why
        print(f"testbed: {e}", file=sys.stderr)
        return 1
    # ./ifec names the repository (IFEC_ROOT), so the default lands there whatever the current directory.
    out = a.out or os.path.join(os.environ.get("IFEC_ROOT", "."), "testbed", "compose", topo.name)
    try:
        if a.cmd == "compose":
            print("wrote " + " and ".join(write_compose(topo, out, _frr_names(a.frr), a.insecure)))
        elif a.cmd == "pki":
            folder = a.out or os.path.join(out, TLS_FOLDER)
            path = write_k8s_secrets(topo, folder)
            print(f"wrote certificates in {folder} and {path} (private keys: keep them out of the repository)")
        else:
            text = k8s(topo, header(topo, "k8s" + (" --insecure" if a.insecure else "")), a.insecure)
            os.makedirs(out, exist_ok=True)
            path = os.path.join(out, "k8s.yaml")
            with open(path, "w") as f:
                f.write(text)
            print(f"wrote {path}")
    except OSError as e:
        print(f"testbed {a.cmd}: {e.strerror}: {e.filename}", file=sys.stderr)
        return 1
    except ValueError as e:  # a PKI that cannot be made (ifec.pki.PkiError)
        print(f"testbed {a.cmd}: {e}", file=sys.stderr)
        return 1
    return 0


def write_k8s_secrets(topo, folder):
    """A fresh PKI for `topo` in `folder` and FOLDER/k8s-secrets.yaml (mode 0600, git-ignored); returns its path."""
    make_pki(topo, folder)
    path = pathlib.Path(folder) / "k8s-secrets.yaml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(k8s_secrets(topo, folder))
    return path


STATE = "/run/ifec-testbed/state.json"


class ContainerFabric(live.LiveFabric):
    """A compose file brought up with docker-compose (project `project`): the measurements and controls of
    ifec.live.LiveFabric (run, status, set_link, set_loss, read_window, ...) over the containers' management
    network, plus kill/start of a node's container and captures on the links' bridges.

    up() makes a fresh CA and certificates in COMPOSE_DIR/tls (tls_dir), which the compose file hands to the
    daemons, and down() removes them; `insecure`: a file written with --insecure, no certificates (tls_dir None)."""

    driver = "live (containers)"
    compose_file = COMPOSE_FILE

    def __init__(self, topology_file, project="ifec", compose_dir=None, ready_timeout=120.0, frr=(), insecure=False):
        try:
            _project_name(project)
        except argparse.ArgumentTypeError as e:
            raise live.LiveError(f"project {e}") from None
        super().__init__(topology_file, ready_timeout=ready_timeout, frr=frr, insecure=insecure)
        self.project = project
        self.compose_dir = compose_dir
        self._own_dir = compose_dir is None  # written here, into a temporary folder down() removes
        self._compose_args = (frr, insecure)
        self._write_own_files()
        self._check_file(insecure)
        self.tls_dir = None if insecure else pathlib.Path(self.compose_dir) / TLS_FOLDER
        self.made = False  # up() has made containers, networks or certificates that down() has not yet removed
        from . import frr as frr_mod
        for name in self.frr_names:
            self.frr[name] = frr_mod.FrrContainer(name, self.container(name), images.DOCKER)

    def _write_own_files(self):
        """The compose file in a fresh temporary folder, where none was given and none is there (down() removed it)."""
        if self._own_dir and not (pathlib.Path(self.compose_dir or "/nonexistent") / self.compose_file).exists():
            self.compose_dir = tempfile.mkdtemp(prefix="ifec-compose-")
            write_compose(self.topo, self.compose_dir, *self._compose_args)

    def _check_file(self, insecure):
        """The compose file is there and hands the daemons what this fabric makes (certificates, or none)."""
        path = pathlib.Path(self.compose_dir) / self.compose_file
        try:
            text = path.read_text()
        except OSError as e:
            raise live.LiveError(f"{path}: {e.strerror} (./ifec testbed compose TOPOLOGY --out {self.compose_dir})")
        tls = "--tls-dir" in text
        if tls == insecure:
            raise live.LiveError(f"{path} was written {'for mutual TLS' if tls else 'with --insecure'}, this fabric is "
                                 f"{'insecure' if insecure else 'mutual TLS'}: write it again (./ifec testbed compose "
                                 f"TOPOLOGY{' --insecure' if insecure else ''} --out {self.compose_dir})")

    def _make_certificates(self, progress):
        """A fresh CA and certificates in tls_dir (make_pki: each daemon's names its node and 127.0.0.1)."""
        if self.tls_dir is None:
            progress("testbed: --insecure: the control plane is plaintext, without certificates or roles")
            return
        make_pki(self.topo, self.tls_dir, self.frr_names, progress=lambda line: progress(f"testbed: {line}"))

    def _remove_certificates(self):
        if self.tls_dir is not None:
            shutil.rmtree(self.tls_dir, ignore_errors=True)

    def container(self, name):
        return f"{self.project}_{name}_1"

    def address(self, nd):
        return f"127.0.0.1:{GRPC_HOST_PORT + nd['index']}"  # published on the host

    def up(self, progress=print):
        """Brings the fabric up and waits until every daemon is ready. Refuses, having made nothing, a project that
        already has containers and a published port another program holds; any failure after that (Ctrl-C
        included) takes down what it made before it is raised (`made` stays True where that failed too)."""
        t0 = time.time()
        self._write_own_files()
        self._check_free()
        self.made = True
        try:
            self._make_certificates(progress)
            self._deploy()
            progress(f"testbed: {len(self.nodes)} containers started ({time.time() - t0:.1f} s); waiting for the "
                     "daemons")
            return self._wait_ready(t0, progress)
        except BaseException as e:
            try:
                self.down()
            except Exception as d:
                if isinstance(e, live.LiveError):
                    raise live.LiveError(f"{e}; taking the failed bring-up down failed too: {d}") from None
                raise
            raise

    def _deploy(self):
        self._compose(["up", "-d"])

    def _wait_ready(self, t0, progress):
        while True:
            self._check_containers()
            status = self.status(timeout=2)
            waiting = [n for n, st in status.items() if not st.get("ready")]
            if not waiting:
                break
            if time.time() - t0 > self.ready_timeout:
                raise live.LiveError(f"not ready after {self.ready_timeout:.0f} s: " + "; ".join(
                    f"{n}: {status[n].get('error') or 'not ready'}" for n in waiting[:8]))
            time.sleep(1)
        progress(f"testbed: up ({time.time() - t0:.1f} s)")
        return self

    # --------------------------------------------------------------------------------- before and during up --

    def published_ports(self):
        """(host address, port, what) of every port this fabric publishes on its machine."""
        host = "0.0.0.0" if self.compose_file == STACK_FILE else "127.0.0.1"
        out = [(host, GRPC_HOST_PORT + n["index"], f"{n['name']}'s gRPC") for n in self.nodes
               if n["name"] not in self.frr_names]
        return out + [(host, 9090, "Prometheus")]

    def _existing(self):
        """The names of this project's containers (any left from an earlier bring-up, up or not)."""
        return _docker(["ps", "-a", "--format", "{{.Names}}", "--filter",
                        f"label=com.docker.compose.project={self.project}"]).split()

    def _check_free(self):
        """LiveError, before anything is made, for a project already up (its down would be this one's) and for a
        published port another program holds (docker-compose would fail midway, naming neither the node nor the
        program)."""
        have = self._existing()
        if have:
            raise live.LiveError(f"project {self.project} already has {len(have)} container(s) "
                                 f"({', '.join(sorted(have)[:4])}{', ...' if len(have) > 4 else ''}): take it down "
                                 "first (./ifec testbed down) or choose another --project")
        taken = []
        for host, port, what in self.published_ports():
            with socket.socket() as s:
                # SO_REUSEADDR: a connection of the last fabric's in TIME_WAIT is no holder; a listener still is.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((host, port))
                except OSError as e:
                    taken.append(f"{host}:{port} ({what}: {e.strerror})")
        if taken:
            raise live.LiveError(f"published port(s) not free: {', '.join(taken[:6])}"
                                 f"{', ...' if len(taken) > 6 else ''}; another testbed or program holds them "
                                 f"(ss -ltnp 'sport = :{taken[0].split(':')[1].split()[0]}' names it)")

    def _check_containers(self):
        """LiveError naming the daemons whose containers exited, or crash and restart, during bring-up, with their
        logs' last lines (before, up waited out its whole ready_timeout and named only the nodes not ready)."""
        ids = _docker(["ps", "-aq", "--filter", f"label=com.docker.compose.project={self.project}"]).split()
        if not ids:
            raise live.LiveError(f"project {self.project} has no containers (removed during the bring-up?)")
        fmt = '{{index .Config.Labels "com.docker.compose.service"}}|{{.State.Status}}|{{.State.ExitCode}}|' \
              '{{.RestartCount}}|{{.Id}}'
        failed = []
        for line in _docker(["inspect", "-f", fmt] + ids).splitlines():
            svc, state, code, restarts, cid = (line.split("|") + [""] * 5)[:5]
            # One restart may be a race at start (restart: on-failure tries again); a second is a daemon that fails.
            if state in ("exited", "dead") or (restarts.isdigit() and int(restarts) >= 2):
                failed.append(f"{svc}: container {state}, exit {code}, restarted {restarts} time(s); its log: "
                              f"{_log_tail(['logs', '--tail', '5', cid])}")
        if failed:
            raise live.LiveError("daemon container(s) failing during bring-up: " + "; ".join(failed))

    def down(self):
        try:
            self._compose(["down", "-v", "--remove-orphans"])
        except live.LiveError as e:
            self._remove_by_label(e)
        self._stubs.clear()
        self._remove_certificates()
        self.made = False
        if self._own_dir:  # (a later up() writes it again)
            shutil.rmtree(self.compose_dir, ignore_errors=True)

    def _remove_by_label(self, why, attempts=3):
        """What carries the project's label, removed whatever docker-compose saw: after Ctrl-C during `up -d`, dockerd
        still made a container the interrupted docker-compose had asked for, after `down` had listed the project's,
        and `down` then failed on the network it was attached to ("has active endpoints")."""
        for i in range(attempts):
            try:
                remove_project(self.project)
                return
            except live.LiveError as e:
                last = e
            time.sleep(2)
        raise live.LiveError(f"{why}; removing project {self.project}'s containers and networks by their labels "
                             f"failed too: {last}")

    def kill(self, node):
        _docker(["kill", self.container(node)])
        self._stubs.pop(node, None)

    def start(self, node):
        _docker(["start", self.container(node)])
        self._stubs.pop(node, None)

    def capture(self, selector, file, seconds=5):
        """Captures link `selector` on its Docker bridge (both ends' frames) into pcap `file`."""
        l = self.link(selector)
        net = _docker(["network", "inspect", "-f", "{{.Id}}", f"{self.project}_{link_network(l)}"]).strip()
        bridge = f"br-{net[:12]}"
        seconds = _args.whole(seconds, "seconds", 1, 86400)
        folder = pathlib.Path(file).parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise live.LiveError(f"capture file {file}: {folder} is no folder this user can write in")
        r = _run_tool(["dumpcap", "-q", "-i", bridge, "-w", str(file), "-a", f"duration:{seconds}"], seconds + 60)
        if r.returncode != 0:
            raise live.LiveError(f"capture on {bridge} (link {l['id']}): {r.stderr.strip()}")
        return f"link {l['id']} ({l['a']}:{l['a_port']} - {l['b']}:{l['b_port']}, bridge {bridge})"

    def _compose(self, args, timeout=300):
        p = _run_tool(["docker-compose", "-p", self.project, "-f", f"{self.compose_dir}/{self.compose_file}"] + args,
                      timeout)
        if p.returncode != 0:
            raise live.LiveError(f"docker-compose {' '.join(args)}: {(p.stderr or p.stdout).strip()[-600:]}")
        return p.stdout + p.stderr


class SwarmFabric(ContainerFabric):
    """The compose file's swarm twin (docker-stack.yml) deployed as a stack on a Docker swarm (`docker stack
    deploy`): services placed by the swarm, link networks overlays (VXLAN between machines), every node's gRPC
    published on its machine, the certificates docker secrets (the stack's own: `docker stack rm` removes them)."""

    driver = "live (swarm)"
    compose_file = STACK_FILE

    def _deploy(self):
        _docker(["stack", "deploy", "-c", f"{self.compose_dir}/{self.compose_file}", self.project])

    def _wait_ready(self, t0, progress):
        super()._wait_ready(t0, progress)
        return self._wait_names(t0, progress)

    def _existing(self):
        return _docker(["service", "ls", "--format", "{{.Name}}", "--filter",
                        f"label=com.docker.stack.namespace={self.project}"]).split()

    def _check_containers(self):
        """LiveError naming the services whose tasks failed twice or were rejected (a swarm retries them forever:
        a host-mode port taken, a daemon that exits at start), with the error and the service's last log lines."""
        p = _run_tool([images.DOCKER, "stack", "ps", self.project, "--no-trunc", "--format",
                       "{{.Name}}|{{.CurrentState}}|{{.Error}}"], 60)
        failures = {}
        for line in p.stdout.splitlines() if p.returncode == 0 else ():  # none yet right after the deploy
            name, state, err = (line.split("|") + ["", ""])[:3]
            service = name.strip().lstrip("\\_ ").split(".")[0]
            if state.startswith(("Failed", "Rejected")):
                failures.setdefault(service, []).append((state.split()[0], err.strip()))
        failed = [f"{s[len(self.project) + 1:]}: {len(f)} task(s) {f[0][0].lower()} "
                  f"({f[0][1] or 'no error given'}); its log: {_log_tail(['service', 'logs', '--tail', '5', s])}"
                  for s, f in sorted(failures.items()) if len(f) >= 2 or f[0][0] == "Rejected"]
        if failed:
            raise live.LiveError("service(s) failing during bring-up: " + "; ".join(failed))

    def _wait_names(self, t0, progress):
        """Waits until every GPU's container resolves every switch's name. The daemons answer on their published
        ports before the swarm's embedded DNS knows every service: a first AllReduce's reservation once found no
        p1-sw for over a second (its one retry included) and ran without plane 1."""
        switches = [n["name"] for n in self.topo.nodes if n["kind"] == "switch"]
        gpus = [n["name"] for n in self.topo.nodes if n["kind"] == "gpu"]
        while True:
            missing = []
            for g in gpus:
                ids = _docker(["ps", "-q", "--filter", f"label=com.docker.swarm.service.name={self.project}_{g}"])
                if not ids.split():
                    missing.append(f"{g} (no container)")
                    continue
                r = subprocess.run(["docker", "exec", ids.split()[0], "getent", "hosts"] + switches,
                                   capture_output=True, text=True, timeout=30)
                known = {w for line in r.stdout.splitlines() for w in line.split()[1:]}
                missing += [f"{g} -> {sw}" for sw in switches if sw not in known]
            if not missing:
                progress(f"testbed: every switch's name resolves in every GPU's container ({time.time() - t0:.1f} s)")
                return self
            if time.time() - t0 > self.ready_timeout:
                raise live.LiveError(f"names unresolved after {self.ready_timeout:.0f} s: {', '.join(missing[:8])}")
            time.sleep(1)

    def down(self, timeout=60):
        """Removes the stack and waits until its services, containers and networks are gone."""
        _docker(["stack", "rm", self.project])
        t0 = time.time()
        while self.leftovers():
            if time.time() - t0 > timeout:
                raise live.LiveError(f"stack {self.project} still has {self.leftovers()} after {timeout} s")
            time.sleep(1)
        self._stubs.clear()
        self._remove_certificates()
        if self._own_dir:
            shutil.rmtree(self.compose_dir, ignore_errors=True)

    def leftovers(self):
        out = []
        for what in (["service", "ls"], ["ps", "-a"], ["network", "ls"], ["secret", "ls"]):
            ids = _docker(what + ["-q", "--filter", f"name={self.project}_"]).split()
            out += [f"{len(ids)} {what[0] if what[0] != 'ps' else 'container'}(s)"] if ids else []
        return ", ".join(out)


def _run_tool(cmd, timeout):
    """A docker tool's run; one missing or not answering is a LiveError naming it (a traceback before)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise live.LiveError(f"{cmd[0]}: not installed (./ifec setup)") from None
    except subprocess.TimeoutExpired:
        raise live.LiveError(f"{' '.join(cmd[:4])}: no answer in {timeout} s (is dockerd running?)") from None


def _log_tail(args, lines=5):
    """The last lines of `docker ARGS` (a container's or service's log) on one line, stdout and stderr alike."""
    try:
        p = _run_tool([images.DOCKER] + args, 30)
    except live.LiveError as e:
        return f"(none: {e})"
    text = " | ".join(l for l in (p.stdout + p.stderr).strip().splitlines()[-lines:] if l.strip())
    return text[-800:] or "(empty)"


def _docker(args, timeout=120):
    p = _run_tool([images.DOCKER] + args, timeout)
    if p.returncode != 0:
        raise live.LiveError(f"docker {' '.join(args[:3])}: {(p.stderr or p.stdout).strip()}")
    return p.stdout


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _read_state(missing_ok=True):
    """The state `./ifec testbed up` wrote, or None where there is none; a LiveError for one that cannot be read."""
    try:
        with open(STATE) as f:
            st = json.load(f)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise live.LiveError("no containerized testbed is up (./ifec testbed up FILE)") from None
    except (OSError, ValueError) as e:
        raise live.LiveError(f"{STATE}: unreadable ({e}): remove it, and the containers with docker-compose down")
    if not (isinstance(st, dict) and {"topology", "project", "compose_dir"} <= st.keys()):
        raise live.LiveError(f"{STATE}: not a testbed's state (topology, project, compose_dir): {str(st)[:80]}; "
                             "remove it, and the containers with docker-compose down")
    return st


def attach():
    """The ContainerFabric `./ifec testbed up` started."""
    st = _read_state(missing_ok=False)
    return ContainerFabric(st["topology"], st["project"], st["compose_dir"], frr=st.get("frr", []),
                           insecure=st.get("insecure", False))


if __name__ == "__main__":
    raise SystemExit(main())
