// A folder held by one process at a time, as a lock file inside it that names its holder (host,
// process id, the process's start time, the host's boot id): two batches on one output folder would
// render every job twice and interleave results.jsonl. A lock whose holder is gone is recognised
// and taken over when the holder ran on this host (its process is gone, is another process with
// the same id, or the host rebooted since). A holder on another host cannot be checked from here:
// its lock counts as left behind when it has not been refreshed for kStaleAfterS (the holder
// touches it every kRefreshS; ages are measured by the file system's clock, not this host's). The lock file appears whole and atomically (written
// under a temporary name, then hard-linked: the classic NFS-safe lock; O_EXCL where a file system
// has no hard links).
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace dlo {

struct LockHolder {
  std::string host, boot_id, since;  // since: UTC, ISO 8601
  long long pid = -1, start_ticks = -1;  // start_ticks: field 22 of /proc/PID/stat
};

// A holder as a lock file's text (one "key value" per line, read by people too), and back; other
// files that name their process (a singleton's MPI session folder) use the same form.
std::string holder_text(const LockHolder& h);
LockHolder parse_holder(const std::string& text);

class FolderLock {
 public:
  // Takes `dir`/`name`. Throws an input dlo::Error naming the holder when another live process
  // (or one on another host) holds it; an I/O one when the lock file cannot be written.
  FolderLock(const std::string& dir, const std::string& name);
  ~FolderLock();  // removes the lock file if it is still this process's
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  const std::string& path() const { return path_; }
  // True when the lock file took over one left by a process that is gone.
  bool took_over_stale() const { return stale_; }

  static constexpr double kRefreshS = 30, kStaleAfterS = 600;

  // Removes the lock this process holds, if its file is still this process's, for a process that
  // ends now without unwinding (a second stop signal, an abort of every rank). Async-signal-safe.
  static void release_for_exit() noexcept;

  // This process as a holder; whether `h`, whose lock was last refreshed `age_s` ago, is gone.
  static LockHolder self();
  static bool holder_gone(const LockHolder& h, double age_s);

 private:
  void refresh();  // the heartbeat thread

  std::string path_, text_;
  bool stale_ = false, registered_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  bool quit_ = false;
  std::thread heartbeat_;
};

}  // namespace dlo
