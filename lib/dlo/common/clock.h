// Wall-clock intervals for reports and estimates (steady clock: immune to clock changes).
#pragma once

#include <chrono>

namespace dlo {

using SteadyClock = std::chrono::steady_clock;

// Seconds from `t0` to now.
inline double seconds_since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

}  // namespace dlo
