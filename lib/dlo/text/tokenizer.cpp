#include "dlo/text/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/text/text_tables.h"

namespace dlo {

namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------------------------------------
// UTF-8

std::u32string utf8_decode(std::string_view s, const char* what) {
  std::u32string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    int len = 0;
    char32_t cp = 0;
    if (b < 0x80) {
      len = 1, cp = b;
    } else if ((b & 0xE0) == 0xC0) {
      len = 2, cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3, cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4, cp = b & 0x07;
    }
    DLO_CHECK(len > 0 && i + len <= s.size(), what, " is not valid UTF-8 (byte ", i, ")");
    for (int k = 1; k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      DLO_CHECK((c & 0xC0) == 0x80, what, " is not valid UTF-8 (byte ", i + k, ")");
      cp = (cp << 6) | (c & 0x3F);
    }
    static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    DLO_CHECK(cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF), what,
              " is not valid UTF-8 (byte ", i, ")");
    out.push_back(cp);
    i += len;
  }
  return out;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

// Length of the UTF-8 sequence starting with byte `b` (input already validated).
std::size_t utf8_len(unsigned char b) { return b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : 4; }

// Unicode White_Space: Python `regex`'s \s, Rust's char::is_whitespace (tokenizers' WhitespaceSplit).
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Python's str.isspace() (what str.strip() removes): White_Space plus U+001C..U+001F.
bool is_py_space(char32_t c) { return is_white_space(c) || (c >= 0x1C && c <= 0x1F); }

std::u32string py_strip(const std::u32string& s) {
  std::size_t b = 0, e = s.size();
  while (b < e && is_py_space(s[b])) ++b;
  while (e > b && is_py_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// ---------------------------------------------------------------------------------------------
// html.unescape (CPython 3.11 Lib/html/__init__.py)

// _invalid_charrefs: numeric references the HTML5 spec remaps (0x00, 0x0D, 0x80..0x9F as cp1252).
bool invalid_charref(std::uint64_t num, std::u32string& out) {
  static constexpr char32_t kCp1252[32] = {0x20AC, 0x81,   0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021,
                                           0x02C6, 0x2030, 0x0160, 0x2039, 0x0152, 0x8D,   0x017D, 0x8F,
                                           0x90,   0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014,
                                           0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x9D,   0x017E, 0x0178};
  if (num == 0x00) {
    out.push_back(0xFFFD);
  } else if (num == 0x0D) {
    out.push_back(0x0D);
  } else if (num >= 0x80 && num <= 0x9F) {
    out.push_back(kCp1252[num - 0x80]);
  } else {
    return false;
  }
  return true;
}

// _invalid_codepoints: controls and noncharacters, replaced by nothing.
bool invalid_codepoint(std::uint64_t c) {
  return (c >= 0x1 && c <= 0x8) || c == 0xB || (c >= 0xE && c <= 0x1F) || (c >= 0x7F && c <= 0x9F) ||
         (c >= 0xFDD0 && c <= 0xFDEF) || (c <= 0x10FFFF && (c & 0xFFFE) == 0xFFFE);
}

const std::string_view* find_entity(std::string_view name) {
  const auto* begin = detail::kHtml5Entities;
  const auto* end = begin + detail::kHtml5EntityCount;
  const auto* it = std::lower_bound(begin, end, name, [](const auto& e, std::string_view n) { return e.first < n; });
  return it != end && it->first == name ? &it->second : nullptr;
}

bool is_digit(char32_t c) { return c >= '0' && c <= '9'; }
bool is_hex(char32_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

std::u32string html_unescape32(const std::u32string& s) {
  if (s.find(U'&') == std::u32string::npos) return s;
  std::u32string out;
  out.reserve(s.size());
  const std::size_t n = s.size();
  std::size_t i = 0;
  auto numeric = [&](std::size_t digits_begin, std::size_t digits_end, int base) {
    std::uint64_t num = 0;
    for (std::size_t k = digits_begin; k < digits_end; ++k) {
      const char32_t c = s[k];
      const int d = is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
      num = std::min<std::uint64_t>(num * base + d, 0x7FFFFFFF);  // saturate: anything > 0x10FFFF is U+FFFD
    }
    if (invalid_charref(num, out)) return;
    if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) {
      out.push_back(0xFFFD);
    } else if (!invalid_codepoint(num)) {
      out.push_back(static_cast<char32_t>(num));
    }
  };
  while (i < n) {
    if (s[i] != U'&') {
      out.push_back(s[i++]);
      continue;
    }
    const std::size_t j = i + 1;
    if (j < n && s[j] == U'#') {
      // '#[0-9]+;?' then '#[xX][0-9a-fA-F]+;?'
      std::size_t k = j + 1;
      while (k < n && is_digit(s[k])) ++k;
      if (k > j + 1) {
        numeric(j + 1, k, 10);
        i = k + (k < n && s[k] == U';');
        continue;
      }
      if (j + 1 < n && (s[j + 1] == U'x' || s[j + 1] == U'X')) {
        k = j + 2;
        while (k < n && is_hex(s[k])) ++k;
        if (k > j + 2) {
          numeric(j + 2, k, 16);
          i = k + (k < n && s[k] == U';');
          continue;
        }
      }
      out.push_back(s[i++]);  // no match: '&' stays
      continue;
    }
    // '[^\t\n\f <&#;]{1,32};?'
    std::size_t k = j;
    while (k < n && k - j < 32 && s[k] != U'\t' && s[k] != U'\n' && s[k] != U'\f' && s[k] != U' ' && s[k] != U'<' &&
           s[k] != U'&' && s[k] != U'#' && s[k] != U';')
      ++k;
    if (k == j) {
      out.push_back(s[i++]);
      continue;
    }
    const bool semi = k < n && s[k] == U';';
    const std::u32string name = s.substr(j, k - j + (semi ? 1 : 0));
    i = k + (semi ? 1 : 0);
    const std::string name8 = utf8_encode(name);
    if (const auto* v = find_entity(name8)) {
      out += utf8_decode(*v, "entity");
      continue;
    }
    // The longest prefix (of at least 2 characters) that is a name.
    bool found = false;
    for (std::size_t x = name.size() - 1; x > 1; --x) {
      if (const auto* v = find_entity(utf8_encode(name.substr(0, x)))) {
        out += utf8_decode(*v, "entity");
        out += name.substr(x);
        found = true;
        break;
      }
    }
    if (!found) {
      out.push_back(U'&');
      out += name;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// A little protobuf wire format, for SentencePiece's ModelProto (sentencepiece_model.proto).

struct ProtoReader {
  std::string_view data;
  std::size_t pos = 0;
  std::string where;

  bool done() const { return pos >= data.size(); }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      DLO_CHECK(pos < data.size(), where, ": truncated protobuf");
      const auto b = static_cast<unsigned char>(data[pos++]);
      v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    DLO_CHECK(false, where, ": bad protobuf varint");
    return 0;
  }
  // Reads one field: returns (field number, wire type) and sets the payload (varint value or bytes).
  std::pair<std::uint32_t, int> field(std::uint64_t& value, std::string_view& bytes) {
    const std::uint64_t key = varint();
    const int wire = static_cast<int>(key & 7);
    const auto num = static_cast<std::uint32_t>(key >> 3);
    switch (wire) {
      case 0:
        value = varint();
        break;
      case 1:
        DLO_CHECK(pos + 8 <= data.size(), where, ": truncated protobuf");
        bytes = data.substr(pos, 8), pos += 8;
        break;
      case 2: {
        const std::uint64_t len = varint();
        DLO_CHECK(len <= data.size() - pos, where, ": truncated protobuf");
        bytes = data.substr(pos, len), pos += len;
        break;
      }
      case 5:
        DLO_CHECK(pos + 4 <= data.size(), where, ": truncated protobuf");
        bytes = data.substr(pos, 4), pos += 4;
        break;
      default:
        DLO_CHECK(false, where, ": unsupported protobuf wire type ", wire);
    }
    return {num, wire};
  }
};

// SentencePiece piece types (ModelProto.SentencePiece.Type): NORMAL 1 .. BYTE 6.
enum PieceType { kPieceNormal = 1, kPieceUnknown = 2, kPieceControl = 3, kPieceUserDefined = 4, kPieceByte = 6 };

struct SpmModel {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<int> types;
  int model_type = 1;                // TrainerSpec.model_type: UNIGRAM
  bool byte_fallback = false;        // TrainerSpec.byte_fallback
  std::string precompiled_charsmap;  // NormalizerSpec.precompiled_charsmap
};

SpmModel parse_spm(std::string_view bytes, const std::string& where) {
  SpmModel m;
  ProtoReader r{bytes, 0, where};
  while (!r.done()) {
    std::uint64_t v = 0;
    std::string_view b;
    const auto [num, wire] = r.field(v, b);
    if (num == 1 && wire == 2) {  // repeated SentencePiece pieces
      ProtoReader pr{b, 0, where};
      std::string piece;
      float score = 0;
      int type = kPieceNormal;
      while (!pr.done()) {
        std::uint64_t pv = 0;
        std::string_view pb;
        const auto [pn, pw] = pr.field(pv, pb);
        if (pn == 1 && pw == 2) piece = std::string(pb);
        if (pn == 2 && pw == 5) std::memcpy(&score, pb.data(), 4);
        if (pn == 3 && pw == 0) type = static_cast<int>(pv);
      }
      m.pieces.push_back(std::move(piece));
      m.scores.push_back(score);
      m.types.push_back(type);
    } else if (num == 2 && wire == 2) {  // TrainerSpec
      ProtoReader tr{b, 0, where};
      while (!tr.done()) {
        std::uint64_t tv = 0;
        std::string_view tb;
        const auto [tn, tw] = tr.field(tv, tb);
        if (tn == 3 && tw == 0) m.model_type = static_cast<int>(tv);
        if (tn == 35 && tw == 0) m.byte_fallback = tv != 0;
      }
    } else if (num == 3 && wire == 2) {  // NormalizerSpec
      ProtoReader nr{b, 0, where};
      while (!nr.done()) {
        std::uint64_t nv = 0;
        std::string_view nb;
        const auto [nn, nw] = nr.field(nv, nb);
        if (nn == 2 && nw == 2) m.precompiled_charsmap = std::string(nb);
      }
    }
  }
  return m;
}

// What SentencePiece itself refuses when it loads a unigram model (model_interface.cc,
// unigram_model.cc: no pieces, an empty or repeated piece, not exactly one unknown piece, a byte
// piece in a model without byte fallback, one not named <0x00>..<0xFF>, other than 256 of them
// with it; also a type outside its enum, which protobuf would read as normal; each checked
// against Python sentencepiece), checked here so that the library is not linked: libsentencepiece.so.0
// exports a 32-byte FLAGS_minloglevel that the dynamic linker binds to libc10's 4-byte one of the
// same name, and its constructor then overwrote libc10's neighbouring globals (among them
// FLAGS_caffe2_use_fatal_for_enforce: a failed allocation in libtorch aborted the process instead
// of throwing). The model's own structure is what parse_spm reads.
void check_spm(const SpmModel& m, const std::string& where) {
  DLO_CHECK(!m.pieces.empty(), where, ": no pieces (not a SentencePiece model?)");
  std::unordered_map<std::string_view, std::size_t> seen;
  std::int64_t unknown = 0, bytes = 0;
  for (std::size_t i = 0; i < m.pieces.size(); ++i) {
    DLO_CHECK(!m.pieces[i].empty(), where, ": piece ", i, " is empty");
    DLO_CHECK(m.types[i] >= kPieceNormal && m.types[i] <= kPieceByte, where, ": piece ", i, " ('", m.pieces[i],
              "') has type ", m.types[i], ", not one of SentencePiece's 1-6");
    const auto [it, fresh] = seen.emplace(m.pieces[i], i);
    DLO_CHECK(fresh, where, ": piece '", m.pieces[i], "' appears twice (ids ", it->second, " and ", i, ")");
    unknown += m.types[i] == kPieceUnknown;
    if (m.types[i] == kPieceByte) {
      DLO_CHECK(m.byte_fallback, where, ": piece ", i, " ('", m.pieces[i],
                "') is a byte piece (type 6), but the model's byte_fallback is off");
      const std::string& b = m.pieces[i];
      const auto upper_hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); };
      DLO_CHECK(b.size() == 6 && b.compare(0, 3, "<0x") == 0 && upper_hex(b[3]) && upper_hex(b[4]) && b[5] == '>',
                where, ": byte piece ", i, " is named '", b, "', not <0x00> .. <0xFF>");
      ++bytes;
    }
  }
  DLO_CHECK(unknown == 1, where, ": ", unknown, " unknown pieces (type 2); a SentencePiece model has exactly one");
  DLO_CHECK(!m.byte_fallback || bytes == 256, where, ": ", bytes,
            " byte pieces (type 6); a model with byte_fallback has one for each of the 256 bytes");
}

// ---------------------------------------------------------------------------------------------
// Grapheme clusters (UAX #29 extended grapheme clusters, as Rust's unicode-segmentation
// `graphemes(true)`, which transformers' Precompiled normaliser uses).

template <typename Range>
const Range* find_range(const Range* ranges, std::size_t n, char32_t c) {
  const Range* end = ranges + n;
  const Range* it = std::upper_bound(ranges, end, c, [](char32_t x, const Range& r) { return x < r.lo; });
  if (it == ranges) return nullptr;
  --it;
  return c <= it->hi ? it : nullptr;
}

detail::Gcb gcb_of(char32_t c) {
  if (c >= 0xAC00 && c <= 0xD7A3) return (c - 0xAC00) % 28 == 0 ? detail::kLV : detail::kLVT;
  const auto* r = find_range(detail::kGcbRanges, detail::kGcbRangeCount, c);
  return r ? r->value : detail::kOther;
}
bool is_ext_pict(char32_t c) { return find_range(detail::kExtPictRanges, detail::kExtPictRangeCount, c) != nullptr; }
detail::InCB incb_of(char32_t c) {
  const auto* r = find_range(detail::kInCBRanges, detail::kInCBRangeCount, c);
  return r ? r->value : detail::kInCBNone;
}

// Start indices of the grapheme clusters of `s`.
std::vector<std::size_t> grapheme_starts(const std::u32string& s) {
  using namespace detail;
  std::vector<std::size_t> starts;
  if (s.empty()) return starts;
  starts.push_back(0);
  Gcb prev = gcb_of(s[0]);
  int ri_run = prev == kRegionalIndicator ? 1 : 0;  // consecutive RIs ending at the previous char
  int emoji = is_ext_pict(s[0]) ? 1 : 0;            // 1: ExtPict Extend*; 2: ... ZWJ
  int incb = incb_of(s[0]) == kConsonant ? 1 : 0;   // 1: Consonant [Extend|Linker]*; 2: ... with a Linker
  for (std::size_t i = 1; i < s.size(); ++i) {
    const char32_t c = s[i];
    const Gcb cur = gcb_of(c);
    const InCB ic = incb_of(c);
    const bool pict = is_ext_pict(c);
    bool brk = true;
    if (prev == kCR && cur == kLF) {
      brk = false;  // GB3
    } else if (prev == kControl || prev == kCR || prev == kLF || cur == kControl || cur == kCR || cur == kLF) {
      brk = true;  // GB4, GB5
    } else if (prev == kL && (cur == kL || cur == kV || cur == kLV || cur == kLVT)) {
      brk = false;  // GB6
    } else if ((prev == kLV || prev == kV) && (cur == kV || cur == kT)) {
      brk = false;  // GB7
    } else if ((prev == kLVT || prev == kT) && cur == kT) {
      brk = false;  // GB8
    } else if (cur == kExtend || cur == kZWJ || cur == kSpacingMark || prev == kPrepend) {
      brk = false;  // GB9, GB9a, GB9b
    } else if (ic == kConsonant && incb == 2) {
      brk = false;  // GB9c
    } else if (pict && emoji == 2) {
      brk = false;  // GB11
    } else if (cur == kRegionalIndicator && prev == kRegionalIndicator && ri_run % 2 == 1) {
      brk = false;  // GB12, GB13
    }
    if (brk) starts.push_back(i);
    ri_run = cur == kRegionalIndicator ? ri_run + 1 : 0;
    if (pict) {
      emoji = 1;
    } else if (emoji == 1 && cur == kExtend) {
      emoji = 1;
    } else if (emoji == 1 && cur == kZWJ) {
      emoji = 2;
    } else {
      emoji = 0;
    }
    if (ic == kConsonant) {
      incb = 1;
    } else if (incb >= 1 && ic == kLinker) {
      incb = 2;
    } else if (!(incb >= 1 && ic == kInCBExtend)) {
      incb = 0;
    }
    prev = cur;
  }
  return starts;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SentencePiece's precompiled charsmap, applied as transformers' Precompiled normaliser does
// (spm_precompiled): per grapheme cluster under 6 bytes, the replacement of the SHORTEST rule
// matching a prefix of the cluster replaces the whole cluster; otherwise per character. Not in
// the anonymous namespace: T5Tokenizer::Impl, which has external linkage, holds one (a member of
// an internal type is what -Wsubobject-linkage flags once the unity build includes this file).
namespace tokenizer_detail {

class Charsmap {
 public:
  Charsmap() = default;
  Charsmap(std::string_view blob, const std::string& where) {
    if (blob.empty()) return;
    DLO_CHECK(blob.size() >= 4, where, ": precompiled_charsmap is truncated");
    std::uint32_t trie_bytes = 0;
    std::memcpy(&trie_bytes, blob.data(), 4);  // little-endian (x86/ARM)
    DLO_CHECK(trie_bytes % 4 == 0 && trie_bytes <= blob.size() - 4, where,
              ": precompiled_charsmap has a bad trie size ", trie_bytes);
    units_.resize(trie_bytes / 4);
    std::memcpy(units_.data(), blob.data() + 4, trie_bytes);
    normalized_ = std::string(blob.substr(4 + trie_bytes));
    utf8_decode(normalized_, (where + ": precompiled_charsmap replacement strings").c_str());
    DLO_CHECK(!units_.empty(), where, ": precompiled_charsmap has an empty trie");
  }
  bool empty() const { return units_.empty(); }

  // The replacement under the first (shortest) rule matching a prefix of `chunk`.
  bool transform(std::string_view chunk, std::string_view& out) const {
    auto offset = [](std::uint32_t u) -> std::size_t { return (u >> 10) << ((u & (1u << 9)) >> 6); };
    std::size_t pos = offset(units_[0]);
    for (const char ch : chunk) {
      const auto c = static_cast<unsigned char>(ch);
      if (c == 0) break;
      pos ^= c;
      if (pos >= units_.size()) return false;
      const std::uint32_t unit = units_[pos];
      if ((unit & (0x80000000u | 0xFFu)) != c) return false;
      pos ^= offset(unit);
      if ((unit >> 8) & 1) {
        if (pos >= units_.size()) return false;
        const std::size_t v = units_[pos] & 0x7FFFFFFFu;
        if (v > normalized_.size()) return false;
        const std::size_t nul = normalized_.find('\0', v);
        out = std::string_view(normalized_).substr(v, (nul == std::string::npos ? normalized_.size() : nul) - v);
        return true;
      }
    }
    return false;
  }

  std::string normalize(const std::string& text) const {
    if (empty()) return text;
    const std::u32string s = utf8_decode(text, "text");
    const std::vector<std::size_t> starts = grapheme_starts(s);
    std::string out;
    out.reserve(text.size());
    std::string_view rep;
    for (std::size_t g = 0; g < starts.size(); ++g) {
      const std::size_t b = starts[g], e = g + 1 < starts.size() ? starts[g + 1] : s.size();
      const std::string cluster = utf8_encode(std::u32string_view(s).substr(b, e - b));
      if (cluster.size() < 6 && transform(cluster, rep)) {
        out.append(rep);
        continue;
      }
      std::string ch;
      for (std::size_t k = b; k < e; ++k) {
        ch.clear();
        utf8_append(ch, s[k]);
        if (transform(ch, rep)) {
          out.append(rep);
        } else {
          out.append(ch);
        }
      }
    }
    return out;
  }

 private:
  std::vector<std::uint32_t> units_;
  std::string normalized_;
};

}  // namespace tokenizer_detail
using tokenizer_detail::Charsmap;

namespace {

// Files are read with dlo::read_file (by stat first: a FIFO named spiece.model is refused).

// A special-token entry of tokenizer_config.json: "text" or {"content": "text", ...}.
std::string token_content(const nlohmann::json& j, const std::string& where) {
  if (j.is_string()) return j.get<std::string>();
  DLO_CHECK(j.is_object() && j.contains("content") && j["content"].is_string(), where,
            ": a special token must be a string or an object with 'content', got ", j.dump());
  return j["content"].get<std::string>();
}

constexpr std::string_view kMeta = "\xE2\x96\x81";  // U+2581, SentencePiece's whitespace mark

// RFC 4648 base64 (with or without '=' padding), as tokenizers serialises precompiled_charsmap.
std::string base64_decode(const std::string& in, const std::string& where) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::size_t n = in.size();
  while (n > 0 && in[n - 1] == '=') --n;
  DLO_CHECK(in.size() - n <= 2 && n % 4 != 1, where, ": not base64 (length ", in.size(), ")");
  std::string out;
  out.reserve(n * 3 / 4);
  std::uint32_t acc = 0;
  int bits = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const int v = value(in[i]);
    DLO_CHECK(v >= 0, where, ": not base64 (character ", static_cast<int>(static_cast<unsigned char>(in[i])),
              " at offset ", i, ")");
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFFu));
    }
  }
  return out;
}

// `path` parsed; dlo::Error naming it unless it is a JSON object.
nlohmann::json read_json_object(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    DLO_CHECK(false, path, ": not valid JSON: ", e.what());
  }
  DLO_CHECK(j.is_object(), path, ": not a JSON object");
  return j;
}

// The parts of a T5 tokenizer, from spiece.model or from tokenizer.json.
struct TokenizerData {
  std::string charsmap_blob;                            // empty: no normaliser
  std::vector<std::string> vocab;                       // id -> token (extra ids included)
  std::vector<double> scores;
  std::vector<std::pair<std::string, std::int64_t>> added;  // tokens split out of the raw text
  std::string source;                                   // the file, for errors
};

const nlohmann::json& json_field(const nlohmann::json& j, const char* key, const std::string& where) {
  DLO_CHECK(j.is_object() && j.contains(key), where, ": no field '", key, "'");
  return j[key];
}

// tokenizer.json as transformers 5's save_pretrained writes a T5 tokenizer (tokenizers'
// serialisation of T5TokenizerFast): model Unigram (unk_id 2, no byte fallback), normaliser
// Precompiled (alone or as the only member of a Sequence) or none, pre-tokeniser
// Sequence[WhitespaceSplit, Metaspace("\u2581", prepend_scheme "always", split)], post-processor
// "$A </s>", added tokens matched on the raw text. Anything else is refused by name rather than
// guessed at. (For a T5Tokenizer, transformers 5 takes only the vocabulary, the charsmap and the
// added tokens from the file and rebuilds the rest, so it also accepts transformers 4's
// Sequence[Precompiled, Strip, Replace] files, which dlo refuses for now.)
TokenizerData read_tokenizer_json(const std::string& path) {
  const nlohmann::json j = read_json_object(path);
  TokenizerData d;
  d.source = path;

  const auto& model = json_field(j, "model", path);
  const std::string type = model.value("type", std::string());
  DLO_CHECK(type == "Unigram", path, ": field 'model.type' is '", type,
            "'; T5 tokenizers are Unigram models (BPE, WordPiece and WordLevel are not supported)");
  DLO_CHECK(!model.value("byte_fallback", false), path,
            ": field 'model.byte_fallback' is true; byte fallback is not supported (transformers' T5 tokenizer "
            "does not use it)");
  DLO_CHECK(model.contains("unk_id") && model["unk_id"].is_number_integer() && model["unk_id"].get<std::int64_t>() == 2,
            path, ": field 'model.unk_id' must be 2 (T5's <unk>), got ",
            model.contains("unk_id") ? model["unk_id"].dump() : std::string("nothing"));
  const auto& vocab = json_field(model, "vocab", path + ": field 'model'");
  DLO_CHECK(vocab.is_array() && !vocab.empty(), path, ": field 'model.vocab' must be a non-empty list");
  for (std::size_t i = 0; i < vocab.size(); ++i) {
    const auto& e = vocab[i];
    DLO_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_number(), path, ": field 'model.vocab[",
              i, "]' must be [piece, score], got ", e.dump());
    d.vocab.push_back(e[0].get<std::string>());
    d.scores.push_back(e[1].get<double>());
  }

  const auto& norm = json_field(j, "normalizer", path);
  const nlohmann::json* pre = &norm;
  if (norm.is_object() && norm.value("type", std::string()) == "Sequence") {
    const auto& list = json_field(norm, "normalizers", path + ": field 'normalizer'");
    DLO_CHECK(list.is_array() && list.size() == 1, path,
              ": field 'normalizer.normalizers' must hold exactly one Precompiled normaliser, got ", list.dump());
    pre = &list[0];
  }
  if (!pre->is_null()) {
    const std::string t = pre->value("type", std::string());
    DLO_CHECK(t == "Precompiled", path, ": normaliser '", t,
              "' is not supported (T5 tokenizers use SentencePiece's Precompiled charsmap)");
    const auto& blob = json_field(*pre, "precompiled_charsmap", path + ": the Precompiled normaliser");
    if (!blob.is_null()) {
      DLO_CHECK(blob.is_string(), path, ": field 'precompiled_charsmap' must be a base64 string");
      d.charsmap_blob = base64_decode(blob.get<std::string>(), path + ": field 'precompiled_charsmap'");
    }
  }

  const auto& pt = json_field(j, "pre_tokenizer", path);
  auto is_whitespace_split = [](const nlohmann::json& p) { return p.is_object() && p.value("type", "") == "WhitespaceSplit"; };
  auto is_metaspace = [](const nlohmann::json& p) {
    return p.is_object() && p.value("type", "") == "Metaspace" && p.value("replacement", "") == std::string(kMeta) &&
           p.value("prepend_scheme", "") == "always" && p.value("split", false);
  };
  DLO_CHECK(pt.is_object() && pt.value("type", "") == "Sequence" && pt.contains("pretokenizers") &&
                pt["pretokenizers"].is_array() && pt["pretokenizers"].size() == 2 &&
                is_whitespace_split(pt["pretokenizers"][0]) && is_metaspace(pt["pretokenizers"][1]),
            path, ": field 'pre_tokenizer' is not T5's Sequence[WhitespaceSplit, Metaspace(replacement U+2581, "
                  "prepend_scheme always, split true)], got ", pt.dump());

  const auto& post = json_field(j, "post_processor", path);
  const std::string post_want =
      R"([{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"</s>","type_id":0}}])";
  DLO_CHECK(post.is_object() && post.value("type", "") == "TemplateProcessing" && post.contains("single") &&
                post["single"].dump() == nlohmann::json::parse(post_want).dump(),
            path, ": field 'post_processor' must be TemplateProcessing with single = \"$A </s>\" (what dlo and "
                  "WanPipeline add), got ", post.dump());

  const auto& added = json_field(j, "added_tokens", path);
  DLO_CHECK(added.is_array(), path, ": field 'added_tokens' must be a list");
  for (std::size_t i = 0; i < added.size(); ++i) {
    const auto& a = added[i];
    const std::string where = str(path, ": field 'added_tokens[", i, "]'");
    DLO_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a.contains("content") &&
                  a["content"].is_string(),
              where, " must be an object with an integer 'id' and a string 'content', got ", a.dump());
    const auto id = a["id"].get<std::int64_t>();
    const std::string content = a["content"].get<std::string>();
    DLO_CHECK(id >= 0 && id < static_cast<std::int64_t>(d.vocab.size()) && d.vocab[id] == content, where, ": '",
              content, "' with id ", id, " is not that entry of model.vocab; added tokens outside the vocabulary are "
              "not supported");
    for (const char* flag : {"lstrip", "rstrip", "single_word", "normalized"})
      DLO_CHECK(!a.value(flag, false), where, ": '", content, "' has ", flag,
                " = true; only added tokens matched exactly on the raw text are supported");
    if (!content.empty()) d.added.emplace_back(content, id);
  }
  return d;
}

}  // namespace

std::string html_unescape(const std::string& text) { return utf8_encode(html_unescape32(utf8_decode(text, "text"))); }

std::string prompt_clean(const std::string& text) {
  // basic_clean: [ftfy.fix_text: skipped, as diffusers does without ftfy]; html.unescape twice; strip.
  std::u32string s = py_strip(html_unescape32(html_unescape32(utf8_decode(text, "prompt"))));
  // whitespace_clean: regex.sub(r"\s+", " ", text).strip()
  std::u32string w;
  w.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    if (is_white_space(s[i])) {
      w.push_back(U' ');
      while (i < s.size() && is_white_space(s[i])) ++i;
    } else {
      w.push_back(s[i++]);
    }
  }
  return utf8_encode(py_strip(w));
}

// ---------------------------------------------------------------------------------------------
// T5Tokenizer

struct T5Tokenizer::Impl {
  std::string dir;
  std::string source;  // the file read
  Charsmap charsmap;
  std::vector<std::string> vocab;                     // id -> token
  std::vector<double> scores;
  std::unordered_map<std::string, std::int64_t> ids;  // token -> id (the last id for duplicates)
  std::size_t max_token_bytes = 0;
  double min_score = 0;
  std::vector<std::pair<std::string, std::int64_t>> added;  // split out of the raw text first

  std::int64_t lookup(const std::string& token) const {
    auto it = ids.find(token);
    return it == ids.end() ? 2 : it->second;
  }

  // tokenizers' Unigram::encode_optimized, then token -> id (fused unknowns become <unk>).
  void viterbi(std::string_view s, std::vector<std::int64_t>& out) const {
    struct Node {
      std::int64_t id = 0;
      double score = 0;
      std::int64_t start = -1;
    };
    const std::size_t size = s.size();
    const double unk_score = min_score - 10.0;
    std::vector<Node> best(size + 1);
    std::string key;
    for (std::size_t start = 0; start < size;) {
      const double here = best[start].score;
      const std::size_t mblen = utf8_len(static_cast<unsigned char>(s[start]));
      bool has_single = false;
      // Candidates in order of increasing length, as a trie's common-prefix search yields them.
      for (std::size_t end = start + mblen; end - start <= max_token_bytes;
           end += utf8_len(static_cast<unsigned char>(s[end]))) {
        key.assign(s.substr(start, end - start));
        auto it = ids.find(key);
        if (it != ids.end()) {
          const double cand = scores[it->second] + here;
          Node& t = best[end];
          if (t.start < 0 || cand > t.score) {
            t.score = cand;
            t.start = static_cast<std::int64_t>(start);
            t.id = it->second;
          }
          if (end - start == mblen) has_single = true;
        }
        if (end >= size) break;
      }
      if (!has_single) {
        Node& t = best[start + mblen];
        const double cand = unk_score + here;
        if (t.start < 0 || cand > t.score) {
          t.score = cand;
          t.start = static_cast<std::int64_t>(start);
          t.id = 2;
        }
      }
      start += mblen;
    }
    // Backtrack, fusing runs of unknowns into one token.
    std::vector<std::string> tokens;
    std::vector<std::string> unk_run;
    auto flush = [&] {
      if (unk_run.empty()) return;
      std::string fused;
      for (auto it = unk_run.rbegin(); it != unk_run.rend(); ++it) fused += *it;
      tokens.push_back(std::move(fused));
      unk_run.clear();
    };
    for (std::size_t end = size; end > 0;) {
      const Node& n = best[end];
      const auto start = static_cast<std::size_t>(n.start);
      std::string tok(s.substr(start, end - start));
      if (n.id == 2) {
        unk_run.push_back(std::move(tok));
      } else {
        flush();
        tokens.push_back(std::move(tok));
      }
      end = start;
    }
    flush();
    for (auto it = tokens.rbegin(); it != tokens.rend(); ++it) out.push_back(lookup(*it));
  }

  // Normaliser, WhitespaceSplit, Metaspace(always, split) and Unigram on text without added tokens.
  void encode_segment(const std::string& segment, std::vector<std::int64_t>& out) const {
    if (segment.empty()) return;
    const std::string norm = charsmap.normalize(segment);
    const std::u32string n32 = utf8_decode(norm, "normalised text");
    std::size_t i = 0;
    while (i < n32.size()) {
      while (i < n32.size() && is_white_space(n32[i])) ++i;
      std::size_t j = i;
      while (j < n32.size() && !is_white_space(n32[j])) ++j;
      if (j > i) {
        std::string word = utf8_encode(std::u32string_view(n32).substr(i, j - i));
        if (word.compare(0, kMeta.size(), kMeta) != 0) word.insert(0, kMeta);
        // Split before every U+2581 (MergedWithNext).
        std::size_t b = 0;
        while (b < word.size()) {
          std::size_t e = word.find(kMeta, b + kMeta.size());
          if (e == std::string::npos) e = word.size();
          viterbi(std::string_view(word).substr(b, e - b), out);
          b = e;
        }
      }
      i = j;
    }
  }

  std::vector<std::int64_t> encode(const std::string& text) const {
    utf8_decode(text, "text");  // validates
    std::vector<std::int64_t> out;
    std::size_t seg = 0, i = 0;
    while (i < text.size()) {
      // Leftmost-longest match among the added tokens at position i.
      std::size_t best_len = 0;
      std::int64_t best_id = -1;
      for (const auto& [tok, id] : added)
        if (tok.size() > best_len && text.compare(i, tok.size(), tok) == 0) best_len = tok.size(), best_id = id;
      if (best_len == 0) {
        ++i;
        continue;
      }
      encode_segment(text.substr(seg, i - seg), out);
      out.push_back(best_id);
      i += best_len;
      seg = i;
    }
    encode_segment(text.substr(seg), out);
    return out;
  }
};

T5Tokenizer::T5Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
T5Tokenizer::T5Tokenizer(T5Tokenizer&&) noexcept = default;
T5Tokenizer& T5Tokenizer::operator=(T5Tokenizer&&) noexcept = default;
T5Tokenizer::~T5Tokenizer() = default;

T5Tokenizer T5Tokenizer::load(const std::string& dir) {
  return with_context(str("loading tokenizer '", dir, "'"), [&] {
    DLO_CHECK(fs::is_directory(dir), "not a directory");
    const std::string model_path = (fs::path(dir) / "spiece.model").string();
    const std::string json_path = (fs::path(dir) / "tokenizer.json").string();
    // tokenizer.json whenever the name is there (a dangling link, a FIFO: refused by name below).
    const bool has_json = fs::exists(fs::symlink_status(json_path));
    DLO_CHECK(has_json || fs::exists(model_path),
              "no tokenizer.json and no spiece.model in the folder (dlo reads a T5 tokenizer from either)");

    // tokenizer_config.json / special_tokens_map.json: extra_ids, special token names, additional tokens.
    std::int64_t extra_ids = 100;
    std::string eos = "</s>", pad = "<pad>", unk = "<unk>";
    std::vector<std::string> additional;
    for (const char* name : {"special_tokens_map.json", "tokenizer_config.json"}) {
      const std::string path = (fs::path(dir) / name).string();
      if (!fs::exists(path)) continue;
      const nlohmann::json j = read_json_object(path);
      if (j.contains("extra_ids") && !j["extra_ids"].is_null()) {
        DLO_CHECK(j["extra_ids"].is_number_integer() && j["extra_ids"].get<std::int64_t>() >= 0, path,
                  ": field 'extra_ids' must be a non-negative integer, got ", j["extra_ids"].dump());
        extra_ids = j["extra_ids"].get<std::int64_t>();
      }
      if (j.contains("eos_token") && !j["eos_token"].is_null()) eos = token_content(j["eos_token"], path);
      if (j.contains("pad_token") && !j["pad_token"].is_null()) pad = token_content(j["pad_token"], path);
      if (j.contains("unk_token") && !j["unk_token"].is_null()) unk = token_content(j["unk_token"], path);
      for (const char* key : {"additional_special_tokens", "extra_special_tokens"}) {
        if (!j.contains(key) || j[key].is_null()) continue;
        DLO_CHECK(j[key].is_array(), path, ": field '", key, "' must be a list, got ", j[key].dump());
        for (const auto& t : j[key]) additional.push_back(token_content(t, path));
      }
    }

    // tokenizer.json first, as transformers 5 reads a folder (tokenizer.h), else spiece.model.
    TokenizerData d;
    std::vector<std::string> pieces_added;  // control and user-defined pieces of spiece.model
    if (has_json) {
      try {
        d = read_tokenizer_json(json_path);  // its vocabulary already holds the extra ids
      } catch (const nlohmann::json::exception& e) {  // a field of the wrong JSON type
        DLO_CHECK(false, json_path, ": a field has the wrong type: ", e.what());
      }
    } else {
      d.source = model_path;
      const std::string bytes = read_file(model_path);
      SpmModel m = parse_spm(bytes, model_path + ": not a SentencePiece model");
      check_spm(m, model_path);
      DLO_CHECK(m.model_type == 1, model_path, ": model type ", m.model_type,
                " is not unigram (1); T5 tokenizers are unigram SentencePiece models");
      d.charsmap_blob = m.precompiled_charsmap;
      // Vocabulary: the pieces, then <extra_id_{n-1}> ... <extra_id_0> (transformers' T5 converter).
      for (std::size_t i = 0; i < m.pieces.size(); ++i) {
        d.vocab.push_back(m.pieces[i]);
        d.scores.push_back(static_cast<double>(m.scores[i]));
        if (m.types[i] == kPieceControl || m.types[i] == kPieceUserDefined) pieces_added.push_back(m.pieces[i]);
      }
      for (std::int64_t i = extra_ids - 1; i >= 0; --i) {
        d.vocab.push_back("<extra_id_" + std::to_string(i) + ">");
        d.scores.push_back(0.0);
      }
    }

    auto impl = std::make_unique<Impl>();
    impl->dir = dir;
    impl->source = d.source;
    impl->charsmap = Charsmap(d.charsmap_blob, d.source);
    impl->vocab = std::move(d.vocab);
    impl->scores = std::move(d.scores);
    impl->min_score = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < impl->vocab.size(); ++i) {
      impl->ids[impl->vocab[i]] = static_cast<std::int64_t>(i);
      impl->max_token_bytes = std::max(impl->max_token_bytes, impl->vocab[i].size());
      impl->min_score = std::min(impl->min_score, impl->scores[i]);
    }
    auto id_of = [&](const std::string& t) { return impl->ids.count(t) ? impl->ids.at(t) : -1; };
    DLO_CHECK(id_of(pad) == 0 && id_of(eos) == 1 && id_of(unk) == 2, d.source,
              ": not a T5 vocabulary: expected ", pad, " = 0, ", eos, " = 1, ", unk, " = 2, got ", id_of(pad), ", ",
              id_of(eos), ", ", id_of(unk));

    // Added tokens, split out of the raw text before normalisation.
    auto add = [&](const std::string& t) {
      if (t.empty()) return;
      const std::int64_t id = id_of(t);
      DLO_CHECK(id >= 0, dir, ": special token '", t,
                "' is neither a piece of the vocabulary nor one of the extra ids; such added tokens are not supported");
      for (const auto& [tok, _] : impl->added)
        if (tok == t) return;
      impl->added.emplace_back(t, id);
    };
    add(pad);
    add(eos);
    add(unk);
    for (const auto& t : pieces_added) add(t);
    if (d.source == model_path) {
      for (std::int64_t i = 0; i < extra_ids; ++i) add("<extra_id_" + std::to_string(i) + ">");
    }
    for (const auto& [t, _] : d.added) add(t);
    for (const auto& t : additional) add(t);
    return T5Tokenizer(std::move(impl));
  });
}

std::vector<std::int64_t> T5Tokenizer::encode(const std::string& text) const { return impl_->encode(text); }

TokenizedBatch T5Tokenizer::encode_padded(const std::vector<std::string>& texts, std::int64_t max_length) const {
  DLO_CHECK(max_length >= 1, "max_length must be >= 1, got ", max_length);
  TokenizedBatch b;
  b.batch = static_cast<std::int64_t>(texts.size());
  b.length = max_length;
  b.input_ids.assign(static_cast<std::size_t>(b.batch * max_length), pad_id());
  b.attention_mask.assign(b.input_ids.size(), 0);
  for (std::int64_t r = 0; r < b.batch; ++r) {
    std::vector<std::int64_t> ids = encode(texts[r]);
    if (static_cast<std::int64_t>(ids.size()) > max_length - 1) ids.resize(max_length - 1);
    ids.push_back(eos_id());
    std::copy(ids.begin(), ids.end(), b.input_ids.begin() + r * max_length);
    std::fill_n(b.attention_mask.begin() + r * max_length, ids.size(), 1);
    b.seq_lens.push_back(static_cast<std::int64_t>(ids.size()));
  }
  return b;
}

TokenizedBatch T5Tokenizer::encode_prompts(const std::vector<std::string>& prompts,
                                           std::int64_t max_sequence_length) const {
  std::vector<std::string> cleaned;
  cleaned.reserve(prompts.size());
  for (const auto& p : prompts) cleaned.push_back(prompt_clean(p));
  return encode_padded(cleaned, max_sequence_length);
}

std::int64_t T5Tokenizer::vocab_size() const { return static_cast<std::int64_t>(impl_->vocab.size()); }

std::int64_t T5Tokenizer::token_to_id(const std::string& token) const {
  auto it = impl_->ids.find(token);
  return it == impl_->ids.end() ? -1 : it->second;
}

const std::string& T5Tokenizer::dir() const { return impl_->dir; }
const std::string& T5Tokenizer::source() const { return impl_->source; }

void T5Tokenizer::check_fits_encoder(std::int64_t encoder_vocab_size) const {
  const std::int64_t n = vocab_size();
  const auto first = static_cast<std::size_t>(std::max<std::int64_t>(encoder_vocab_size, 0));  // read on failure
  DLO_CHECK(n <= encoder_vocab_size, impl_->source, ": token ids reach ", n - 1, ", beyond the text encoder's vocab_size ",
            encoder_vocab_size, " (text_encoder/config.json): id ", encoder_vocab_size, " ('", impl_->vocab[first],
            "') and above have no embedding row, and a prompt holding one could not be encoded (the tokenizer does "
            "not belong to this text encoder)");
}

}  // namespace dlo
