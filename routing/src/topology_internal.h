// Helpers shared by the topology generators, validate() and the YAML loader (not part of the public API).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ifec/routing/topology.h"

namespace ifec::routing::detail {

// The first structural problem validate() finds. The loader maps `node`, `link` or `keys` back to a line of the
// file, so the rule lives in one place and the YAML error still points at the offending line.
struct Problem {
  std::string message;
  int node = -1;
  int link = -1;
  std::vector<std::string> keys;  // dotted YAML keys ("params.pfc.xon_bytes"), most specific first
};

std::optional<Problem> find_problem(const Topology& t);

// Addressing scheme (host byte order):
//  - GPU i:            10.0.(i / 250).(i % 250 + 1), so the last octet is never 0 or 255 and 64000 GPUs fit;
//  - switch n of plane p (n counts the switches of that plane in node order, from 1): 10.255.p.n.
uint32_t gpu_loopback(int gpu_index);
uint32_t switch_loopback(int plane, int n);
std::string ipv4_to_string(uint32_t addr);

// Fills the derived node fields (num_ports = highest used port + 1, loopbacks) after nodes and links are set.
void assign_derived_fields(Topology& t);

// Shortest decimal form that parses back to exactly `v` (so YAML output round-trips bit for bit).
std::string format_double(double v);

}  // namespace ifec::routing::detail
