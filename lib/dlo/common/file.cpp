#include "dlo/common/file.h"

#include <fcntl.h>
#include <signal.h>
#include <dirent.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <vector>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "dlo/common/error.h"

namespace dlo {
namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a regular file";
}

std::string host_name() {
  char h[256] = {0};
  if (::gethostname(h, sizeof h - 1) != 0) return "host";
  std::string s(h);
  std::replace(s.begin(), s.end(), '/', '_');
  return s.empty() ? "host" : s;
}

void fsync_fd(int fd, const std::string& what) {
  DLO_CHECK_IO(::fsync(fd) == 0 || errno == EINVAL || errno == EROFS, "syncing '", what, "': ", std::strerror(errno));
}

}  // namespace

std::string canonical_path(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  if (ec) return std::filesystem::path(path).lexically_normal().string();
  std::filesystem::path c = std::filesystem::weakly_canonical(p, ec);
  if (ec) c = p;
  c = c.lexically_normal();
  if (c.filename().empty() && c.has_parent_path() && c != c.root_path()) c = c.parent_path();  // no trailing '/'
  return c.string();
}

std::string path_folder(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string path_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string resolve_output_path(const std::string& path_in) {
  DLO_CHECK(!path_in.empty(), "an output path is empty");
  std::string path = path_in;
  for (int hops = 0;; ++hops) {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
      DLO_CHECK(errno == ENOENT, "'", path, "': ", std::strerror(errno));
      return path;  // a new file
    }
    if (S_ISREG(st.st_mode)) return path;
    DLO_CHECK(S_ISLNK(st.st_mode), "'", path_in, "'", path == path_in ? "" : str(" (-> '", path, "')"), " is ",
              kind_of(st.st_mode), ": outputs are written only to regular files");
    DLO_CHECK(hops < 40, "'", path_in, "': too many levels of symbolic links");
    std::string target(PATH_MAX, '\0');
    const ssize_t n = ::readlink(path.c_str(), target.data(), target.size());
    DLO_CHECK(n > 0, "reading the symbolic link '", path, "': ", std::strerror(errno));
    target.resize(static_cast<std::size_t>(n));
    path = target.front() == '/' ? target : path_folder(path) + "/" + target;
  }
}

void check_output_path(const std::string& path) {
  const std::string real = resolve_output_path(path);
  const std::string dir = path_folder(real);
  struct stat st;
  DLO_CHECK(::stat(dir.c_str(), &st) == 0, "the folder '", dir, "' of '", path, "' does not exist");
  DLO_CHECK(S_ISDIR(st.st_mode), "'", dir, "' (the folder of '", path, "') is not a directory");
  DLO_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "the folder '", dir, "' of '", path,
            "' is not writable: ", std::strerror(errno));
}

void check_output_folder(const std::string& dir_in) {
  DLO_CHECK(!dir_in.empty(), "an output folder path is empty");
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    DLO_CHECK(S_ISDIR(st.st_mode), "'", dir_in, "' exists and is ", (S_ISREG(st.st_mode) ? "a regular file" : kind_of(st.st_mode)),
              ", not a folder");
    DLO_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "the folder '", dir_in, "' is not writable: ", std::strerror(errno));
    return;
  }
  DLO_CHECK(errno == ENOENT || errno == ENOTDIR, "'", dir_in, "': ", std::strerror(errno));
  // The nearest existing ancestor must be a writable folder.
  std::string up = dir;
  for (;;) {
    up = path_folder(up);
    if (::stat(up.c_str(), &st) == 0) break;
    DLO_CHECK((errno == ENOENT || errno == ENOTDIR) && up != "/" && up != ".", "'", up, "' (a parent of '", dir_in,
              "'): ", std::strerror(errno));
  }
  DLO_CHECK(S_ISDIR(st.st_mode), "'", up, "' (a parent of '", dir_in, "') is ", (S_ISREG(st.st_mode) ? "a regular file" : kind_of(st.st_mode)),
            ", not a folder");
  DLO_CHECK(::access(up.c_str(), W_OK | X_OK) == 0, "cannot create '", dir_in, "': '", up, "' is not writable");
}

void make_folders(const std::string& dir) {
  check_output_folder(dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DLO_CHECK_IO(!ec, "cannot create the folder '", dir, "': ", ec.message());
}

void check_regular_file(const std::string& path) {
  struct stat st;
  DLO_CHECK(::stat(path.c_str(), &st) == 0, "'", path, "': ", std::strerror(errno));
  DLO_CHECK(S_ISREG(st.st_mode), "'", path, "' is ", kind_of(st.st_mode), ", not a regular file");
}

std::string read_file(const std::string& path) {
  check_regular_file(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  // A file the user may not read is bad input; any other failure to open a regular file is I/O.
  DLO_CHECK_KIND(errno == EACCES || errno == EPERM ? ErrorKind::kInput : ErrorKind::kIo, fd >= 0, "cannot open '", path,
                 "': ", std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      DLO_CHECK_IO(false, "reading '", path, "': ", std::strerror(e));
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

std::string unique_temp_name(const std::string& final_path) {
  static std::atomic<unsigned> counter{0};
  return path_folder(final_path) + "/." + path_name(final_path) + ".tmp-" + host_name() + "-" + std::to_string(::getpid()) +
         "-" + std::to_string(counter++);
}

AtomicFile::AtomicFile(const std::string& path) : path_(resolve_output_path(path)) {
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    temp_ = unique_temp_name(path_);
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    DLO_CHECK_IO(fd_ >= 0 || errno == EEXIST, "cannot create '", temp_, "' (for '", path_, "'): ", std::strerror(errno));
  }
  DLO_CHECK_IO(fd_ >= 0, "cannot create a temporary file for '", path_, "'");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFile::write(const void* data, std::size_t n) {
  DLO_CHECK_KIND(::dlo::ErrorKind::kInternal, fd_ >= 0, "writing '", path_, "' after commit()");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min<std::size_t>(n, std::size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    DLO_CHECK_IO(w > 0, "writing '", path_, "' (temporary '", temp_, "'): ",
              w == 0 ? "no byte written" : std::strerror(errno));
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void AtomicFile::commit() {
  DLO_CHECK_KIND(::dlo::ErrorKind::kInternal, fd_ >= 0 && !committed_, "AtomicFile::commit() called twice for '", path_, "'");
  // The data may also have been written by a library through temp_path(): sync what is on disk.
  fsync_fd(fd_, temp_);
  const int fd = fd_;
  fd_ = -1;
  DLO_CHECK_IO(::close(fd) == 0, "closing '", temp_, "': ", std::strerror(errno));
  DLO_CHECK_IO(std::rename(temp_.c_str(), path_.c_str()) == 0, "renaming '", temp_, "' to '", path_,
            "': ", std::strerror(errno));
  committed_ = true;
  sync_folder(path_folder(path_));
}

int remove_stale_temporaries(const std::string& final_path) {
  const std::string dir = path_folder(final_path);
  const std::string prefix = "." + path_name(final_path) + ".tmp-" + host_name() + "-";
  int removed = 0;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());  // "<pid>-<n>"
    const auto dash = rest.find('-');
    if (dash == std::string::npos || dash == 0 || rest.find_first_not_of("0123456789-") != std::string::npos) continue;
    const long pid = std::strtol(rest.substr(0, dash).c_str(), nullptr, 10);
    if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)) stale.push_back(dir + "/" + name);
  }
  ::closedir(d);
  for (const auto& p : stale) {
    std::error_code ec;
    if (std::filesystem::remove_all(p, ec) > 0 && !ec) ++removed;
  }
  return removed;
}

void write_file_atomic(const std::string& path, std::string_view data) {
  AtomicFile f(path);
  f.write(data);
  f.commit();
}

void sync_folder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DLO_CHECK_IO(fd >= 0, "opening the folder '", dir, "': ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  DLO_CHECK_IO(rc == 0 || e == EINVAL || e == EROFS, "syncing the folder '", dir, "': ", std::strerror(e));
}

}  // namespace dlo
