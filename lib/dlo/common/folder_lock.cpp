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
#include <iterator>
#include <sstream>
#include <thread>
#include <vector>

#include "dlo/common/error.h"
#include "dlo/common/file.h"

namespace dlo {
namespace {

// The locks this process holds, for release_for_exit() (a signal handler: fixed buffers only).
struct HeldLock {
  std::atomic<bool> taken{false};    // the slot belongs to a FolderLock
  std::atomic<bool> holding{false};  // path and text are set and the lock is held
  char path[4096];
  char text[1024];
};
HeldLock g_held[4];

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

// What a file type is, for messages.
const char* type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "of another kind";
}

[[noreturn]] void refuse_lock(const std::string& path, const std::string& what) {
  throw Error(str("the lock file '", path, "' is ", what,
                  ", not a regular file: dlo neither reads nor removes it; remove it if no run uses it"));
}

// The lock file at `path` (at most FolderLock::kMaxBytes of it); *exists false when there is none.
// Never blocks: the path is checked by lstat (and stat, for a symbolic link) before it is opened,
// non-blocking, and what was opened is checked again. Throws an input dlo::Error naming the path
// when it is anything but a regular file or a symbolic link to one; an I/O one when it cannot be read.
std::string read_lock(const std::string& path, bool* exists) {
  *exists = false;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    DLO_CHECK_IO(errno == ENOENT, "reading the lock file '", path, "': ", std::strerror(errno));
    return "";
  }
  if (S_ISLNK(st.st_mode)) {
    char target[4096] = {};
    (void)::readlink(path.c_str(), target, sizeof target - 1);
    struct stat to {};
    if (::stat(path.c_str(), &to) != 0)
      refuse_lock(path, str("a symbolic link to '", target, "', which ",
                            errno == ENOENT ? std::string("does not exist") : str("cannot be read (", std::strerror(errno), ")")));
    if (!S_ISREG(to.st_mode)) refuse_lock(path, str("a symbolic link to ", type_name(to.st_mode), " ('", target, "')"));
  } else if (!S_ISREG(st.st_mode)) {
    refuse_lock(path, type_name(st.st_mode));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    DLO_CHECK_IO(errno == ENOENT, "reading the lock file '", path, "': ", std::strerror(errno));
    return "";  // its holder just removed it
  }
  struct stat opened {};
  if (::fstat(fd, &opened) != 0 || !S_ISREG(opened.st_mode)) {  // replaced since the lstat
    ::close(fd);
    refuse_lock(path, type_name(opened.st_mode));
  }
  std::string text(FolderLock::kMaxBytes, '\0');
  std::size_t n = 0;
  for (ssize_t got = 1; got > 0 && n < text.size(); n += got > 0 ? static_cast<std::size_t>(got) : 0)
    got = ::read(fd, &text[n], text.size() - n);
  ::close(fd);
  text.resize(n);
  *exists = true;
  return text;
}

// Whether the lock file at `path` is exactly `text` (the lock a FolderLock wrote: a regular file,
// never a symbolic link). Never blocks, never throws, async-signal-safe (system calls and a
// buffer on the stack), so the destructor and release_for_exit() may use it.
bool holds_text(const char* path, const char* text, std::size_t size) noexcept {
  char buf[FolderLock::kMaxBytes];
  if (size >= sizeof buf) return false;
  struct stat st {};
  if (::lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) return false;
  const int fd = ::open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return false;
  std::size_t n = 0;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
    for (ssize_t got = 1; got > 0 && n <= size; n += got > 0 ? static_cast<std::size_t>(got) : 0)
      got = ::read(fd, buf + n, size + 1 - n);  // one byte more than `text`: a longer file differs
  ::close(fd);
  return n == size && std::memcmp(buf, text, size) == 0;
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
  return holds_text(path.c_str(), text.data(), text.size());
}

}  // namespace

// One "key value" per line; the lock file is read by people too.
std::string holder_text(const LockHolder& h) {
  return str("host ", h.host, "\npid ", h.pid, "\nstart_ticks ", h.start_ticks, "\nboot_id ", h.boot_id,
             h.pid_ns.empty() ? "" : "\npid_ns " + h.pid_ns, "\nsince ", h.since, "\n");
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
    else if (key == "pid_ns") h.pid_ns = value;
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
  char ns[256] = {};
  if (::readlink("/proc/self/ns/pid", ns, sizeof ns - 1) > 0) h.pid_ns = ns;
  h.since = utc_now();
  return h;
}

bool FolderLock::holder_gone(const LockHolder& h, double age_s) {
  const LockHolder me = self();
  if (h.host.empty() || h.pid <= 0) return true;  // names no holder: not a lock this code wrote (they appear whole)
  if (h.host != me.host) return age_s > kStaleAfterS;  // not refreshed for that long: its holder is gone
  if (!h.boot_id.empty() && !me.boot_id.empty() && h.boot_id != me.boot_id) return true;  // rebooted since
  // Another PID namespace (a container with the host's name): its process ids mean nothing here.
  if (!h.pid_ns.empty() && !me.pid_ns.empty() && h.pid_ns != me.pid_ns) return age_s > kStaleAfterS;
  if (::kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH) return true;
  if (exited(h.pid)) return true;
  return h.start_ticks >= 0 && start_ticks(h.pid) != h.start_ticks;  // the id now names another process
}

FolderLock::FolderLock(const std::string& dir, const std::string& name, const std::string& what)
    : dir_(dir), path_(dir + "/" + name), what_(what.empty() ? str("the output folder '", dir, "'") : what) {
  const LockHolder me = self();
  // A token makes this lock's text unique (two locks of one process in one second differ), so a
  // lock file holding exactly it is this object's.
  static std::atomic<long long> count{0};
  text_ = holder_text(me) + str("token ", std::chrono::steady_clock::now().time_since_epoch().count(), "-", ++count, "\n");
  for (int attempt = 0; attempt < 2; ++attempt) {
    double fs_now = 0;
    if (create_exclusive(path_, text_, &fs_now)) {
      for (int i = 0; i < static_cast<int>(std::size(g_held)) && slot_ < 0; ++i) {
        HeldLock& h = g_held[i];
        bool free = false;
        if (path_.size() >= sizeof h.path || text_.size() >= sizeof h.text || !h.taken.compare_exchange_strong(free, true))
          continue;
        std::memcpy(h.path, path_.c_str(), path_.size() + 1);
        std::memcpy(h.text, text_.c_str(), text_.size() + 1);
        h.holding.store(true);
        slot_ = i;
      }
      heartbeat_ = std::thread([this] { refresh(); });
      return;
    }
    bool exists = false;
    const std::string held = read_lock(path_, &exists);
    struct stat st {};
    if (!exists || ::stat(path_.c_str(), &st) != 0) continue;  // its holder just removed it
    const double age = std::max(0.0, fs_now - mtime_s(st));
    const LockHolder h = parse_holder(held);
    if (!holder_gone(h, age)) {
      // Where the holder's process can be checked (this host, this PID namespace), it is alive;
      // elsewhere only the refreshes say so.
      const bool here = h.host == me.host && (h.pid_ns.empty() || me.pid_ns.empty() || h.pid_ns == me.pid_ns);
      const bool other_ns = h.host == me.host && !here;
      throw Error(str(what_, " is in use by another run (host ", h.host, ", pid ", h.pid,
                      other_ns ? str(" in another PID namespace (", h.pid_ns, ")") : "", ", since ",
                      h.since.empty() ? "?" : h.since, "; lock file '", path_, "'",
                      here ? "" : str(", refreshed ", static_cast<long long>(age), " s ago"), "): wait for it to end",
                      here ? "" : str("; a lock not refreshed for ", static_cast<long long>(kStaleAfterS),
                                      " s is taken over (its run is gone), or remove it if you know it is")));
    }
    // Gone: remove its lock if it is still the same one (another run may be taking it over too).
    bool still = false;
    if (read_lock(path_, &still) == held && still) ::unlink(path_.c_str());
    stale_ = true;
  }
  throw Error(str(what_, " is being taken over by another run at the same time (lock file '", path_, "'): try again"));
}

void FolderLock::check_held() const {
  if (holds_text(path_.c_str(), text_.data(), text_.size())) return;
  struct stat st {};
  if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw Error(str("the folder '", dir_, "' was removed while this run held it (its lock file '", path_,
                    "' went with it): stopping; nothing more can be written there"),
                ErrorKind::kIo);
  throw Error(str("the lock file '", path_, "' of ", what_,
                  " was removed or replaced while this run held it: stopping, as another run may now write there"),
              ErrorKind::kIo);
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
  if (slot_ >= 0) {
    g_held[slot_].holding.store(false);
    g_held[slot_].taken.store(false);
  }
  if (holds_text(path_.c_str(), text_.data(), text_.size())) ::unlink(path_.c_str());
}

void FolderLock::release_for_exit() noexcept {
  for (HeldLock& h : g_held)
    if (h.holding.exchange(false) && holds_text(h.path, h.text, std::strlen(h.text)))
      ::unlink(h.path);  // still this process's
}

}  // namespace dlo
