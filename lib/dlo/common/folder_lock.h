// A folder held by one process at a time, as a lock file inside it that names its holder (host,
// process id, the process's start time, the host's boot id): two batches on one output folder would
// render every job twice and interleave results.jsonl. A lock whose holder is gone is recognised
// and taken over when the holder ran on this host and in this PID namespace (its process is gone,
// is another process with the same id, or the host rebooted since). A holder on another host, or
// in another PID namespace of this one (a container sharing the host's name and boot id), cannot
// be checked from here: its lock counts as left behind when it has not been refreshed for
// kStaleAfterS (the holder touches it every kRefreshS; ages are measured by the file system's
// clock, not this host's). Lock files of earlier versions name no PID namespace: their holder is
// taken to share this one. The lock file appears whole and atomically (written under a temporary
// name, then hard-linked: the classic NFS-safe lock; O_EXCL where a file system has no hard links).
// A lock file is only ever read as a regular file (or a symbolic link to one), without blocking
// and at most kMaxBytes of it: anything else at its path (a FIFO, a socket, a device, a folder, a
// dangling symbolic link) is refused, never opened for reading or removed.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <string>
#include <thread>

namespace dlo {

struct LockHolder {
  std::string host, boot_id, since;  // since: UTC, ISO 8601
  long long pid = -1, start_ticks = -1;  // start_ticks: field 22 of /proc/PID/stat
  std::string pid_ns;  // the target of /proc/self/ns/pid ("pid:[4026531836]"); "": not recorded
};

// A holder as a lock file's text (one "key value" per line, read by people too), and back; other
// files that name their process (a singleton's MPI session folder) use the same form.
std::string holder_text(const LockHolder& h);
LockHolder parse_holder(const std::string& text);

class FolderLock {
 public:
  // Takes `dir`/`name` for `what` (in messages; default "the output folder 'DIR'"). Throws an input
  // dlo::Error naming the holder when another live process (or one on another host or in another
  // PID namespace) holds it, and one naming the lock file and what it is when that is not a regular
  // file; an I/O one when the lock file cannot be written (no room, a vanished folder).
  FolderLock(const std::string& dir, const std::string& name, const std::string& what = "");
  ~FolderLock();  // removes the lock file if it is still this process's
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  const std::string& path() const { return path_; }
  // True when the lock file took over one left by a process that is gone.
  bool took_over_stale() const { return stale_; }

  // Throws an I/O dlo::Error when the lock file is no longer this lock's: its folder was removed
  // (or replaced), or the file itself removed or replaced, while held; nothing more should be
  // written there. Reads the lock file (a few hundred bytes); thread-safe.
  void check_held() const;

  static constexpr double kRefreshS = 30, kStaleAfterS = 600;
  static constexpr std::size_t kMaxBytes = 4096;  // read of a lock file at most (one is ~200)

  // Removes the locks this process holds (up to four at once), each if its file is still this
  // process's, for a process that ends now without unwinding (a second stop signal, an abort of
  // every rank). Async-signal-safe.
  static void release_for_exit() noexcept;

  // This process as a holder; whether `h`, whose lock was last refreshed `age_s` ago, is gone.
  static LockHolder self();
  static bool holder_gone(const LockHolder& h, double age_s);

 private:
  void refresh();  // the heartbeat thread

  std::string dir_, path_, what_, text_;
  bool stale_ = false;
  int slot_ = -1;  // this lock's place among those release_for_exit() removes; -1: none
  std::mutex mu_;
  std::condition_variable cv_;
  bool quit_ = false;
  std::thread heartbeat_;
};

}  // namespace dlo
