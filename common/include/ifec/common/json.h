// JSON text helpers shared by every report writer (CLI benches, the sim report, the Python bindings' JSON rows).
#pragma once

#include <cstdio>
#include <sstream>
#include <string>
#include <type_traits>
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

// One JSON object built field by field, in order: the single writer behind every report row (collective rows, MoE
// rows, the raw-traffic report) that the CLI prints and the Python package parses.
class JsonObject {
 public:
  JsonObject& add(const std::string& key, const std::string& v) { return raw(key, json_quote(v)); }
  JsonObject& add(const std::string& key, const char* v) { return raw(key, json_quote(v)); }
  JsonObject& add(const std::string& key, bool v) { return raw(key, v ? "true" : "false"); }
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
  JsonObject& add(const std::string& key, T v) {
    return raw(key, number(v));
  }
  template <typename T>
  JsonObject& add(const std::string& key, const std::vector<T>& v) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      out += (i ? "," : "") + value(v[i]);
    }
    return raw(key, out + "]");
  }
  JsonObject& add(const std::string& key, const JsonObject& v) { return raw(key, v.str()); }
  // A value already in JSON.
  JsonObject& raw(const std::string& key, const std::string& json) {
    body_ += (body_.empty() ? "" : ",") + json_quote(key) + ":" + json;
    return *this;
  }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  template <typename T>
  static std::string number(T v) {
    std::ostringstream os;
    os.precision(10);
    os << +v;
    return os.str();
  }
  static std::string value(const std::string& s) { return json_quote(s); }
  static std::string value(const JsonObject& o) { return o.str(); }
  template <typename T>
  static std::string value(T v) {
    return number(v);
  }
  std::string body_;
};

}  // namespace ifec::common
