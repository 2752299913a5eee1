#include "dlo/common/settings.h"

#include <sched.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "dlo/common/error.h"

namespace dlo {

double parse_seconds_setting(const char* text, const std::string& name, double default_s) {
  if (text == nullptr) return default_s;
  const std::string s(text);
  char* end = nullptr;
  errno = 0;
  const bool plain = !s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.');
  const double v = plain ? std::strtod(s.c_str(), &end) : 0;
  DLO_CHECK(plain && end == s.c_str() + s.size() && errno == 0 && std::isfinite(v) && v > 0, name, "='", s,
            "' is not a number of seconds > 0");
  // Beyond this the clocks' integer nanoseconds would overflow (at about 9.2e9 s) and every wait
  // would end at once.
  DLO_CHECK(v <= kMaxSecondsSetting, name, "='", s, "' is more than ", kMaxSecondsSetting, " seconds");
  return v;
}

double gather_timeout_setting(const char* text) {
  return parse_seconds_setting(text, "DLO_GATHER_TIMEOUT_S", kDefaultGatherTimeoutS);
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int bound_threads(int requested, const std::string& what, std::string* note) {
  DLO_CHECK(requested >= 0, what, " must be >= 0 (0: the default), got ", requested);
  if (note != nullptr) note->clear();
  const int cores = available_cores();
  if (requested <= cores) return requested;
  if (note != nullptr)
    *note = str(what, " ", requested, " exceeds the ", cores, " core(s) this process may run on; using ", cores);
  return cores;
}

}  // namespace dlo
