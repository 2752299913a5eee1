// Checked (saturating) arithmetic for sizes that come from user input: a memory estimate of a
// 2^40 x 2^40 video must read "more than 16 EiB", never a wrapped-around small number that fits.
// UINT64_MAX stands for "too large to count" and stays so through further sums and products.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace dlo {

inline constexpr std::uint64_t kSaturated = UINT64_MAX;

inline std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? kSaturated : r;
}

inline std::uint64_t sat_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? kSaturated : r;
}

// The product of `factors` (each a non-negative count), saturated. Negative factors count as 0.
inline std::uint64_t sat_product(std::initializer_list<std::int64_t> factors) {
  std::uint64_t p = 1;
  for (std::int64_t f : factors) p = sat_mul(p, f < 0 ? 0 : static_cast<std::uint64_t>(f));
  return p;
}

// `v` rounded up to a multiple of `a` (> 0), saturated.
inline std::uint64_t sat_round_up(std::uint64_t v, std::uint64_t a) { return sat_mul(sat_add(v, a - 1) / a, a); }

// `a` + `a` / 10: the 10% margin of the memory checks, saturated.
inline std::uint64_t with_margin(std::uint64_t a) { return sat_add(a, a / 10); }

}  // namespace dlo
