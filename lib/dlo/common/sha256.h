// SHA-256 (FIPS 180-4), implemented here so that dlo_core needs no crypto library. Used to compare
// frames and files across ranks, strategies and runs.
//
// Thread-safety: sha256_hex is thread-safe; one Sha256 object is driven by one thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dlo {

// Incremental SHA-256: update() any number of times (any sizes, including 0), then hex_digest().
class Sha256 {
 public:
  Sha256();
  // Appends `n` bytes at `data` (`data` may be null when `n` is 0).
  void update(const void* data, std::size_t n);
  // The digest of everything appended, as 64 lowercase hex digits. Ends the hash: a later
  // update() or digest call throws dlo::Error (call reset() to start over).
  std::string hex_digest();
  // The 32 raw digest bytes; same rule as hex_digest().
  std::array<std::uint8_t, 32> digest();
  // Starts a new, empty hash.
  void reset();

 private:
  void block(const std::uint8_t* p);
  std::array<std::uint32_t, 8> h_;
  std::array<std::uint8_t, 64> buf_;
  std::size_t buf_len_ = 0;
  std::uint64_t total_ = 0;  // bytes appended
  bool done_ = false;
};

// SHA-256 of `n` bytes at `data`, as 64 lowercase hex digits.
std::string sha256_hex(const void* data, std::size_t n);

}  // namespace dlo
