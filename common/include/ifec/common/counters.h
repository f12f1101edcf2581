// Counter sets declared once: a list X(name, "help") per set makes the struct's uint64_t fields and a table of them,
// so every report (named counters, the daemons' status and metrics, the gRPC conversion) iterates the table and a
// counter is added in one place.
//
//   #define IFEC_QUEUE_COUNTERS(X) X(drops, "frames refused at admission") X(ecn_marks, "")
//   (one X a line in the headers, each line ending in a backslash, between clang-format off and on)
//   struct QueueCounters {
//     IFEC_COUNTER_SET(QueueCounters, IFEC_QUEUE_COUNTERS)
//     std::vector<int> other;  // members outside the list are not counters: for_each and += leave them alone
//   };
//
//   q.for_each([&](const char* name, uint64_t value) { out[name] = value; });  // in the list's order
//   q.for_each([&](const char* name, uint64_t& value) { value = in.at(name); });
//   total += q;                                  // every counter of the list
//   for (const auto& f : QueueCounters::kCounters) { f.name, f.help, q.*f.member }
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace ifec::common {

template <typename T>
struct CounterField {
  const char* name;
  const char* help;  // the field's comment ("" where the name says it)
  uint64_t T::*member;
};

// A counter set as name -> value, and back (names the map lacks stay 0; names the set lacks are ignored): what a
// set looks like across gRPC or in a table.
template <typename T>
std::map<std::string, uint64_t> counters_to_map(const T& c) {
  std::map<std::string, uint64_t> m;
  c.for_each([&](const char* name, uint64_t v) { m[name] = v; });
  return m;
}

template <typename T>
T counters_from_map(const std::map<std::string, uint64_t>& m) {
  T c;
  c.for_each([&](const char* name, uint64_t& v) {
    if (auto it = m.find(name); it != m.end()) {
      v = it->second;
    }
  });
  return c;
}

}  // namespace ifec::common

#define IFEC_COUNTER_FIELD_(name, help) uint64_t name = 0;
#define IFEC_COUNTER_ROW_(name, help) {#name, help, &CounterSet::name},

// Inside the struct `Type`: the fields of LIST, then kCounters, for_each and +=.
#define IFEC_COUNTER_SET(Type, LIST)                                                           \
  LIST(IFEC_COUNTER_FIELD_)                                                                    \
  using CounterSet = Type;                                                                     \
  static constexpr ::ifec::common::CounterField<Type> kCounters[] = {LIST(IFEC_COUNTER_ROW_)}; \
  template <typename F>                                                                        \
  void for_each(F&& fn) const {                                                                \
    for (const auto& f : kCounters) {                                                          \
      fn(f.name, this->*f.member);                                                             \
    }                                                                                          \
  }                                                                                            \
  template <typename F>                                                                        \
  void for_each(F&& fn) {                                                                      \
    for (const auto& f : kCounters) {                                                          \
      fn(f.name, this->*f.member);                                                             \
    }                                                                                          \
  }                                                                                            \
  Type& operator+=(const Type& o) {                                                            \
    for (const auto& f : kCounters) {                                                          \
      this->*f.member += o.*f.member;                                                          \
    }                                                                                          \
    return *this;                                                                              \
  }
