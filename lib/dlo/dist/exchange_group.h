// Activation exchanges among the ranks that compute one job together (sequence and CFG
// parallelism): MPI on the CPU, NCCL on CUDA, behind one interface, so the Ulysses exchanges
// (dist/sequence_exchange.h) and the runner's group forwards are the same code on both.
//
// The weight gathers (dist/collective.h) never share a communicator with these: on the CPU a
// group is an MPI communicator split from the world's (MPI_Comm_split), used by the compute
// thread while the weight gathers run on their own communicator and thread; on CUDA every group
// is a set of peers on one activation communicator over the whole world (NCCL, created once; a
// group costs nothing to form, so regrouping at job boundaries is free), its exchanges grouped
// ncclSend/ncclRecv on the compute stream, issued by the thread that issues the weight gathers.
//
// Fault rules, both transports: an exchange that does not finish within the gather timeout
// (DLO_GATHER_TIMEOUT_S: a peer gone or stuck), or an NCCL error on the activation communicator,
// ends every rank (MpiWorld::abort) naming the phase; nobody waits forever.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace dlo {

class MpiWorld;

// A group of ranks: its members in world rank order. Not thread-safe: one thread exchanges on a
// group (and, on CUDA, on every group of one network).
class ExchangeGroup {
 public:
  virtual ~ExchangeGroup() = default;
  int rank() const { return rank_; }  // in the group
  int size() const { return static_cast<int>(world_ranks_.size()); }
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  // Where the exchanged tensors live: the CPU (MPI) or the CUDA device (NCCL).
  virtual c10::Device device() const = 0;
  // The largest buffer one exchange takes (MPI: INT_MAX bytes in all; NCCL: no limit of its own).
  // Callers that must refuse alike on every rank check their sizes against it first.
  virtual std::uint64_t max_exchange_bytes() const = 0;

  // Collective over the group: this rank's bytes send[send_offset[j], + send_bytes[j]) go to group
  // rank j, which receives them at recv + recv_offset[i] (recv_bytes[i] of them) for this rank i.
  // `send` and `recv` are contiguous uint8 tensors on device(). CPU: returns once done. CUDA:
  // enqueued on the current stream of the device (what follows on that stream sees the bytes);
  // returns once the exchange is on the stream. A transfer failure ends every rank (see above);
  // a size above max_exchange_bytes() is dlo::Error (internal) before anything is sent.
  virtual void alltoallv(const at::Tensor& send, const std::vector<std::size_t>& send_bytes,
                         const std::vector<std::size_t>& send_offset, const at::Tensor& recv,
                         const std::vector<std::size_t>& recv_bytes, const std::vector<std::size_t>& recv_offset,
                         const char* phase) const = 0;

  // Bytes this rank has sent to the group's other ranks so far, over every exchange (its piece
  // for itself not counted): the activations sequence and CFG parallelism move, for reports.
  std::uint64_t bytes_sent() const { return bytes_sent_; }

 protected:
  ExchangeGroup(int rank, std::vector<int> world_ranks) : rank_(rank), world_ranks_(std::move(world_ranks)) {}
  void count_sent(const std::vector<std::size_t>& send_bytes) const {
    for (std::size_t j = 0; j < send_bytes.size(); ++j)
      if (static_cast<int>(j) != rank_) bytes_sent_ += send_bytes[j];
  }

 private:
  int rank_;
  std::vector<int> world_ranks_;
  mutable std::uint64_t bytes_sent_ = 0;
};

// What groups are made from: MPI communicators on the CPU, one NCCL activation communicator on
// CUDA. Outlives the groups it made.
class ExchangeNetwork {
 public:
  virtual ~ExchangeNetwork() = default;
  // "mpi" or "nccl 2.28.9 (activations, 4 ranks, cuda:0)", for reports.
  virtual std::string describe() const = 0;
  // Collective over the world: the ranks passing the same `color` (>= 0) form one group, ordered
  // by world rank. The colors are exchanged in a bounded allgather first, so a missing rank ends
  // every rank, naming `phase`.
  virtual std::unique_ptr<ExchangeGroup> split(int color, const char* phase) = 0;
};

// The network for `device`: MPI for the CPU; NCCL for CUDA (collective: one communicator over
// every rank, bounded set-up, as make_nccl_collective; throws dlo::Error on every rank alike when
// it cannot be made, e.g. a build without CUDA).
std::unique_ptr<ExchangeNetwork> make_exchange_network(const MpiWorld& world, c10::Device device);
// The CUDA one alone (collective_nccl.cpp): an NCCL communicator over every rank on CUDA device
// `device`, separate from the weight gathers'. Throws dlo::Error when built without CUDA.
std::unique_ptr<ExchangeNetwork> make_nccl_exchange_network(const MpiWorld& world, int device);

}  // namespace dlo
