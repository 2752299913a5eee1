#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "dlo/common/error.h"
#include "dlo/dist/collective.h"
#include "dlo/dist/mpi_world.h"

namespace dlo {
namespace {

class MpiCollective final : public Collective {
 public:
  explicit MpiCollective(const MpiWorld& world) : rank_(world.rank()), size_(world.size()) {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
  }
  ~MpiCollective() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  void allgather_inplace(void* buffer, std::size_t shard_bytes, void*) override {
    if (size_ == 1 || shard_bytes == 0) return;
    auto* base = static_cast<char*>(buffer);
    // Chunks of at most 1 GiB per rank; each rank's chunk c sits at rank*shard + c*chunk, so the
    // receive type is `chunk` bytes with an extent of one whole shard.
    const std::size_t max_chunk = std::size_t{1} << 30;
    for (std::size_t done = 0; done < shard_bytes; done += max_chunk) {
      const std::size_t n = std::min(max_chunk, shard_bytes - done);
      MPI_Datatype chunk, strided;
      MPI_Type_contiguous(static_cast<int>(n), MPI_BYTE, &chunk);
      MPI_Type_create_resized(chunk, 0, static_cast<MPI_Aint>(shard_bytes), &strided);
      MPI_Type_commit(&strided);
      const int rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, base + done, 1, strided, comm_);
      MPI_Type_free(&strided);
      MPI_Type_free(&chunk);
      DLO_CHECK(rc == MPI_SUCCESS, "MPI_Allgather of ", shard_bytes, "-byte shards failed (code ", rc, ")");
    }
  }

 private:
  int rank_, size_;
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace

std::unique_ptr<Collective> make_mpi_collective(const MpiWorld& world) {
  return std::make_unique<MpiCollective>(world);
}

}  // namespace dlo
