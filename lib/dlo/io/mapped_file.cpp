#include "dlo/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "dlo/common/error.h"
#include "dlo/common/file.h"

namespace dlo {
namespace {

// Live mappings, for mapped_file_at(). A slot is claimed by CAS on `begin`; `path` points into the
// MappedFile's own string, which outlives the slot (the destructor frees the slot first).
struct Slot {
  std::atomic<const std::byte*> begin{nullptr};
  std::atomic<std::size_t> size{0};
  std::atomic<const char*> path{nullptr};
};
constexpr std::size_t kSlots = 4096;
Slot g_slots[kSlots];

void register_mapping(const std::byte* begin, std::size_t size, const char* path) {
  for (auto& s : g_slots) {
    const std::byte* expected = nullptr;
    if (s.begin.load(std::memory_order_relaxed) == nullptr &&
        s.begin.compare_exchange_strong(expected, begin)) {
      s.path.store(path);
      s.size.store(size);
      return;
    }
  }
  // More than kSlots live mappings: the file is simply not named in a SIGBUS message.
}

void unregister_mapping(const std::byte* begin) {
  for (auto& s : g_slots)
    if (s.begin.load() == begin) {
      s.size.store(0);
      s.path.store(nullptr);
      s.begin.store(nullptr);
      return;
    }
}

}  // namespace

bool mapped_file_at(const void* address, char* out, std::size_t n) noexcept {
  const auto* a = static_cast<const std::byte*>(address);
  for (auto& s : g_slots) {
    const std::byte* b = s.begin.load();
    if (b == nullptr || a < b || a >= b + s.size.load()) continue;
    const char* p = s.path.load();
    if (p == nullptr || n == 0) return false;
    std::size_t i = 0;
    for (; i + 1 < n && p[i] != '\0'; ++i) out[i] = p[i];
    out[i] = '\0';
    return true;
  }
  return false;
}

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
  check_regular_file(path);  // by stat: names a FIFO, device or folder without opening it
  // O_NONBLOCK: opening a FIFO returns at once (and is refused below) instead of waiting for a writer.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  DLO_CHECK(fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    DLO_CHECK(false, "'", path, "' is not a regular file (it changed while being opened)");
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
    : path_(std::move(path)), fd_(fd), data_(data), size_(size) {
  if (data_ != nullptr) register_mapping(data_, size_, path_.c_str());
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) unregister_mapping(data_);
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
