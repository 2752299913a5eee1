// Element types as named in safetensors headers, independent of torch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace dlo {

enum class DType : std::uint8_t {
  F64, F32, F16, BF16, F8_E4M3, F8_E5M2,
  I64, I32, I16, I8, U64, U32, U16, U8, BOOL,
};

// Bytes per element (1 for BOOL, as safetensors and torch store it).
std::size_t dtype_size(DType t);
// The safetensors spelling: "F32", "BF16", ...
std::string_view dtype_name(DType t);
// Parses the safetensors spelling; nullopt for anything else.
std::optional<DType> parse_dtype(std::string_view name);

}  // namespace dlo
