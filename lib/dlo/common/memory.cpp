#include "dlo/common/memory.h"

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

bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return (std::fclose(f) == 0) && ok;
}

}  // namespace dlo
