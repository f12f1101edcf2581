// Check macros and the project's exception type: API edges throw with a message naming the bad value.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ifec::common {

// Thrown at API edges (config, topology, Python); the hot path returns status codes instead.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown out of a long run when its caller asked to stop (Ctrl-C in Python; see EventLoop::set_interrupt_check).
class Interrupted : public Error {
 public:
  Interrupted() : Error("interrupted") {}
};

}  // namespace ifec::common

// IFEC_CHECK(cond, stream-expression): throws ifec::common::Error("file:line: <message>") when cond is false.
#define IFEC_CHECK(cond, msg)                            \
  do {                                                   \
    if (!(cond)) {                                       \
      std::ostringstream ifec_check_os_;                 \
      ifec_check_os_ << msg;                             \
      throw ::ifec::common::Error(ifec_check_os_.str()); \
    }                                                    \
  } while (0)

// IFEC_FAIL(stream-expression): unconditional throw with the same message style.
#define IFEC_FAIL(msg)                                 \
  do {                                                 \
    std::ostringstream ifec_check_os_;                 \
    ifec_check_os_ << msg;                             \
    throw ::ifec::common::Error(ifec_check_os_.str()); \
  } while (0)
