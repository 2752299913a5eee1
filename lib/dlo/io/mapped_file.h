// A read-only memory mapping of a whole file (RAII).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace dlo {

// The path of the live MappedFile whose mapping holds `address`, copied NUL-terminated (cut to
// `n` bytes) into `out`; false when no mapping holds it. Lock-free and async-signal-safe: for a
// SIGBUS handler to name the file that changed under a mapping (see dlo/dist/tool.h).
bool mapped_file_at(const void* address, char* out, std::size_t n) noexcept;

class MappedFile {
 public:
  // Maps `path` read-only and shared, so every process mapping the same file shares one copy in
  // the page cache. Throws dlo::Error naming the path if it cannot be opened or mapped, or is not
  // a regular file (a FIFO is refused without blocking).
  // An empty file maps to size() == 0 and data() == nullptr.
  static std::shared_ptr<const MappedFile> open(const std::string& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Tells the kernel the byte range [offset, offset+length) will not be needed again, and drops
  // its page-cache pages when no other process holds them (posix_fadvise DONTNEED + MADV_DONTNEED).
  // Views into the range stay valid: touching them again faults the pages back in from disk.
  void release_pages(std::uint64_t offset, std::uint64_t length) const;

 private:
  MappedFile(std::string path, int fd, const std::byte* data, std::size_t size);
  std::string path_;
  int fd_ = -1;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace dlo
