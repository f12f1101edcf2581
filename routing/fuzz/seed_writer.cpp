// Writes BGP messages into a libFuzzer corpus directory as seeds for fuzz_bgp (mode byte 0x01: raw stream bytes).
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "ifec/routing/bgp.h"

int main(int argc, char** argv) {
  using namespace ifec::routing;
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_bgp_seeds DIR\n");
    return 2;
  }
  BgpUpdate u;
  u.withdrawn = {bgp_prefix(0x0a090000, 16)};
  u.attrs.origin = BgpOrigin::kIgp;
  u.attrs.as_path = std::vector<BgpAsPathSegment>{{kAsSequence, {4200000002u, 65001}}, {kAsSet, {7, 8}}};
  u.attrs.next_hop = 0x0a000002;
  u.attrs.med = 5;
  u.attrs.aggregator = BgpAggregator{4200000002u, 0x0a000002};
  u.attrs.ext_communities = {encode_path_bandwidth(4200000002u, 400)};
  u.attrs.unknown = {BgpRawAttribute{0xc0, 8, {0xfd, 0xe9, 0, 1}}};
  u.nlri = {bgp_prefix(0x0a010002, 32), bgp_prefix(0x0a020000, 15)};
  // IPv4 unicast in MP_UNREACH_NLRI and MP_REACH_NLRI (RFC 4760), as GoBGP sends it: no encoder here writes these.
  const std::vector<uint8_t> mp = {
      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,  // marker
      0x00, 0x3e, 0x02,                                                        // length 62, UPDATE
      0x00, 0x00,                                                              // no withdrawn routes
      0x00, 0x27,                                                              // attributes: 39 bytes
      0x40, 0x01, 0x01, 0x00,                                                  // ORIGIN IGP
      0x40, 0x02, 0x06, 0x02, 0x01, 0xfa, 0x56, 0xea, 0x02,                    // AS_PATH [4200000002]
      0x80, 0x0f, 0x06, 0x00, 0x01, 0x01, 0x10, 0x0a, 0x09,                    // MP_UNREACH_NLRI 10.9.0.0/16
      0x80, 0x0e, 0x0e, 0x00, 0x01, 0x01, 0x04, 0x0a, 0x00, 0x00, 0x02, 0x00,  // MP_REACH_NLRI via 10.0.0.2:
      0x20, 0x0a, 0x01, 0x00, 0x02};                                           // 10.1.0.2/32
  BgpOpen frr = make_bgp_open(65001, 9, 0x0a0000fe);
  frr.unknown = {{128, {}}, {70, {}}, {6, {}}, {69, {0, 1, 1, 1}}, {73, {5, 'l', 'e', 'a', 'f', '1', 0}}};
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> seeds = {
      {"open", encode_bgp_open(make_bgp_open(4200000002u, 90, 0x0a000002))},
      {"open_frr", encode_bgp_open(frr)},
      {"update_as4", encode_bgp_update(u, true)},
      {"update_as2", encode_bgp_update(u, false)},
      {"update_mp", mp},
      {"keepalive", encode_bgp_keepalive()},
      {"notification", encode_bgp_notification({3, 11, {1, 2}})},
      {"route_refresh", encode_bgp_route_refresh({})},
  };
  for (const auto& [name, bytes] : seeds) {
    const std::string path = std::string(argv[1]) + "/seed_" + name;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) {
      std::perror(path.c_str());
      return 1;
    }
    std::fputc(0x01, f);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  return 0;
}
