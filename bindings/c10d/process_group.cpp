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
constexpr size_t kMovementAlign = 4;       // bytes moved without reducing travel as int32 elements

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
    case c10d::ReduceOp::PREMUL_SUM:
      return "premul_sum";
    default:
      return "bitwise";
  }
}

// The fabric's operation for torch's: sum, min, max (avg is a sum divided by the group's size at the ranks).
std::string fabric_op(c10d::ReduceOp op, const std::string& torch_op, const at::Tensor& t) {
  const std::string name = reduce_op_name(op);
  TORCH_CHECK(name == "sum" || name == "avg" || name == "min" || name == "max", "ifec: ", torch_op, " with ", name,
              " on ", torch_dtype(t.scalar_type()), " is not supported (sum, avg, min, max are)");
  TORCH_CHECK(name != "avg" || at::isFloatingType(t.scalar_type()), "ifec: ", torch_op, " with avg on ",
              torch_dtype(t.scalar_type()), " is not supported (avg needs a floating-point dtype)");
  return name == "avg" ? "sum" : name;
}

void check_tensor(const at::Tensor& t, const std::string& torch_op) {
  TORCH_CHECK(t.device().is_cpu(), "ifec: ", torch_op, " of a ", t.device().str(), " tensor (",
              torch_dtype(t.scalar_type()),
              "): this backend moves CPU tensors (a CUDA tensor's path through the descriptor ring needs a GPU)");
  TORCH_CHECK(t.layout() == at::kStrided, "ifec: ", torch_op, " of a sparse tensor is not supported");
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

// Writes `len` bytes at `data` into `t` (its elements in order, whatever its strides).
void write_into(at::Tensor& t, const char* data, size_t len) {
  TORCH_CHECK(len >= t.nbytes(), "ifec: hostd returned ", len, " B for a ", t.nbytes(), " B tensor");
  if (t.is_contiguous()) {
    std::memcpy(t.data_ptr(), data, t.nbytes());
  } else {
    t.copy_(tensor_from(data, t));
  }
}

// A reduction the fabric runs: the tensor's bytes, the fabric's dtype and operation, and the trace's names.
Call reduction(const std::string& what, const std::string& torch_op, const at::Tensor& t, c10d::ReduceOp op,
               const std::string& dtype) {
  Call c;
  c.what = what;
  c.dtype = dtype;
  c.op = fabric_op(op, torch_op, t);
  c.torch_op = torch_op;
  c.torch_dtype = torch_dtype(t.scalar_type());
  c.reduce_op = reduce_op_name(op);
  c.bytes = t.nbytes();
  c.input = bytes_of(t);
  return c;
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
  static std::shared_ptr<Runner> shared() {
    static std::mutex mu;
    static std::weak_ptr<Runner> current;
    std::lock_guard<std::mutex> lock(mu);
    std::shared_ptr<Runner> r = current.lock();
    if (!r) {
      r = std::make_shared<Runner>();
      current = r;
    }
    return r;
  }
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
};

namespace {

std::string describe(const Call& c, int rank) {
  std::ostringstream os;
  os << "ifec: " << c.torch_op << " of " << c.torch_dtype << " (" << c.bytes << " B"
     << (c.reduce_op.empty() ? "" : ", ") << c.reduce_op << ") on rank " << rank;
  return os.str();
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

}  // namespace

ProcessGroup::ProcessGroup(int rank, int size, BackendOptions o)
    : c10d::ProcessGroup(rank, size), o_(std::move(o)), runner_(Runner::shared()), next_run_id_(o_.first_run_id) {}

ProcessGroup::~ProcessGroup() = default;

c10::intrusive_ptr<c10d::Work> ProcessGroup::submit(c10d::OpType type, std::vector<at::Tensor> outputs, Call call,
                                                    std::function<void(const std::string&)> finish) {
  const bool empty = call.bytes == 0 && call.what != "barrier" &&
                     std::all_of(outputs.begin(), outputs.end(), [](const at::Tensor& t) { return t.nbytes() == 0; });
  auto work = c10::make_intrusive<Work>(getRank(), type, std::move(outputs));
  if (empty) {  // no elements in or out: nothing to move (as Gloo), done at once
    work->complete(nullptr);
    return work;
  }
  const int64_t issued = now_ns();
  const uint64_t first = o_.first_run_id;
  const uint64_t run_id = next_run_id_++;
  const int rank = getRank();
  const int size = getSize();
  runner_->post([work, call = std::move(call), finish = std::move(finish), issued, first, run_id, rank, size,
                 o = o_](Runner& runner) mutable {
    const int64_t start = now_ns();
    std::string row_json;
    std::string error;
    try {
      finish(call_hostd(runner, o, call, run_id, rank, &row_json));
      work->complete(nullptr);
    } catch (const std::exception& e) {
      error = e.what();
      work->complete(std::make_exception_ptr(std::runtime_error(error)));
    }
    if (!o.trace.empty()) {
      append_trace(o, call, rank, size, run_id - first, issued, start, now_ns(), row_json, error);
    }
  });
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::reduce_at_ranks(c10d::OpType type, const std::string& torch_op,
                                                             at::Tensor input, c10d::ReduceOp op,
                                                             std::function<void(const at::Tensor&)> finish,
                                                             std::vector<at::Tensor> outputs) {
  const std::string name = reduce_op_name(op);
  TORCH_CHECK(input.scalar_type() == at::kLong || input.scalar_type() == at::kDouble, "ifec: ", torch_op, " of ",
              torch_dtype(input.scalar_type()),
              " is not supported (float32, bfloat16, float16, int32 reduce in the fabric; int64 and float64 at the "
              "ranks)");
  TORCH_CHECK(name == "sum" || name == "min" || name == "max" || (name == "avg" && input.is_floating_point()),
              "ifec: ", torch_op, " with ", name, " on ", torch_dtype(input.scalar_type()),
              " is not supported (sum, min, max; avg on float64)");
  Call c = movement("all-gather", torch_op, input);
  c.reduce_op = name;
  const uint64_t block = c.input.size();
  const int n = getSize();
  if (outputs.empty()) {
    outputs = {input};
  }
  return submit(type, std::move(outputs), std::move(c), [input, block, n, name, finish](const std::string& out) {
    std::vector<at::Tensor> parts;
    for (int r = 0; r < n; ++r) {
      parts.push_back(tensor_from(out.data() + r * block, input));
    }
    at::Tensor all = at::stack(parts);
    at::Tensor reduced = name == "min" ? std::get<0>(all.min(0)) : name == "max" ? std::get<0>(all.max(0)) : all.sum(0);
    finish(name == "avg" ? reduced.div_(n) : reduced);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  check_one(tensors, "all_reduce");
  at::Tensor t = tensors[0];
  const std::string dtype = fabric_dtype(t.scalar_type());
  if (dtype.empty()) {
    return reduce_at_ranks(c10d::OpType::ALLREDUCE, "all_reduce", t, opts.reduceOp,
                           [t](const at::Tensor& r) mutable { t.copy_(r.view(t.sizes())); });
  }
  Call c = reduction("allreduce", "all_reduce", t, opts.reduceOp, dtype);
  const bool avg = c.reduce_op == "avg";
  const int n = getSize();
  return submit(c10d::OpType::ALLREDUCE, {t}, std::move(c), [t, avg, n](const std::string& out) mutable {
    write_into(t, out.data(), out.size());
    if (avg) {
      t.div_(n);
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  check_one(tensors, "reduce");
  at::Tensor t = tensors[0];
  const bool root = opts.rootRank == getRank();
  const std::string dtype = fabric_dtype(t.scalar_type());
  if (dtype.empty()) {
    return reduce_at_ranks(c10d::OpType::REDUCE, "reduce", t, opts.reduceOp, [t, root](const at::Tensor& r) mutable {
      if (root) {
        t.copy_(r.view(t.sizes()));
      }
    });
  }
  Call c = reduction("reduce", "reduce", t, opts.reduceOp, dtype);
  c.root = static_cast<int>(opts.rootRank);
  const bool avg = c.reduce_op == "avg";
  const int n = getSize();
  return submit(c10d::OpType::REDUCE, {t}, std::move(c), [t, avg, n, root](const std::string& out) mutable {
    if (root) {
      write_into(t, out.data(), out.size());
      if (avg) {
        t.div_(n);
      }
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  check_one(tensors, "broadcast");
  at::Tensor t = tensors[0];
  Call c = movement("multicast", "broadcast", t);
  c.root = static_cast<int>(opts.rootRank);
  return submit(c10d::OpType::BROADCAST, {t}, std::move(c),
                [t](const std::string& out) mutable { write_into(t, out.data(), out.size()); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) {
  check_one(inputs, "all_gather");
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
              "ifec: all_gather needs one "
              "list of ",
              getSize(), " output tensors");
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
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions&) {
  check_tensor(input, "all_gather_into_tensor");
  check_tensor(output, "all_gather_into_tensor");
  TORCH_CHECK(output.nbytes() == input.nbytes() * getSize() && output.scalar_type() == input.scalar_type(),
              "ifec: all_gather_into_tensor of ", input.nbytes(), " B into ", output.nbytes(), " B (needs ",
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
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  check_one(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
              "ifec: reduce_scatter needs one list of ", getSize(), " input tensors");
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : inputs[0]) {
    check_tensor(t, "reduce_scatter");
    TORCH_CHECK(t.nbytes() == outputs[0].nbytes() && t.scalar_type() == outputs[0].scalar_type(),
                "ifec: reduce_scatter of unequal blocks (", t.nbytes(), " B of ", torch_dtype(t.scalar_type()),
                " against ", outputs[0].nbytes(), " B of ", torch_dtype(outputs[0].scalar_type()), ")");
    flat.push_back(t.reshape({-1}));
  }
  at::Tensor in = at::cat(flat);
  return _reduce_scatter_base(outputs[0], in, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  check_tensor(input, "reduce_scatter");
  check_tensor(output, "reduce_scatter");
  const int n = getSize();
  TORCH_CHECK(input.nbytes() == output.nbytes() * n && input.scalar_type() == output.scalar_type(),
              "ifec: reduce_scatter of ", input.nbytes(), " B into ", output.nbytes(), " B (needs ", n,
              " blocks of the output's size and dtype)");
  at::Tensor out_t = output;
  const std::string dtype = fabric_dtype(input.scalar_type());
  if (dtype.empty()) {
    const int64_t block = output.numel();
    return reduce_at_ranks(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", input, opts.reduceOp,
                           [out_t, block, me = getRank()](const at::Tensor& r) mutable {
                             out_t.copy_(r.reshape({-1}).narrow(0, me * block, block).view(out_t.sizes()));
                           },
                           {output});
  }
  Call c = reduction("reduce-scatter", "reduce_scatter", input, opts.reduceOp, dtype);
  const bool avg = c.reduce_op == "avg";
  return submit(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, std::move(c),
                [out_t, avg, n](const std::string& out) mutable {
                  write_into(out_t, out.data(), out.size());
                  if (avg) {
                    out_t.div_(n);
                  }
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& output_splits,
                                                           std::vector<int64_t>& input_splits,
                                                           const c10d::AllToAllOptions&) {
  check_tensor(input, "all_to_all_single");
  check_tensor(output, "all_to_all_single");
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "ifec: all_to_all_single from ",
              torch_dtype(input.scalar_type()), " into ", torch_dtype(output.scalar_type()));
  const size_t n = static_cast<size_t>(getSize());
  TORCH_CHECK(
      (input_splits.empty() || input_splits.size() == n) && (output_splits.empty() || output_splits.size() == n),
      "ifec: all_to_all_single with ", input_splits.size(), " input and ", output_splits.size(), " output splits for ",
      n, " ranks");
  Call c;
  c.what = "alltoall";
  c.torch_op = "all_to_all_single";
  c.torch_dtype = torch_dtype(input.scalar_type());
  c.bytes = input.nbytes();
  c.input = bytes_of(input);
  c.send_splits = split_bytes(input_splits, row_bytes(input));
  c.recv_splits = split_bytes(output_splits, row_bytes(output));
  if (c.send_splits.empty()) {
    TORCH_CHECK(input.nbytes() % n == 0, "ifec: all_to_all_single of ", input.nbytes(), " B in ", n,
                " equal blocks: give the input splits");
    c.send_splits.assign(n, input.nbytes() / n);
  }
  if (c.recv_splits.empty()) {
    TORCH_CHECK(output.nbytes() % n == 0, "ifec: all_to_all_single into ", output.nbytes(), " B in ", n,
                " equal blocks: give the output splits");
    c.recv_splits.assign(n, output.nbytes() / n);
  }
  auto sum = [](const std::vector<uint64_t>& v) { return std::accumulate(v.begin(), v.end(), uint64_t{0}); };
  TORCH_CHECK(sum(c.send_splits) == input.nbytes() && sum(c.recv_splits) == output.nbytes(),
              "ifec: all_to_all_single: the input splits add up to ", sum(c.send_splits), " B of an input of ",
              input.nbytes(), " B, the output splits to ", sum(c.recv_splits), " B of an output of ", output.nbytes(),
              " B (each must be its tensor's first dimension)");
  at::Tensor out_t = output;
  return submit(c10d::OpType::ALLTOALL_BASE, {output}, std::move(c),
                [out_t](const std::string& out) mutable { write_into(out_t, out.data(), out.size()); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::barrier(const c10d::BarrierOptions&) {
  Call c;
  c.what = "barrier";
  c.dtype = "fp32";
  c.torch_op = "barrier";
  c.torch_dtype = "none";
  return submit(c10d::OpType::BARRIER, {}, std::move(c), [](const std::string&) {});
}

c10::intrusive_ptr<c10d::ProcessGroup> create(int rank, int size, const BackendOptions& o) {
  TORCH_CHECK(!o.hostd.empty(), "ifec: no hostd address for rank ", rank);
  return c10::make_intrusive<ProcessGroup>(rank, size, o);
}

}  // namespace ifec::c10d_backend
