// GrpcControl and GrpcBootstrap: gRPC's callback client API; every answer is posted to the rank's loop.
#include "ifec/live/grpc_clients.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "ifec/common/checks.h"
#include "ifec/live/node_runtime.h"
#include "ifec/live/tls.h"
#include "proto_convert.h"

namespace ifec::live {

std::map<std::string, uint64_t> counter_map(const common::IfecCounters& c) { return common::counters_to_map(c); }

common::IfecCounters counters_from_map(const std::map<std::string, uint64_t>& m) {
  return common::counters_from_map<common::IfecCounters>(m);
}

namespace {

constexpr int kConnectTimeoutMs = 5000;

// A channel resolves a name again no sooner than this after a failed resolution (daemon_channel) ...
constexpr int kDnsMinTimeBetweenResolutionsMs = 1000;
// ... so a call that failed on an unresolved name is made again this much later.
constexpr int kResolveAgainMs = kDnsMinTimeBetweenResolutionsMs + 200;

// gRPC as Debian builds it (1.51 on iomgr) serves every channel's callback API from one process-wide completion
// queue, counted by the channels that used it: when the last of them is destroyed gRPC shuts that queue down and
// joins its polling threads ("nexting_thread") while the tail of a call that just finished may still be running,
// and now and then that aborts the whole process ("ref_counted.h:183] assertion failed: prior > 0": seen once in CI,
// a test's only channel destroyed right after a call its stopped switchd had refused). A daemon's channels come and
// go (a bootstrap per job, one per responder reset), so the count passes zero in production too. One channel that
// made a callback call and is never destroyed keeps it above zero: the queue and its threads then live as long
// as the process and are never torn down. Its call goes nowhere (a socket path that does not exist, a deadline
// already past) and it never tries again within the hour.
void pin_callback_queue() {
  static const bool pinned = [] {
    struct Pin {
      std::shared_ptr<grpc::Channel> channel;
      std::unique_ptr<v1::Switch::Stub> stub;
      grpc::ClientContext ctx;
      v1::Empty req;
      v1::FreeSlotsReply reply;
    };
    grpc::ChannelArguments args;
    for (const char* backoff : {GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
                                GRPC_ARG_MAX_RECONNECT_BACKOFF_MS}) {
      args.SetInt(backoff, 3'600'000);
    }
    auto* pin = new Pin;  // never deleted (see above)
    pin->channel = grpc::CreateCustomChannel("unix:/nonexistent/ifec-callback-queue-pin",
                                             grpc::InsecureChannelCredentials(), args);
    pin->stub = v1::Switch::NewStub(pin->channel);
    pin->ctx.set_deadline(std::chrono::system_clock::now());
    pin->stub->async()->FreeSlots(&pin->ctx, &pin->req, &pin->reply, [](const grpc::Status&) {});
    return true;
  }();
  (void)pinned;
}

// A channel to another daemon that reconnects within a second once it is back (a restarted switchd or container):
// gRPC's default reconnect back-off grows to two minutes, and every call meanwhile fails at once as unreachable;
// and a name is resolved again after a second, not thirty (a restarted container may come back at new addresses).
// gRPC also takes the minimum back-off as the time one connection attempt (TCP, TLS, HTTP/2 SETTINGS) may last: at
// 100 ms a handshake with a daemon a loaded host had not scheduled yet failed, and the call with it ("connection
// attempt timed out before receiving SETTINGS frame"), so that stays at kConnectTimeoutMs.
std::shared_ptr<grpc::Channel> daemon_channel(const std::string& address) {
  pin_callback_queue();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, kDnsMinTimeBetweenResolutionsMs);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kConnectTimeoutMs);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, process_channel_credentials(), args);
}

// The call failed before its request left because the target's name did not resolve (gRPC's resolvers say
// "DNS resolution failed" in the status).
bool unresolved(const grpc::Status& st) {
  return st.error_code() == grpc::StatusCode::UNAVAILABLE &&
         st.error_message().find("resolution failed") != std::string::npos;
}

std::chrono::system_clock::time_point deadline_after(common::TimeNs ns) {
  return std::chrono::system_clock::now() + std::chrono::nanoseconds(ns);
}

// "p0-sw (172.31.0.4:50051): unreachable: ..." from a failed call's status.
std::string describe(const std::string& who, const std::string& addr, const grpc::Status& st) {
  const std::string where = addr.empty() ? who : who + " (" + addr + ")";
  switch (st.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return where + ": unreachable: " + st.error_message();
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return where + ": no answer before the deadline";
    default:
      return st.error_message().empty() ? who + ": error " + std::to_string(st.error_code()) : st.error_message();
  }
}

// One unary call to a hostd: what gRPC's callback API needs to outlive the call.
template <typename Req, typename Reply>
struct HostCall {
  grpc::ClientContext ctx;
  Req req;
  Reply reply;
  std::unique_ptr<v1::Host::Stub> stub;
};

}  // namespace

// ------------------------------------------------------------------------------------------------ control --

struct GrpcControl::Impl {
  EpollLoop& loop;
  const routing::Topology& topo;
  AddressOf address;
  common::TimeNs deadline_ns;
  std::map<int, std::unique_ptr<v1::Switch::Stub>> stubs;  // loop thread only
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);

  // The stub of switch `sw`, or an error naming it.
  v1::Switch::Stub* stub(const std::string& sw, std::string* addr, std::string* why) {
    const int n = topo.find_node(sw);
    if (n < 0 || topo.nodes[n].kind != routing::NodeKind::kSwitch) {
      *why = sw + ": no such switch in topology " + topo.name;
      return nullptr;
    }
    *addr = address(n);
    auto& s = stubs[n];
    if (!s) {
      s = v1::Switch::NewStub(daemon_channel(*addr));
    }
    return s.get();
  }

  // One unary call: `start(stub, ctx, req, reply, callback)`; `finish(status, reply)` runs on the loop. A call
  // that failed because the switch's name did not resolve (the request never left) is made once more after the
  // channel may resolve again (kResolveAgainMs): a container platform's DNS can miss a name for a moment (Docker
  // swarm's embedded DNS just after a stack came up), and a failed resolution fails every call at once until then.
  template <typename Req, typename Reply, typename Start, typename Finish>
  void call(const std::string& sw, Req req, Start start, Finish finish, int resolve_retries = 1) {
    std::string addr, why;
    v1::Switch::Stub* s = stub(sw, &addr, &why);
    if (s == nullptr) {
      loop.schedule(0, [finish, why] { finish(common::ControlError{"", why}, Reply{}); });
      return;
    }
    struct Call {
      grpc::ClientContext ctx;
      Req req;
      Reply reply;
    };
    auto c = std::make_shared<Call>();
    c->req = std::move(req);
    c->ctx.set_deadline(deadline_after(deadline_ns));
    std::weak_ptr<bool> live = alive;
    EpollLoop* lp = &loop;
    start(s, &c->ctx, &c->req, &c->reply, [=, this](grpc::Status st) {
      if (live.expired()) {
        return;
      }
      if (resolve_retries > 0 && unresolved(st)) {
        lp->schedule(lp->now() + kResolveAgainMs * 1'000'000ULL, [=, this] {
          if (!live.expired()) {
            call<Req, Reply>(sw, c->req, start, finish, resolve_retries - 1);
          }
        });
        return;
      }
      std::optional<common::ControlError> err;
      if (!st.ok()) {
        err = common::ControlError{sw, describe(sw, addr, st)};
      }
      lp->schedule(0, [c, finish, err, live] {
        if (!live.expired()) {
          finish(err, c->reply);
        }
      });
    });
  }
};

GrpcControl::GrpcControl(EpollLoop& loop, const routing::Topology& topo, AddressOf address, common::TimeNs deadline_ns)
    : impl_(std::make_unique<Impl>(Impl{loop, topo, std::move(address), deadline_ns, {}})) {}

GrpcControl::~GrpcControl() { *impl_->alive = false; }

namespace {

common::ControlStatus status_of(const std::optional<common::ControlError>& e) { return e; }

}  // namespace

void GrpcControl::reserve(const std::string& sw, const common::GroupReservation& r, Done done) {
  impl_->call<v1::GroupReservation, v1::Empty>(
      sw, to_proto(r),
      [](v1::Switch::Stub* s, grpc::ClientContext* ctx, const v1::GroupReservation* q, v1::Empty* a, auto cb) {
        s->async()->Reserve(ctx, q, a, cb);
      },
      [done](const std::optional<common::ControlError>& e, const v1::Empty&) { done(status_of(e)); });
}

void GrpcControl::release(const std::string& sw, uint32_t job, uint16_t group, Done done) {
  v1::ReleaseRequest q;
  q.set_job(job);
  q.set_group(group);
  impl_->call<v1::ReleaseRequest, v1::Empty>(
      sw, q,
      [](v1::Switch::Stub* s, grpc::ClientContext* ctx, const v1::ReleaseRequest* q, v1::Empty* a, auto cb) {
        s->async()->Release(ctx, q, a, cb);
      },
      [done](const std::optional<common::ControlError>& e, const v1::Empty&) { done(status_of(e)); });
}

void GrpcControl::register_window(const std::string& sw, const common::WindowRegistration& w, Done done) {
  impl_->call<v1::WindowRegistration, v1::Empty>(
      sw, to_proto(w),
      [](v1::Switch::Stub* s, grpc::ClientContext* ctx, const v1::WindowRegistration* q, v1::Empty* a, auto cb) {
        s->async()->RegisterWindow(ctx, q, a, cb);
      },
      [done](const std::optional<common::ControlError>& e, const v1::Empty&) { done(status_of(e)); });
}

void GrpcControl::free_slots(const std::string& sw, std::function<void(const common::ControlReply<uint32_t>&)> done) {
  impl_->call<v1::Empty, v1::FreeSlotsReply>(
      sw, v1::Empty{},
      [](v1::Switch::Stub* s, grpc::ClientContext* ctx, const v1::Empty* q, v1::FreeSlotsReply* a, auto cb) {
        s->async()->FreeSlots(ctx, q, a, cb);
      },
      [done](const std::optional<common::ControlError>& e, const v1::FreeSlotsReply& a) {
        common::ControlReply<uint32_t> r;
        r.error = e;
        r.value = a.slots();
        done(r);
      });
}

void GrpcControl::counters(const std::string& sw,
                           std::function<void(const common::ControlReply<common::IfecCounters>&)> done) {
  impl_->call<v1::Empty, v1::CounterSet>(
      sw, v1::Empty{},
      [](v1::Switch::Stub* s, grpc::ClientContext* ctx, const v1::Empty* q, v1::CounterSet* a, auto cb) {
        s->async()->IfecCounters(ctx, q, a, cb);
      },
      [done](const std::optional<common::ControlError>& e, const v1::CounterSet& a) {
        common::ControlReply<common::IfecCounters> r;
        r.error = e;
        r.value = counters_from_map(std::map<std::string, uint64_t>(a.values().begin(), a.values().end()));
        done(r);
      });
}

void GrpcControl::set_link_state(int link, bool up, Done done) {
  const routing::Topology& topo = impl_->topo;
  if (link < 0 || link >= static_cast<int>(topo.links.size())) {
    impl_->loop.schedule(0, [done, link] {
      done(common::ControlError{"link " + std::to_string(link), "no such link"});
    });
    return;
  }
  // The switch end takes its interface down: the veth peer (the other end) loses carrier with it.
  const routing::Link& l = topo.links[link];
  const bool a_switch = topo.nodes[l.a].kind == routing::NodeKind::kSwitch;
  const int node = a_switch ? l.a : l.b;
  v1::SetLinkRequest q;
  q.set_port(a_switch ? l.a_port : l.b_port);
  q.set_up(up);
  impl_->call<v1::SetLinkRequest, v1::Empty>(
      topo.nodes[node].name, q,
      [](v1::Switch::Stub* s, grpc::ClientContext* ctx, const v1::SetLinkRequest* q, v1::Empty* a, auto cb) {
        s->async()->SetLink(ctx, q, a, cb);
      },
      [done](const std::optional<common::ControlError>& e, const v1::Empty&) { done(status_of(e)); });
}

void GrpcControl::fare_weights(const std::string& sw, int dest_gpu,
                               std::function<void(const common::ControlReply<std::vector<common::PortWeight>>&)> done) {
  v1::FareWeightsRequest q;
  q.set_dest_gpu(dest_gpu);
  impl_->call<v1::FareWeightsRequest, v1::FareWeightsReply>(
      sw, q,
      [](v1::Switch::Stub* s, grpc::ClientContext* ctx, const v1::FareWeightsRequest* q, v1::FareWeightsReply* a,
         auto cb) { s->async()->FareWeights(ctx, q, a, cb); },
      [done](const std::optional<common::ControlError>& e, const v1::FareWeightsReply& a) {
        common::ControlReply<std::vector<common::PortWeight>> r;
        r.error = e;
        for (const v1::PortWeight& w : a.weights()) {
          r.value.push_back({w.port(), w.gbps()});
        }
        done(r);
      });
}

// ---------------------------------------------------------------------------------------------- bootstrap --

GrpcBootstrap::GrpcBootstrap(EpollLoop& loop, const routing::Topology& topo, AddressOf address, int rank,
                             std::vector<int> gpus, common::TimeNs deadline_ns, uint32_t group)
    : loop_(loop),
      rank_(rank),
      gpus_(std::move(gpus)),
      deadline_ns_(deadline_ns),
      group_(group),
      alive_(std::make_shared<bool>(true)) {
  IFEC_CHECK(rank_ >= 0 && rank_ < static_cast<int>(gpus_.size()),
             "bootstrap: rank " << rank_ << " outside 0.." << gpus_.size() - 1);
  const int root_node = topo.gpu_node(gpus_.at(0));
  root_ = "rank 0's hostd " + topo.nodes[root_node].name + " (" + address(root_node) + ")";
  channel_ = daemon_channel(address(root_node));
}

GrpcBootstrap::~GrpcBootstrap() { *alive_ = false; }

void GrpcBootstrap::allgather(std::vector<uint8_t> mine, std::function<void(workloads::Gathered)> done) {
  auto c = std::make_shared<HostCall<v1::AllgatherRequest, v1::AllgatherReply>>();
  c->req.set_rank(rank_);
  c->req.set_epoch(epoch_);
  c->req.set_seq(seq_++);
  c->req.set_part(std::string(mine.begin(), mine.end()));
  if (group_ != 0) {
    c->req.set_group(group_);
    for (int g : gpus_) {
      c->req.add_members(g);
    }
  }
  c->req.set_wait_ms(static_cast<uint32_t>(std::min<common::TimeNs>(wait_ns_ / 1'000'000, UINT32_MAX)));
  c->ctx.set_deadline(deadline_after(deadline_ns_ + wait_ns_));
  c->ctx.set_wait_for_ready(true);  // rank 0 may still be starting: wait for it, up to the deadline
  c->stub = v1::Host::NewStub(channel_);
  std::weak_ptr<bool> live = alive_;
  EpollLoop* lp = &loop_;
  const std::string root = root_;
  const size_t n = gpus_.size();
  c->stub->async()->Allgather(&c->ctx, &c->req, &c->reply, [c, live, lp, done, root, n](grpc::Status st) {
    workloads::Gathered g;
    if (!st.ok()) {
      g.ok = false;
      g.error = st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ? root + ": no answer before the deadline"
                                                                       : describe(root, "", st);
    } else if (static_cast<size_t>(c->reply.parts_size()) != n) {
      g.ok = false;
      g.error =
          root + " answered " + std::to_string(c->reply.parts_size()) + " parts for " + std::to_string(n) + " ranks";
    } else {
      for (const std::string& p : c->reply.parts()) {
        g.parts.emplace_back(p.begin(), p.end());
      }
    }
    if (live.expired()) {
      return;
    }
    lp->schedule(0, [live, done, g = std::move(g)]() mutable {
      if (!live.expired()) {
        done(std::move(g));
      }
    });
  });
}

// --------------------------------------------------------------------------------------- status probe --

std::string ask_hostd_status(const std::string& who, const std::string& address, common::TimeNs deadline_ns) {
  auto stub = v1::Host::NewStub(daemon_channel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline_after(deadline_ns));
  v1::NodeStatus out;
  const grpc::Status st = stub->Status(&ctx, v1::Empty(), &out);
  return st.ok() ? "" : describe(who, address, st);
}

// --------------------------------------------------------------------------------------- responder reset --

void reset_peer_responder(EpollLoop& loop, std::weak_ptr<bool> alive, const std::string& who,
                          const std::string& address, int requester_gpu, int qp, uint32_t psn,
                          common::TimeNs deadline_ns, int attempts,
                          std::function<void(const std::string& error)> done) {
  auto c = std::make_shared<HostCall<v1::ResetResponderRequest, v1::Empty>>();
  c->req.set_requester_gpu(requester_gpu);
  c->req.set_qp(static_cast<uint32_t>(qp));
  c->req.set_psn(psn);
  c->stub = v1::Host::NewStub(daemon_channel(address));
  c->ctx.set_deadline(deadline_after(deadline_ns));
  EpollLoop* lp = &loop;
  // `keep` holds the call's context, request, reply, stub and channel until gRPC has called back, then moves to the
  // loop (`call`): the last reference must not die on gRPC's own thread, inside the channel it is calling back from.
  c->stub->async()->ResetResponder(&c->ctx, &c->req, &c->reply, [=, keep = c](grpc::Status st) mutable {
    if (alive.expired()) {
      return;  // the loop may be gone
    }
    const bool retry =
        !st.ok() && attempts > 1 &&
        (st.error_code() == grpc::StatusCode::UNAVAILABLE || st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
    const std::string error = st.ok() ? "" : describe(who, address, st);
    lp->schedule(
        retry ? lp->now() + 200'000'000 : 0, [=, call = std::move(keep)] {  // on the loop; a retry 200 ms later
          if (alive.expired()) {
            return;
          }
          if (retry) {
            reset_peer_responder(*lp, alive, who, address, requester_gpu, qp, psn, deadline_ns, attempts - 1, done);
          } else {
            done(error);
          }
        });
  });
}

}  // namespace ifec::live
