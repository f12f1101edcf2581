// The daemons' command line: ifec-switchd / ifec-hostd --topo FILE --node NAME [--listen ADDR] [--netns NAME]
// [--loopback-mgmt] ... One clear line per problem on stderr and exit status 1 (serve() in daemon_serve.h).
#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

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

void check_listen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  const std::string port = colon == std::string::npos ? "" : listen.substr(colon + 1);
  IFEC_CHECK(colon != std::string::npos && colon > 0 && !port.empty() && port.size() <= 5 &&
                 port.find_first_not_of("0123456789") == std::string::npos,
             "--listen '" << listen << "': expected HOST:PORT (e.g. 0.0.0.0:50051)");
  IFEC_CHECK(std::stoi(port) >= 1 && std::stoi(port) <= 65535,
             "--listen '" << listen << "': port " << std::stoi(port) << " outside 1..65535");
}

std::vector<std::string> parse_external_peers(const std::string& v) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= v.size();) {
    const size_t comma = std::min(v.find(',', at), v.size());
    IFEC_CHECK(comma > at, "--external-peers '" << v << "': an empty GPU name");
    const std::string name = v.substr(at, comma - at);
    IFEC_CHECK(std::find(out.begin(), out.end(), name) == out.end(),
               "--external-peers '" << v << "' lists " << name << " twice");
    out.push_back(name);
    at = comma + 1;
  }
  return out;
}

// 0.0.0.0 is refused too: links_base 0 means "not given" (interfaces by their f<port> names).
uint32_t parse_links_base(const std::string& v) {
  in_addr addr{};
  IFEC_CHECK(inet_pton(AF_INET, v.c_str(), &addr) == 1 && (ntohl(addr.s_addr) & 7) == 0 && addr.s_addr != 0,
             "--links-by-subnet '" << v << "' is not a nonzero IPv4 address on an 8-address boundary");
  return ntohl(addr.s_addr);
}

// The guest's MAC as the interface shows it (xx:xx:xx:xx:xx:xx, hex digits in either case).
void check_guest_mac(const std::string& mac) {
  bool ok = mac.size() == 17;
  for (size_t i = 0; ok && i < mac.size(); ++i) {
    ok = i % 3 == 2 ? mac[i] == ':' : std::isxdigit(static_cast<unsigned char>(mac[i])) != 0;
  }
  IFEC_CHECK(ok, "--guest-mac '" << mac << "' is not a MAC address xx:xx:xx:xx:xx:xx");
}

// Options that must be given, and those that exclude each other.
void check_combination(const DaemonOptions& o, const char* what) {
  IFEC_CHECK(!o.topology_file.empty(), "--topo FILE is required");
  IFEC_CHECK(!o.node.empty(), "--node NAME is required");
  IFEC_CHECK(!o.tls_dir.empty() || o.insecure,
             "--tls-dir DIR (the control plane's certificates) or --insecure (plaintext) is required");
  IFEC_CHECK(o.tls_dir.empty() || !o.insecure, "--tls-dir and --insecure exclude each other");
  IFEC_CHECK(!o.mgmt_names || !o.mgmt_loopback, "--mgmt-names and --loopback-mgmt exclude each other");
  const bool host = std::string(what) == "a GPU";  // hostd's options, which a switch would ignore
  IFEC_CHECK(host || (o.guest_mac.empty() && o.external_peers.empty()),
             "--guest-mac and --external-peers are hostd's (a GPU's RDMA peers), not " << what << "'s");
}

const std::set<std::string> kValueOptions = {"--topo",    "--node",          "--listen",
                                             "--netns",   "--guest-mac",     "--external-peers",
                                             "--tls-dir", "--fabric-driver", "--links-by-subnet"};

// One of kValueOptions: checks `v` and fills it in `o`.
void set_value_option(const std::string& a, const std::string& v, DaemonOptions* o) {
  if (a == "--topo") {
    o->topology_file = v;
  } else if (a == "--node") {
    o->node = v;
  } else if (a == "--listen") {
    check_listen(v);
    o->listen = v;
  } else if (a == "--netns") {
    o->netns = v;
  } else if (a == "--guest-mac") {
    check_guest_mac(v);
    o->guest_mac = v;
  } else if (a == "--external-peers") {
    o->external_peers = parse_external_peers(v);
  } else if (a == "--tls-dir") {
    o->tls_dir = v;
  } else if (a == "--fabric-driver") {
    parse_fabric_driver(v);  // a bad name is refused here, naming it
    o->fabric_driver = v;
  } else {
    o->links_base = parse_links_base(v);
  }
}

bool set_flag(const std::string& a, DaemonOptions* o) {
  if (a == "--loopback-mgmt") {
    o->mgmt_loopback = true;
  } else if (a == "--mgmt-names") {
    o->mgmt_names = true;
  } else if (a == "--insecure") {
    o->insecure = true;
  } else {
    return false;
  }
  return true;
}

}  // namespace

bool parse_daemon_options(int argc, char** argv, DaemonOptions* o, const char* what) {
  std::map<std::string, std::string> given;  // value options so far: one value each, never an empty one
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(kUsage, argv[0], what);
      return false;
    }
    if (set_flag(a, o)) {
      continue;
    }
    IFEC_CHECK(kValueOptions.count(a) != 0, "unknown option '" << a << "' (--help lists them)");
    IFEC_CHECK(i + 1 < argc, a << " needs a value");
    const std::string v = argv[++i];
    // An empty value would read as the option not given (--netns '': the daemon's own namespace).
    IFEC_CHECK(!v.empty(), a << " needs a value, got ''");
    const auto [first, fresh] = given.emplace(a, v);
    IFEC_CHECK(fresh, a << " given twice ('" << first->second << "', then '" << v << "')");
    set_value_option(a, v, o);
  }
  check_combination(*o, what);
  return true;
}

}  // namespace ifec::live
