#include "dlo/common/folder_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "dlo/common/error.h"
#include "dlo/common/file.h"

namespace dlo {
namespace {

// The lock this process holds, for release_for_exit() (a signal handler: fixed buffers only).
char g_held_path[4096];
char g_held_text[1024];
std::atomic<bool> g_holding{false};

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Fields of /proc/PID/stat after the command name (which may hold spaces and parentheses); empty
// when there is no such process.
std::vector<std::string> stat_fields(long long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  std::vector<std::string> fields;
  if (close == std::string::npos || close + 2 > text.size()) return fields;
  std::istringstream rest(text.substr(close + 2));
  for (std::string f; rest >> f;) fields.push_back(f);
  return fields;  // fields[0] is field 3 (the state)
}

// Field 22 (starttime, clock ticks since boot); -1 when there is no such process.
long long start_ticks(long long pid) {
  const auto f = stat_fields(pid);
  return f.size() > 19 ? std::atoll(f[19].c_str()) : -1;
}

// A process that has exited but not been reaped (a zombie: where no init reaps orphans, as in
// many containers) still answers kill(pid, 0).
bool exited(long long pid) {
  const auto f = stat_fields(pid);
  return f.empty() || f[0] == "Z" || f[0] == "X";
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

double mtime_s(const struct stat& st) { return static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * st.st_mtim.tv_nsec; }

std::string read_text(const std::string& path, bool* exists) {
  std::ifstream in(path, std::ios::binary);
  *exists = static_cast<bool>(in);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Creates `path` holding `text` if it does not exist; false when it exists. The file appears whole
// (written under a temporary name, then hard-linked: atomic, also on NFS), so a lock file that
// names no holder was not written by this code; where the file system has no hard links, O_EXCL.
// `fs_now` gets the time as the file system stamps it (the temporary's mtime: on NFS the server's
// clock), to age other holders' locks by.
bool create_exclusive(const std::string& path, const std::string& text, double* fs_now) {
  const std::string temp = unique_temp_name(path);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  DLO_CHECK_IO(fd >= 0, "creating the lock file '", path, "': ", std::strerror(errno));
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  int err = errno;
  struct stat st {};
  *fs_now = ::fstat(fd, &st) == 0 ? mtime_s(st) : static_cast<double>(std::time(nullptr));
  ::close(fd);
  if (!written) ::unlink(temp.c_str());
  DLO_CHECK_IO(written, "writing the lock file '", path, "': ", std::strerror(err));
  int rc = ::link(temp.c_str(), path.c_str());
  err = errno;
  ::unlink(temp.c_str());
  if (rc != 0 && (err == EPERM || err == ENOTSUP || err == EOPNOTSUPP || err == EXDEV || err == EMLINK || err == ENOSYS)) {
    // No hard links here: O_EXCL on the lock itself (its content appears a moment later).
    const int lfd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    err = errno;
    if (lfd >= 0) {
      const bool ok = ::write(lfd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
      ::close(lfd);
      DLO_CHECK_IO(ok, "writing the lock file '", path, "'");
      return true;
    }
  }
  if (rc == 0) return true;
  DLO_CHECK_IO(err == EEXIST, "creating the lock file '", path, "': ", std::strerror(err));
  // NFS: a retransmitted link() that succeeded the first time reports EEXIST; the lock is ours
  // when it holds our text (unique: host, pid, start ticks, time).
  bool exists = false;
  return read_text(path, &exists) == text && exists;
}

}  // namespace

// One "key value" per line; the lock file is read by people too.
std::string holder_text(const LockHolder& h) {
  return str("host ", h.host, "\npid ", h.pid, "\nstart_ticks ", h.start_ticks, "\nboot_id ", h.boot_id, "\nsince ",
             h.since, "\n");
}

LockHolder parse_holder(const std::string& text) {
  LockHolder h;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto sp = line.find(' ');
    if (sp == std::string::npos) continue;
    const std::string key = line.substr(0, sp), value = line.substr(sp + 1);
    if (key == "host") h.host = value;
    else if (key == "pid") h.pid = std::atoll(value.c_str());
    else if (key == "start_ticks") h.start_ticks = std::atoll(value.c_str());
    else if (key == "boot_id") h.boot_id = value;
    else if (key == "since") h.since = value;
  }
  return h;
}

LockHolder FolderLock::self() {
  LockHolder h;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  h.host = host;
  h.pid = static_cast<long long>(::getpid());
  h.start_ticks = start_ticks(h.pid);
  h.boot_id = first_line("/proc/sys/kernel/random/boot_id");
  h.since = utc_now();
  return h;
}

bool FolderLock::holder_gone(const LockHolder& h, double age_s) {
  const LockHolder me = self();
  if (h.host.empty() || h.pid <= 0) return true;  // names no holder: not a lock this code wrote (they appear whole)
  if (h.host != me.host) return age_s > kStaleAfterS;  // not refreshed for that long: its holder is gone
  if (!h.boot_id.empty() && !me.boot_id.empty() && h.boot_id != me.boot_id) return true;  // rebooted since
  if (::kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH) return true;
  if (exited(h.pid)) return true;
  return h.start_ticks >= 0 && start_ticks(h.pid) != h.start_ticks;  // the id now names another process
}

FolderLock::FolderLock(const std::string& dir, const std::string& name) : path_(dir + "/" + name) {
  const LockHolder me = self();
  // A token makes this lock's text unique (two locks of one process in one second differ), so a
  // lock file holding exactly it is this object's.
  static std::atomic<long long> count{0};
  text_ = holder_text(me) + str("token ", std::chrono::steady_clock::now().time_since_epoch().count(), "-", ++count, "\n");
  for (int attempt = 0; attempt < 2; ++attempt) {
    double fs_now = 0;
    if (create_exclusive(path_, text_, &fs_now)) {
      if (path_.size() < sizeof g_held_path && text_.size() < sizeof g_held_text && !g_holding.load()) {
        std::memcpy(g_held_path, path_.c_str(), path_.size() + 1);
        std::memcpy(g_held_text, text_.c_str(), text_.size() + 1);
        g_holding.store(true);
        registered_ = true;
      }
      heartbeat_ = std::thread([this] { refresh(); });
      return;
    }
    bool exists = false;
    const std::string held = read_text(path_, &exists);
    struct stat st {};
    if (!exists || ::stat(path_.c_str(), &st) != 0) continue;  // its holder just removed it
    const double age = std::max(0.0, fs_now - mtime_s(st));
    const LockHolder h = parse_holder(held);
    if (!holder_gone(h, age)) {
      const bool here = h.host == me.host;
      throw Error(str("the output folder '", dir, "' is in use by another run (host ", h.host, ", pid ", h.pid,
                      ", since ", h.since.empty() ? "?" : h.since, "; lock file '", path_, "'", 
                      here ? "" : str(", refreshed ", static_cast<long long>(age), " s ago"), "): wait for it to end",
                      here ? "" : str("; a lock not refreshed for ", static_cast<long long>(kStaleAfterS),
                                      " s is taken over (its run is gone), or remove it if you know it is")));
    }
    // Gone: remove its lock if it is still the same one (another run may be taking it over too).
    bool still = false;
    if (read_text(path_, &still) == held && still) ::unlink(path_.c_str());
    stale_ = true;
  }
  throw Error(str("the output folder '", dir, "' is being taken over by another run at the same time (lock file '",
                  path_, "'): try again"));
}

void FolderLock::refresh() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::duration<double>(kRefreshS), [this] { return quit_; }))
    (void)::utimensat(AT_FDCWD, path_.c_str(), nullptr, 0);  // now, as the file system stamps it
}

FolderLock::~FolderLock() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (registered_) g_holding.store(false);
  bool exists = false;
  if (read_text(path_, &exists) == text_ && exists) ::unlink(path_.c_str());
}

void FolderLock::release_for_exit() noexcept {
  if (!g_holding.exchange(false)) return;
  char buf[sizeof g_held_text];
  const int fd = ::open(g_held_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n < 0) return;
  buf[n] = '\0';
  if (std::strcmp(buf, g_held_text) == 0) ::unlink(g_held_path);  // still this process's
}

}  // namespace dlo
