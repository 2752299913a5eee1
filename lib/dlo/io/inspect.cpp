#include "dlo/io/inspect.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dlo/common/bytes.h"

namespace dlo {
namespace {

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// Compares "blocks.2" < "blocks.10": digit runs compare by value.
bool natural_less(const std::string& a, const std::string& b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      std::size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit(static_cast<unsigned char>(a[i2]))) ++i2;
      while (j2 < b.size() && std::isdigit(static_cast<unsigned char>(b[j2]))) ++j2;
      std::string x = a.substr(i, i2 - i), y = b.substr(j, j2 - j);
      x.erase(0, std::min(x.find_first_not_of('0'), x.size() - 1));
      y.erase(0, std::min(y.find_first_not_of('0'), y.size() - 1));
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = i2;
      j = j2;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

}  // namespace

std::string group_prefix(const std::string& name) {
  std::string prefix;
  std::size_t start = 0;
  while (start <= name.size()) {
    std::size_t dot = name.find('.', start);
    std::string part = name.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    prefix += (prefix.empty() ? "" : ".") + part;
    if (all_digits(part)) return prefix;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  const auto dot = name.find('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

CheckpointSummary summarize(const Checkpoint& ck) {
  CheckpointSummary s;
  s.source = ck.source();
  s.files = ck.files().size();
  s.metadata = ck.metadata();
  std::map<std::string, CheckpointSummary::Group> groups;
  for (const TensorInfo* t : ck.tensors()) {
    ++s.tensors;
    s.bytes += t->nbytes;
    auto& d = s.by_dtype[std::string(dtype_name(t->dtype))];
    ++d.first;
    d.second += t->nbytes;
    auto& g = groups[group_prefix(t->name)];
    ++g.tensors;
    g.bytes += t->nbytes;
  }
  for (auto& [prefix, g] : groups) {
    g.prefix = prefix;
    s.groups.push_back(g);
  }
  std::sort(s.groups.begin(), s.groups.end(),
            [](const auto& a, const auto& b) { return natural_less(a.prefix, b.prefix); });
  return s;
}

std::string format_text(const CheckpointSummary& s) {
  std::ostringstream os;
  os << "checkpoint: " << s.source << "\n";
  os << "files:      " << s.files << "\n";
  os << "tensors:    " << s.tensors << "\n";
  os << "bytes:      " << s.bytes << " (" << human_bytes(s.bytes) << ")\n";
  os << "dtypes:\n";
  for (const auto& [name, tb] : s.by_dtype)
    os << "  " << name << ": " << tb.first << " tensors, " << human_bytes(tb.second) << "\n";
  if (!s.metadata.empty()) {
    os << "metadata:\n";
    for (const auto& [k, v] : s.metadata) os << "  " << k << ": " << v << "\n";
  }
  os << "by prefix:\n";
  std::size_t width = 0;
  for (const auto& g : s.groups) width = std::max(width, g.prefix.size());
  for (const auto& g : s.groups) {
    char line[64];
    std::snprintf(line, sizeof line, "%6llu tensors %12s",
                  static_cast<unsigned long long>(g.tensors), human_bytes(g.bytes).c_str());
    os << "  " << g.prefix << std::string(width - g.prefix.size() + 1, ' ') << line << "  ("
       << g.bytes << " B)\n";
  }
  return os.str();
}

std::string format_json(const CheckpointSummary& s) {
  nlohmann::ordered_json j;
  j["source"] = s.source;
  j["files"] = s.files;
  j["tensors"] = s.tensors;
  j["bytes"] = s.bytes;
  j["dtypes"] = nlohmann::ordered_json::object();
  for (const auto& [name, tb] : s.by_dtype) j["dtypes"][name] = {{"tensors", tb.first}, {"bytes", tb.second}};
  j["metadata"] = s.metadata;
  j["groups"] = nlohmann::ordered_json::array();
  for (const auto& g : s.groups)
    j["groups"].push_back({{"prefix", g.prefix}, {"tensors", g.tensors}, {"bytes", g.bytes}});
  return j.dump(2) + "\n";
}

}  // namespace dlo
