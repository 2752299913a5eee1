// Small text helpers shared by the readers of user input (manifests, flags, configs).
// Thread-safety: all functions are thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dlo {

// Whether `s` is valid UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF). On
// failure *bad (if given) is the offset of the first bad byte.
bool valid_utf8(const std::string& s, std::size_t* bad = nullptr);

// " (did you mean 'steps'?)" or "": the closest of `known` to `word` by edit distance (case and
// '-' vs '_' ignored), or one that contains it or is contained in it ("num_frames" -> "frames").
std::string did_you_mean(const std::string& word, const std::vector<std::string>& known);

}  // namespace dlo
