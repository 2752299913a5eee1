#include "dlo/dist/mpi_world.h"

#include <mpi.h>
#include <unistd.h>

#include <cstdio>

#include "dlo/common/error.h"

namespace dlo {

MpiWorld::MpiWorld(int* argc, char*** argv) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  int provided = 0;
  if (!initialised) {
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    we_initialised_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  DLO_CHECK(provided >= MPI_THREAD_MULTIPLE, "MPI provides thread level ", provided,
            "; dlo needs MPI_THREAD_MULTIPLE");
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  host_.assign(name, static_cast<std::size_t>(len));
}

MpiWorld::~MpiWorld() {
  if (we_initialised_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
}

std::string MpiWorld::tag() const { return str("[", rank_, "/", size_, "]"); }

void MpiWorld::abort(const std::string& message, int code) {
  int rank = -1, size = 0, initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  std::fprintf(stderr, "[%d/%d] fatal: %s; aborting all ranks\n", rank, size, message.c_str());
  std::fflush(stderr);
  if (initialised) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

std::vector<std::int64_t> MpiWorld::allgather(std::int64_t value) const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(size_));
  MPI_Allgather(&value, 1, MPI_INT64_T, out.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
  return out;
}

std::vector<std::string> MpiWorld::gather_strings(const std::string& mine, int root) const {
  const int n = static_cast<int>(mine.size());
  std::vector<int> sizes(static_cast<std::size_t>(size_));
  MPI_Gather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, root, MPI_COMM_WORLD);
  std::vector<int> displs(static_cast<std::size_t>(size_), 0);
  std::string all;
  if (rank_ == root) {
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[r] = total;
      total += sizes[r];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  MPI_Gatherv(mine.data(), n, MPI_CHAR, all.data(), sizes.data(), displs.data(), MPI_CHAR, root, MPI_COMM_WORLD);
  std::vector<std::string> out;
  if (rank_ == root)
    for (int r = 0; r < size_; ++r) out.push_back(all.substr(static_cast<std::size_t>(displs[r]), static_cast<std::size_t>(sizes[r])));
  return out;
}

std::string MpiWorld::broadcast_string(const std::string& value, int root) const {
  std::int64_t n = static_cast<std::int64_t>(value.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, root, MPI_COMM_WORLD);
  std::string out = rank_ == root ? value : std::string(static_cast<std::size_t>(n), '\0');
  MPI_Bcast(out.data(), static_cast<int>(n), MPI_CHAR, root, MPI_COMM_WORLD);
  return out;
}

std::int64_t MpiWorld::allreduce_max(std::int64_t value) const {
  std::int64_t out = 0;
  MPI_Allreduce(&value, &out, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

std::int64_t MpiWorld::allreduce_min(std::int64_t value) const {
  std::int64_t out = 0;
  MPI_Allreduce(&value, &out, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  return out;
}

void MpiWorld::barrier() const { MPI_Barrier(MPI_COMM_WORLD); }

void MpiWorld::check_all(const std::string& my_error) const {
  if (allreduce_max(my_error.empty() ? 0 : 1) == 0) return;
  auto all = gather_strings(my_error);
  std::string combined;
  if (rank_ == 0) {
    // Identical messages (the usual case: every rank read the same bad input) are said once.
    std::vector<std::string> seen;
    for (int r = 0; r < size_; ++r) {
      if (all[r].empty()) continue;
      bool dup = false;
      for (const auto& s : seen) dup = dup || s == all[r];
      if (dup) continue;
      seen.push_back(all[r]);
      if (!combined.empty()) combined += "\n";
      combined += size_ > 1 ? str("rank ", r, ": ", all[r]) : all[r];
    }
  }
  throw Error(broadcast_string(combined));
}

}  // namespace dlo
