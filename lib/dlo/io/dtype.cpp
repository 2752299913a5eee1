#include "dlo/io/dtype.h"

#include <array>
#include <utility>

namespace dlo {
namespace {

struct DTypeRow {
  DType type;
  std::string_view name;
  std::size_t size;
};

constexpr std::array<DTypeRow, 15> kDTypes{{
    {DType::F64, "F64", 8},      {DType::F32, "F32", 4},         {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},    {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::I64, "I64", 8},      {DType::I32, "I32", 4},         {DType::I16, "I16", 2},
    {DType::I8, "I8", 1},        {DType::U64, "U64", 8},         {DType::U32, "U32", 4},
    {DType::U16, "U16", 2},      {DType::U8, "U8", 1},           {DType::BOOL, "BOOL", 1},
}};

const DTypeRow& row(DType t) { return kDTypes[static_cast<std::size_t>(t)]; }

}  // namespace

std::size_t dtype_size(DType t) { return row(t).size; }
std::string_view dtype_name(DType t) { return row(t).name; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& r : kDTypes)
    if (r.name == name) return r.type;
  return std::nullopt;
}

}  // namespace dlo
