// Command-line options of ifec-cli: every command declares its options once, in a table that parses argv, answers
// --help, and names the bad value in every error (unknown option, missing value, not a number, out of range).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ifec::cli {

struct Option {
  std::string name;     // "--bytes"
  std::string value;    // placeholder of its value ("SIZE"), "" for a flag
  std::string help;     // one line
  bool repeat = false;  // may be given more than once (--fail)
};

struct CommandSpec {
  std::string name;      // "sim", "bench moe"
  std::string synopsis;  // "--topo FILE --traffic PATTERN --bytes SIZE [options]"
  std::string summary;   // what it does, one or two lines
  std::vector<Option> options;
  int positionals = 0;  // required positional arguments (pcap FILE)
};

class Args {
 public:
  // Parses argv against `spec`; throws common::Error naming the bad argument. help() is true for --help / -h.
  Args(const CommandSpec& spec, int argc, char** argv);
  bool help() const { return help_; }
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  // The value of an option given once ("" when absent), every value of a repeatable one, the positionals.
  std::string get(const std::string& name, const std::string& fallback = "") const;
  const std::vector<std::string>& all(const std::string& name) const;
  const std::vector<std::string>& positionals() const { return positionals_; }

 private:
  bool help_ = false;
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positionals_;
};

// The command's --help text: synopsis, summary and one line per option.
std::string help_text(const CommandSpec& spec);

// Value parsers: each throws common::Error("FLAG 'TEXT' ...") naming the flag and the text.
// A whole number in [min, max]: digits only (no sign), no overflow.
uint64_t parse_uint(const std::string& text, const std::string& flag, uint64_t min = 0, uint64_t max = UINT64_MAX);
// A byte size: digits with an optional unit B, K/KiB, M/MiB, G/GiB (binary); no sign, no overflow.
uint64_t parse_size(const std::string& text, const std::string& flag);
// Comma-separated sizes ("1MiB,4MiB").
std::vector<uint64_t> parse_sizes(const std::string& text, const std::string& flag);
// Comma-separated whole numbers in [min, max] ("8,16,32").
std::vector<uint64_t> parse_uints(const std::string& text, const std::string& flag, uint64_t min, uint64_t max);
// A probability in [0, 1).
double parse_probability(const std::string& text, const std::string& flag);
// One of `choices`.
std::string parse_choice(const std::string& text, const std::string& flag, const std::vector<std::string>& choices);
// Comma-separated, each one of `choices`, none twice ("per_rank,ifec").
std::vector<std::string> parse_choices(const std::string& text, const std::string& flag,
                                       const std::vector<std::string>& choices);

}  // namespace ifec::cli
