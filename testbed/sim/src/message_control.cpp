// The control plane's byte messages: the little-endian codec, the client and the server side.
#include "ifec/testbed/message_control.h"

#include <cstring>
#include <iterator>

#include "ifec/common/bytes.h"
#include "ifec/common/checks.h"

namespace ifec::testbed {

namespace {

enum Kind : uint8_t { kRequest = 1, kReply = 2 };
enum Op : uint8_t { kReserve = 1, kRelease, kRegisterWindow, kFreeSlots, kCounters, kSetLinkState, kFareWeights };
constexpr const char* kOpNames[] = {nullptr,      "reserve",  "release",        "register_window",
                                    "free_slots", "counters", "set_link_state", "fare_weights"};

const char* op_name(uint8_t op) { return op >= kReserve && op <= kFareWeights ? kOpNames[op] : nullptr; }

}  // namespace

class ControlWriter : public common::ByteWriter {};

class ControlReader : public common::ByteReader {
 public:
  using ByteReader::ByteReader;
};

namespace {

// --------------------------------------------------------------------------------------------------- fields --

// Structured bindings list every field: a field added to these structs stops the build here until it is encoded.
void write_reservation(ControlWriter& w, const common::GroupReservation& r) {
  const auto& [job, group, op, dtype, redop, window, slots, members, upstream_ip, upstream_group, upstream_contributor,
               upstream_fp32] = r;
  w.u32(job);
  w.u16(group);
  w.u8(static_cast<uint8_t>(op));
  w.u8(static_cast<uint8_t>(dtype));
  w.u8(static_cast<uint8_t>(redop));
  w.u16(window);
  w.u32(slots);
  w.u32(static_cast<uint32_t>(members.size()));
  for (const auto& [local, ip, result_va, rkey, destination] : members) {
    w.boolean(local);
    w.u32(ip);
    w.u64(result_va);
    w.u32(rkey);
    w.boolean(destination);
  }
  w.u32(upstream_ip);
  w.u16(upstream_group);
  w.u16(upstream_contributor);
  w.boolean(upstream_fp32);
}

constexpr size_t kMemberBytes = 1 + 4 + 8 + 4 + 1;

// Enums pass as their bytes (any value of an enum's underlying type is valid): a value the switch does not know is
// the switch's to refuse, with its own reason, as in process.
common::GroupReservation read_reservation(ControlReader& r) {
  common::GroupReservation g;
  g.job = r.u32("job");
  g.group = r.u16("group");
  g.op = static_cast<common::EchOp>(r.u8("ECH op"));
  g.dtype = static_cast<common::EchDtype>(r.u8("dtype"));
  g.redop = static_cast<common::EchRedOp>(r.u8("redop"));
  g.window = r.u16("window");
  g.slots = r.u32("slots");
  g.members.resize(r.count("members", kMemberBytes));
  for (common::GroupMember& m : g.members) {
    m.local = r.boolean("member.local");
    m.ip = r.u32("member.ip");
    m.result_va = r.u64("member.result_va");
    m.rkey = r.u32("member.rkey");
    m.destination = r.boolean("member.destination");
  }
  g.upstream_ip = r.u32("upstream_ip");
  g.upstream_group = r.u16("upstream_group");
  g.upstream_contributor = r.u16("upstream_contributor");
  g.upstream_fp32 = r.boolean("upstream_fp32");
  return g;
}

void write_window(ControlWriter& w, const common::WindowRegistration& reg) {
  const auto& [gpu, ip, window, va, rkey, job] = reg;
  w.i32(gpu);
  w.u32(ip);
  w.u16(window);
  w.u64(va);
  w.u32(rkey);
  w.u32(job);
}

common::WindowRegistration read_window(ControlReader& r) {
  common::WindowRegistration w;
  w.gpu = r.i32("gpu");
  w.ip = r.u32("ip");
  w.window = r.u16("window");
  w.va = r.u64("va");
  w.rkey = r.u32("rkey");
  w.job = r.u32("job");
  return w;
}

void write_status(ControlWriter& w, const common::ControlStatus& st) {
  w.boolean(st.has_value());
  if (st) {
    w.str(st->target);
    w.str(st->reason);
  }
}

common::ControlStatus read_status(ControlReader& r) {
  if (!r.boolean("error flag")) {
    return std::nullopt;
  }
  common::ControlError e;
  e.target = r.str("error target");
  e.reason = r.str("error reason");
  return e;
}

// The replies' values.
void write_value(ControlWriter& w, uint32_t v) { w.u32(v); }
void read_value(ControlReader& r, uint32_t& v) { v = r.u32("value"); }

// The counters go in their list's order, after their number: two builds with different lists disagree loudly.
constexpr size_t kNumCounters = std::size(common::IfecCounters::kCounters);

void write_value(ControlWriter& w, const common::IfecCounters& c) {
  w.u16(static_cast<uint16_t>(kNumCounters));
  c.for_each([&w](const char*, uint64_t v) { w.u64(v); });
}

void read_value(ControlReader& r, common::IfecCounters& c) {
  const size_t at = r.pos();
  const uint16_t n = r.u16("counter count");
  IFEC_CHECK(n == kNumCounters,
             r.what() << ": " << n << " counters at byte " << at << ", this build has " << kNumCounters);
  c.for_each([&r](const char* name, uint64_t& v) { v = r.u64(name); });
}

void write_value(ControlWriter& w, const std::vector<common::PortWeight>& ws) {
  w.u32(static_cast<uint32_t>(ws.size()));
  for (const auto& [port, gbps] : ws) {
    w.i32(port);
    w.f64(gbps);
  }
}

void read_value(ControlReader& r, std::vector<common::PortWeight>& ws) {
  ws.resize(r.count("port weights", 4 + 8));
  for (common::PortWeight& p : ws) {
    p.port = r.i32("port");
    p.gbps = r.f64("gbps");
  }
}

// ------------------------------------------------------------------------------------------------- messages --

struct Header {
  uint64_t id = 0;
  uint8_t op = 0;
};

Header read_header(ControlReader& r, Kind kind) {
  const uint8_t k = r.u8("message kind");
  IFEC_CHECK(k == kind, r.what() << ": message kind " << int{k} << ", expected " << int{kind} << " ("
                                 << (kind == kRequest ? "request" : "reply") << ")");
  Header h;
  h.id = r.u64("id");
  const size_t at = r.pos();
  h.op = r.u8("op code");
  IFEC_CHECK(op_name(h.op) != nullptr, r.what() << ": unknown op code " << int{h.op} << " at byte " << at);
  return h;
}

// A request, decoded whole: the fields its op uses.
struct Request {
  Header h;
  std::string sw;
  common::GroupReservation reservation;  // reserve
  common::WindowRegistration window;     // register_window
  uint32_t job = 0;                      // release
  uint16_t group = 0;
  int link = -1;  // set_link_state
  bool up = false;
  int dest_gpu = 0;  // fare_weights
};

Request read_request(const std::vector<uint8_t>& msg) {
  ControlReader r(msg, "control request");
  Request q;
  q.h = read_header(r, kRequest);
  if (q.h.op != kSetLinkState) {
    q.sw = r.str("switch");
  }
  switch (q.h.op) {
    case kReserve:
      q.reservation = read_reservation(r);
      break;
    case kRelease:
      q.job = r.u32("job");
      q.group = r.u16("group");
      break;
    case kRegisterWindow:
      q.window = read_window(r);
      break;
    case kSetLinkState:
      q.link = r.i32("link");
      q.up = r.boolean("up");
      break;
    case kFareWeights:
      q.dest_gpu = r.i32("dest_gpu");
      break;
    default:  // free_slots, counters: the switch alone
      break;
  }
  r.end(std::string("a ") + op_name(q.h.op) + " request");
  return q;
}

template <typename... Value>
std::vector<uint8_t> encode_reply(const Header& h, const common::ControlStatus& st, const Value&... value) {
  ControlWriter w;
  w.u8(kReply);
  w.u64(h.id);
  w.u8(h.op);
  write_status(w, st);
  (write_value(w, value), ...);
  return w.take();
}

// What the client keeps per call: read the reply's status (and value) and bind the callback to them.
auto decode_status(common::ControlPlane::Done done) {
  return [done = std::move(done)](ControlReader& r) -> std::function<void()> {
    common::ControlStatus st = read_status(r);
    return [done, st] { done(st); };
  };
}

template <typename T>
auto decode_reply(std::function<void(const common::ControlReply<T>&)> done) {
  return [done = std::move(done)](ControlReader& r) -> std::function<void()> {
    common::ControlReply<T> rep;
    rep.error = read_status(r);
    read_value(r, rep.value);
    return [done, rep] { done(rep); };
  };
}

}  // namespace

// --------------------------------------------------------------------------------------------------- client --

MessageControlClient::MessageControlClient(Send send) : send_(std::move(send)) {}

MessageControlClient::~MessageControlClient() = default;

void MessageControlClient::call(uint8_t op, const std::function<void(ControlWriter&)>& args, Decode decode) {
  const uint64_t id = next_id_++;
  ControlWriter w;
  w.u8(kRequest);
  w.u64(id);
  w.u8(op);
  args(w);
  // Pending before the send: a transport may deliver the reply before send returns.
  pending_[id] = Pending{op, std::move(decode)};
  try {
    send_(w.take());
  } catch (...) {
    pending_.erase(id);  // never sent: its callback will not run
    throw;
  }
}

void MessageControlClient::reserve(const std::string& sw, const common::GroupReservation& r, Done done) {
  call(
      kReserve,
      [&](ControlWriter& w) {
        w.str(sw);
        write_reservation(w, r);
      },
      decode_status(std::move(done)));
}

void MessageControlClient::release(const std::string& sw, uint32_t job, uint16_t group, Done done) {
  call(
      kRelease,
      [&](ControlWriter& w) {
        w.str(sw);
        w.u32(job);
        w.u16(group);
      },
      decode_status(std::move(done)));
}

void MessageControlClient::register_window(const std::string& sw, const common::WindowRegistration& reg, Done done) {
  call(
      kRegisterWindow,
      [&](ControlWriter& w) {
        w.str(sw);
        write_window(w, reg);
      },
      decode_status(std::move(done)));
}

void MessageControlClient::free_slots(const std::string& sw,
                                      std::function<void(const common::ControlReply<uint32_t>&)> done) {
  call(
      kFreeSlots, [&](ControlWriter& w) { w.str(sw); }, decode_reply(std::move(done)));
}

void MessageControlClient::counters(const std::string& sw,
                                    std::function<void(const common::ControlReply<common::IfecCounters>&)> done) {
  call(
      kCounters, [&](ControlWriter& w) { w.str(sw); }, decode_reply(std::move(done)));
}

void MessageControlClient::set_link_state(int link, bool up, Done done) {
  call(
      kSetLinkState,
      [&](ControlWriter& w) {
        w.i32(link);
        w.boolean(up);
      },
      decode_status(std::move(done)));
}

void MessageControlClient::fare_weights(
    const std::string& sw, int dest_gpu,
    std::function<void(const common::ControlReply<std::vector<common::PortWeight>>&)> done) {
  call(
      kFareWeights,
      [&](ControlWriter& w) {
        w.str(sw);
        w.i32(dest_gpu);
      },
      decode_reply(std::move(done)));
}

void MessageControlClient::on_reply(const std::vector<uint8_t>& msg) {
  ControlReader r(msg, "control reply");
  const Header h = read_header(r, kReply);
  auto it = pending_.find(h.id);
  IFEC_CHECK(it != pending_.end(),
             "control reply: call " << h.id << " is not pending (" << pending_.size() << " calls pending)");
  IFEC_CHECK(it->second.op == h.op, "control reply: call " << h.id << " is a " << op_name(it->second.op)
                                                           << " but the reply is a " << op_name(h.op));
  // The whole reply is read before the call is done with: a malformed one leaves it pending and runs nothing.
  std::function<void()> run = it->second.decode(r);
  r.end(std::string("a ") + op_name(h.op) + " reply");
  pending_.erase(it);
  run();
}

// --------------------------------------------------------------------------------------------------- server --

ControlRequestInfo peek_control_request(const std::vector<uint8_t>& msg) {
  const Request q = read_request(msg);
  return ControlRequestInfo{q.h.id, op_name(q.h.op), q.sw, q.link};
}

void serve_control_request(const std::vector<uint8_t>& msg, common::ControlPlane& target,
                           std::function<void(std::vector<uint8_t>)> reply) {
  const Request q = read_request(msg);
  const Header h = q.h;
  auto status = [h, reply](const common::ControlStatus& st) { reply(encode_reply(h, st)); };
  auto value = [h, reply](const auto& rep) { reply(encode_reply(h, rep.error, rep.value)); };
  switch (h.op) {
    case kReserve:
      return target.reserve(q.sw, q.reservation, status);
    case kRelease:
      return target.release(q.sw, q.job, q.group, status);
    case kRegisterWindow:
      return target.register_window(q.sw, q.window, status);
    case kFreeSlots:
      return target.free_slots(q.sw, value);
    case kCounters:
      return target.counters(q.sw, value);
    case kSetLinkState:
      return target.set_link_state(q.link, q.up, status);
    case kFareWeights:
      return target.fare_weights(q.sw, q.dest_gpu, value);
  }
}

}  // namespace ifec::testbed
