// MPI_COMM_WORLD as what a partitioned run needs: a sum (MPI_Allreduce of 64-bit counters, in chunks MPI's int
// counts can hold) and an exchange of byte messages (their sizes by MPI_Alltoall, then point to point).
#include "ifec/testbed/mpi_processes.h"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>

#include "ifec/common/checks.h"

namespace ifec::testbed {

namespace {
constexpr int kExchangeTag = 17;  // the exchange's point-to-point messages (the other calls are collectives)
}  // namespace

bool launched_by_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

MpiProcesses::MpiProcesses() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  // A partitioned run's worker threads never call MPI; the thread that made this one does (between windows).
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    IFEC_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) == MPI_SUCCESS,
               "MPI_Init_thread failed");
  } else {
    MPI_Query_thread(&provided);
  }
  IFEC_CHECK(provided >= MPI_THREAD_FUNNELED, "MPI gives thread level " << provided << ", below MPI_THREAD_FUNNELED ("
                                                                        << MPI_THREAD_FUNNELED
                                                                        << "): worker threads live beside MPI here");
  MPI_Comm_rank(MPI_COMM_WORLD, &procs_.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &procs_.size);
  procs_.exchange = [n = procs_.size, rank = procs_.rank](std::vector<Processes::Bytes>& out,
                                                          std::vector<Processes::Bytes>& in) {
    IFEC_CHECK(static_cast<int>(out.size()) == n, "exchange: " << out.size() << " messages for " << n << " ranks");
    in.resize(static_cast<size_t>(n));
    std::vector<int> send(n), recv(n);
    for (int p = 0; p < n; ++p) {
      IFEC_CHECK(out[p].size() < (1u << 31),
                 "exchange: " << out[p].size() << " bytes for rank " << p << " overflow MPI's int counts");
      send[p] = static_cast<int>(out[p].size());
    }
    IFEC_CHECK(MPI_Alltoall(send.data(), 1, MPI_INT, recv.data(), 1, MPI_INT, MPI_COMM_WORLD) == MPI_SUCCESS,
               "MPI_Alltoall of message sizes failed");
    // Straight from each message to its rank and into the buffer it ends in (one copy, MPI's), not through one
    // concatenated buffer as MPI_Alltoallv would need: a window's frames can be hundreds of megabytes.
    std::vector<MPI_Request> reqs;
    reqs.reserve(2 * static_cast<size_t>(n));
    for (int p = 0; p < n; ++p) {
      if (p == rank) continue;
      in[p].resize(static_cast<size_t>(recv[p]));
      reqs.emplace_back();
      IFEC_CHECK(
          MPI_Irecv(in[p].data(), recv[p], MPI_BYTE, p, kExchangeTag, MPI_COMM_WORLD, &reqs.back()) == MPI_SUCCESS,
          "MPI_Irecv of " << recv[p] << " bytes from rank " << p << " failed");
    }
    for (int p = 0; p < n; ++p) {
      if (p == rank) continue;
      reqs.emplace_back();
      IFEC_CHECK(
          MPI_Isend(out[p].data(), send[p], MPI_BYTE, p, kExchangeTag, MPI_COMM_WORLD, &reqs.back()) == MPI_SUCCESS,
          "MPI_Isend of " << send[p] << " bytes to rank " << p << " failed");
    }
    IFEC_CHECK(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE) == MPI_SUCCESS,
               "the exchange's " << reqs.size() << " sends and receives failed");
    in[rank].swap(out[rank]);
  };
  procs_.sum = [](std::vector<uint64_t>& v) {
    constexpr size_t kChunk = size_t{1} << 28;
    for (size_t off = 0; off < v.size(); off += kChunk) {
      const int n = static_cast<int>(std::min(kChunk, v.size() - off));
      IFEC_CHECK(MPI_Allreduce(MPI_IN_PLACE, v.data() + off, n, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS,
                 "MPI_Allreduce of " << n << " counters failed");
    }
  };
}

void MpiProcesses::abort(int code) const {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; if it did, neither does this
}

MpiProcesses::~MpiProcesses() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    MPI_Finalize();
  }
}

}  // namespace ifec::testbed
