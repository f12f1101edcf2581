// JSON text helpers shared by every report writer (CLI benches, the sim report, the Python bindings' JSON rows).
#pragma once

#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
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
  JsonObject& add(const std::string& key, const std::string& v) { return put(key, json_quote(v), csv_quote(v)); }
  JsonObject& add(const std::string& key, const char* v) { return add(key, std::string(v)); }
  JsonObject& add(const std::string& key, bool v) { return put(key, v ? "true" : "false", v ? "true" : "false"); }
  // A number; NaN or an infinity is null in the JSON (which has neither: "nan" made the row unparseable) and the
  // number's text in the CSV column ("nan", "inf", as Python's float() reads them).
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
  JsonObject& add(const std::string& key, T v) {
    return put(key, value(v), number(v));
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
  // A value already in JSON (not a CSV column).
  JsonObject& raw(const std::string& key, const std::string& json) { return put(key, json, std::nullopt); }
  std::string str() const { return "{" + body_ + "}"; }

  // The row as CSV, the one rule of every report file (the Python package's reports.write_csv follows it too):
  // the scalar fields in the order added (lists and objects are JSON-only), numbers as in the JSON, booleans as
  // true/false, strings quoted (RFC 4180) when they hold a comma, quote or line break.
  std::string csv_header() const { return join(true); }
  std::string csv_row() const { return join(false); }

  static std::string csv_quote(const std::string& s) {
    if (s.find_first_of(",\"\r\n") == std::string::npos) {
      return s;
    }
    std::string out = "\"";
    for (char c : s) {
      out += c == '"' ? "\"\"" : std::string(1, c);
    }
    return out + "\"";
  }

 private:
  JsonObject& put(const std::string& key, const std::string& json, std::optional<std::string> csv) {
    body_ += (body_.empty() ? "" : ",") + json_quote(key) + ":" + json;
    if (csv) {
      columns_.emplace_back(csv_quote(key), std::move(*csv));
    }
    return *this;
  }
  std::string join(bool keys) const {
    std::string out;
    for (size_t i = 0; i < columns_.size(); ++i) {
      out += (i ? "," : "") + (keys ? columns_[i].first : columns_[i].second);
    }
    return out;
  }
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
    if constexpr (std::is_floating_point_v<T>) {
      if (!std::isfinite(v)) return "null";
    }
    return number(v);
  }
  std::string body_;
  std::vector<std::pair<std::string, std::string>> columns_;  // scalar fields: (key, value) as CSV text
};

}  // namespace ifec::common
