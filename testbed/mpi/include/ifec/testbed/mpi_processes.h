// One simulation spread over MPI processes (Open MPI): the world communicator as testbed::Processes. Only the
// front end links this (ifec-cli); the simulator itself knows nothing of MPI, only the collective sum it is given.
#pragma once

#include <memory>

#include "ifec/testbed/traffic_run.h"

namespace ifec::testbed {

// True when this process was started by mpirun (Open MPI's environment says so).
bool launched_by_mpirun();

// MPI initialized for the life of the object (finalized by its destructor): rank, size and a sum over
// MPI_COMM_WORLD. Throws Error when MPI fails to start.
class MpiProcesses {
 public:
  MpiProcesses();
  ~MpiProcesses();
  MpiProcesses(const MpiProcesses&) = delete;
  MpiProcesses& operator=(const MpiProcesses&) = delete;

  const Processes& processes() const { return procs_; }
  // Ends every process of the job (MPI_Abort): an error on one rank while the others wait in an exchange.
  [[noreturn]] void abort(int code) const;

 private:
  Processes procs_;
};

}  // namespace ifec::testbed
