#include "dlo/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dlo/common/error.h"

namespace dlo {

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DLO_CHECK(fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    int err = errno;
    ::close(fd);
    DLO_CHECK(false, "'", path, "' is not a regular file", err ? str(": ", std::strerror(err)) : "");
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  const std::byte* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      DLO_CHECK(false, "cannot mmap '", path, "' (", size, " bytes): ", std::strerror(err));
    }
    data = static_cast<const std::byte*>(p);
  }
  return std::shared_ptr<const MappedFile>(new MappedFile(path, fd, data, size));
}

MappedFile::MappedFile(std::string path, int fd, const std::byte* data, std::size_t size)
    : path_(std::move(path)), fd_(fd), data_(data), size_(size) {}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

void MappedFile::release_pages(std::uint64_t offset, std::uint64_t length) const {
  if (offset >= size_ || length == 0) return;
  length = std::min<std::uint64_t>(length, size_ - offset);
  // madvise needs a page-aligned start; only whole pages inside the range are dropped.
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t begin = (offset + page - 1) / page * page;
  const std::uint64_t end = (offset + length) / page * page;
  if (end > begin)
    ::madvise(const_cast<std::byte*>(data_) + begin, end - begin, MADV_DONTNEED);
  ::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(length), POSIX_FADV_DONTNEED);
}

}  // namespace dlo
