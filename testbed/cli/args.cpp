// Option tables and strict value parsers for ifec-cli.
#include "args.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "ifec/common/checks.h"

namespace ifec::cli {

namespace {

const Option* find(const CommandSpec& spec, const std::string& name) {
  for (const Option& o : spec.options) {
    if (o.name == name) {
      return &o;
    }
  }
  return nullptr;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s + sep) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return out;
}

}  // namespace

Args::Args(const CommandSpec& spec, int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      return;
    }
    if (a.rfind("--", 0) != 0 || a == "--") {
      positionals_.push_back(a);
      continue;
    }
    const Option* o = find(spec, a);
    IFEC_CHECK(o != nullptr, "unknown option '" << a << "' (see ifec " << spec.name << " --help)");
    IFEC_CHECK(o->repeat || !values_.count(a), a << " given twice");
    if (o->value.empty()) {
      values_[a].push_back("");
      continue;
    }
    IFEC_CHECK(i + 1 < argc, a << " needs a value (" << o->value << ")");
    values_[a].push_back(argv[++i]);
  }
  // More than expected: the first extra one is named (it is the one to take out).
  const size_t want = static_cast<size_t>(std::max(spec.positionals, 0));
  IFEC_CHECK(positionals_.size() == want,
             "expected " << spec.positionals << " argument(s), got " << positionals_.size()
                         << (positionals_.size() > want ? ": '" + positionals_[want] + "' is one too many" : "")
                         << " (see ifec " << spec.name << " --help)");
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second.front();
}

const std::vector<std::string>& Args::all(const std::string& name) const {
  static const std::vector<std::string> kNone;
  auto it = values_.find(name);
  return it == values_.end() ? kNone : it->second;
}

std::string help_text(const CommandSpec& spec) {
  std::ostringstream o;
  o << "usage: ifec " << spec.name << (spec.synopsis.empty() ? "" : " " + spec.synopsis) << "\n\n"
    << spec.summary << "\n";
  if (!spec.options.empty()) {
    o << "\noptions:\n";
  }
  for (const Option& opt : spec.options) {
    std::string left = "  " + opt.name + (opt.value.empty() ? "" : " " + opt.value);
    left.resize(std::max<size_t>(left.size() + 2, 26), ' ');
    o << left << opt.help << (opt.repeat ? " (repeatable)" : "") << "\n";
  }
  o << "  --help                  this text\n";
  return o.str();
}

uint64_t parse_uint(const std::string& text, const std::string& flag, uint64_t min, uint64_t max) {
  IFEC_CHECK(!text.empty() && text.find_first_not_of("0123456789") == std::string::npos,
             flag << " '" << text << "' is not a whole number");
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  IFEC_CHECK(errno != ERANGE, flag << " '" << text << "' is too large");
  IFEC_CHECK(v >= min && v <= max, flag << " '" << text << "' outside " << min << ".." << max);
  return v;
}

uint64_t parse_size(const std::string& text, const std::string& flag) {
  const size_t digits = text.find_first_not_of("0123456789");
  IFEC_CHECK(digits != 0 && !text.empty(),
             flag << " '" << text << "' is not a size (a whole number of bytes, or with B, KiB, MiB or GiB)");
  const std::string unit = digits == std::string::npos ? "" : text.substr(digits);
  IFEC_CHECK(unit.empty() || (unit[0] != '.' && unit[0] != 'e' && unit[0] != 'E'),
             flag << " '" << text << "' is not a whole number of bytes (write 1536MiB, not 1.5GiB)");
  uint64_t shift = 0;
  if (unit == "" || unit == "B") {
    shift = 0;
  } else if (unit == "K" || unit == "k" || unit == "KiB") {
    shift = 10;
  } else if (unit == "M" || unit == "MiB") {
    shift = 20;
  } else if (unit == "G" || unit == "GiB") {
    shift = 30;
  } else {
    IFEC_FAIL(flag << " '" << text << "': unknown unit '" << unit << "' (use B, KiB, MiB or GiB)");
  }
  const uint64_t v = parse_uint(text.substr(0, digits), flag);
  IFEC_CHECK(v <= (UINT64_MAX >> shift), flag << " '" << text << "' is too large (above 2^64 bytes)");
  return v << shift;
}

std::vector<uint64_t> parse_sizes(const std::string& text, const std::string& flag) {
  std::vector<uint64_t> out;
  for (const std::string& item : split(text, ',')) {
    IFEC_CHECK(!item.empty(), flag << " '" << text << "': empty size in the list");
    out.push_back(parse_size(item, flag));
  }
  return out;
}

std::vector<uint64_t> parse_uints(const std::string& text, const std::string& flag, uint64_t min, uint64_t max) {
  std::vector<uint64_t> out;
  for (const std::string& item : split(text, ',')) {
    out.push_back(parse_uint(item, flag, min, max));
  }
  return out;
}

double parse_probability(const std::string& text, const std::string& flag) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  IFEC_CHECK(!text.empty() && end && *end == 0 && std::isfinite(v) && v >= 0 && v < 1,
             flag << " '" << text << "': expected a probability 0 <= P < 1");
  return v;
}

std::string parse_choice(const std::string& text, const std::string& flag, const std::vector<std::string>& choices) {
  std::string list;
  for (const std::string& c : choices) {
    if (c == text) {
      return text;
    }
    list += (list.empty() ? "" : ", ") + c;
  }
  IFEC_FAIL(flag << " '" << text << "': expected one of " << list);
}

std::vector<std::string> parse_choices(const std::string& text, const std::string& flag,
                                       const std::vector<std::string>& choices) {
  std::vector<std::string> out;
  for (const std::string& item : split(text, ',')) {
    IFEC_CHECK(std::find(out.begin(), out.end(), item) == out.end(),
               flag << " '" << text << "': '" << item << "' given twice");
    out.push_back(parse_choice(item, flag, choices));
  }
  return out;
}

}  // namespace ifec::cli
