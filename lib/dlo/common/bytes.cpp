#include "dlo/common/bytes.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dlo/common/error.h"

namespace dlo {

std::string human_bytes(std::uint64_t n) {
  if (n == UINT64_MAX) return "more than 16 EiB";  // a saturated figure (common/checked.h)
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  else std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::uint64_t parse_bytes(std::string_view text, std::string_view what) {
  std::string s(text);
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  std::string number = s.substr(0, i), unit = s.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  char* end = nullptr;
  const double v = number.empty() ? NAN : std::strtod(number.c_str(), &end);
  DLO_CHECK(!number.empty() && end == number.c_str() + number.size() && std::isfinite(v), what,
            ": '", text, "' is not a byte size (e.g. 4096, 500MB, 10GB, 2GiB)");
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KB") scale = 1e3;
  else if (unit == "MB") scale = 1e6;
  else if (unit == "GB") scale = 1e9;
  else if (unit == "TB") scale = 1e12;
  else if (unit == "KIB") scale = 1024.0;
  else if (unit == "MIB") scale = 1024.0 * 1024;
  else if (unit == "GIB") scale = 1024.0 * 1024 * 1024;
  else if (unit == "TIB") scale = 1024.0 * 1024 * 1024 * 1024;
  DLO_CHECK(scale > 0, what, ": unknown unit '", unit, "' in '", text, "' (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  const double bytes = std::round(v * scale);
  DLO_CHECK(bytes < 18446744073709551615.0, what, ": '", text, "' is too large");
  return static_cast<std::uint64_t>(bytes);
}

}  // namespace dlo
