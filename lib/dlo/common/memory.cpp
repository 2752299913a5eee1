#include "dlo/common/memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <utility>

namespace dlo {
namespace {

// Reads "Key:   123 kB" lines from a /proc file into the given fields.
void read_kb_fields(const char* path, std::initializer_list<std::pair<const char*, std::int64_t*>> fields) {
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    for (const auto& [key, out] : fields) {
      const std::size_t n = std::strlen(key);
      if (std::strncmp(line, key, n) == 0 && line[n] == ':') {
        long long v = 0;
        if (std::sscanf(line + n + 1, "%lld", &v) == 1) *out = v;
      }
    }
  }
  std::fclose(f);
}

}  // namespace

ProcessMemory read_process_memory() {
  ProcessMemory m;
  read_kb_fields("/proc/self/status", {{"VmRSS", &m.rss_kb}, {"VmHWM", &m.hwm_kb}});
  read_kb_fields("/proc/self/smaps_rollup",
                 {{"Pss", &m.pss_kb}, {"Pss_Anon", &m.pss_anon_kb}, {"Pss_File", &m.pss_file_kb}});
  return m;
}

namespace {

std::int64_t read_number(const char* path) {
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return -1;
  long long v = -1;
  if (std::fscanf(f, "%lld", &v) != 1) v = -1;  // "max" reads as no number
  std::fclose(f);
  return v;
}

}  // namespace

std::uint64_t available_memory_bytes() {
  std::uint64_t best = UINT64_MAX;
  std::int64_t avail_kb = -1, swap_kb = -1;
  read_kb_fields("/proc/meminfo", {{"MemAvailable", &avail_kb}, {"SwapFree", &swap_kb}});
  if (avail_kb >= 0) best = static_cast<std::uint64_t>(avail_kb + std::max<std::int64_t>(swap_kb, 0)) * 1024;
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    std::int64_t vm_kb = -1;
    read_kb_fields("/proc/self/status", {{"VmSize", &vm_kb}});
    const std::uint64_t used = vm_kb > 0 ? static_cast<std::uint64_t>(vm_kb) * 1024 : 0;
    best = std::min<std::uint64_t>(best, rl.rlim_cur > used ? rl.rlim_cur - used : 0);
  }
  const std::int64_t max = read_number("/sys/fs/cgroup/memory.max");
  const std::int64_t cur = read_number("/sys/fs/cgroup/memory.current");
  if (max > 0 && cur >= 0) best = std::min<std::uint64_t>(best, max > cur ? static_cast<std::uint64_t>(max - cur) : 0);
  return best == UINT64_MAX ? 0 : best;
}

bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return (std::fclose(f) == 0) && ok;
}

}  // namespace dlo
