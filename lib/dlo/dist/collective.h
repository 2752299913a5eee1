// The weight-gather collective: MPI on the CPU, NCCL on NVIDIA GPUs, chosen at run time.
//
// One operation matters: an in-place AllGather of equal-sized byte shards into one buffer. Every
// rank has already placed its own shard at buffer + rank * shard_bytes; afterwards every rank's
// buffer holds all size() shards in rank order. Collectives run on a communicator of their own
// (duplicated from MPI_COMM_WORLD), so they never interleave with other MPI traffic.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "dlo/common/settings.h"

namespace dlo {

class MpiWorld;

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi" or "nccl".
  virtual std::string name() const = 0;
  // For reports: the name, the library and its version, e.g. "nccl 2.28.9 (non-blocking
  // communicator, 2 ranks, cuda:0)" or "mpi (Open MPI v4.1.4, ...)". Cheap.
  virtual std::string describe() const { return name(); }
  // How long one gather (NCCL: one call's host-side completion) may take before it fails: the
  // MpiWorld::timeout_s() the collective was made with (600 s, MpiWorld's default, for
  // implementations that do not say).
  virtual double timeout_s() const { return kDefaultGatherTimeoutS; }

  // Collective, in-place AllGather (see above). Call from one thread at a time.
  // CPU: blocks until done. NCCL: `stream` is the cudaStream_t to enqueue on; returns once the
  // gather is enqueued on that stream (the call is complete on the communicator, so an event
  // recorded on `stream` afterwards follows the gather kernel). Throws dlo::Error on an NCCL
  // error or after timeout_s() (having aborted the communicator), and after abort(). MPI: after
  // timeout_s() every rank ends (MpiWorld::abort_after_timeout names the ranks that did not arrive).
  virtual void allgather_inplace(void* buffer, std::size_t shard_bytes, void* stream = nullptr) = 0;

  // NCCL: raises dlo::Error if the communicator reported an asynchronous error (a peer died, a
  // network fault; the communicator is then aborted) or was aborted. Cheap; safe to call from a
  // watchdog thread while another thread gathers (it skips the poll while a call is in flight:
  // that call polls itself). MPI: nothing (mpirun ends the job on a death).
  virtual void check_async_error() {}
  // NCCL: aborts the communicator so pending collectives return (kernels stop, a gather waiting
  // on another thread throws). Any thread; idempotent; never throws. Later calls throw.
  // MPI: nothing.
  virtual void abort() {}
};

// An MPI collective over a duplicate of MPI_COMM_WORLD. No message is larger than
// `max_chunk_bytes` (at most INT_MAX; bigger gathers go in chunks): 1 GiB, or a few bytes in tests
// of the chunking. Across nodes placed node by node, gathers go in two levels (collective_mpi.cpp).
std::unique_ptr<Collective> make_mpi_collective(const MpiWorld& world, std::size_t max_chunk_bytes = std::size_t{1} << 30);

// An NCCL communicator over all ranks, on CUDA device `device` (rank 0 creates the unique id and
// broadcasts it over MPI). Collective. Non-blocking underneath, so set-up is bounded by
// world.timeout_s(); on failure or timeout the communicator is aborted and dlo::Error names the
// step, the NCCL error and NCCL's last warning. Also throws when built without CUDA, and when the
// NCCL library loaded has another major.minor version than the nccl.h dlo was compiled with.
// Destruction finalizes and destroys the communicator (bounded; aborts on failure) and never
// throws; problems are one line on stderr.
std::unique_ptr<Collective> make_nccl_collective(const MpiWorld& world, int device);

}  // namespace dlo
