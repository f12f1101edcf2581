// The control plane as byte messages: a client whose calls become requests, and the server side that runs a request
// on a ControlPlane and encodes its answer, so a call can cross from the process of the GPUs that make it to the
// process of the switch it addresses (one simulation over MPI processes).
//
// Every message is little-endian binary: a kind byte (request / reply), the call's u64 id (the client's, from 1),
// its op code, then a request's arguments or a reply's status (an optional ControlError) and value. Readers
// bounds-check every field and reject trailing bytes: a malformed message throws common::Error naming what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ifec/common/control.h"

namespace ifec::testbed {

class ControlReader;  // message_control.cpp
class ControlWriter;

// A ControlPlane whose every call becomes a request handed to `send`, in the caller's context; the call's callback
// runs, exactly once, in on_reply of the call's reply. Not thread-safe: the calls and on_reply come from one thread
// (or are serialized by the caller). A `send` that delivers the reply before returning makes the callback run
// inside the call, which ControlPlane's callers do not expect: a transport queues.
class MessageControlClient : public common::ControlPlane {
 public:
  using Send = std::function<void(std::vector<uint8_t>)>;
  explicit MessageControlClient(Send send);
  ~MessageControlClient() override;

  void reserve(const std::string& sw, const common::GroupReservation& r, Done done) override;
  void release(const std::string& sw, uint32_t job, uint16_t group, Done done) override;
  void register_window(const std::string& sw, const common::WindowRegistration& w, Done done) override;
  void free_slots(const std::string& sw, std::function<void(const common::ControlReply<uint32_t>&)> done) override;
  void counters(const std::string& sw,
                std::function<void(const common::ControlReply<common::IfecCounters>&)> done) override;
  void set_link_state(int link, bool up, Done done) override;
  void fare_weights(const std::string& sw, int dest_gpu,
                    std::function<void(const common::ControlReply<std::vector<common::PortWeight>>&)> done) override;

  // Runs the callback of the call `msg` answers. Throws common::Error on a malformed reply, an id not pending or a
  // reply to another op than the call's, naming it; the call then stays pending.
  void on_reply(const std::vector<uint8_t>& msg);
  // Calls sent and not yet answered.
  size_t pending() const { return pending_.size(); }

 private:
  // Decodes a reply's status and value and returns the call's callback bound to them (run once the whole reply
  // has been read, so a malformed one runs nothing).
  using Decode = std::function<std::function<void()>(ControlReader&)>;
  struct Pending {
    uint8_t op = 0;
    Decode decode;
  };
  // Sends call `op` with the arguments `args` writes, its reply to be read by `decode`.
  void call(uint8_t op, const std::function<void(ControlWriter&)>& args, Decode decode);

  Send send_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Pending> pending_;
};

// What a request is for, read without running it: its id, its op ("reserve", "release", "register_window",
// "free_slots", "counters", "set_link_state", "fare_weights"), the switch it addresses ("" for set_link_state) and
// the link (-1 unless set_link_state).
struct ControlRequestInfo {
  uint64_t id = 0;
  std::string op;
  std::string sw;
  int link = -1;
};
// Throws common::Error on a malformed request.
ControlRequestInfo peek_control_request(const std::vector<uint8_t>& msg);

// Decodes request `msg` and calls the matching method of `target`; when its answer comes (at once or later) hands
// the encoded reply, carrying the request's id, to `reply`. Throws common::Error on a malformed request (unknown
// op code, truncated at byte N, trailing bytes, ...) before calling `target`.
void serve_control_request(const std::vector<uint8_t>& msg, common::ControlPlane& target,
                           std::function<void(std::vector<uint8_t>)> reply);

}  // namespace ifec::testbed
