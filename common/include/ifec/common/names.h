// One table per vocabulary (enum value <-> name), from which a vocabulary's X_name(value) and parse_X(text) derive.
//
//   constexpr Name<Ordering> kOrderingNames[] = {{Ordering::kWeak, "weak"}, {Ordering::kPartial, "partial"}};
//   constexpr Vocabulary kOrderings("ordering mode", kOrderingNames);
//   const char* ordering_name(Ordering o) { return kOrderings.name(o); }
//   Ordering parse_ordering(const std::string& text) { return kOrderings.parse(text); }
//
// A later row with a value already named is an alias: parse accepts it, name answers the first row's, and errors
// list it in parentheses after the name ("fp32 (float)"). A table may have rows of its own type with more columns,
// as long as they have `value` and `name` (the communicator's algorithms: how each runs, what scratch it needs).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "ifec/common/checks.h"

namespace ifec::common {

template <typename E>
struct Name {
  E value;
  const char* name;
};

template <typename Row>
class Vocabulary {
 public:
  using Value = decltype(Row::value);

  // `kind` says what a value is, for errors ("ordering mode": "unknown ordering mode 'x' (expected ...)");
  // `unknown` is the name of a value the table lacks (a corrupt or future enum value).
  template <size_t N>
  constexpr Vocabulary(const char* kind, const Row (&rows)[N], const char* unknown = "?")
      : kind_(kind), rows_(rows), size_(N), unknown_(unknown) {}

  // The first row of `v`, or null.
  constexpr const Row* find(Value v) const {
    for (size_t i = 0; i < size_; ++i) {
      if (rows_[i].value == v) {
        return &rows_[i];
      }
    }
    return nullptr;
  }
  constexpr const char* name(Value v) const {
    const Row* r = find(v);
    return r != nullptr ? r->name : unknown_;
  }
  // The row named `text` (aliases included), or null.
  constexpr const Row* find(std::string_view text) const {
    for (size_t i = 0; i < size_; ++i) {
      if (text == rows_[i].name) {
        return &rows_[i];
      }
    }
    return nullptr;
  }
  // Throws Error "unknown <kind> '<text>' (expected a, b (alias) or c)".
  Value parse(std::string_view text) const {
    if (const Row* r = find(text)) {
      return r->value;
    }
    IFEC_FAIL("unknown " << kind_ << " '" << text << "' (expected " << expected() << ")");
  }
  // "a, b (alias) or c": the names, each with its aliases.
  std::string expected() const {
    std::string out;
    size_t names = 0;
    for (size_t i = 0; i < size_; ++i) {
      names += is_alias(i) ? 0 : 1;
    }
    size_t listed = 0;
    for (size_t i = 0; i < size_; ++i) {
      if (is_alias(i)) {
        continue;
      }
      out += listed == 0 ? "" : listed + 1 == names ? " or " : ", ";
      out += rows_[i].name;
      const char* open = " (";
      for (size_t j = i + 1; j < size_; ++j) {
        if (rows_[j].value == rows_[i].value) {
          out += open;
          out += rows_[j].name;
          open = ", ";
        }
      }
      out += open[0] == ',' ? ")" : "";
      ++listed;
    }
    return out;
  }
  const Row* begin() const { return rows_; }
  const Row* end() const { return rows_ + size_; }

 private:
  constexpr bool is_alias(size_t i) const { return find(rows_[i].value) != &rows_[i]; }

  const char* kind_;
  const Row* rows_;
  size_t size_;
  const char* unknown_;
};

}  // namespace ifec::common
