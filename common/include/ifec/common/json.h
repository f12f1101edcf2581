// JSON text helpers shared by every report writer (CLI benches, the sim report, the Python bindings' JSON rows).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace ifec::common {

// `s` as a JSON string literal, quotes included (quote, backslash and control characters escaped).
inline std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// A JSON array of strings.
inline std::string json_strings(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    out += (i ? "," : "") + json_quote(v[i]);
  }
  return out + "]";
}

}  // namespace ifec::common
