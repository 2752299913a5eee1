#include "dlo/mpi/mpi_world.h"

#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <thread>

#include "dlo/common/folder_lock.h"
#include "dlo/common/error.h"

namespace dlo {
namespace {

// A singleton's own Open MPI session folder (MpiWorld's private_tmp_), for abort() to remove too.
std::string g_private_tmp;

// A singleton's session folder: "<TMPDIR>/dlo-mpi-XXXXXX", holding "owner" (its process, as a
// lock file names one). The process removes it when it ends, but one that was killed (SIGKILL, a
// second stop signal) cannot: the next singleton on the host removes those whose owner is gone.
constexpr const char* kSessionPrefix = "dlo-mpi-";
constexpr const char* kSessionOwner = "owner";

// Removes the session folders in `parent` left by singletons of this user on this host that are
// gone. A folder whose owner file is missing (being made this moment, or made before owners were
// written) or names a live process or another host is left alone.
void remove_stale_sessions(const std::string& parent) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(parent, fs::directory_options::skip_permission_denied, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const fs::path dir = it->path();
    struct stat st {};
    if (dir.filename().string().rfind(kSessionPrefix, 0) != 0 || ::lstat(dir.c_str(), &st) != 0 ||
        !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
      continue;
    std::ifstream in(dir / kSessionOwner);
    if (!in) continue;
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const LockHolder owner = parse_holder(text);
    if (owner.host.empty() || owner.pid <= 0) continue;  // cut short while written: leave it
    if (FolderLock::holder_gone(owner, 0.0)) {  // age 0: another host's folder is never taken for gone
      std::error_code ignored;
      fs::remove_all(dir, ignored);
    }
  }
}

// Polls one non-blocking collective until it completes (true) or `timeout_s` has passed (false):
// spins briefly (a pass boundary's exchange takes microseconds), then sleeps between tests, which
// both leaves the cores to other ranks and, through MPI_Test, moves the collective's rounds on.
bool wait_request(MPI_Request& req, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    int done = 0;
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return true;
    if (spins < 200) continue;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout_s) return false;
    // The first 20 ms: give the core to any other rank that has work (with more ranks than cores
    // the collective's next round waits for them to run) and test again at once; then sleep.
    if (waited < 0.02)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(waited < 1 ? 50 : 1000));
  }
}

// The roll call after a collective timed out: tag and the most a "sequence|phase" line may take.
constexpr int kRollTag = 77;
constexpr int kRollBytes = 256;

}  // namespace

MpiWorld::MpiWorld(int* argc, char*** argv) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  int provided = 0;
  if (!initialised) {
    // Open MPI picks the linear algorithm for MPI_Iallgather (every rank sends to every other, as
    // the pass boundary's exchange once did by hand); recursive doubling takes log2 N rounds where
    // N is a power of two (linear otherwise): 0.45x and 0.48x the linear one's time at 32 and 64
    // ranks here (docs/benchmarks.md). A value the user set wins; other MPIs ignore the variable.
    ::setenv("OMPI_MCA_coll_libnbc_iallgather_algorithm", "2", 0);
    // Started without a launcher (a plain `./dlo-forward`): Open MPI 4.1's singleton init would
    // fork/exec `orted`, which a bare GPU machine or a bundle without it lacks (then MPI_Init
    // aborts). An isolated singleton needs no daemon and runs as one rank. This is where the
    // library reads the environment: which launcher started the process is not the user's input
    // but decides how MPI must start. setenv(..., 0) keeps a value the user set.
    const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") ||
                          std::getenv("PMI_RANK") || std::getenv("SLURM_PROCID");
    if (!launched) {
      ::setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
      // Its session directory in a folder of its own: under the shared /tmp/ompi.HOST.UID a job
      // that ends at the same moment may remove the parent while this one creates its own
      // (seen in CI: "mkdir /tmp/ompi.vm.0/jf.0: No such file or directory", MPI_Init fails).
      if (std::getenv("OMPI_MCA_orte_tmpdir_base") == nullptr) {
        const char* tmp = std::getenv("TMPDIR");
        const std::string parent = tmp && *tmp ? tmp : "/tmp";
        remove_stale_sessions(parent);
        std::string templ = parent + "/" + kSessionPrefix + "XXXXXX";
        if (::mkdtemp(templ.data()) != nullptr) {
          std::ofstream(templ + "/" + kSessionOwner) << holder_text(FolderLock::self());
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
  MPI_Comm comm, roll;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_dup(MPI_COMM_WORLD, &roll);
  comm_f_ = static_cast<int>(MPI_Comm_c2f(comm));
  roll_f_ = static_cast<int>(MPI_Comm_c2f(roll));
  have_comm_ = true;
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  host_.assign(name, static_cast<std::size_t>(len));
  // Every rank's host, for messages that name a missing rank's node (blocking, as the
  // MPI_Comm_split_type above: start-up is where every rank meets first).
  std::vector<int> lens(static_cast<std::size_t>(size_)), displs(static_cast<std::size_t>(size_));
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm);
  int total = 0;
  for (int r = 0; r < size_; ++r) {
    displs[static_cast<std::size_t>(r)] = total;
    total += lens[static_cast<std::size_t>(r)];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  MPI_Allgatherv(name, len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, comm);
  for (int r = 0; r < size_; ++r)
    hosts_.push_back(all.substr(static_cast<std::size_t>(displs[static_cast<std::size_t>(r)]),
                                static_cast<std::size_t>(lens[static_cast<std::size_t>(r)])));
}

MpiWorld::~MpiWorld() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (have_comm_) {
    MPI_Comm comm = MPI_Comm_f2c(comm_f_), roll = MPI_Comm_f2c(roll_f_);
    MPI_Comm_free(&comm);
    MPI_Comm_free(&roll);
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

void MpiWorld::complete(void* request, const char* phase) const {
  const std::uint64_t seq = seq_++;  // every rank counts its collectives alike
  if (!wait_request(*static_cast<MPI_Request*>(request), timeout_s_)) roll_call(seq, phase);
}

void MpiWorld::abort_after_timeout(const char* phase) const {
  roll_call(std::numeric_limits<std::uint64_t>::max(), phase);  // a number no small collective has
}

void MpiWorld::roll_call(std::uint64_t seq, const char* phase) const {
  // Who is where: every rank that timed out says to rank 0 which collective it waits in (its
  // number and phase); rank 0 names the ranks it did not hear from, or that wait elsewhere, and
  // ends every rank. A rank not heard from is stuck, stopped or gone (the collective's own request
  // cannot say which rank it lacks).
  // One roll call per process: a weight gather's worker and the main thread can time out at the
  // same moment, and two callers would share rank 0's messages between them. The second waits
  // for the first, which ends the process.
  static std::atomic<bool> started{false};
  if (started.exchange(true)) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  MPI_Comm roll = MPI_Comm_f2c(roll_f_);
  const std::string here = str(seq, "|", phase).substr(0, kRollBytes - 1);
  const double grace = std::min(timeout_s_, 10.0);
  if (rank_ != 0) {
    MPI_Request r = MPI_REQUEST_NULL;
    MPI_Isend(here.data(), static_cast<int>(here.size()), MPI_CHAR, 0, kRollTag, roll, &r);
    // Rank 0 ends every rank once it has heard; if it does not, it is the one missing.
    (void)wait_request(r, 2 * grace + 1);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(2 * grace + 1);
    while (std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    abort(str(phase, ": rank 0 did not arrive within ", timeout_s_,
              " s (DLO_GATHER_TIMEOUT_S): stuck, stopped or gone (it would have named any other missing rank)"));
  }
  std::vector<std::string> where(static_cast<std::size_t>(size_));
  where[0] = here;
  int heard = 1;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace);
  while (heard < size_ && std::chrono::steady_clock::now() < until) {
    int flag = 0;
    MPI_Status st;
    MPI_Message msg;
    MPI_Improbe(MPI_ANY_SOURCE, kRollTag, roll, &flag, &msg, &st);
    if (!flag) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    int n = 0;
    MPI_Get_count(&st, MPI_CHAR, &n);
    std::string text(static_cast<std::size_t>(std::max(n, 0)), '\0');
    MPI_Mrecv(text.data(), n, MPI_CHAR, &msg, MPI_STATUS_IGNORE);
    if (where[static_cast<std::size_t>(st.MPI_SOURCE)].empty()) ++heard;
    where[static_cast<std::size_t>(st.MPI_SOURCE)] = text;
  }
  std::vector<int> missing;
  std::string elsewhere;
  for (int r = 1; r < size_; ++r) {
    const std::string& w = where[static_cast<std::size_t>(r)];
    if (w.empty()) {
      missing.push_back(r);
    } else if (w != here) {
      elsewhere += str("; rank ", r, " waits in another collective ('", w.substr(w.find('|') + 1), "', number ",
                       w.substr(0, w.find('|')), " against ", seq, ")");
    }
  }
  std::string names;
  for (std::size_t i = 0; i < missing.size(); ++i) names += (i ? ", " : "") + std::to_string(missing[i]);
  // Their nodes, when the world spans several.
  std::vector<std::string> nodes;
  for (const int r : missing)
    if (std::find(nodes.begin(), nodes.end(), hosts_[static_cast<std::size_t>(r)]) == nodes.end())
      nodes.push_back(hosts_[static_cast<std::size_t>(r)]);
  if (!nodes.empty() && std::any_of(hosts_.begin(), hosts_.end(), [&](const std::string& h) { return h != hosts_[0]; })) {
    names += nodes.size() == 1 ? " (on node " : " (on nodes ";
    for (std::size_t i = 0; i < nodes.size(); ++i) names += (i ? ", " : "") + nodes[i];
    names += ")";
  }
  if (missing.empty() && elsewhere.empty())
    abort(str(phase, ": every rank is in the collective but it did not complete within ", timeout_s_,
              " s (DLO_GATHER_TIMEOUT_S): the MPI transport is stuck"));
  abort(str(phase, ": ",
            missing.empty() ? std::string("no rank is missing")
                            : str(missing.size() == 1 ? "rank " : "ranks ", names, " did not arrive within ", timeout_s_,
                                  " s (DLO_GATHER_TIMEOUT_S): stuck, stopped or gone"),
            elsewhere));
}

std::vector<std::int64_t> MpiWorld::allgather(std::int64_t value, const char* phase) const {
  return allgather(std::vector<std::int64_t>{value}, phase);
}

std::vector<std::int64_t> MpiWorld::allgather(const std::vector<std::int64_t>& values, const char* phase) const {
  const std::size_t k = values.size();
  std::vector<std::int64_t> out(static_cast<std::size_t>(size_) * k);
  std::copy(values.begin(), values.end(), out.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(rank_) * k));
  if (size_ == 1 || k == 0) return out;
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Iallgather(values.data(), static_cast<int>(k), MPI_INT64_T, out.data(), static_cast<int>(k), MPI_INT64_T,
                 MPI_Comm_f2c(comm_f_), &req);
  complete(&req, phase);
  return out;
}

std::vector<std::string> MpiWorld::gather_strings(const std::string& mine, int root, const char* phase) const {
  DLO_CHECK(root >= 0 && root < size_, "gather_strings: root ", root, " is not a rank");
  if (size_ == 1) return {mine};
  // The sizes to every rank (so that the root's own arrival is waited for everywhere, and every
  // rank refuses an oversized gather alike), then the bytes to the root.
  const std::vector<std::int64_t> sizes = allgather(static_cast<std::int64_t>(mine.size()), phase);
  std::vector<int> counts(static_cast<std::size_t>(size_)), displs(static_cast<std::size_t>(size_));
  std::int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    DLO_CHECK(sizes[r] >= 0 && total + sizes[r] < (std::int64_t{1} << 31), phase, ": the gathered strings exceed 2 GiB");
    counts[static_cast<std::size_t>(r)] = static_cast<int>(sizes[r]);
    displs[static_cast<std::size_t>(r)] = static_cast<int>(total);
    total += sizes[r];
  }
  std::string all(rank_ == root ? static_cast<std::size_t>(total) : 0, '\0');
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Igatherv(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR,
               root, MPI_Comm_f2c(comm_f_), &req);
  complete(&req, phase);
  if (rank_ != root) return {};
  std::vector<std::string> out(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r)
    out[static_cast<std::size_t>(r)] = all.substr(static_cast<std::size_t>(displs[static_cast<std::size_t>(r)]),
                                                  static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]));
  return out;
}

std::string MpiWorld::broadcast_string(const std::string& value, int root, const char* phase) const {
  DLO_CHECK(root >= 0 && root < size_, "broadcast_string: root ", root, " is not a rank");
  if (size_ == 1) return value;
  std::int64_t n = rank_ == root ? static_cast<std::int64_t>(value.size()) : 0;
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Ibcast(&n, 1, MPI_INT64_T, root, MPI_Comm_f2c(comm_f_), &req);
  complete(&req, phase);
  DLO_CHECK(n >= 0 && n < (std::int64_t{1} << 31), phase, ": rank ", root, " sent a size of ", n);
  std::string out = rank_ == root ? value : std::string(static_cast<std::size_t>(n), '\0');
  if (n == 0) return out;
  MPI_Ibcast(out.data(), static_cast<int>(n), MPI_CHAR, root, MPI_Comm_f2c(comm_f_), &req);
  complete(&req, phase);
  return out;
}

std::int64_t MpiWorld::allreduce(std::int64_t value, bool max, const char* phase) const {
  if (size_ == 1) return value;
  std::int64_t out = value;
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Iallreduce(&value, &out, 1, MPI_INT64_T, max ? MPI_MAX : MPI_MIN, MPI_Comm_f2c(comm_f_), &req);
  complete(&req, phase);
  return out;
}

std::int64_t MpiWorld::allreduce_max(std::int64_t value, const char* phase) const { return allreduce(value, true, phase); }

std::int64_t MpiWorld::allreduce_min(std::int64_t value, const char* phase) const { return allreduce(value, false, phase); }

void MpiWorld::barrier(const char* phase) const {
  if (size_ == 1) return;
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Ibarrier(MPI_Comm_f2c(comm_f_), &req);
  complete(&req, phase);
}

void MpiWorld::check_all(const std::string& my_error, const char* phase, ErrorKind my_kind) const {
  if (allreduce_max(my_error.empty() ? 0 : 1, phase) == 0) return;
  const auto kind = static_cast<ErrorKind>(allreduce_max(my_error.empty() ? 0 : static_cast<int>(my_kind), phase));
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
  throw Error(broadcast_string(combined, 0, phase), kind, /*on_every_rank=*/true);
}

}  // namespace dlo
