#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "dlo/common/error.h"
#include "dlo/dist/collective.h"
#include "dlo/mpi/mpi_world.h"

namespace dlo {
namespace {

class MpiCollective final : public Collective {
 public:
  MpiCollective(const MpiWorld& world, std::size_t max_chunk_bytes)
      : world_(world),
        max_chunk_(std::max<std::size_t>(1, std::min<std::size_t>(max_chunk_bytes, INT_MAX))),
        rank_(world.rank()),
        size_(world.size()),
        timeout_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(world.timeout_s()))) {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    plan_two_levels(world.hosts());
  }
  ~MpiCollective() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Comm* c : {&comm_, &across_, &within_})
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  std::string describe() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int length = 0;
    MPI_Get_library_version(version, &length);
    std::string v(version, static_cast<std::size_t>(std::max(0, length)));
    v = v.substr(0, v.find_first_of("\r\n"));  // the first line: "Open MPI v4.1.4, package: ..."
    while (!v.empty() && (v.back() == ' ' || v.back() == ',')) v.pop_back();
    if (nodes_ > 1) return str("mpi (", v, "; ", size_, " ranks; two-level gathers over ", nodes_, " nodes)");
    return str("mpi (", v, "; ", size_, " ranks)");
  }
  double timeout_s() const override { return std::chrono::duration<double>(timeout_).count(); }

  void allgather_inplace(void* buffer, std::size_t shard_bytes, void*) override {
    if (size_ == 1 || shard_bytes == 0) return;
    auto* base = static_cast<char*>(buffer);
    // Chunks of at most max_chunk_ bytes per message; each rank's chunk c sits at rank*shard +
    // c*chunk, so the receive type is `chunk` bytes with an extent of one whole shard. Two levels
    // send a column of nodes_ chunks per message within a node: chunks a nodes_-th the size.
    const std::size_t max_chunk = std::max<std::size_t>(1, max_chunk_ / static_cast<std::size_t>(nodes_));
    // One deadline for the whole gather, every chunk and both levels: a rank that left one step
    // late must not time out in the next on a clock of its own while its peers' clocks run ahead.
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (std::size_t done = 0; done < shard_bytes; done += max_chunk) {
      const std::size_t n = std::min(max_chunk, shard_bytes - done);
      MPI_Datatype chunk, strided;
      MPI_Type_contiguous(static_cast<int>(n), MPI_BYTE, &chunk);
      MPI_Type_create_resized(chunk, 0, static_cast<MPI_Aint>(shard_bytes), &strided);
      MPI_Type_commit(&strided);
      MPI_Request req;
      int rc = MPI_SUCCESS;
      if (nodes_ > 1) {
        // 1. Across the nodes, among the ranks of one local index: the shards of those ranks,
        //    at their places (global rank r = node * per_node + local index).
        rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, base + done, ones_.data(), across_places_.data(),
                             strided, across_, &req);
        if (rc == MPI_SUCCESS) rc = wait(req, deadline);
        // 2. Within the node: each rank's column (its local index's shard of every node, one
        //    shard every per_node) to the node's other ranks.
        if (rc == MPI_SUCCESS && per_node_ > 1) {
          MPI_Datatype column, column_at;
          MPI_Type_create_hvector(nodes_, 1, static_cast<MPI_Aint>(shard_bytes) * per_node_, chunk, &column);
          MPI_Type_create_resized(column, 0, static_cast<MPI_Aint>(shard_bytes), &column_at);
          MPI_Type_commit(&column_at);
          rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, base + done, 1, column_at, within_, &req);
          if (rc == MPI_SUCCESS) rc = wait(req, deadline);
          MPI_Type_free(&column_at);
          MPI_Type_free(&column);
        }
      } else {
        rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, base + done, 1, strided, comm_, &req);
        if (rc == MPI_SUCCESS) rc = wait(req, deadline);
      }
      MPI_Type_free(&strided);
      MPI_Type_free(&chunk);
      DLO_CHECK_KIND(ErrorKind::kTransfer, rc == MPI_SUCCESS, "MPI_Allgather of ", shard_bytes, "-byte shards failed (code ", rc, ")");
    }
  }

 private:
  // Across several nodes, a flat allgather sends every shard to every rank of another node
  // separately: with k ranks per node, k copies of each shard cross the node's link. Two levels
  // send each across once: an allgather among the ranks of one local index (one per node), then
  // one within each node. Used when the ranks sit node by node with as many on each (rank r on
  // node r / k as local index r % k: mpirun's and srun's default block placement); otherwise,
  // and on one node, the flat allgather. `hosts` is the same on every rank, so is the choice.
  void plan_two_levels(const std::vector<std::string>& hosts) {
    std::vector<std::string> nodes;
    for (const auto& h : hosts)
      if (std::find(nodes.begin(), nodes.end(), h) == nodes.end()) nodes.push_back(h);
    const int count = static_cast<int>(nodes.size());
    if (count < 2 || size_ % count != 0 || hosts.size() != static_cast<std::size_t>(size_)) return;
    const int k = size_ / count;
    for (int r = 0; r < size_; ++r)
      if (hosts[static_cast<std::size_t>(r)] != nodes[static_cast<std::size_t>(r / k)]) return;
    nodes_ = count;
    per_node_ = k;
    MPI_Comm_split(comm_, rank_ % k, rank_, &across_);
    MPI_Comm_split(comm_, rank_ / k, rank_, &within_);
    ones_.assign(static_cast<std::size_t>(count), 1);
    for (int n = 0; n < count; ++n) across_places_.push_back(n * k + rank_ % k);
  }

  // Polls the request: spins briefly (small gathers finish in microseconds), then sleeps between
  // tests so a waiting rank leaves the cores to compute. A gather that has not finished in
  // MpiWorld::timeout_s() (DLO_GATHER_TIMEOUT_S in the apps) means a rank is gone or stuck: the
  // ranks that waited hold the world's roll call, and every rank ends with the missing ranks and
  // their nodes named (the request, still active, may yet write into the slot: nothing can unwind).
  int wait(MPI_Request& req, std::chrono::steady_clock::time_point deadline) {
    for (int spins = 0;; ++spins) {
      int done = 0;
      const int rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS || done) return rc;
      if (spins < 2000) continue;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      if ((spins & 1023) == 0 && std::chrono::steady_clock::now() > deadline) {
        world_.abort_after_timeout("the weight gathers (AllGather)");
      }
    }
  }

  const MpiWorld& world_;
  std::size_t max_chunk_;
  int rank_, size_;
  std::chrono::steady_clock::duration timeout_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  // Two levels (plan_two_levels): nodes_ > 1 when used.
  int nodes_ = 1, per_node_ = 0;
  MPI_Comm across_ = MPI_COMM_NULL, within_ = MPI_COMM_NULL;
  std::vector<int> ones_, across_places_;
};

}  // namespace

std::unique_ptr<Collective> make_mpi_collective(const MpiWorld& world, std::size_t max_chunk_bytes) {
  return std::make_unique<MpiCollective>(world, max_chunk_bytes);
}

}  // namespace dlo
