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
  procs_.sum = [](std::vector<uint64_t>& v) {
    constexpr size_t kChunk = size_t{1} << 28;
    for (size_t off = 0; off < v.size(); off += kChunk) {
      const int n = static_cast<int>(std::min(kChunk, v.size() - off));
      IFEC_CHECK(MPI_Allreduce(MPI_IN_PLACE, v.data() + off, n, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS,
                 "MPI_Allreduce of " << n << " counters failed");
    }
  };
}

MpiProcesses::~MpiProcesses() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    MPI_Finalize();
  }
}

}  // namespace ifec::testbed
