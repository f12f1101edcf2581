// The daemons' command line: ifec-switchd / ifec-hostd --topo FILE --node NAME [--listen ADDR] [--netns NAME]
// [--loopback-mgmt] ... One clear line per problem on stderr and exit status 1 (serve() in daemon_serve.h).
#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "daemon_serve.h"
#include "ifec/common/checks.h"
#include "ifec/live/xdp_port.h"

namespace ifec::live {

namespace {

const char* kUsage =
    "usage: %s --topo FILE --node NAME [--listen ADDR] [--netns NAME] [--loopback-mgmt]\n"
    "          [--mgmt-names] [--links-by-subnet BASE] [--guest-mac MAC]\n"
    "          [--external-peers GPU[,GPU...]] [--fabric-driver D] (--tls-dir DIR | --insecure)\n"
    "  --topo FILE       the topology (YAML) every daemon of the fabric runs from; env:NAME reads it from\n"
    "                    environment variable NAME (containers)\n"
    "  --node NAME       the topology node this daemon is (%s)\n"
    "  --listen ADDR     gRPC address HOST:PORT (default: the node's management address 172.31.x.y:50051);\n"
    "                    Prometheus metrics listen apart from it, on the management address :9400 (with\n"
    "                    --loopback-mgmt 127.0.0.1:9400 + node index, with --mgmt-names 0.0.0.0:9400)\n"
    "  --netns NAME      open the fabric interfaces (f<port>) in this network namespace\n"
    "  --loopback-mgmt   every daemon on 127.0.0.1, port 50051 + node index (tests)\n"
    "  --mgmt-names      every daemon at its node name (containers: DNS), gRPC :50051, metrics :9400\n"
    "  --links-by-subnet BASE  link L's interface is the one with an address in BASE + 8 L /29 (containers,\n"
    "                    whose interfaces Docker names; BASE an IPv4 address, e.g. 10.64.0.0)\n"
    "  --guest-mac MAC   hostd: the GPU is an external RDMA peer (a Soft-RoCE guest) sharing the node's\n"
    "                    interface: speak FARE for it under MAC, run no endpoint (testbed/rxe)\n"
    "  --external-peers GPU[,GPU...]  hostd: these GPUs are external RDMA peers, not ranks (testbed/rxe)\n"
    "  --tls-dir DIR     mutual TLS: DIR holds ca.pem (the testbed's CA) and NAME.pem / NAME.key, this node's\n"
    "                    certificate (the bring-up makes them, ifec.pki); clients need a certificate of that CA\n"
    "                    whose role may call the rpc (control.proto's roles)\n"
    "  --insecure        plaintext gRPC, no certificates, no roles: anyone who reaches the address may do anything\n"
    "  --fabric-driver D the fabric ports' sockets: af_packet (default), af_xdp (an XDP program redirecting the\n"
    "                    fabric's frames to an AF_XDP socket), auto (AF_XDP where it can, else AF_PACKET, saying\n"
    "                    why in the daemon's events)\n";

}  // namespace

bool parse_daemon_options(int argc, char** argv, DaemonOptions* o, const char* what) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string* out) {
      IFEC_CHECK(i + 1 < argc, a << " needs a value");
      *out = argv[++i];
    };
    if (a == "--topo") {
      value(&o->topology_file);
    } else if (a == "--node") {
      value(&o->node);
    } else if (a == "--listen") {
      value(&o->listen);
      const size_t colon = o->listen.rfind(':');
      const std::string port = colon == std::string::npos ? "" : o->listen.substr(colon + 1);
      IFEC_CHECK(colon != std::string::npos && colon > 0 && !port.empty() && port.size() <= 5 &&
                     port.find_first_not_of("0123456789") == std::string::npos,
                 "--listen '" << o->listen << "': expected HOST:PORT (e.g. 0.0.0.0:50051)");
      IFEC_CHECK(std::stoi(port) >= 1 && std::stoi(port) <= 65535,
                 "--listen '" << o->listen << "': port " << std::stoi(port) << " outside 1..65535");
    } else if (a == "--netns") {
      value(&o->netns);
    } else if (a == "--loopback-mgmt") {
      o->mgmt_loopback = true;
    } else if (a == "--guest-mac") {
      value(&o->guest_mac);
    } else if (a == "--external-peers") {
      std::string v;
      value(&v);
      for (size_t at = 0; at <= v.size();) {
        const size_t comma = std::min(v.find(',', at), v.size());
        IFEC_CHECK(comma > at, "--external-peers '" << v << "': an empty GPU name");
        o->external_peers.push_back(v.substr(at, comma - at));
        at = comma + 1;
      }
    } else if (a == "--tls-dir") {
      value(&o->tls_dir);
    } else if (a == "--insecure") {
      o->insecure = true;
    } else if (a == "--fabric-driver") {
      value(&o->fabric_driver);
      parse_fabric_driver(o->fabric_driver);  // a bad name is refused here, naming it
    } else if (a == "--mgmt-names") {
      o->mgmt_names = true;
    } else if (a == "--links-by-subnet") {
      std::string v;
      value(&v);
      in_addr addr{};
      IFEC_CHECK(inet_pton(AF_INET, v.c_str(), &addr) == 1 && (ntohl(addr.s_addr) & 7) == 0,
                 "--links-by-subnet '" << v << "' is not an IPv4 address on an 8-address boundary");
      o->links_base = ntohl(addr.s_addr);
    } else if (a == "--help" || a == "-h") {
      std::printf(kUsage, argv[0], what);
      return false;
    } else {
      IFEC_FAIL("unknown option '" << a << "' (--help lists them)");
    }
  }
  IFEC_CHECK(!o->topology_file.empty(), "--topo FILE is required");
  IFEC_CHECK(!o->node.empty(), "--node NAME is required");
  IFEC_CHECK(!o->tls_dir.empty() || o->insecure,
             "--tls-dir DIR (the control plane's certificates) or --insecure (plaintext) is required");
  IFEC_CHECK(o->tls_dir.empty() || !o->insecure, "--tls-dir and --insecure exclude each other");
  const bool host = std::string(what) == "a GPU";  // hostd's options, which a switch would ignore
  IFEC_CHECK(host || (o->guest_mac.empty() && o->external_peers.empty()),
             "--guest-mac and --external-peers are hostd's (a GPU's RDMA peers), not " << what << "'s");
  return true;
}

}  // namespace ifec::live
