// The process's place among the ranks: MPI set-up, rank facts and small collectives.
//
// Works with or without mpirun/srun (a singleton run is one rank). Only mpi/ and dist/ include
// <mpi.h> (and media/latents_h5, through parallel HDF5's own header).
//
// Every collective here waits a bounded time: it is one of MPI's own non-blocking collectives
// (MPI_Iallgather, MPI_Igatherv, MPI_Ibcast, MPI_Iallreduce, MPI_Ibarrier: log N rounds, not a
// message to every other rank) on a communicator of its own, polled against timeout_s(). A
// collective that has not completed by then (a rank stuck while loading, a stopped or vanished
// process, a rank in another collective) ends every rank through abort(): the ranks that timed
// out report to rank 0 over a second communicator (a roll call: which collective each waits in),
// and rank 0 names the phase and the ranks it did not hear from, e.g.
//   "[0/3] fatal: start-up check: rank 2 did not arrive within 600 s (DLO_GATHER_TIMEOUT_S) ..."
// (when rank 0 itself is the one missing, the others name it after a grace period).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlo/common/error.h"
#include "dlo/common/settings.h"

namespace dlo {

class MpiWorld;

// A group of ranks that compute one job together (sequence or CFG parallelism): a communicator
// of its own, split from the world's, so its traffic never meets the weight gathers or the
// world's small collectives. Made by MpiWorld::split; destroying it frees the communicator. Not
// thread-safe: one thread exchanges on a group.
class MpiGroup {
 public:
  ~MpiGroup();
  MpiGroup(const MpiGroup&) = delete;
  MpiGroup& operator=(const MpiGroup&) = delete;

  int rank() const { return rank_; }  // in the group: by world rank, in order
  int size() const { return size_; }
  const std::vector<int>& world_ranks() const { return world_ranks_; }

  // Collective over the group: rank i's send[send_offset[j] .. + send_bytes[j]) goes to rank j,
  // which receives it at recv + recv_offset[i] (recv_bytes[i] of it). Bounded like the world's
  // collectives: not finished after the timeout (a peer is gone or stuck), it ends every rank
  // (abort()), naming `phase` and the group. A count or offset above INT_MAX bytes is refused
  // (dlo::Error, kind internal) before anything is sent: callers that must stay in step check
  // their sizes first (every rank of the group must refuse alike).
  void alltoallv(const void* send, const std::vector<std::size_t>& send_bytes, const std::vector<std::size_t>& send_offset,
                 void* recv, const std::vector<std::size_t>& recv_bytes, const std::vector<std::size_t>& recv_offset,
                 const char* phase) const;
  // Bytes this rank has sent to the group's other ranks so far, over every alltoallv (its piece
  // for itself not counted): the activations sequence and CFG parallelism move, for reports.
  std::uint64_t bytes_sent() const { return bytes_sent_; }

 private:
  friend class MpiWorld;
  MpiGroup() = default;
  mutable std::uint64_t bytes_sent_ = 0;
  int comm_f_ = 0;
  bool have_comm_ = false;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;
  double timeout_s_ = kDefaultGatherTimeoutS;
};

class MpiWorld {
 public:
  // Initialises MPI with MPI_THREAD_MULTIPLE (the weight-gather thread calls MPI while the main
  // thread may too) and duplicates MPI_COMM_WORLD for the collectives below. Collective: every
  // rank constructs it once, first. Throws dlo::Error if MPI cannot give the thread level.
  MpiWorld(int* argc, char*** argv);
  // Finalises MPI (collective) if this object initialised it.
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Rank among the ranks on this node (MPI_Comm_split_type SHARED) and their count.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& host() const { return host_; }
  // Every rank's host, in rank order (gathered at start-up).
  const std::vector<std::string>& hosts() const { return hosts_; }
  // "[rank/size]" for log lines.
  std::string tag() const;

  // How long a collective (here, and the weight gathers of make_mpi_collective) waits for the
  // other ranks before ending them all. Default 600 s; apps set it from DLO_GATHER_TIMEOUT_S
  // (parse_seconds_setting). Throws dlo::Error unless seconds > 0. Set it on every rank alike,
  // before the first collective; not thread-safe against collectives in flight.
  void set_timeout_s(double seconds);
  double timeout_s() const { return timeout_s_; }

  // Ends every rank now: prints `message` (with the rank tag) to stderr and calls MPI_Abort.
  // Safe from any thread. Used when a rank cannot continue and the others would otherwise wait
  // in a collective forever.
  [[noreturn]] static void abort(const std::string& message, int code = 1);
  // Ends every rank after a collective on another communicator (the weight gathers of
  // make_mpi_collective) did not complete within timeout_s(): the ranks that timed out in it hold
  // the roll call described at the top under `phase` (the same on every rank), and rank 0 names
  // the ranks it did not hear from and their nodes. Any thread; every live rank should be timing
  // out in that collective too (else rank 0 reports the ranks that are elsewhere).
  [[noreturn]] void abort_after_timeout(const char* phase) const;
  // The same without a message, from a signal handler (async-signal-safe calls only).
  [[noreturn]] static void abort_from_signal_handler(int code) noexcept;

  // Small collectives (collective: every rank, same order, from one thread at a time). `phase`
  // names the step in the timeout message ("start-up check", "wave agreement", ...). A rank that
  // does not arrive within timeout_s() ends every rank (abort()), naming the phase and the ranks.
  std::vector<std::int64_t> allgather(std::int64_t value, const char* phase = "allgather") const;
  // Every rank's `values` (the same count on every rank), rank after rank: size() * values.size().
  std::vector<std::int64_t> allgather(const std::vector<std::int64_t>& values, const char* phase = "allgather") const;
  // Root gets every rank's string in rank order; the others get {}. The sizes go to every rank
  // first (an allgather), so non-roots wait for the root too and a stuck root is noticed by
  // every rank; then the bytes to the root. At most 2 GiB in all.
  std::vector<std::string> gather_strings(const std::string& mine, int root = 0,
                                          const char* phase = "gather") const;
  std::string broadcast_string(const std::string& value, int root = 0, const char* phase = "broadcast") const;
  std::int64_t allreduce_max(std::int64_t value, const char* phase = "allreduce") const;
  std::int64_t allreduce_min(std::int64_t value, const char* phase = "allreduce") const;
  void barrier(const char* phase = "barrier") const;

  // Collective: a duplicate of the world's communicator for a library that needs an MPI_Comm of its
  // own (parallel HDF5), as its Fortran handle (MPI_Comm_f2c gives the MPI_Comm). The ranks first
  // meet in a bounded barrier, so the duplication itself does not wait on a missing rank. Free it
  // with free_comm().
  int duplicate_comm(const char* phase = "communicator") const;
  // Collective: the ranks that pass the same `color` (>= 0) form one group, ordered by world
  // rank. The ranks first exchange their colors in a bounded allgather, so the split itself does
  // not wait on a missing rank.
  std::unique_ptr<MpiGroup> split(int color, const char* phase = "group split") const;
  static void free_comm(int handle) noexcept;

  // Collective: each rank passes its error message ("" if it has none) and its kind. If any rank
  // has one, every rank throws the same dlo::Error listing them ("rank 2: ..."), marked
  // on_every_rank(), so a failure found on one rank before a wave ends all of them cleanly (exit 2
  // everywhere for bad input) instead of leaving the others in a collective. Its kind is the
  // gravest of the ranks' (input < I/O < internal < transfer): no room for a file is not bad input.
  void check_all(const std::string& my_error, const char* phase = "start-up check",
                 ErrorKind my_kind = ErrorKind::kInput) const;

 private:
  // Polls `request` (an MPI_Request*: <mpi.h> stays out of this header) to completion; after
  // timeout_s() the roll call, then every rank ends.
  void complete(void* request, const char* phase) const;
  [[noreturn]] void roll_call(std::uint64_t seq, const char* phase) const;
  std::int64_t allreduce(std::int64_t value, bool max, const char* phase) const;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string host_;
  std::vector<std::string> hosts_;
  bool we_initialised_ = false;
  std::string private_tmp_;  // a singleton's own Open MPI session folder, removed after MPI_Finalize
  int comm_f_ = 0;                // the duplicated communicator (Fortran handle: no <mpi.h> here)
  int roll_f_ = 0;                // another, for the roll call after a timeout
  bool have_comm_ = false;
  mutable std::uint64_t seq_ = 0;  // collectives made: every rank counts alike (the roll call names them)
  double timeout_s_ = kDefaultGatherTimeoutS;
};

}  // namespace dlo
