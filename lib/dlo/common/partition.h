// Contiguous, in-order partitions of n items over p parts, as sequence parallelism splits tokens
// and heads: part r gets floor(n / p) items, and the first n % p parts one more. No padding, so
// every item is in exactly one part and parts differ by at most one item. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dlo/common/error.h"

namespace dlo {

struct Partition {
  std::vector<std::int64_t> offset, size;  // part r holds items [offset[r], offset[r] + size[r])

  std::int64_t parts() const { return static_cast<std::int64_t>(size.size()); }
  std::int64_t total() const { return size.empty() ? 0 : offset.back() + size.back(); }

  // Throws dlo::Error (input) naming `what` when parts < 1 or parts > n: a part without items
  // has no work and, in an all-to-all, nothing to send.
  static Partition even(std::int64_t n, std::int64_t parts, const std::string& what) {
    DLO_CHECK(parts >= 1, what, ": cannot split into ", parts, " parts");
    DLO_CHECK(parts <= n, what, ": ", n, " cannot be split into ", parts, " parts of at least one");
    Partition p;
    std::int64_t at = 0;
    for (std::int64_t r = 0; r < parts; ++r) {
      const std::int64_t s = n / parts + (r < n % parts ? 1 : 0);
      p.offset.push_back(at);
      p.size.push_back(s);
      at += s;
    }
    return p;
  }
};

}  // namespace dlo
