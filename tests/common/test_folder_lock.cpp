// dlo/common/folder_lock.h: one holder at a time; a holder that is gone (its process exited, its id
// reused, the host rebooted) is recognised on its host; one on another host is reported, not taken.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "dlo/common/error.h"
#include "dlo/common/folder_lock.h"

namespace fs = std::filesystem;
using dlo::test::error_of;
using dlo::test::TempDir;

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// A lock file as another holder would have written it.
std::string holder(const std::string& host, long long pid, long long ticks, const std::string& boot) {
  return "host " + host + "\npid " + std::to_string(pid) + "\nstart_ticks " + std::to_string(ticks) + "\nboot_id " +
         boot + "\nsince 2026-11-30T10:00:00Z\n";
}

// The id of a process that has exited and been reaped.
long long dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

// A child that has exited and is not reaped (a zombie) and its start time (field 22 of its stat).
std::pair<long long, long long> zombie() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  for (int i = 0; i < 200; ++i) {  // until it has exited
    const std::string stat = text_of("/proc/" + std::to_string(child) + "/stat");
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::vector<std::string> f;
    for (std::string x; rest >> x;) f.push_back(x);
    if (!f.empty() && f[0] == "Z") return {child, std::atoll(f[19].c_str())};
    ::usleep(10000);
  }
  return {child, -1};
}

}  // namespace

TEST_CASE("a folder lock: held once, refused while held (naming the holder), free again when released") {
  TempDir d;
  const std::string file = d.file(".lock");
  const dlo::LockHolder me = dlo::FolderLock::self();
  {
    dlo::FolderLock a(d.path().string(), ".lock");
    CHECK_FALSE(a.took_over_stale());
    const std::string text = text_of(file);
    CHECK(has(text, "host " + me.host + "\n"));
    CHECK(has(text, "pid " + std::to_string(::getpid()) + "\n"));
    const std::string e = error_of([&] { dlo::FolderLock b(d.path().string(), ".lock"); });
    CHECK(has(e, "is in use by another run (host " + me.host + ", pid " + std::to_string(::getpid())));
    CHECK(has(e, "lock file '" + file + "'"));
    CHECK_FALSE(has(e, "refreshed"));  // this host can tell: the holder is alive
    CHECK(text_of(file) == text);                           // the refused one left it alone
  }
  CHECK_FALSE(fs::exists(file));
  dlo::FolderLock again(d.path().string(), ".lock");
  CHECK(fs::exists(file));
}

TEST_CASE("a folder lock left by a holder that is gone is taken over, one on another host is not") {
  TempDir d;
  const std::string dir = d.path().string(), file = d.file(".lock");
  const dlo::LockHolder me = dlo::FolderLock::self();
  REQUIRE(me.start_ticks > 0);
  REQUIRE_FALSE(me.boot_id.empty());
  struct Case {
    const char* what;
    std::string text;
  };
  const auto [zpid, zticks] = zombie();
  REQUIRE(zticks > 0);
  for (const Case& c : {Case{"an exited process not yet reaped (a zombie answers kill(pid, 0))",
                             holder(me.host, zpid, zticks, me.boot_id)},
                        Case{"an exited process", holder(me.host, dead_pid(), 1, me.boot_id)},
                        Case{"a reused process id", holder(me.host, ::getpid(), me.start_ticks + 1, me.boot_id)},
                        Case{"an earlier boot", holder(me.host, ::getpid(), me.start_ticks, "another-boot")},
                        Case{"a file that names no process", "garbage\n"}}) {
    CAPTURE(c.what);
    write(file, c.text);
    {
      dlo::FolderLock l(dir, ".lock");
      CHECK(l.took_over_stale());
      CHECK(has(text_of(file), "pid " + std::to_string(::getpid()) + "\n"));
    }
    CHECK_FALSE(fs::exists(file));
  }
  // On another host nothing can be proven: refused, and the message says what to do.
  const std::string other = holder("another-node", 12345, 99, "b");
  write(file, other);
  const std::string e = error_of([&] { dlo::FolderLock l(dir, ".lock"); });
  CHECK(has(e, "in use by another run (host another-node, pid 12345, since 2026-11-30T10:00:00Z"));
  CHECK(has(e, ", refreshed 0 s ago): wait for it to end; a lock not refreshed for 600 s is taken over"));
  CHECK(text_of(file) == other);
  // ... unless it has not been refreshed for longer than that: its holder is gone.
  const struct timespec old_times[2] = {{::time(nullptr) - 700, 0}, {::time(nullptr) - 700, 0}};
  REQUIRE(::utimensat(AT_FDCWD, file.c_str(), old_times, 0) == 0);
  {
    dlo::FolderLock l(dir, ".lock");
    CHECK(l.took_over_stale());
  }
  write(file, other);
  // The same holder alive on this host (this process, its true start time): refused.
  write(file, holder(me.host, ::getpid(), me.start_ticks, me.boot_id));
  CHECK(has(error_of([&] { dlo::FolderLock l(dir, ".lock"); }), "in use by another run"));
  int status = 0;
  ::waitpid(static_cast<pid_t>(zpid), &status, 0);
}

TEST_CASE("a folder lock releases only its own file") {
  TempDir d;
  const std::string file = d.file(".lock");
  {
    dlo::FolderLock l(d.path().string(), ".lock");
    write(file, holder("another-node", 1, 1, "b"));  // replaced under it (removed by hand, taken by another run)
  }
  CHECK(fs::exists(file));
  CHECK(has(text_of(file), "another-node"));
  // A folder that cannot hold a lock file: an I/O error naming it.
  const std::string e = error_of([&] { dlo::FolderLock l(d.file("missing"), ".lock"); });
  CHECK(has(e, "creating the lock file '" + d.file("missing") + "/.lock'"));
}
