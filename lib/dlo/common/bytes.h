// Byte counts for people: formatting and parsing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dlo {

// "1.50 GiB", "12.0 KiB", "17 B"; UINT64_MAX (a saturated figure) is "more than 16 EiB".
std::string human_bytes(std::uint64_t n);

// Parses "123", "10GB" (10^9, as diffusers' max_shard_size), "5GiB" (2^30), "1.5MB", "64KiB".
// Throws dlo::Error naming `what` for anything else or a value beyond 2^64.
std::uint64_t parse_bytes(std::string_view text, std::string_view what);

}  // namespace dlo
