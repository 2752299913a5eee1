// The process's place among the ranks: MPI set-up, rank facts and small collectives.
//
// Works with or without mpirun/srun (a singleton run is one rank). Only this file and the
// collectives include <mpi.h>.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dlo {

class MpiWorld {
 public:
  // Initialises MPI with MPI_THREAD_MULTIPLE (the weight-gather thread calls MPI while the main
  // thread may too). Collective: every rank constructs it once, first. Throws dlo::Error if MPI
  // cannot give the thread level.
  MpiWorld(int* argc, char*** argv);
  // Finalises MPI (collective).
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Rank among the ranks on this node (MPI_Comm_split_type SHARED) and their count.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& host() const { return host_; }
  // "[rank/size]" for log lines.
  std::string tag() const;

  // Ends every rank now: prints `message` (with the rank tag) to stderr and calls MPI_Abort.
  // Safe from any thread. Used when a rank cannot continue and the others would otherwise wait
  // in a collective forever.
  [[noreturn]] static void abort(const std::string& message, int code = 1);

  // Small collectives on MPI_COMM_WORLD (collective: every rank, same order).
  std::vector<std::int64_t> allgather(std::int64_t value) const;
  std::vector<std::string> gather_strings(const std::string& mine, int root = 0) const;  // root gets all
  std::string broadcast_string(const std::string& value, int root = 0) const;
  std::int64_t allreduce_max(std::int64_t value) const;
  std::int64_t allreduce_min(std::int64_t value) const;
  void barrier() const;

  // Collective: each rank passes its error message ("" if it has none). If any rank has one,
  // every rank throws the same dlo::Error listing them ("rank 2: ..."), so a failure found on one
  // rank before a wave ends all of them cleanly instead of leaving the others in a collective.
  void check_all(const std::string& my_error) const;

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string host_;
  bool we_initialised_ = false;
};

}  // namespace dlo
