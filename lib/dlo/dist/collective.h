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

namespace dlo {

class MpiWorld;

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi" or "nccl".
  virtual std::string name() const = 0;

  // Collective, in-place AllGather (see above). CPU: blocks until done; call from one thread at a
  // time. NCCL: `stream` is the cudaStream_t to enqueue on; returns once enqueued.
  virtual void allgather_inplace(void* buffer, std::size_t shard_bytes, void* stream = nullptr) = 0;

  // NCCL: raises dlo::Error if the communicator reported an asynchronous error (a peer died, a
  // network fault). Cheap; the watchdog polls it. MPI: nothing (mpirun ends the job on a death).
  virtual void check_async_error() {}
  // NCCL: aborts the communicator so pending collectives return. MPI: nothing.
  virtual void abort() {}
};

// An MPI collective over a duplicate of MPI_COMM_WORLD. Counts above INT_MAX are chunked.
std::unique_ptr<Collective> make_mpi_collective(const MpiWorld& world);

// An NCCL communicator over all ranks, on CUDA device `device` (rank 0 creates the unique id and
// broadcasts it over MPI). Throws dlo::Error when built without CUDA or when NCCL fails, and when
// the NCCL library loaded differs from the headers dlo was compiled with.
std::unique_ptr<Collective> make_nccl_collective(const MpiWorld& world, int device);

}  // namespace dlo
