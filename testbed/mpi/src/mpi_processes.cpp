// MPI_COMM_WORLD as the sum a partitioned run needs: MPI_Allreduce of 64-bit counters, in chunks MPI's int counts
// can hold.
#include "ifec/testbed/mpi_processes.h"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>

#include "ifec/common/checks.h"

namespace ifec::testbed {

bool launched_by_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

MpiProcesses::MpiProcesses() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    IFEC_CHECK(MPI_Init(nullptr, nullptr) == MPI_SUCCESS, "MPI_Init failed");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &procs_.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &procs_.size);
  procs_.exchange = [n = procs_.size](const std::vector<Processes::Bytes>& out) {
    IFEC_CHECK(static_cast<int>(out.size()) == n, "exchange: " << out.size() << " messages for " << n << " ranks");
    std::vector<int> send(n), recv(n), send_at(n), recv_at(n);
    Processes::Bytes all;
    for (int p = 0; p < n; ++p) {
      IFEC_CHECK(out[p].size() < (1u << 31) - all.size(),
                 "exchange: " << out[p].size() << " bytes for rank " << p << " overflow MPI's int counts");
      send_at[p] = static_cast<int>(all.size());
      send[p] = static_cast<int>(out[p].size());
      all.insert(all.end(), out[p].begin(), out[p].end());
    }
    IFEC_CHECK(MPI_Alltoall(send.data(), 1, MPI_INT, recv.data(), 1, MPI_INT, MPI_COMM_WORLD) == MPI_SUCCESS,
               "MPI_Alltoall of message sizes failed");
    size_t total = 0;
    for (int p = 0; p < n; ++p) {
      recv_at[p] = static_cast<int>(total);
      total += static_cast<size_t>(recv[p]);
    }
    Processes::Bytes got(total);
    IFEC_CHECK(MPI_Alltoallv(all.data(), send.data(), send_at.data(), MPI_BYTE, got.data(), recv.data(), recv_at.data(),
                             MPI_BYTE, MPI_COMM_WORLD) == MPI_SUCCESS,
               "MPI_Alltoallv of " << all.size() << " bytes failed");
    std::vector<Processes::Bytes> in(n);
    for (int p = 0; p < n; ++p) {
      in[p].assign(got.begin() + recv_at[p], got.begin() + recv_at[p] + recv[p]);
    }
    return in;
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
