#include "dlo/app/tool.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <cstring>
#include <iostream>
#include <new>

#include <c10/util/Exception.h>

#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/common/folder_lock.h"
#include "dlo/common/settings.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/io/mapped_file.h"

namespace dlo {
namespace {

std::atomic<int> g_rank{-1}, g_size{0};
std::atomic<bool> g_installed{false};

// Async-signal-safe pieces: write(2) and integer formatting by hand.
void put(const char* s) {
  std::size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(2, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<std::size_t>(w);
  }
}

void put_int(long v) {
  char buf[24];
  int i = sizeof buf - 1;
  buf[i] = '\0';
  const bool neg = v < 0;
  unsigned long u = neg ? static_cast<unsigned long>(-v) : static_cast<unsigned long>(v);
  do {
    buf[--i] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u > 0 && i > 1);
  if (neg) buf[--i] = '-';
  put(buf + i);
}

void on_sigbus(int, siginfo_t* info, void*) {
  char path[1024];
  put("[");
  put_int(g_rank.load());
  put("/");
  put_int(g_size.load());
  put("] fatal: ");
  if (mapped_file_at(info->si_addr, path, sizeof path)) {
    put("'");
    put(path);
    put("' changed while in use (truncated or rewritten by another process): reading its memory mapping failed "
        "(SIGBUS)");
  } else {
    put("bus error (SIGBUS) outside any mapped checkpoint");
  }
  put("; aborting all ranks\n");
  MpiWorld::abort_from_signal_handler(kExitFailed);
}

[[noreturn]] void on_terminate() {
  std::string what = "std::terminate called without an exception";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = "uncaught exception: " + describe_exception(x);
    } catch (...) {
      what = "uncaught exception of an unknown type";
    }
  }
  MpiWorld::abort(what, kExitFailed);
}

std::atomic<int> g_stop{0};      // the first stop signal
std::atomic<int> g_stop_again{0};  // a later one

// The handler only records; a watcher thread acts on a second signal from a normal thread
// context (MPI_Abort, the lock, stderr are not safe in a handler that may have interrupted any
// thread inside malloc or MPI).
void on_stop(int sig) {
  int none = 0;
  if (!g_stop.compare_exchange_strong(none, sig)) g_stop_again.store(sig);
}

void watch_for_second_signal() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const int sig = g_stop_again.load();
    if (sig == 0) continue;
    const std::string what = str("second signal ", sig,
                                 ": stopping now; finished videos are kept (a rerun recognises them), the rest render on the rerun");
    if (g_size.load() <= 1) {
      std::fprintf(stderr, "%s\n", what.c_str());
      std::fflush(stderr);
      FolderLock::release_for_exit();
      std::_Exit(128 + sig);
    }
    MpiWorld::abort(what, 128 + sig);  // releases the lock too
  }
}

}  // namespace

void install_fault_handlers(const MpiWorld* world) {
  if (world != nullptr) {
    g_rank = world->rank();
    g_size = world->size();
  }
  if (g_installed.exchange(true)) return;
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, nullptr);
  std::set_terminate(on_terminate);
}

namespace {

ErrorKind kind_of(const std::exception& e) {
  if (const auto* d = dynamic_cast<const Error*>(&e)) return d->kind();
  return ErrorKind::kInternal;
}

bool shared_by_every_rank(const std::exception& e) {
  const auto* d = dynamic_cast<const Error*>(&e);
  return d != nullptr && d->on_every_rank();
}

}  // namespace

void install_stop_handlers() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sa.sa_flags = SA_RESTART;  // the first signal must not make blocking calls fail with EINTR
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  std::thread(watch_for_second_signal).detach();
}

int stop_signal() { return g_stop.load(); }

void end_all_ranks_unless_shared(const std::string& tool, const MpiWorld& world, const std::exception& e) {
  if (world.size() <= 1 || shared_by_every_rank(e)) return;
  MpiWorld::abort(str(tool, ": ", describe_exception(e)), exit_code_of(kind_of(e)));
}

int run_tool(const std::string& tool, const MpiWorld* world, const std::function<int()>& body) {
  install_fault_handlers(world);
  try {
    return body();
  } catch (const std::exception& e) {
    if (world != nullptr) end_all_ranks_unless_shared(tool, *world, e);
    // One rank, or an error every rank raised alike: rank 0 says it, every rank returns.
    if (world == nullptr || world->rank() == 0) std::cerr << tool << ": error: " << describe_exception(e) << "\n";
    return exit_code_of(kind_of(e));
  }
}

int default_threads(const MpiWorld& world, std::string* why) {
  // This rank's CPUs and its node (a hash of the host name) to every rank.
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (::sched_getaffinity(0, sizeof mine, &mine) != 0) {
    for (int c = 0; c < available_cores() && c < CPU_SETSIZE; ++c) CPU_SET(c, &mine);
  }
  constexpr int kWords = CPU_SETSIZE / 64;
  std::vector<std::int64_t> words(kWords + 1, 0);
  words[0] = static_cast<std::int64_t>(std::hash<std::string>{}(world.host()) >> 1);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mine)) words[1 + c / 64] |= std::int64_t{1} << (c % 64);
  const std::vector<std::int64_t> all = world.allgather(words, "thread defaults");
  int sharing = 0;
  for (int r = 0; r < world.size(); ++r) {
    const std::int64_t* w = &all[static_cast<std::size_t>(r) * words.size()];
    if (w[0] != words[0]) continue;
    bool overlap = false;
    for (int i = 1; i <= kWords && !overlap; ++i) overlap = (w[i] & words[static_cast<std::size_t>(i)]) != 0;
    sharing += overlap;
  }
  // After the collective, which every rank joins whatever its environment says.
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env != nullptr && *env != '\0') {
    // A list ("8,2": nested levels) sets the outer level first.
    const std::string first = std::string(env).substr(0, std::string(env).find(','));
    char* end = nullptr;
    const long n = std::strtol(first.c_str(), &end, 10);
    DLO_CHECK(end != first.c_str() && *end == '\0' && n > 0 && n <= 1 << 20, "OMP_NUM_THREADS='", env,
              "' is not a positive thread count");
    std::string note;
    const int t = bound_threads(static_cast<int>(n), "OMP_NUM_THREADS", &note);
    if (why != nullptr) *why = note.empty() ? str("OMP_NUM_THREADS=", n) : note;
    return t;
  }
  const int cores = available_cores();
  const int t = std::max(1, cores / std::max(1, sharing));
  if (why != nullptr)
    *why = str(cores, " core(s) in this rank's CPU mask, shared by ", sharing, " rank(s) of its node");
  return t;
}

}  // namespace dlo
