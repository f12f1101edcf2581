// The ifec process group: torch's collectives as Host.Run requests to this rank's hostd (see process_group.h).
#include "process_group.h"

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ifec/live/tls.h"
#include "ifec/v1/control.grpc.pb.h"

namespace ifec::c10d_backend {

namespace v1 = ::ifec::v1;

namespace {

constexpr int kMaxMessageBytes = 1 << 30;  // the daemons' own limit (daemon_common.h)
// What one operation's input or output may take of a message: the rest is the request's other fields and splits.
constexpr uint64_t kMaxOperationBytes = kMaxMessageBytes - (1 << 20);
constexpr size_t kMovementAlign = 4;  // bytes moved without reducing travel as int32 elements

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string torch_dtype(at::ScalarType s) {
  switch (s) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kInt:
      return "int32";
    case at::kLong:
      return "int64";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(s);
  }
}

// The fabric's name for a dtype it reduces, or "" (ECH reduces fp32, bf16, fp16 and int32).
std::string fabric_dtype(at::ScalarType s) {
  switch (s) {
    case at::kFloat:
      return "fp32";
    case at::kBFloat16:
      return "bf16";
    case at::kHalf:
      return "fp16";
    case at::kInt:
      return "int32";
    default:
      return "";
  }
}

std::string reduce_op_name(c10d::ReduceOp op) {
  switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM:
      return "sum";
    case c10d::ReduceOp::AVG:
      return "avg";
    case c10d::ReduceOp::MIN:
      return "min";
    case c10d::ReduceOp::MAX:
      return "max";
    case c10d::ReduceOp::PRODUCT:
      return "product";
    case c10d::ReduceOp::BAND:
      return "band";
    case c10d::ReduceOp::BOR:
      return "bor";
    case c10d::ReduceOp::BXOR:
      return "bxor";
    case c10d::ReduceOp::PREMUL_SUM:
      return "premul_sum";
    default:
      return "reduction " + std::to_string(static_cast<int>(static_cast<c10d::ReduceOp::RedOpType>(op)));
  }
}

// Where torch's reduction `op` of `t` runs: the fabric's operation (sum, min, max; avg is a sum divided by the
// group's size at the ranks) where the fabric reduces the dtype and operation, or "" where the ranks reduce it
// themselves; throws naming the operation, reduction and dtype where neither can.
std::string fabric_reduction(c10d::ReduceOp op, const std::string& torch_op, const at::Tensor& t) {
  const std::string name = reduce_op_name(op);
  const at::ScalarType s = t.scalar_type();
  const std::string what = "ifec: " + torch_op + " with " + name + " on " + torch_dtype(s) + " is not supported";
  const bool bitwise = name == "band" || name == "bor" || name == "bxor";
  TORCH_CHECK(bitwise || name == "sum" || name == "avg" || name == "product" || name == "min" || name == "max", what,
              " (sum, avg, product, min, max, band, bor, bxor are)");
  TORCH_CHECK(!bitwise || at::isIntegralType(s, /*includeBool=*/true), what,
              " (bitwise reductions need an integer or bool dtype)");
  TORCH_CHECK(name != "avg" || at::isFloatingType(s) || at::isComplexType(s), what,
              " (avg needs a floating-point dtype)");
  TORCH_CHECK((name != "min" && name != "max") || !at::isComplexType(s), what, " (complex numbers have no order)");
  if (fabric_dtype(s).empty() || !(name == "sum" || name == "avg" || name == "min" || name == "max")) {
    return "";
  }
  return name == "avg" ? "sum" : name;
}

// The ranks' inputs reduced in rank order, in their dtype (a sum of int8 wraps as torch's own does; bool's sum and
// max are its or, product and min its and, as NCCL's and Gloo's are).
at::Tensor fold(const std::vector<at::Tensor>& parts, const std::string& name) {
  at::Tensor r = parts[0];  // fresh from the reply: reduced in place
  for (size_t i = 1; i < parts.size(); ++i) {
    const at::Tensor& p = parts[i];
    if (name == "sum" || name == "avg") {
      r.add_(p);
    } else if (name == "product") {
      r.mul_(p);
    } else if (name == "min") {
      r = at::minimum(r, p);
    } else if (name == "max") {
      r = at::maximum(r, p);
    } else if (name == "band") {
      r.bitwise_and_(p);
    } else if (name == "bor") {
      r.bitwise_or_(p);
    } else {
      r.bitwise_xor_(p);
    }
  }
  if (name == "avg") {
    r.div_(static_cast<int64_t>(parts.size()));
  }
  return r;
}

void check_tensor(const at::Tensor& t, const std::string& torch_op) {
  TORCH_CHECK(t.device().is_cpu(), "ifec: ", torch_op, " of a ", t.device().str(), " tensor (",
              torch_dtype(t.scalar_type()),
              "): this backend moves CPU tensors (a CUDA tensor's path through the descriptor ring needs a GPU)");
  TORCH_CHECK(t.layout() == at::kStrided, "ifec: ", torch_op, " of a sparse tensor is not supported");
  TORCH_CHECK(!t.is_quantized(), "ifec: ", torch_op, " of a quantized tensor (", torch_dtype(t.scalar_type()),
              ") is not supported");
}

// A root (reduce's dst, broadcast's src, gather's and scatter's) that is no rank of the group: refused on every rank
// before anything moves (a reduce reduced at the ranks ran with no rank taking the result, and said nothing).
void check_root(int64_t root, int size, const std::string& torch_op) {
  TORCH_CHECK(root >= 0 && root < size, "ifec: ", torch_op, " with root rank ", root, ": the group's ranks are 0..",
              size - 1);
}

void check_one(const std::vector<at::Tensor>& tensors, const std::string& torch_op) {
  TORCH_CHECK(tensors.size() == 1, "ifec: ", torch_op, " takes one tensor per process, not ", tensors.size());
  check_tensor(tensors[0], torch_op);
}

std::string bytes_of(const at::Tensor& t, size_t align = 1) {
  const at::Tensor c = t.contiguous();
  std::string out(static_cast<const char*>(c.data_ptr()), c.nbytes());
  out.resize((out.size() + align - 1) / align * align, '\0');
  return out;
}

// A contiguous tensor shaped like `like` holding the bytes at `data`.
at::Tensor tensor_from(const char* data, const at::Tensor& like) {
  at::Tensor t = at::empty(like.sizes(), like.options().memory_format(at::MemoryFormat::Contiguous));
  std::memcpy(t.data_ptr(), data, t.nbytes());
  return t;
}

// A flat tensor of `numel` elements of `like`'s dtype holding the bytes at `data` (`len` of them came back).
at::Tensor flat_from(const char* data, size_t len, int64_t numel, const at::Tensor& like) {
  at::Tensor t = at::empty({numel}, like.options().memory_format(at::MemoryFormat::Contiguous));
  TORCH_CHECK(len >= t.nbytes(), "ifec: hostd returned ", len, " B for a ", t.nbytes(), " B result");
  std::memcpy(t.data_ptr(), data, t.nbytes());
  return t;
}

// Writes `len` bytes at `data` into `t` (its elements in order, whatever its strides).
void write_into(at::Tensor& t, const char* data, size_t len) {
  TORCH_CHECK(len >= t.nbytes(), "ifec: hostd returned ", len, " B for a ", t.nbytes(), " B tensor");
  if (t.is_contiguous()) {
    std::memcpy(t.data_ptr(), data, t.nbytes());
  } else {
    t.copy_(tensor_from(data, t));
  }
}

// Bytes moved, not reduced: any dtype, as int32 elements on the wire (padded to 4 bytes; the result is not).
Call movement(const std::string& what, const std::string& torch_op, const at::Tensor& t) {
  Call c;
  c.what = what;
  c.dtype = "int32";
  c.torch_op = torch_op;
  c.torch_dtype = torch_dtype(t.scalar_type());
  c.bytes = t.nbytes();
  c.input = bytes_of(t, kMovementAlign);
  return c;
}

std::string json_list(const std::vector<uint64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) {
    os << (i ? "," : "") << v[i];
  }
  os << "]";
  return os.str();
}

// What an operation's Work hands back: its output tensors once done, or the exception that ended it.
class Work : public c10d::Work {
 public:
  Work(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}
  // The future first: wait() returns once finish() ran, and the future must be complete by then (its value() was
  // read before markCompleted and failed torch's assertion, about one call in ten).
  void complete(std::exception_ptr error) {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    finish(error);
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

// The process's one worker: operations run in the order they were issued, every ifec group's (hostd runs one at a
// time).
class Runner {
 public:
  static std::shared_ptr<Runner> shared() { return of({-1, -1}); }
  // The channel from GPU `from` to GPU `to`'s: one per direction, whichever group issues its transfers.
  static std::shared_ptr<Runner> for_channel(int from, int to) { return of({from, to}); }
  Runner() : thread_([this] { loop(); }) {}
  ~Runner() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();  // what was queued still runs: every Work completes
  }
  // A job gets the runner it runs on: it holds no reference of its own, so the runner is never destroyed (and its
  // thread joined) from its own thread.
  using Job = std::function<void(Runner&)>;
  // Also destroys, on the calling (Python) thread, the jobs that ran since the last post: see loop().
  void post(Job job) {
    std::vector<Job> ran;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ran.swap(ran_);
      queue_.push_back(std::move(job));
    }
    cv_.notify_all();
  }
  // The rank's certificate (IFEC_TLS=DIR: DIR/ca.pem, rank.pem, rank.key; torchrun sets it), or plaintext where
  // IFEC_TLS is unset (a testbed brought up --insecure).
  static std::shared_ptr<grpc::ChannelCredentials> credentials() {
    const char* dir = std::getenv("IFEC_TLS");
    return live::channel_credentials({dir ? dir : "", "rank", dir == nullptr || *dir == 0});
  }
  v1::Host::Stub& stub(const std::string& address) {  // only on the worker
    auto& s = stubs_[address];
    if (!s) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(kMaxMessageBytes);
      args.SetMaxSendMessageSize(kMaxMessageBytes);
      s = v1::Host::NewStub(grpc::CreateCustomChannel(address, credentials(), args));
    }
    return *s;
  }

 private:
  void loop() {
    // Results are written into the caller's tensors in place, as NCCL's and Gloo's are: a parameter that requires
    // grad is a leaf autograd would refuse (avg's division, a non-contiguous tensor's copy).
    at::NoGradGuard no_grad;
    for (;;) {
      Job next;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) {
          return;
        }
        next = std::move(queue_.front());
        queue_.pop_front();
      }
      next(*this);
      // The job's captures (its Work, the caller's tensors) are not destroyed here: once its Work completed, this
      // may be the last reference to a tensor that owns its Python object, and freeing that takes the GIL, which
      // ends this thread (std::terminate) when the interpreter is already finalizing. The next post() or the
      // runner's destructor, on a Python thread, destroys them.
      std::lock_guard<std::mutex> lock(mu_);
      ran_.push_back(std::move(next));
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<Job> ran_;  // run, not yet destroyed (see loop())
  bool stop_ = false;
  std::map<std::string, std::unique_ptr<v1::Host::Stub>> stubs_;
  std::thread thread_;  // last: it starts once the rest exists

  // The runner for `key` ({-1, -1}: the collectives'), made when none lives: the groups using it hold it.
  static std::shared_ptr<Runner> of(std::pair<int, int> key) {
    static std::mutex mu;
    static std::map<std::pair<int, int>, std::weak_ptr<Runner>> current;
    std::lock_guard<std::mutex> lock(mu);
    std::shared_ptr<Runner> r = current[key].lock();
    if (!r) {
      r = std::make_shared<Runner>();
      current[key] = r;
    }
    return r;
  }
};

// The numbers of transfers: the channel from one GPU to another numbers its transfers from the world's first
// operation number on, in the order this process issued them (whatever group issued each), as its peer does.
class TransferNumbers {
 public:
  static TransferNumbers& get() {
    static TransferNumbers n;
    return n;
  }
  void new_world(uint64_t first) {
    std::lock_guard<std::mutex> lock(mu_);
    first_ = first;
    next_.clear();
  }
  std::pair<uint64_t, uint64_t> next(int from, int to) {  // (the first, this transfer's)
    std::lock_guard<std::mutex> lock(mu_);
    return {first_, first_ + next_[{from, to}]++};
  }

 private:
  std::mutex mu_;
  uint64_t first_ = 0;
  std::map<std::pair<int, int>, uint64_t> next_;
};

namespace {

std::string describe(const Call& c, int rank) {
  std::ostringstream os;
  if (c.torch_op == "barrier") {
    os << "ifec: barrier on rank " << rank;
    return os.str();
  }
  if (c.what == "send") {
    os << "ifec: " << c.torch_op << " of " << c.torch_dtype << " (" << c.bytes << " B, tag " << c.tag << ") "
       << (c.torch_op == "send" ? "to" : "from") << " rank " << c.peer << " on rank " << rank;
    return os.str();
  }
  os << "ifec: " << c.torch_op << " of " << c.torch_dtype << " (" << c.bytes << " B"
     << (c.reduce_op.empty() ? "" : ", ") << c.reduce_op << ") on rank " << rank;
  if (c.what == "barrier") {
    os << " (no elements: it meets the other ranks as a barrier)";
  }
  return os.str();
}

// The bytes hostd's reply carries for `c` over `n` ranks.
uint64_t reply_bytes(const Call& c, int n) {
  if (c.what == "all-gather") {
    return c.input.size() * static_cast<uint64_t>(n);
  }
  if (c.what == "reduce-scatter") {
    return c.input.size() / static_cast<uint64_t>(n);
  }
  if (c.what == "alltoall") {
    return std::accumulate(c.recv_splits.begin(), c.recv_splits.end(), uint64_t{0});
  }
  if (c.what == "send") {
    return c.torch_op == "recv" ? c.bytes : 0;
  }
  return c.what == "barrier" ? 0 : c.input.size();
}

// Runs `c` at hostd (its input moves into the request); returns this rank's output or throws naming the operation,
// hostd and what went wrong.
std::string call_hostd(Runner& runner, const BackendOptions& o, Call& c, uint64_t run_id, int rank,
                       std::string* row_json) {
  v1::RunRequest q;
  q.set_what(c.what);
  q.set_algo(o.algo);
  q.set_dtype(c.dtype);
  q.set_op(c.op);
  q.set_root(c.root);
  q.set_run_id(run_id);
  q.set_group(o.group);
  q.set_world_size(static_cast<uint32_t>(o.world_size));
  for (int m : o.members) {
    q.add_members(m);
  }
  q.set_bytes(c.input.size());
  if (c.what == "send") {  // the channel's; the group that issued it is compared at the two ends
    q.set_group(o.group);
    q.clear_members();
    q.add_members(c.from_gpu);
    q.add_members(c.to_gpu);
    q.set_bytes(c.bytes);
    q.set_tag(c.tag);
    q.set_op(c.refused ? "refused" : "");
  }
  q.set_input(std::move(c.input));  // a gradient bucket is copied once into the request, not twice
  for (uint64_t s : c.send_splits) {
    q.add_send_splits(s);
  }
  for (uint64_t s : c.recv_splits) {
    q.add_recv_splits(s);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + o.timeout);
  v1::RunReply r;
  const grpc::Status st = runner.stub(o.hostd).Run(&ctx, q, &r);
  const std::string who = "hostd " + o.node + " (" + o.hostd + ")";
  if (!st.ok()) {
    std::string why = st.error_message();
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE) {
      why = "does not answer: " + why;
    } else if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      why = "did not answer in " + std::to_string(o.timeout.count() / 1000) + " s";
    }
    throw std::runtime_error(describe(c, rank) + ": " + who + " " + why);
  }
  if (!r.ok()) {
    throw std::runtime_error(describe(c, rank) + " failed at " + who + ": " + r.error());
  }
  *row_json = r.row_json();
  return std::move(*r.mutable_output());
}

// One JSON line of the trace: what the program asked (operation, dtype, sizes, group), when (issued, started and
// ended, wall-clock ns), and hostd's row of what the fabric did (time, bytes per plane and per link).
void append_trace(const BackendOptions& o, const Call& c, int rank, int size, uint64_t seq, int64_t issued,
                  int64_t start, int64_t end, const std::string& row_json, const std::string& error) {
  std::ostringstream os;
  os << "{\"rank\":" << rank << ",\"group\":" << o.group << ",\"group_size\":" << size;
  if (!o.members.empty()) {
    os << ",\"members\":[";
    for (size_t i = 0; i < o.members.size(); ++i) {
      os << (i ? "," : "") << o.members[i];
    }
    os << "]";
  }
  os << ",\"seq\":" << seq << ",\"op\":\"" << c.torch_op << "\",\"dtype\":\"" << c.torch_dtype
     << "\",\"bytes\":" << c.bytes;
  if (!c.reduce_op.empty()) {
    os << ",\"reduce_op\":\"" << c.reduce_op << "\"";
  }
  if (c.what == "reduce" || c.what == "multicast") {
    os << ",\"root\":" << c.root;
  }
  if (c.what == "send") {
    os << ",\"peer\":" << c.peer << ",\"tag\":" << c.tag;
  }
  if (c.what == "alltoall") {
    os << ",\"send_splits\":" << json_list(c.send_splits) << ",\"recv_splits\":" << json_list(c.recv_splits);
  }
  os << ",\"fabric_op\":\"" << c.what << "\",\"algo\":\"" << o.algo << "\",\"issued_ns\":" << issued
     << ",\"start_ns\":" << start << ",\"end_ns\":" << end << ",\"ok\":" << (error.empty() ? "true" : "false");
  if (!row_json.empty()) {
    os << ",\"row\":" << row_json;
  }
  os << "}\n";
  std::ofstream f(o.trace, std::ios::app);
  f << os.str();
}

std::vector<uint64_t> split_bytes(const std::vector<int64_t>& splits, uint64_t row_bytes) {
  std::vector<uint64_t> out;
  for (int64_t s : splits) {
    TORCH_CHECK(s >= 0, "ifec: all_to_all_single split size ", s, " < 0");
    out.push_back(static_cast<uint64_t>(s) * row_bytes);
  }
  return out;
}

uint64_t row_bytes(const at::Tensor& t) {
  return t.dim() == 0 || t.size(0) == 0 ? t.element_size() : t.nbytes() / static_cast<uint64_t>(t.size(0));
}

uint64_t sum_of(const std::vector<uint64_t>& v) { return std::accumulate(v.begin(), v.end(), uint64_t{0}); }

// Tensors of a list that must all be `like`'s dtype (all_to_all's, gather's, scatter's).
void check_list(const std::vector<at::Tensor>& list, const at::Tensor& like, const std::string& torch_op) {
  for (const at::Tensor& t : list) {
    check_tensor(t, torch_op);
    TORCH_CHECK(t.scalar_type() == like.scalar_type(), "ifec: ", torch_op, " of ", torch_dtype(like.scalar_type()),
                " with a tensor of ", torch_dtype(t.scalar_type()), " in its list (one dtype throughout)");
  }
}

}  // namespace

ProcessGroup::ProcessGroup(int rank, int size, BackendOptions o)
    : c10d::ProcessGroup(rank, size), o_(std::move(o)), runner_(Runner::shared()), next_run_id_(o_.first_run_id) {
  if (o_.group == 0) {
    TransferNumbers::get().new_world(o_.first_run_id);
  }
}

ProcessGroup::~ProcessGroup() = default;

c10::intrusive_ptr<c10d::Work> ProcessGroup::submit(c10d::OpType type, std::vector<at::Tensor> outputs, Call call,
                                                    std::function<void(const std::string&)> finish) {
  const uint64_t out_bytes = reply_bytes(call, getSize());
  TORCH_CHECK(call.input.size() <= kMaxOperationBytes && out_bytes <= kMaxOperationBytes, describe(call, getRank()),
              ": ", call.input.size(), " B in and ", out_bytes, " B out, where one request to hostd carries at most ",
              kMaxOperationBytes, " B each way (gRPC's 1 GiB message less 1 MiB): split it into smaller operations");
  const bool empty = call.bytes == 0 && call.what != "barrier" && call.what != "alltoall" &&
                     std::all_of(outputs.begin(), outputs.end(), [](const at::Tensor& t) { return t.nbytes() == 0; });
  if (empty) {  // nothing to move, but the other ranks are met (see submit's comment in the header)
    call.what = "barrier";
    call.dtype = "fp32";
    call.op.clear();
    call.input.clear();
    finish = [](const std::string&) {};
  }
  const uint64_t run_id = next_run_id_;
  const bool reduction =
      call.torch_op == "all_reduce" || call.torch_op == "all_reduce_coalesced" || call.torch_op == "reduce";
  next_run_id_ += reduction ? 2 : 1;  // see the header
  return post(*runner_, o_.first_run_id, run_id, type, std::move(outputs), std::move(call), std::move(finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::post(Runner& runner, uint64_t first, uint64_t run_id, c10d::OpType type,
                                                  std::vector<at::Tensor> outputs, Call call,
                                                  std::function<void(const std::string&)> finish) {
  auto work = c10::make_intrusive<Work>(getRank(), type, std::move(outputs));
  const int64_t issued = now_ns();
  const int rank = getRank();
  const int size = getSize();
  runner.post([work, call = std::move(call), finish = std::move(finish), issued, first, run_id, rank, size,
               o = o_](Runner& runner) mutable {
    // One operation at hostd, traced (its own line): its output, or what it threw.
    auto step = [&](Call& c, uint64_t id) {
      const int64_t start = now_ns();
      std::string row_json;
      std::string error;
      std::string out;
      try {
        out = call_hostd(runner, o, c, id, rank, &row_json);
      } catch (const std::exception& e) {
        error = e.what();
      }
      if (!o.trace.empty() && c.traced) {
        append_trace(o, c, rank, size, id - first, issued, start, now_ns(), row_json, error);
      }
      if (!error.empty()) {
        throw std::runtime_error(error);
      }
      return out;
    };
    try {
      std::string out = step(call, run_id);
      if (call.then) {
        Call next = call.then(out);
        out = step(next, run_id + 1);
      }
      finish(out);
      work->complete(nullptr);
    } catch (const std::exception& e) {
      work->complete(std::make_exception_ptr(std::runtime_error(e.what())));
    }
  });
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::guarded(const std::string& torch_op,
                                                     const std::function<c10::intrusive_ptr<c10d::Work>()>& issue) {
  try {
    return issue();  // nothing before submit takes an operation number, and nothing after it throws
  } catch (const std::exception&) {
    Call c;
    c.what = "barrier";
    c.dtype = "fp32";
    c.torch_op = torch_op;
    c.torch_dtype = "none";
    c.traced = false;
    submit(c10d::OpType::BARRIER, {}, std::move(c), [](const std::string&) {});
    throw;
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::reduce_work(c10d::OpType type, const std::string& torch_op,
                                                         const std::string& what, const at::Tensor& input,
                                                         c10d::ReduceOp op, int root, std::vector<at::Tensor> outputs,
                                                         std::function<void(const at::Tensor&)> finish) {
  check_tensor(input, torch_op);
  const std::string fabric = fabric_reduction(op, torch_op, input);
  const std::string name = reduce_op_name(op);
  const int n = getSize();
  const int64_t numel = input.numel();
  const int64_t mine = what == "reduce-scatter" ? numel / n : numel;  // this rank's result's elements
  if (!fabric.empty()) {
    Call c;
    c.what = what;
    c.dtype = fabric_dtype(input.scalar_type());
    c.op = fabric;
    c.root = root;
    c.torch_op = torch_op;
    c.torch_dtype = torch_dtype(input.scalar_type());
    c.reduce_op = name;
    c.bytes = input.nbytes();
    c.input = bytes_of(input);
    return submit(type, std::move(outputs), std::move(c), [input, mine, n, name, finish](const std::string& out) {
      at::Tensor r = flat_from(out.data(), out.size(), mine, input);
      finish(name == "avg" ? r.div_(n) : r);
    });
  }
  // At the ranks: each rank's block of every rank's input comes to it (an all-to-all of equal blocks), which it
  // folds in rank order; then (allreduce, reduce) the ranks all-gather the folded blocks. Each rank moves its
  // tensor's bytes about twice, where an all-gather of whole tensors moved them n times.
  const int64_t block = what == "reduce-scatter" ? mine : (numel + n - 1) / n;  // elements (the last ones padded)
  const uint64_t block_bytes = static_cast<uint64_t>(block) * input.element_size();
  at::Tensor padded = input;  // whole blocks already (a reduce-scatter's): bytes_of copies it once
  if (block * n != numel) {
    padded = at::zeros({block * n}, input.options().memory_format(at::MemoryFormat::Contiguous));
    padded.narrow(0, 0, numel).copy_(input.reshape({-1}));
  }
  Call c;
  c.what = "alltoall";
  c.torch_op = torch_op;
  c.torch_dtype = torch_dtype(input.scalar_type());
  c.reduce_op = name;
  c.bytes = padded.nbytes();
  c.input = bytes_of(padded);
  c.send_splits.assign(n, block_bytes);
  c.recv_splits.assign(n, block_bytes);
  auto folded = [input, block, block_bytes, n, name](const std::string& out) {
    TORCH_CHECK(out.size() >= block_bytes * n, "ifec: hostd returned ", out.size(), " B for ", n, " blocks of ",
                block_bytes, " B");
    std::vector<at::Tensor> parts;
    for (int r = 0; r < n; ++r) {
      parts.push_back(flat_from(out.data() + r * block_bytes, block_bytes, block, input));
    }
    return fold(parts, name);
  };
  if (what == "reduce-scatter") {
    return submit(type, std::move(outputs), std::move(c),
                  [folded, finish](const std::string& out) { finish(folded(out)); });
  }
  c.then = [folded, torch_op, name](const std::string& out) {
    Call g = movement("all-gather", torch_op, folded(out));
    g.reduce_op = name;
    return g;
  };
  const uint64_t moved = (block_bytes + kMovementAlign - 1) / kMovementAlign * kMovementAlign;  // padded on the wire
  return submit(type, std::move(outputs), std::move(c),
                [input, block, block_bytes, moved, numel, n, finish](const std::string& out) {
                  TORCH_CHECK(out.size() >= moved * n, "ifec: hostd returned ", out.size(), " B for ", n, " blocks of ",
                              moved, " B");
                  std::string packed;
                  for (int r = 0; r < n; ++r) {
                    packed.append(out.data() + r * moved, block_bytes);
                  }
                  finish(flat_from(packed.data(), packed.size(), block * n, input).narrow(0, 0, numel));
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::exchange(c10d::OpType type, const std::string& torch_op,
                                                      const at::Tensor& like, std::string input,
                                                      std::vector<uint64_t> send, std::vector<uint64_t> recv,
                                                      std::vector<at::Tensor> outputs,
                                                      std::function<void(const std::string&)> finish) {
  Call c;
  c.what = "alltoall";
  c.torch_op = torch_op;
  c.torch_dtype = torch_dtype(like.scalar_type());
  c.bytes = input.size();
  c.input = std::move(input);
  c.send_splits = std::move(send);
  c.recv_splits = std::move(recv);
  return submit(type, std::move(outputs), std::move(c), std::move(finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  return guarded("all_reduce", [&] {
    check_one(tensors, "all_reduce");
    at::Tensor t = tensors[0];
    return reduce_work(c10d::OpType::ALLREDUCE, "all_reduce", "allreduce", t, opts.reduceOp, 0, {t},
                       [t](const at::Tensor& r) mutable { t.copy_(r.view(t.sizes())); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceCoalescedOptions& opts) {
  return guarded("all_reduce_coalesced", [&] {
    TORCH_CHECK(!tensors.empty(), "ifec: all_reduce_coalesced of no tensors");
    std::vector<at::Tensor> flat;
    for (const at::Tensor& t : tensors) {
      check_tensor(t, "all_reduce_coalesced");
      TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "ifec: all_reduce_coalesced of ",
                  torch_dtype(tensors[0].scalar_type()), " and ", torch_dtype(t.scalar_type()),
                  " tensors (one dtype throughout)");
      flat.push_back(t.reshape({-1}));
    }
    std::vector<at::Tensor> ts = tensors;
    return reduce_work(c10d::OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", "allreduce", at::cat(flat),
                       opts.reduceOp, 0, ts, [ts](const at::Tensor& r) mutable {
                         int64_t at = 0;
                         for (at::Tensor& t : ts) {
                           t.copy_(r.narrow(0, at, t.numel()).view(t.sizes()));
                           at += t.numel();
                         }
                       });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  return guarded("reduce", [&] {
    check_one(tensors, "reduce");
    check_root(opts.rootRank, getSize(), "reduce");
    at::Tensor t = tensors[0];
    const bool root = opts.rootRank == getRank();
    return reduce_work(c10d::OpType::REDUCE, "reduce", "reduce", t, opts.reduceOp, static_cast<int>(opts.rootRank), {t},
                       [t, root](const at::Tensor& r) mutable {
                         if (root) {
                           t.copy_(r.view(t.sizes()));
                         }
                       });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  return guarded("broadcast", [&] {
    check_one(tensors, "broadcast");
    check_root(opts.rootRank, getSize(), "broadcast");
    at::Tensor t = tensors[0];
    Call c = movement("multicast", "broadcast", t);
    c.root = static_cast<int>(opts.rootRank);
    return submit(c10d::OpType::BROADCAST, {t}, std::move(c),
                  [t](const std::string& out) mutable { write_into(t, out.data(), out.size()); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) {
  return guarded("all_gather", [&] {
    check_one(inputs, "all_gather");
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                "ifec: all_gather needs one list of ", getSize(), " output tensors, not ",
                outputs.empty() ? 0 : outputs[0].size());
    at::Tensor in = inputs[0];
    for (const at::Tensor& o : outputs[0]) {
      check_tensor(o, "all_gather");
      TORCH_CHECK(o.nbytes() == in.nbytes() && o.scalar_type() == in.scalar_type(), "ifec: all_gather of ", in.nbytes(),
                  " B of ", torch_dtype(in.scalar_type()), " into a tensor of ", o.nbytes(), " B of ",
                  torch_dtype(o.scalar_type()), " (uneven all_gather is not supported)");
    }
    Call c = movement("all-gather", "all_gather", in);
    const uint64_t block = c.input.size();
    std::vector<at::Tensor> outs = outputs[0];
    return submit(c10d::OpType::ALLGATHER, outs, std::move(c), [outs, block](const std::string& out) mutable {
      for (size_t r = 0; r < outs.size(); ++r) {
        write_into(outs[r], out.data() + r * block, block);
      }
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions&) {
  return guarded("all_gather_into_tensor", [&] {
    check_tensor(input, "all_gather_into_tensor");
    check_tensor(output, "all_gather_into_tensor");
    TORCH_CHECK(output.nbytes() == input.nbytes() * getSize() && output.scalar_type() == input.scalar_type(),
                "ifec: all_gather_into_tensor of ", input.nbytes(), " B of ", torch_dtype(input.scalar_type()),
                " into ", output.nbytes(), " B of ", torch_dtype(output.scalar_type()), " (needs ",
                input.nbytes() * getSize(), " B of ", torch_dtype(input.scalar_type()), ")");
    Call c = movement("all-gather", "all_gather_into_tensor", input);
    const uint64_t block = c.input.size();
    const uint64_t len = input.nbytes();
    at::Tensor out_t = output;
    return submit(c10d::OpType::_ALLGATHER_BASE, {output}, std::move(c),
                  [out_t, block, len, n = getSize()](const std::string& out) mutable {
                    std::string packed;
                    for (int r = 0; r < n; ++r) {
                      packed.append(out.data() + r * block, len);
                    }
                    write_into(out_t, packed.data(), packed.size());
                  });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  return guarded("gather", [&] {
    check_one(inputs, "gather");
    const int n = getSize();
    check_root(opts.rootRank, n, "gather");
    const at::Tensor in = inputs[0];
    const bool root = opts.rootRank == getRank();
    std::vector<uint64_t> send(n, 0);
    std::vector<uint64_t> recv(n, 0);
    send[opts.rootRank] = in.nbytes();
    std::vector<at::Tensor> outs;
    if (root) {
      TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == n, "ifec: gather needs one list of ", n,
                  " output tensors at its root, not ", outputs.empty() ? 0 : outputs[0].size());
      outs = outputs[0];
      check_list(outs, in, "gather");
      for (int s = 0; s < n; ++s) {  // each rank's block its output's size (hostd names a sender that differs)
        recv[s] = outs[s].nbytes();
      }
    } else {
      TORCH_CHECK(outputs.empty() || outputs[0].empty(), "ifec: gather's output tensors are given at its root only");
    }
    return exchange(c10d::OpType::GATHER, "gather", in, bytes_of(in), std::move(send), recv, outs,
                    [outs, recv](const std::string& out) mutable {
                      uint64_t at = 0;
                      for (size_t s = 0; s < outs.size(); ++s) {
                        write_into(outs[s], out.data() + at, recv[s]);
                        at += recv[s];
                      }
                    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  return guarded("scatter", [&] {
    check_one(outputs, "scatter");
    const int n = getSize();
    check_root(opts.rootRank, n, "scatter");
    at::Tensor out_t = outputs[0];
    std::vector<uint64_t> send(n, 0);
    std::vector<uint64_t> recv(n, 0);
    recv[opts.rootRank] = out_t.nbytes();
    std::string input;
    if (opts.rootRank == getRank()) {
      TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == n, "ifec: scatter needs one list of ", n,
                  " input tensors at its root, not ", inputs.empty() ? 0 : inputs[0].size());
      check_list(inputs[0], out_t, "scatter");
      for (int d = 0; d < n; ++d) {
        send[d] = inputs[0][d].nbytes();
        input += bytes_of(inputs[0][d]);
      }
    } else {
      TORCH_CHECK(inputs.empty() || inputs[0].empty(), "ifec: scatter's input tensors are given at its root only");
    }
    return exchange(c10d::OpType::SCATTER, "scatter", out_t, std::move(input), std::move(send), std::move(recv),
                    {out_t}, [out_t](const std::string& out) mutable { write_into(out_t, out.data(), out.size()); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  return guarded("reduce_scatter", [&] {
    check_one(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                "ifec: reduce_scatter needs one list of ", getSize(), " input tensors, not ",
                inputs.empty() ? 0 : inputs[0].size());
    std::vector<at::Tensor> flat;
    for (const at::Tensor& t : inputs[0]) {
      check_tensor(t, "reduce_scatter");
      TORCH_CHECK(t.nbytes() == outputs[0].nbytes() && t.scalar_type() == outputs[0].scalar_type(),
                  "ifec: reduce_scatter of unequal blocks (", t.nbytes(), " B of ", torch_dtype(t.scalar_type()),
                  " against ", outputs[0].nbytes(), " B of ", torch_dtype(outputs[0].scalar_type()), ")");
      flat.push_back(t.reshape({-1}));
    }
    at::Tensor in = at::cat(flat);
    at::Tensor out_t = outputs[0];
    return reduce_work(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", "reduce-scatter", in, opts.reduceOp, 0, {out_t},
                       [out_t](const at::Tensor& r) mutable { out_t.copy_(r.view(out_t.sizes())); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  return guarded("reduce_scatter", [&] {
    check_tensor(input, "reduce_scatter");
    check_tensor(output, "reduce_scatter");
    const int n = getSize();
    TORCH_CHECK(input.nbytes() == output.nbytes() * n && input.scalar_type() == output.scalar_type(),
                "ifec: reduce_scatter of ", input.nbytes(), " B of ", torch_dtype(input.scalar_type()), " into ",
                output.nbytes(), " B of ", torch_dtype(output.scalar_type()), " (needs ", n,
                " blocks of the output's size and dtype)");
    at::Tensor out_t = output;
    return reduce_work(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter", "reduce-scatter", input, opts.reduceOp, 0,
                       {output}, [out_t](const at::Tensor& r) mutable { out_t.copy_(r.view(out_t.sizes())); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& output_splits,
                                                           std::vector<int64_t>& input_splits,
                                                           const c10d::AllToAllOptions&) {
  return guarded("all_to_all_single", [&] {
    check_tensor(input, "all_to_all_single");
    check_tensor(output, "all_to_all_single");
    TORCH_CHECK(input.scalar_type() == output.scalar_type(), "ifec: all_to_all_single from ",
                torch_dtype(input.scalar_type()), " into ", torch_dtype(output.scalar_type()));
    const size_t n = static_cast<size_t>(getSize());
    TORCH_CHECK(
        (input_splits.empty() || input_splits.size() == n) && (output_splits.empty() || output_splits.size() == n),
        "ifec: all_to_all_single with ", input_splits.size(), " input and ", output_splits.size(),
        " output splits for ", n, " ranks");
    std::vector<uint64_t> send = split_bytes(input_splits, row_bytes(input));
    std::vector<uint64_t> recv = split_bytes(output_splits, row_bytes(output));
    if (send.empty()) {
      TORCH_CHECK(input.nbytes() % n == 0, "ifec: all_to_all_single of ", input.nbytes(), " B in ", n,
                  " equal blocks: give the input splits");
      send.assign(n, input.nbytes() / n);
    }
    if (recv.empty()) {
      TORCH_CHECK(output.nbytes() % n == 0, "ifec: all_to_all_single into ", output.nbytes(), " B in ", n,
                  " equal blocks: give the output splits");
      recv.assign(n, output.nbytes() / n);
    }
    TORCH_CHECK(sum_of(send) == input.nbytes() && sum_of(recv) == output.nbytes(),
                "ifec: all_to_all_single: the input splits add up to ", sum_of(send), " B of an input of ",
                input.nbytes(), " B, the output splits to ", sum_of(recv), " B of an output of ", output.nbytes(),
                " B (each must be its tensor's first dimension)");
    at::Tensor out_t = output;
    return exchange(c10d::OpType::ALLTOALL_BASE, "all_to_all_single", input, bytes_of(input), std::move(send),
                    std::move(recv), {output},
                    [out_t](const std::string& out) mutable { write_into(out_t, out.data(), out.size()); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions&) {
  return guarded("all_to_all", [&] {
    const int n = getSize();
    TORCH_CHECK(static_cast<int>(inputs.size()) == n && static_cast<int>(outputs.size()) == n,
                "ifec: all_to_all needs ", n, " input and ", n, " output tensors, not ", inputs.size(), " and ",
                outputs.size());
    check_list(inputs, inputs[0], "all_to_all");
    check_list(outputs, inputs[0], "all_to_all");
    std::string input;
    std::vector<uint64_t> send;
    std::vector<uint64_t> recv;
    for (int r = 0; r < n; ++r) {
      input += bytes_of(inputs[r]);
      send.push_back(inputs[r].nbytes());
      recv.push_back(outputs[r].nbytes());
    }
    std::vector<at::Tensor> outs = outputs;
    return exchange(c10d::OpType::ALLTOALL, "all_to_all", inputs[0], std::move(input), std::move(send), recv, outs,
                    [outs, recv](const std::string& out) mutable {
                      uint64_t at = 0;
                      for (size_t s = 0; s < outs.size(); ++s) {
                        write_into(outs[s], out.data() + at, recv[s]);
                        at += recv[s];
                      }
                    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::barrier(const c10d::BarrierOptions&) {
  Call c;
  c.what = "barrier";
  c.dtype = "fp32";
  c.torch_op = "barrier";
  c.torch_dtype = "none";
  return submit(c10d::OpType::BARRIER, {}, std::move(c), [](const std::string&) {});
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  return transfer(true, tensors, dst, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  return transfer(false, tensors, src, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::recvAnysource(std::vector<at::Tensor>&, int) {
  TORCH_CHECK(false,
              "ifec: recv from any source is not supported: give recv its src (transfers run on one channel "
              "per pair of ranks)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::transfer(bool sending, std::vector<at::Tensor>& tensors, int peer,
                                                      int tag) {
  const std::string torch_op = sending ? "send" : "recv";
  const int n = getSize();
  const int me = getRank();
  TORCH_CHECK(peer >= 0 && peer < n, "ifec: ", torch_op, (sending ? " to" : " from"), " rank ", peer,
              ": the group's ranks are 0..", n - 1);
  TORCH_CHECK(peer != me, "ifec: ", torch_op, (sending ? " to" : " from"), " rank ", peer, ", this rank itself");
  TORCH_CHECK(static_cast<int>(o_.gpus.size()) == n, "ifec: ", torch_op, ": the group's GPUs are not known (",
              o_.gpus.size(), " for ", n, " ranks)");
  Call c;
  c.what = "send";
  c.torch_op = torch_op;
  c.from_gpu = o_.gpus[sending ? me : peer];
  c.to_gpu = o_.gpus[sending ? peer : me];
  c.peer = peer;
  c.tag = tag;
  const auto key = std::make_pair(c.from_gpu, c.to_gpu);
  std::shared_ptr<Runner>& runner = channel_runners_[key];
  if (!runner) {
    runner = Runner::for_channel(key.first, key.second);
  }
  const auto [first, run_id] = TransferNumbers::get().next(key.first, key.second);
  at::Tensor t;
  try {
    check_one(tensors, torch_op);
    t = tensors[0];
    TORCH_CHECK(t.nbytes() <= kMaxOperationBytes, "ifec: ", torch_op, " of ", t.nbytes(),
                " B, where one request to hostd carries at most ", kMaxOperationBytes,
                " B: split it into smaller transfers");
  } catch (const std::exception&) {
    c.refused = true;
    c.torch_dtype = "none";
    c.traced = false;
    post(*runner, first, run_id, sending ? c10d::OpType::SEND : c10d::OpType::RECV, {}, std::move(c),
         [](const std::string&) {});
    throw;
  }
  c.torch_dtype = torch_dtype(t.scalar_type());
  c.bytes = t.nbytes();
  if (sending) {
    c.input = bytes_of(t);
    return post(*runner, first, run_id, c10d::OpType::SEND, {t}, std::move(c), [](const std::string&) {});
  }
  return post(*runner, first, run_id, c10d::OpType::RECV, {t}, std::move(c),
              [t](const std::string& out) mutable { write_into(t, out.data(), out.size()); });
}

c10::intrusive_ptr<c10d::ProcessGroup> create(int rank, int size, const BackendOptions& o) {
  TORCH_CHECK(!o.hostd.empty(), "ifec: no hostd address for rank ", rank);
  return c10::make_intrusive<ProcessGroup>(rank, size, o);
}

}  // namespace ifec::c10d_backend
