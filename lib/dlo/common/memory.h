// Memory of this process as the kernel reports it (Linux /proc).
#pragma once

#include <cstdint>

namespace dlo {

struct ProcessMemory {
  std::int64_t rss_kb = -1;       // VmRSS: resident, shared file pages included
  std::int64_t hwm_kb = -1;       // VmHWM: peak RSS since start or the last reset_peak_rss()
  std::int64_t pss_kb = -1;       // Pss from smaps_rollup: shared pages divided among the sharers
  std::int64_t pss_anon_kb = -1;  // private (anonymous) part of PSS
  std::int64_t pss_file_kb = -1;  // file-backed part of PSS (mmap'ed checkpoints)
};

// Reads /proc/self/status and /proc/self/smaps_rollup; fields it cannot read stay -1.
ProcessMemory read_process_memory();

// Bytes this process could still allocate, for estimates made before work starts: the least of
// MemAvailable (/proc/meminfo) plus free swap, the address-space limit (RLIMIT_AS, ulimit -v) less
// what is mapped now, and the cgroup's memory.max less memory.current. 0 if none can be read.
std::uint64_t available_memory_bytes();

// Resets VmHWM to the current RSS (writes 5 to /proc/self/clear_refs). Returns false if refused.
bool reset_peak_rss();

}  // namespace dlo
