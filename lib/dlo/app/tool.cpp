#include "dlo/app/tool.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <new>

#include <c10/util/Exception.h>

#include "dlo/common/error.h"
#include "dlo/common/file.h"
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

void check_output_files(const MpiWorld& world, const std::vector<std::string>& files) {
  std::string error;
  for (const auto& f : files) {
    if (f.empty()) continue;
    try {
      check_output_path(f);
    } catch (const Error& e) {
      error += (error.empty() ? "" : "; ") + std::string(e.what());
    }
  }
  world.check_all(error, "output check");
}

}  // namespace dlo
