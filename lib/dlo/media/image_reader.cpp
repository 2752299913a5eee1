#include "dlo/media/image_reader.h"

#include <cstdint>
#include <string_view>

namespace dlo {
namespace {

// The Orientation of a TIFF structure (EXIF's payload): its byte order, IFD0, tag 0x0112 (SHORT).
int tiff_orientation(std::string_view t) {
  if (t.size() < 8) return 1;
  const bool le = t.substr(0, 4) == std::string_view("II*\0", 4);
  if (!le && t.substr(0, 4) != std::string_view("MM\0*", 4)) return 1;
  const auto u16 = [&](std::size_t at) -> std::uint32_t {
    const auto b = [&](std::size_t i) { return static_cast<std::uint32_t>(static_cast<unsigned char>(t[at + i])); };
    return le ? b(0) | b(1) << 8 : b(0) << 8 | b(1);
  };
  const auto u32 = [&](std::size_t at) { return le ? u16(at) | u16(at + 2) << 16 : u16(at) << 16 | u16(at + 2); };
  const std::size_t ifd = u32(4);
  if (ifd + 2 > t.size()) return 1;
  const std::uint32_t n = u16(ifd);
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::size_t e = ifd + 2 + 12 * static_cast<std::size_t>(i);
    if (e + 12 > t.size()) return 1;
    if (u16(e) != 0x0112) continue;
    const std::uint32_t v = u16(e + 2) == 3 ? u16(e + 8) : 1;  // type SHORT, the value in place
    return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
  }
  return 1;
}

std::uint32_t be32(std::string_view s, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = v << 8 | static_cast<unsigned char>(s[at + static_cast<std::size_t>(i)]);
  return v;
}
std::uint32_t le32(std::string_view s, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(s[at + static_cast<std::size_t>(i)]);
  return v;
}

}  // namespace

int exif_orientation(const std::string& bytes) {
  const std::string_view s(bytes);
  const std::string_view exif_header("Exif\0\0", 6);
  if (s.size() >= 4 && static_cast<unsigned char>(s[0]) == 0xFF && static_cast<unsigned char>(s[1]) == 0xD8) {
    // JPEG: the markers up to the scan; APP1 "Exif\0\0" holds the TIFF structure.
    std::size_t at = 2;
    while (at + 4 <= s.size() && static_cast<unsigned char>(s[at]) == 0xFF) {
      const unsigned marker = static_cast<unsigned char>(s[at + 1]);
      if (marker == 0xDA || marker == 0xD9) break;
      const std::size_t len = static_cast<std::size_t>(static_cast<unsigned char>(s[at + 2])) << 8 |
                              static_cast<unsigned char>(s[at + 3]);
      if (len < 2 || at + 2 + len > s.size()) break;
      const std::string_view body = s.substr(at + 4, len - 2);
      if (marker == 0xE1 && body.substr(0, 6) == exif_header) return tiff_orientation(body.substr(6));
      at += 2 + len;
    }
    return 1;
  }
  if (s.size() >= 8 && s.substr(0, 8) == std::string_view("\x89PNG\r\n\x1a\n", 8)) {
    // PNG: chunks of length, type, data, CRC; eXIf holds the TIFF structure.
    for (std::size_t at = 8; at + 12 <= s.size();) {
      const std::size_t len = be32(s, at);
      if (at + 12 + len > s.size()) break;
      if (s.substr(at + 4, 4) == "eXIf") return tiff_orientation(s.substr(at + 8, len));
      at += 12 + len;
    }
    return 1;
  }
  if (s.size() >= 12 && s.substr(0, 4) == "RIFF" && s.substr(8, 4) == "WEBP") {
    // WebP: RIFF chunks (little-endian sizes, padded to even); EXIF holds the TIFF structure,
    // after an "Exif\0\0" some writers put first.
    for (std::size_t at = 12; at + 8 <= s.size();) {
      const std::size_t len = le32(s, at + 4);
      if (at + 8 + len > s.size()) break;
      if (s.substr(at, 4) == "EXIF") {
        std::string_view t = s.substr(at + 8, len);
        if (t.substr(0, 6) == exif_header) t = t.substr(6);
        return tiff_orientation(t);
      }
      at += 8 + len + (len & 1);
    }
  }
  return 1;
}

}  // namespace dlo
