#include "dlo/common/text.h"

#include <algorithm>
#include <cctype>

namespace dlo {
namespace {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::string did_you_mean(const std::string& key, const std::vector<std::string>& known) {
  std::string k = key;
  for (auto& c : k) c = c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string best;
  std::size_t best_d = std::max<std::size_t>(2, k.size() / 3) + 1;
  for (const auto& cand : known) {
    const std::size_t d = edit_distance(k, cand);
    if (d < best_d) best_d = d, best = cand;
  }
  if (best.empty())
    for (const auto& cand : known)
      if (std::min(k.size(), cand.size()) >= 4 && (k.find(cand) != std::string::npos || cand.find(k) != std::string::npos)) {
        best = cand;
        break;
      }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

bool valid_utf8(const std::string& s, std::size_t* bad) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned c = p[i];
    std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = len != 0 && i + len <= n && !(len == 2 && c < 0xc2);
    for (std::size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xc0) == 0x80;
    if (ok && len == 3) {
      const unsigned cp = ((c & 0x0f) << 12) | ((p[i + 1] & 0x3f) << 6);
      ok = cp >= 0x800 && !(cp >= 0xd800 && cp <= 0xdfff);
    }
    if (ok && len == 4) {
      const unsigned cp = ((c & 0x07) << 18) | ((p[i + 1] & 0x3f) << 12);
      ok = cp >= 0x10000 && cp <= 0x10ffff;
    }
    if (!ok) {
      if (bad) *bad = i;
      return false;
    }
    i += len;
  }
  return true;
}

}  // namespace dlo
