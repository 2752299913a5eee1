// libFuzzer target: a safetensors file and an index, parsed from the same bytes.
// Any input may be rejected with dlo::Error; none may crash, leak or read out of bounds
// (ASan/UBSan watch). For a file that parses, every tensor's bytes are read, so a header that
// points outside the buffer is caught by ASan.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "dlo/common/error.h"
#include "dlo/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Exact-size heap copy, so ASan flags a read one byte past the end.
  std::vector<std::byte> buf(reinterpret_cast<const std::byte*>(data), reinterpret_cast<const std::byte*>(data) + size);
  try {
    auto h = dlo::parse_safetensors_header(buf.data(), buf.size(), "fuzz");
    volatile std::uint8_t sink = 0;
    for (const auto& t : h.tensors)
      for (std::uint64_t i = 0; i < t.nbytes; i += 61) sink ^= static_cast<std::uint8_t>(buf[t.offset + i]);
    if (!h.tensors.empty() && h.tensors.back().nbytes > 0)
      sink ^= static_cast<std::uint8_t>(buf[h.tensors.back().offset + h.tensors.back().nbytes - 1]);
  } catch (const dlo::Error&) {
  }
  try {
    dlo::parse_safetensors_index(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  } catch (const dlo::Error&) {
  }
  return 0;
}
