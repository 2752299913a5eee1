// dlo/common/folder_lock.h: one holder at a time; a holder that is gone (its process exited, its id
// reused, the host rebooted) is recognised on its host; one on another host is reported, not taken.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <functional>
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

// fn's outcome, run in a child process that gets `seconds` (a lock read that blocks on a FIFO or
// never ends on a device would hang the test): "(blocked)" when it did not end in time, else the
// dlo::Error's kind ("input: ", "io: ") and message, or "(no error)".
std::string outcome_within(int seconds, const std::function<void()>& fn) {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(p[0]);
    std::string out = "(no error)";
    try {
      fn();
    } catch (const dlo::Error& e) {
      out = std::string(e.kind() == dlo::ErrorKind::kInput ? "input: " : "io: ") + e.what();
    }
    (void)!::write(p[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(p[1]);
  int status = 0;
  bool ended = false;
  for (int i = 0; i < seconds * 100 && !ended; ++i) {
    ended = ::waitpid(child, &status, WNOHANG) == child;
    if (!ended) ::usleep(10000);
  }
  if (!ended) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
  }
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(p[0]);
  return ended ? out : "(blocked)";
}

// A lock file as a holder in another PID namespace of this host would have written it.
std::string holder_in_ns(const dlo::LockHolder& me, long long pid, const std::string& ns) {
  dlo::LockHolder h = me;
  h.pid = pid;
  h.start_ticks = 1;
  h.pid_ns = ns;
  return dlo::holder_text(h);
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

// N1 and V7 of the 2026-12-07 probe: a FIFO at the lock's path hung the batch forever (the lock was
// read with an ifstream, which blocks opening a FIFO), a symbolic link to /dev/zero was read until
// memory ran out, a folder gave "basic_filebuf::underflow error" naming no path, a dangling
// symbolic link "is being taken over by another run at the same time: try again" for ever.
TEST_CASE("a lock file that is a FIFO, a socket, a device, a folder or a dangling symbolic link is refused at once, named, untouched") {
  TempDir d;
  const std::string dir = d.path().string(), file = d.file(".lock");
  struct Case {
    const char* what;
    std::function<void()> make;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"a FIFO", [&] { REQUIRE(::mkfifo(file.c_str(), 0644) == 0); }, "is a FIFO, not a regular file"},
      {"a socket",
       [&] {
         const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
         sockaddr_un a{};
         a.sun_family = AF_UNIX;
         REQUIRE(file.size() < sizeof a.sun_path);
         std::memcpy(a.sun_path, file.c_str(), file.size() + 1);
         REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
         ::close(s);
       },
       "is a socket, not a regular file"},
      {"a symbolic link to /dev/zero", [&] { fs::create_symlink("/dev/zero", file); },
       "is a symbolic link to a character device ('/dev/zero'), not a regular file"},
      {"a symbolic link to a FIFO",
       [&] {
         REQUIRE(::mkfifo(d.file("fifo").c_str(), 0644) == 0);
         fs::create_symlink(d.file("fifo"), file);
       },
       "is a symbolic link to a FIFO"},
      {"a folder", [&] { fs::create_directory(file); }, "is a folder, not a regular file"},
      {"a symbolic link to a folder", [&] { fs::create_directory_symlink(dir, file); }, "is a symbolic link to a folder"},
      {"a dangling symbolic link", [&] { fs::create_symlink(d.file("nowhere"), file); },
       "is a symbolic link to '"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    fs::remove(d.file("fifo"));
    c.make();
    const auto type = fs::symlink_status(file).type();
    const std::string e = outcome_within(10, [&] { dlo::FolderLock l(dir, ".lock"); });
    CHECK(e.rfind("input: the lock file '" + file + "' is ", 0) == 0);  // bad input (exit 2), the path named
    CHECK(has(e, c.says));
    CHECK(has(e, "remove it if no run uses it"));
    CHECK(fs::symlink_status(file).type() == type);  // left as it was
    fs::remove(file);
  }
  // The dangling link says where it points.
  fs::create_symlink(d.file("nowhere"), file);
  CHECK(has(outcome_within(10, [&] { dlo::FolderLock l(dir, ".lock"); }), "nowhere', which does not exist"));
  fs::remove(file);
  // A symbolic link to a user's file is still read as a lock that names no holder: taken over,
  // the link removed, the file untouched.
  write(d.file("notes.txt"), "my notes\n");
  fs::create_symlink(d.file("notes.txt"), file);
  {
    dlo::FolderLock l(dir, ".lock");
    CHECK(l.took_over_stale());
  }
  CHECK(text_of(d.file("notes.txt")) == "my notes\n");
}

TEST_CASE("a huge lock file is read only in part: garbage, taken over") {
  TempDir d;
  const std::string file = d.file(".lock");
  write(file, std::string(1 << 20, 'x'));  // 1 MiB: a lock is ~200 bytes
  dlo::FolderLock l(d.path().string(), ".lock");
  CHECK(l.took_over_stale());
}

// V8 of the 2026-12-07 probe: a batch in a container with the host's name and boot id (its own PID
// namespace) held the folder; a batch outside found its pid absent here and took the lock over.
TEST_CASE("a lock from another PID namespace of this host counts as another host's (the refresh rule), an old lock as before") {
  TempDir d;
  const std::string dir = d.path().string(), file = d.file(".lock");
  const dlo::LockHolder me = dlo::FolderLock::self();
  REQUIRE(me.pid_ns.rfind("pid:[", 0) == 0);
  CHECK(has(dlo::holder_text(me), "\npid_ns " + me.pid_ns + "\n"));
  CHECK(dlo::parse_holder(dlo::holder_text(me)).pid_ns == me.pid_ns);
  const long long gone = dead_pid();  // the holder's pid means nothing here
  const std::string foreign = holder_in_ns(me, gone, "pid:[1]");
  CHECK_FALSE(dlo::FolderLock::holder_gone(dlo::parse_holder(foreign), 0));
  CHECK(dlo::FolderLock::holder_gone(dlo::parse_holder(foreign), dlo::FolderLock::kStaleAfterS + 1));
  write(file, foreign);
  const std::string e = error_of([&] { dlo::FolderLock l(dir, ".lock"); });
  CHECK(has(e, "is in use by another run (host " + me.host + ", pid " + std::to_string(gone) +
                   " in another PID namespace (pid:[1])"));
  CHECK(has(e, "refreshed 0 s ago): wait for it to end; a lock not refreshed for 600 s is taken over"));
  CHECK(text_of(file) == foreign);
  const struct timespec old_times[2] = {{::time(nullptr) - 700, 0}, {::time(nullptr) - 700, 0}};
  REQUIRE(::utimensat(AT_FDCWD, file.c_str(), old_times, 0) == 0);
  {
    dlo::FolderLock l(dir, ".lock");
    CHECK(l.took_over_stale());
  }
  // This namespace, or a lock of an earlier version (no pid_ns line): the pid is checked here.
  for (const std::string& text : {holder_in_ns(me, gone, me.pid_ns), holder(me.host, gone, 1, me.boot_id)}) {
    CAPTURE(text);
    CHECK(dlo::FolderLock::holder_gone(dlo::parse_holder(text), 0));
    write(file, text);
    dlo::FolderLock l(dir, ".lock");
    CHECK(l.took_over_stale());
  }
  write(file, holder(me.host, ::getpid(), me.start_ticks, me.boot_id));  // old format, alive: refused
  CHECK(has(error_of([&] { dlo::FolderLock l(dir, ".lock"); }), "in use by another run"));
}

// V16 of the 2026-12-07 probe: an output folder removed mid-batch went unnoticed; every remaining
// job was denoised in full and then failed.
TEST_CASE("a held lock knows when its folder or its file is gone or replaced") {
  TempDir d;
  const std::string dir = d.file("out"), file = dir + "/.lock";
  fs::create_directory(dir);
  {
    dlo::FolderLock l(dir, ".lock", "the latents file 'x.h5'");
    CHECK_NOTHROW(l.check_held());
    write(file, holder("another-node", 1, 1, "b"));
    const std::string e = outcome_within(10, [&] { l.check_held(); });
    CHECK(e == "io: the lock file '" + file + "' of the latents file 'x.h5' was removed or replaced while this run "
                   "held it: stopping, as another run may now write there");
  }
  {
    fs::remove(file);
    dlo::FolderLock l(dir, ".lock");
    fs::remove_all(dir);
    const std::string e = outcome_within(10, [&] { l.check_held(); });
    CHECK(e.rfind("io: the folder '" + dir + "' was removed while this run held it", 0) == 0);
    fs::create_directory(dir);  // a new folder of the same name is not the one held
    CHECK(has(outcome_within(10, [&] { l.check_held(); }), "was removed or replaced while this run held it"));
  }
}

// V16 of the 2026-12-07 probe (its other half): no room for the lock file is an I/O error.
TEST_CASE("a lock that cannot be written is an I/O error, not bad input") {
  TempDir d;
  const std::string e = outcome_within(10, [&] { dlo::FolderLock l(d.file("missing"), ".lock"); });
  CHECK(e.rfind("io: creating the lock file '" + d.file("missing") + "/.lock'", 0) == 0);
}
