// Link selectors and times with units, resolved against a topology.
#include "ifec/testbed/link_events.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <sstream>

#include "ifec/common/checks.h"

namespace ifec::testbed {

using common::TimeNs;

TimeNs parse_time(const std::string& text) {
  // Decimal digits with an optional fraction and exponent: std::stod alone would also take "0x10", " 5" and "inf".
  const size_t idx = text.find_first_not_of("0123456789.eE+-");
  const std::string number = text.substr(0, idx);
  const bool decimal = !number.empty() && (std::isdigit(static_cast<unsigned char>(number[0])) || number[0] == '.');
  double v = 0;
  size_t used = 0;
  try {
    v = decimal ? std::stod(number, &used) : 0;
  } catch (const std::exception&) {
  }
  IFEC_CHECK(decimal && used == number.size(),
             "bad time '" << text << "': expected a number with ns (the default), us, ms or s");
  const std::string unit = idx == std::string::npos ? "" : text.substr(idx);
  double scale = 1;
  if (unit.empty() || unit == "ns") {
    scale = 1;
  } else if (unit == "us") {
    scale = 1e3;
  } else if (unit == "ms") {
    scale = 1e6;
  } else if (unit == "s") {
    scale = 1e9;
  } else {
    IFEC_FAIL("bad time unit '" << unit << "' in '" << text << "': expected ns, us, ms or s");
  }
  IFEC_CHECK(std::isfinite(v), "bad time '" << text << "': expected a number with ns (the default), us, ms or s");
  IFEC_CHECK(v >= 0 && v * scale <= kMaxEventTimeNs, "time '" << text << "' outside 0.."
                                                              << static_cast<uint64_t>(kMaxEventTimeNs / 1e9)
                                                              << " s of simulated time");
  return static_cast<TimeNs>(std::llround(v * scale));
}

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

bool all_digits(const std::string& s) { return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos; }

// A whole number in a selector, at most 9 digits (std::stoi cannot overflow); throws naming the selector.
int selector_number(const std::string& digits, const std::string& selector, const char* what) {
  IFEC_CHECK(all_digits(digits),
             "link selector '" << selector << "': " << what << " '" << digits << "' is not a number");
  IFEC_CHECK(digits.size() <= 9, "link selector '" << selector << "': " << what << " " << digits << " is too large");
  return std::stoi(digits);
}

int prefixed_number(const std::string& s, const std::string& prefix, const std::string& selector) {
  IFEC_CHECK(s.rfind(prefix, 0) == 0 && all_digits(s.substr(prefix.size())),
             "link selector '" << selector << "': expected '" << prefix << "N', got '" << s << "'");
  return selector_number(s.substr(prefix.size()), selector, prefix.c_str());
}

}  // namespace

std::vector<int> resolve_links(const routing::Topology& topo, const std::string& selector) {
  if (all_digits(selector)) {
    const int id = selector_number(selector, selector, "link id");
    IFEC_CHECK(id < static_cast<int>(topo.links.size()), "link id " << id << " outside 0.." << topo.links.size() - 1);
    return {id};
  }
  const std::vector<std::string> parts = split(selector, ':');
  IFEC_CHECK(parts.size() == 2 || parts.size() == 3,
             "link selector '" << selector << "': expected ID, NODE:NODE[:SUB] or GPU:planeP[:subS]");
  const int a = topo.find_node(parts[0]);
  IFEC_CHECK(a >= 0, "link selector '" << selector << "': unknown node '" << parts[0] << "'");
  std::vector<int> out;
  if (parts[1].rfind("plane", 0) == 0) {
    const int plane = prefixed_number(parts[1], "plane", selector);
    IFEC_CHECK(plane < topo.num_planes,
               "link selector '" << selector << "': plane " << plane << " outside 0.." << topo.num_planes - 1);
    const int sub = parts.size() == 3 ? prefixed_number(parts[2], "sub", selector) : -1;
    for (int l : topo.links_of(a)) {
      const routing::Link& lk = topo.links[l];
      if (lk.plane == plane && (sub < 0 || lk.subport == sub)) {
        out.push_back(l);
      }
    }
  } else {
    const int b = topo.find_node(parts[1]);
    IFEC_CHECK(b >= 0, "link selector '" << selector << "': unknown node '" << parts[1] << "'");
    int sub = -1;
    if (parts.size() == 3) {
      sub = selector_number(parts[2], selector, "sub-link");
    }
    for (int l : topo.links_of(a)) {
      const routing::Link& lk = topo.links[l];
      if ((lk.a == b || lk.b == b) && (sub < 0 || lk.subport == sub)) {
        out.push_back(l);
      }
    }
  }
  IFEC_CHECK(!out.empty(), "link selector '" << selector << "' matches no link");
  return out;
}

LinkEvent parse_link_event(const routing::Topology& topo, const std::string& text, bool up) {
  const size_t at = text.rfind('@');
  IFEC_CHECK(at != std::string::npos && at > 0 && at + 1 < text.size(),
             "link event '" << text << "': expected LINK@TIME, e.g. gpu5:plane2:sub0@10us");
  LinkEvent e;
  e.spec = text;
  e.links = resolve_links(topo, text.substr(0, at));
  e.at = parse_time(text.substr(at + 1));
  e.up = up;
  return e;
}

namespace {

// Event indices in the order a run applies them: by time, equal times in the list's order.
std::vector<size_t> applied_order(const std::vector<LinkEvent>& events) {
  std::vector<size_t> order(events.size());
  for (size_t i = 0; i < order.size(); ++i) {
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return events[a].at < events[b].at; });
  return order;
}

}  // namespace

void check_link_events(const std::vector<LinkEvent>& events) {
  std::map<int, bool> down;
  for (size_t i : applied_order(events)) {
    const LinkEvent& e = events[i];
    const bool restores = std::any_of(e.links.begin(), e.links.end(), [&](int l) { return down[l]; });
    IFEC_CHECK(!e.up || restores, "restore '" << e.spec
                                              << "': " << (e.links.size() == 1 ? "its link is" : "its links are")
                                              << " up at " << e.at
                                              << " ns (no failure before it, or restored already): a restoration "
                                                 "follows a failure");
    for (int l : e.links) {
      down[l] = !e.up;
    }
  }
}

std::string cut_off_gpus(const routing::Topology& topo, const std::vector<LinkEvent>& events) {
  std::map<int, bool> down;
  std::map<int, TimeNs> since;  // GPU node -> when it lost its last fabric link
  std::ostringstream out;
  auto fabric_links_down = [&](int node) {
    const std::vector<int>& ls = topo.links_of(node);
    return std::all_of(ls.begin(), ls.end(),
                       [&](int l) { return topo.links[l].plane == routing::kNvlinkPlane || down[l]; });
  };
  auto report = [&](int node, const TimeNs* restored) {
    out << (out.tellp() > 0 ? "; " : "") << "GPU " << topo.nodes[node].gpu_index << " lost every fabric link at "
        << since[node] << " ns";
    if (restored != nullptr) out << ", restored at " << *restored << " ns";
  };
  for (size_t i : applied_order(events)) {
    const LinkEvent& e = events[i];
    for (int l : e.links) down[l] = !e.up;
    for (int l : e.links) {
      for (int node : {topo.links[l].a, topo.links[l].b}) {
        if (topo.nodes[node].kind != routing::NodeKind::kGpu) continue;
        const bool cut = fabric_links_down(node);
        if (cut && since.count(node) == 0) {
          since[node] = e.at;
        } else if (!cut && since.count(node) != 0) {
          report(node, &e.at);
          since.erase(node);
        }
      }
    }
  }
  for (const auto& cut : since) report(cut.first, nullptr);
  return out.str();
}

}  // namespace ifec::testbed
