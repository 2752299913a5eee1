// Internal: generated Unicode / HTML tables used by the tokenizer (lib/dlo/text/text_tables.cpp).
#pragma once

#include <cstddef>
#include <string_view>
#include <utility>

namespace dlo::detail {

// Grapheme_Cluster_Break values (UAX #29); kOther for code points in no range.
enum Gcb : unsigned char { kOther, kCR, kLF, kControl, kExtend, kZWJ, kRegionalIndicator, kPrepend, kSpacingMark,
                           kL, kV, kT, kLV, kLVT };
// Indic_Conjunct_Break values.
enum InCB : unsigned char { kInCBNone, kLinker, kConsonant, kInCBExtend };

struct CodeRange {
  char32_t lo, hi;
};
struct GcbRange {
  char32_t lo, hi;
  Gcb value;
};
struct InCBRange {
  char32_t lo, hi;
  InCB value;
};

extern const std::pair<std::string_view, std::string_view> kHtml5Entities[];  // sorted by name
extern const std::size_t kHtml5EntityCount;
extern const GcbRange kGcbRanges[];  // sorted, disjoint; no LV/LVT (computed)
extern const std::size_t kGcbRangeCount;
extern const CodeRange kExtPictRanges[];  // Extended_Pictographic
extern const std::size_t kExtPictRangeCount;
extern const InCBRange kInCBRanges[];
extern const std::size_t kInCBRangeCount;

}  // namespace dlo::detail
