// Private to the live library: the control-plane structs <-> their control.proto messages, and gRPC status helpers.
#pragma once

#include <grpcpp/grpcpp.h>

#include <initializer_list>
#include <string>

#include "ifec/common/control.h"
#include "ifec/v1/control.grpc.pb.h"

namespace ifec::live {

inline v1::GroupReservation to_proto(const common::GroupReservation& r) {
  v1::GroupReservation p;
  p.set_job(r.job);
  p.set_group(r.group);
  p.set_op(static_cast<uint32_t>(r.op));
  p.set_dtype(static_cast<uint32_t>(r.dtype));
  p.set_redop(static_cast<uint32_t>(r.redop));
  p.set_window(r.window);
  p.set_slots(r.slots);
  for (const common::GroupMember& m : r.members) {
    v1::GroupMember* pm = p.add_members();
    pm->set_local(m.local);
    pm->set_ip(m.ip);
    pm->set_result_va(m.result_va);
    pm->set_rkey(m.rkey);
    pm->set_destination(m.destination);
  }
  p.set_upstream_ip(r.upstream_ip);
  p.set_upstream_group(r.upstream_group);
  p.set_upstream_contributor(r.upstream_contributor);
  p.set_upstream_fp32(r.upstream_fp32);
  return p;
}

// A request field and the values its struct (common/control.h) holds: a narrowing conversion would otherwise make
// group 65543 group 7, and dtype 256 fp32.
struct FieldRange {
  const char* field;
  int64_t value;  // every field checked is 32 bits, signed or not
  int64_t lo, hi;
};

// "" when every field is within its range, else the first that is not, named with its value.
inline std::string range_problem(std::initializer_list<FieldRange> fields) {
  for (const FieldRange& f : fields) {
    if (f.value < f.lo || f.value > f.hi) {
      return std::string(f.field) + " " + std::to_string(f.value) + " outside " + std::to_string(f.lo) + ".." +
             std::to_string(f.hi);
    }
  }
  return "";
}

inline std::string reservation_problem(const v1::GroupReservation& p) {
  return range_problem(
      {{"group", p.group(), 0, 0xFFFF},
       {"window", p.window(), 0, 0xFFFF},
       {"op", p.op(), static_cast<int64_t>(common::EchOp::kMulticast), static_cast<int64_t>(common::EchOp::kBarrier)},
       {"dtype", p.dtype(), 0, static_cast<int64_t>(common::EchDtype::kInt32)},
       {"redop", p.redop(), 0, static_cast<int64_t>(common::EchRedOp::kMax)},
       {"upstream_group", p.upstream_group(), 0, 0xFFFF},
       {"upstream_contributor", p.upstream_contributor(), 0, 0xFFFF}});
}

inline common::GroupReservation from_proto(const v1::GroupReservation& p) {
  common::GroupReservation r;
  r.job = p.job();
  r.group = static_cast<uint16_t>(p.group());
  r.op = static_cast<common::EchOp>(p.op());
  r.dtype = static_cast<common::EchDtype>(p.dtype());
  r.redop = static_cast<common::EchRedOp>(p.redop());
  r.window = static_cast<uint16_t>(p.window());
  r.slots = p.slots();
  for (const v1::GroupMember& pm : p.members()) {
    r.members.push_back({pm.local(), pm.ip(), pm.result_va(), pm.rkey(), pm.destination()});
  }
  r.upstream_ip = p.upstream_ip();
  r.upstream_group = static_cast<uint16_t>(p.upstream_group());
  r.upstream_contributor = static_cast<uint16_t>(p.upstream_contributor());
  r.upstream_fp32 = p.upstream_fp32();
  return r;
}

inline v1::WindowRegistration to_proto(const common::WindowRegistration& w) {
  v1::WindowRegistration p;
  p.set_gpu(w.gpu);
  p.set_ip(w.ip);
  p.set_window(w.window);
  p.set_va(w.va);
  p.set_rkey(w.rkey);
  p.set_job(w.job);
  return p;
}

inline common::WindowRegistration from_proto(const v1::WindowRegistration& p) {
  return {p.gpu(), p.ip(), static_cast<uint16_t>(p.window()), p.va(), p.rkey(), p.job()};
}

}  // namespace ifec::live
