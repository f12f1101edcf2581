// The `ifec` torch.distributed backend: a c10d ProcessGroup (PyTorch 1.13's interface) whose collectives run on the
// live fabric. Each rank process asks its own GPU's hostd (Host.Run over gRPC, the caller's bytes in, its result
// out); every rank's hostd runs its part of the same operation on the fabric, in-switch where the fabric can and
// otherwise with the endpoint algorithm asked for.
//
// Operations run one at a time, in the order the program issued them, on one worker thread per process (shared by
// every ifec group: hostd runs one operation at a time here); each is numbered within its group (run_id: the group's
// first number + its place), as every member numbers it. A group other than the world has a communicator of its own
// at each member's hostd (RunRequest.group, members). The Work an operation returns completes when its reply came
// back and its result was copied into the caller's tensors.
//
// Point-to-point transfers (send, recv, and isend, irecv, batch_isend_irecv through them) run on channels, one per
// pair of GPUs and direction, each with its own worker thread in the process (whatever group issued the transfer)
// and its own communicator at the two hostds (RunRequest what = send): a transfer meets the peer's in the order each
// side issued its transfers on that channel (as NCCL's do; tags are checked, not matched), and a send waiting for
// its receiver holds up neither the collectives nor the other channels, so a ring exchange of isends then irecvs
// completes. A transfer's Work completes once the bytes landed at the receiver.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace ifec::c10d_backend {

struct BackendOptions {
  std::string hostd;          // this rank's hostd, host:port
  std::string node;           // its node name, for errors
  std::string algo = "ifec";  // RunRequest.algo for reductions: ifec | best | ring | tree | rd | oneshot
  std::chrono::milliseconds timeout{120000};  // an operation that has not answered by then fails, naming hostd
  uint64_t first_run_id = 0;                  // the number of the group's first operation, the same on every member
  std::string trace;                          // a JSON-lines file each operation is appended to ("": none)
  uint32_t group = 0;                         // the program's number for the group (0: the world, every rank)
  std::vector<int> members;                   // a group's GPUs in group-rank order (the world: empty)
  std::vector<int> gpus;                      // every group rank's GPU, the world's too (transfers name them)
  int world_size = 0;                         // the world's size, said to hostd (RunRequest.world_size; 0: not)
};

// One operation as hostd runs it: the RunRequest's fields, and what the trace says of it.
struct Call {
  std::string what;   // allreduce | reduce | multicast | all-gather | reduce-scatter | alltoall | barrier
  std::string dtype;  // the fabric's dtype (fp32 | bf16 | fp16 | int32)
  std::string op;     // sum | min | max
  int root = 0;
  std::string input;
  std::vector<uint64_t> send_splits;
  std::vector<uint64_t> recv_splits;
  // The trace's description: torch's name for the operation, the tensor's dtype, its bytes in and out.
  std::string torch_op;
  std::string torch_dtype;
  std::string reduce_op;
  uint64_t bytes = 0;
  // A transfer's (what = send): the sender's and receiver's GPUs, the peer's group rank, the tag; `refused`: a
  // stand-in for one this rank refused (see ProcessGroup::transfer).
  int from_gpu = -1;
  int to_gpu = -1;
  int peer = -1;
  int64_t tag = 0;
  bool refused = false;
  bool traced = true;  // false: a refused operation's stand-in (ProcessGroup::guarded), which the trace leaves out
  // A second operation at hostd, made from this one's output once it came back (a reduction at the ranks: the
  // all-gather of the folded blocks), numbered next; its output is the operation's.
  std::function<Call(const std::string& out)> then;
};

class Runner;

class ProcessGroup : public c10d::ProcessGroup {
 public:
  ProcessGroup(int rank, int size, BackendOptions o);
  ~ProcessGroup() override;

  const std::string getBackendName() const override { return "ifec"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

 private:
  // Queues `call`; `finish(output)` runs on the worker once hostd answered (it copies the output into the tensors).
  // Every call takes the group's next operation number, also one of no elements (it meets the other ranks as a
  // barrier: a rank that skipped it would meet their next operation with this one, and every later one, out of step);
  // an allreduce or reduce takes two, whichever way it runs (at the ranks it is two operations at hostd), so a rank
  // that refused one (its stand-in) or ran it in the fabric stays in step with ranks that reduced at the ranks.
  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type, std::vector<at::Tensor> outputs, Call call,
                                        std::function<void(const std::string&)> finish);
  // Posts `call` as operation `run_id` (`first`: its sequence's first, for the trace) to `runner`.
  c10::intrusive_ptr<c10d::Work> post(Runner& runner, uint64_t first, uint64_t run_id, c10d::OpType type,
                                      std::vector<at::Tensor> outputs, Call call,
                                      std::function<void(const std::string&)> finish);
  // This rank's send of `t` to group rank `peer`, or its recv into `t` from it, on that direction's channel: its
  // next number there and its worker. A transfer this rank refuses (a CUDA tensor, too many bytes) still takes its
  // number: a stand-in goes to hostd, so the peer's transfer fails at once naming it, and the channel stays in step.
  c10::intrusive_ptr<c10d::Work> transfer(bool sending, std::vector<at::Tensor>& tensors, int peer, int tag);
  // Issues an operation (`issue`: its checks, then its submit). One it refuses still takes its operation number: a
  // barrier goes to hostd in its place before the error is thrown, so where the other ranks did not refuse it (one
  // rank's tensors or splits differ) their operation fails at once naming this rank's barrier, not after the hub's
  // 30 s, and every later operation still meets its own.
  c10::intrusive_ptr<c10d::Work> guarded(const std::string& torch_op,
                                         const std::function<c10::intrusive_ptr<c10d::Work>()>& issue);
  // A reduction (allreduce, reduce, reduce-scatter) of `input`: in the fabric where it reduces the dtype and the
  // operation (fp32, bf16, fp16, int32; sum, avg, min, max), else at the ranks: each rank's block of every input
  // comes to it in an all-to-all and it folds them in rank order (the same result on every rank), then (allreduce,
  // reduce) the ranks all-gather the folded blocks. `finish` gets this rank's result as a flat
  // contiguous tensor of `input`'s dtype: every element (allreduce, reduce) or this rank's block (reduce-scatter).
  c10::intrusive_ptr<c10d::Work> reduce_work(c10d::OpType type, const std::string& torch_op, const std::string& what,
                                             const at::Tensor& input, c10d::ReduceOp op, int root,
                                             std::vector<at::Tensor> outputs,
                                             std::function<void(const at::Tensor& reduced)> finish);
  // An all-to-all of bytes (all_to_all_single, all_to_all, gather, scatter): `input` holds this rank's blocks in
  // rank order, send[d] bytes for rank d; recv[s] bytes come from rank s, and `finish` gets them in rank order. hostd
  // checks every sender's splits against its receiver's, on every rank.
  c10::intrusive_ptr<c10d::Work> exchange(c10d::OpType type, const std::string& torch_op, const at::Tensor& like,
                                          std::string input, std::vector<uint64_t> send, std::vector<uint64_t> recv,
                                          std::vector<at::Tensor> outputs,
                                          std::function<void(const std::string&)> finish);

  BackendOptions o_;
  std::shared_ptr<Runner> runner_;
  std::map<std::pair<int, int>, std::shared_ptr<Runner>> channel_runners_;  // (from GPU, to GPU): the channels used
  uint64_t next_run_id_;  // issued from the program's thread, in its order
};

// The factory torch.distributed.Backend.register_backend's function calls (through ifec.torch_backend).
c10::intrusive_ptr<c10d::ProcessGroup> create(int rank, int size, const BackendOptions& o);

}  // namespace ifec::c10d_backend
