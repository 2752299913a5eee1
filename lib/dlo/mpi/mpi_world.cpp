#include "dlo/mpi/mpi_world.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "dlo/common/folder_lock.h"
#include "dlo/common/error.h"

namespace dlo {
namespace {

// A singleton's own Open MPI session folder (MpiWorld's private_tmp_), for abort() to remove too.
std::string g_private_tmp;

// Waits for every request, polling: spins briefly (these messages are small), then sleeps between
// tests so a waiting rank leaves the cores to the others. After `timeout_s` the ranks `peers[i]`
// whose request i has not completed are named and every rank is ended.
void wait_all(std::vector<MPI_Request>& reqs, const std::vector<int>& peers, const char* phase, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  std::size_t pending = reqs.size();
  std::vector<int> done(reqs.size());
  for (int spins = 0; pending > 0; ++spins) {
    int n = 0;
    MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &n, done.data(), MPI_STATUSES_IGNORE);
    if (n == MPI_UNDEFINED) break;
    pending -= static_cast<std::size_t>(n);
    if (pending == 0) break;
    if (spins < 200) continue;
    std::this_thread::sleep_for(std::chrono::microseconds(spins < 5000 ? 50 : 1000));
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <= timeout_s) continue;
    std::vector<int> missing;
    for (std::size_t i = 0; i < reqs.size(); ++i)
      if (reqs[i] != MPI_REQUEST_NULL) missing.push_back(peers[i]);
    std::sort(missing.begin(), missing.end());
    missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
    std::string names;
    for (std::size_t i = 0; i < missing.size(); ++i) names += (i ? ", " : "") + std::to_string(missing[i]);
    MpiWorld::abort(str(phase, ": ", missing.size() == 1 ? "rank " : "ranks ", names,
                        " did not arrive within ", timeout_s, " s (DLO_GATHER_TIMEOUT_S): stuck, stopped or gone"));
  }
}

}  // namespace

MpiWorld::MpiWorld(int* argc, char*** argv) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  int provided = 0;
  if (!initialised) {
    // Started without a launcher (a plain `./dlo-forward`): Open MPI 4.1's singleton init would
    // fork/exec `orted`, which a bare GPU machine or a bundle without it lacks (then MPI_Init
    // aborts). An isolated singleton needs no daemon and runs as one rank. This is the one place
    // the library reads the environment: which launcher started the process is not the user's
    // input but decides how MPI must start. setenv(..., 0) keeps a value the user set.
    const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") ||
                          std::getenv("PMI_RANK") || std::getenv("SLURM_PROCID");
    if (!launched) {
      ::setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
      // Its session directory in a folder of its own: under the shared /tmp/ompi.HOST.UID a job
      // that ends at the same moment may remove the parent while this one creates its own
      // (seen in CI: "mkdir /tmp/ompi.vm.0/jf.0: No such file or directory", MPI_Init fails).
      if (std::getenv("OMPI_MCA_orte_tmpdir_base") == nullptr) {
        const char* tmp = std::getenv("TMPDIR");
        std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/dlo-mpi-XXXXXX";
        if (::mkdtemp(templ.data()) != nullptr) {
          ::setenv("OMPI_MCA_orte_tmpdir_base", templ.c_str(), 0);
          private_tmp_ = templ;
          g_private_tmp = templ;
        }
      }
    }
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
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  comm_f_ = static_cast<int>(MPI_Comm_c2f(comm));
  have_comm_ = true;
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  host_.assign(name, static_cast<std::size_t>(len));
}

MpiWorld::~MpiWorld() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (have_comm_) {
    MPI_Comm comm = MPI_Comm_f2c(comm_f_);
    MPI_Comm_free(&comm);
  }
  if (we_initialised_) MPI_Finalize();
  if (!private_tmp_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(private_tmp_, ignored);
  }
}

std::string MpiWorld::tag() const { return str("[", rank_, "/", size_, "]"); }

void MpiWorld::set_timeout_s(double seconds) {
  DLO_CHECK(std::isfinite(seconds) && seconds > 0, "a collective timeout must be > 0 seconds, got ", seconds);
  timeout_s_ = seconds;
}

void MpiWorld::abort(const std::string& message, int code) {
  int rank = -1, size = 0, initialised = 0, finalized = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalized);
  const bool live = initialised && !finalized;
  if (live) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  std::fprintf(stderr, "[%d/%d] fatal: %s; aborting all ranks\n", rank, size, message.c_str());
  std::fflush(stderr);
  FolderLock::release_for_exit();  // the run is over: a rerun on any node may take the folder
  if (!g_private_tmp.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(g_private_tmp, ignored);
  }
  if (live) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

int MpiWorld::duplicate_comm(const char* phase) const {
  barrier(phase);
  MPI_Comm dup = MPI_COMM_NULL;
  DLO_CHECK_KIND(ErrorKind::kInternal, MPI_Comm_dup(MPI_Comm_f2c(comm_f_), &dup) == MPI_SUCCESS,
                 "MPI_Comm_dup failed (", phase, ")");
  return MPI_Comm_c2f(dup);
}

std::unique_ptr<MpiGroup> MpiWorld::split(int color, const char* phase) const {
  DLO_ASSERT(color >= 0, "group color ", color);
  const std::vector<std::int64_t> colors = allgather(color, phase);  // bounded: every rank is here
  std::unique_ptr<MpiGroup> g(new MpiGroup());
  for (int r = 0; r < size_; ++r)
    if (colors[static_cast<std::size_t>(r)] == color) g->world_ranks_.push_back(r);
  MPI_Comm comm = MPI_COMM_NULL;
  DLO_CHECK_KIND(ErrorKind::kInternal, MPI_Comm_split(MPI_Comm_f2c(comm_f_), color, rank_, &comm) == MPI_SUCCESS,
                 "MPI_Comm_split failed (", phase, ")");
  g->comm_f_ = MPI_Comm_c2f(comm);
  g->have_comm_ = true;
  MPI_Comm_rank(comm, &g->rank_);
  MPI_Comm_size(comm, &g->size_);
  g->timeout_s_ = timeout_s_;
  DLO_ASSERT(g->size_ == static_cast<int>(g->world_ranks_.size()), "group of ", g->size_, " ranks, expected ",
             g->world_ranks_.size());
  return g;
}

MpiGroup::~MpiGroup() {
  if (have_comm_) MpiWorld::free_comm(comm_f_);
}

void MpiGroup::alltoallv(const void* send, const std::vector<std::size_t>& send_bytes,
                         const std::vector<std::size_t>& send_offset, void* recv,
                         const std::vector<std::size_t>& recv_bytes, const std::vector<std::size_t>& recv_offset,
                         const char* phase) const {
  const auto n = static_cast<std::size_t>(size_);
  DLO_ASSERT(send_bytes.size() == n && send_offset.size() == n && recv_bytes.size() == n && recv_offset.size() == n,
             phase, ": counts for ", n, " ranks");
  std::vector<int> sc(n), sd(n), rc(n), rd(n);
  const auto to_int = [phase](std::size_t v) {
    DLO_CHECK_KIND(ErrorKind::kInternal, v <= static_cast<std::size_t>(INT_MAX), phase, ": ", v,
                   " bytes to one rank is more than one MPI call carries");
    return static_cast<int>(v);
  };
  for (std::size_t i = 0; i < n; ++i) {
    sc[i] = to_int(send_bytes[i]);
    sd[i] = to_int(send_offset[i]);
    rc[i] = to_int(recv_bytes[i]);
    rd[i] = to_int(recv_offset[i]);
  }
  MPI_Request req = MPI_REQUEST_NULL;
  int rcode = MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE,
                             MPI_Comm_f2c(comm_f_), &req);
  DLO_CHECK_KIND(ErrorKind::kTransfer, rcode == MPI_SUCCESS, phase, ": MPI_Ialltoallv failed (code ", rcode, ")");
  const auto start = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    int done = 0;
    rcode = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    DLO_CHECK_KIND(ErrorKind::kTransfer, rcode == MPI_SUCCESS, phase, ": MPI_Ialltoallv failed (code ", rcode, ")");
    if (done) {
      for (std::size_t i = 0; i < n; ++i)
        if (static_cast<int>(i) != rank_) bytes_sent_ += send_bytes[i];
      return;
    }
    if (spins < 2000) continue;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    if ((spins & 1023) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s_)
    {
      // The request is still active and MPI may yet write into `recv`: the process cannot go on
      // (nor unwind and free the buffers), so every rank ends here, as the world's collectives do.
      std::string ranks;
      for (std::size_t i = 0; i < world_ranks_.size(); ++i) ranks += (i ? ", " : "") + std::to_string(world_ranks_[i]);
      MpiWorld::abort(str(phase, ": the all-to-all of the group of ranks ", ranks, " has not finished in ", timeout_s_,
                          " s (DLO_GATHER_TIMEOUT_S): a rank of the group is gone or stuck"));
    }
  }
}

void MpiWorld::free_comm(int handle) noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  MPI_Comm c = MPI_Comm_f2c(handle);
  if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
}

void MpiWorld::abort_from_signal_handler(int code) noexcept {
  int initialised = 0, finalized = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalized);
  FolderLock::release_for_exit();
  if (initialised && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  ::_exit(code);
}

int MpiWorld::next_tag() const {
  // Four tags per collective; MPI guarantees tags up to 32767.
  return 1 + static_cast<int>((seq_++ % 8000) * 4);
}

std::vector<std::int64_t> MpiWorld::allgather(std::int64_t value, const char* phase) const {
  return allgather(std::vector<std::int64_t>{value}, phase);
}

std::vector<std::int64_t> MpiWorld::allgather(const std::vector<std::int64_t>& values, const char* phase) const {
  const std::size_t k = values.size();
  std::vector<std::int64_t> out(static_cast<std::size_t>(size_) * k);
  std::copy(values.begin(), values.end(), out.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(rank_) * k));
  if (size_ == 1 || k == 0) return out;
  MPI_Comm comm = MPI_Comm_f2c(comm_f_);
  const int tag = next_tag();
  std::vector<MPI_Request> reqs;
  std::vector<int> peers;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    reqs.emplace_back();
    MPI_Irecv(&out[static_cast<std::size_t>(r) * k], static_cast<int>(k), MPI_INT64_T, r, tag, comm, &reqs.back());
    peers.push_back(r);
    reqs.emplace_back();
    MPI_Isend(values.data(), static_cast<int>(k), MPI_INT64_T, r, tag, comm, &reqs.back());
    peers.push_back(r);
  }
  wait_all(reqs, peers, phase, timeout_s_);
  return out;
}

std::vector<std::string> MpiWorld::gather_strings(const std::string& mine, int root, const char* phase) const {
  DLO_CHECK(root >= 0 && root < size_, "gather_strings: root ", root, " is not a rank");
  if (size_ == 1) return {mine};
  MPI_Comm comm = MPI_Comm_f2c(comm_f_);
  const int tag = next_tag();
  std::vector<MPI_Request> reqs;
  std::vector<int> peers;
  if (rank_ != root) {
    // Size, then bytes; then wait for the root's acknowledgement, so a stuck root is noticed here.
    std::int64_t n = static_cast<std::int64_t>(mine.size());
    char ack = 0;
    reqs.resize(3);
    MPI_Isend(&n, 1, MPI_INT64_T, root, tag, comm, &reqs[0]);
    MPI_Isend(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, root, tag + 1, comm, &reqs[1]);
    MPI_Irecv(&ack, 1, MPI_CHAR, root, tag + 2, comm, &reqs[2]);
    peers.assign(3, root);
    // The root knows which ranks are missing: give it the first word (a grace period here), so
    // the message names the stuck rank rather than "rank 0" whenever the root is alive.
    wait_all(reqs, peers, phase, timeout_s_ + std::min(timeout_s_, 30.0));
    return {};
  }
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(size_), 0);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    reqs.emplace_back();
    MPI_Irecv(&sizes[static_cast<std::size_t>(r)], 1, MPI_INT64_T, r, tag, comm, &reqs.back());
    peers.push_back(r);
  }
  wait_all(reqs, peers, phase, timeout_s_);
  std::vector<std::string> out(static_cast<std::size_t>(size_));
  out[static_cast<std::size_t>(rank_)] = mine;
  reqs.clear();
  peers.clear();
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    DLO_CHECK(sizes[r] >= 0 && sizes[r] < (std::int64_t{1} << 31), phase, ": rank ", r, " sent a size of ", sizes[r]);
    out[static_cast<std::size_t>(r)].resize(static_cast<std::size_t>(sizes[r]));
    reqs.emplace_back();
    MPI_Irecv(out[static_cast<std::size_t>(r)].data(), static_cast<int>(sizes[r]), MPI_CHAR, r, tag + 1, comm,
              &reqs.back());
    peers.push_back(r);
  }
  static const char ack = 1;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    reqs.emplace_back();
    MPI_Isend(&ack, 1, MPI_CHAR, r, tag + 2, comm, &reqs.back());
    peers.push_back(r);
  }
  wait_all(reqs, peers, phase, timeout_s_);
  return out;
}

std::string MpiWorld::broadcast_string(const std::string& value, int root, const char* phase) const {
  DLO_CHECK(root >= 0 && root < size_, "broadcast_string: root ", root, " is not a rank");
  if (size_ == 1) return value;
  MPI_Comm comm = MPI_Comm_f2c(comm_f_);
  const int tag = next_tag();
  std::vector<MPI_Request> reqs;
  std::vector<int> peers;
  if (rank_ == root) {
    std::int64_t n = static_cast<std::int64_t>(value.size());
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      reqs.emplace_back();
      MPI_Isend(&n, 1, MPI_INT64_T, r, tag, comm, &reqs.back());
      peers.push_back(r);
      reqs.emplace_back();
      MPI_Isend(value.data(), static_cast<int>(value.size()), MPI_CHAR, r, tag + 1, comm, &reqs.back());
      peers.push_back(r);
    }
    wait_all(reqs, peers, phase, timeout_s_);
    return value;
  }
  std::int64_t n = 0;
  reqs.resize(1);
  MPI_Irecv(&n, 1, MPI_INT64_T, root, tag, comm, &reqs[0]);
  peers.assign(1, root);
  wait_all(reqs, peers, phase, timeout_s_);
  DLO_CHECK(n >= 0 && n < (std::int64_t{1} << 31), phase, ": rank ", root, " sent a size of ", n);
  std::string out(static_cast<std::size_t>(n), '\0');
  MPI_Irecv(out.data(), static_cast<int>(n), MPI_CHAR, root, tag + 1, comm, &reqs[0]);
  wait_all(reqs, peers, phase, timeout_s_);
  return out;
}

std::int64_t MpiWorld::allreduce_max(std::int64_t value, const char* phase) const {
  const auto all = allgather(value, phase);
  return *std::max_element(all.begin(), all.end());
}

std::int64_t MpiWorld::allreduce_min(std::int64_t value, const char* phase) const {
  const auto all = allgather(value, phase);
  return *std::min_element(all.begin(), all.end());
}

void MpiWorld::barrier(const char* phase) const { allgather(0, phase); }

void MpiWorld::check_all(const std::string& my_error, const char* phase) const {
  if (allreduce_max(my_error.empty() ? 0 : 1, phase) == 0) return;
  auto all = gather_strings(my_error, 0, phase);
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
  throw Error(broadcast_string(combined, 0, phase), ErrorKind::kInput, /*on_every_rank=*/true);
}

}  // namespace dlo
