#include "dlo/models/tensor_view.h"

#include <cstring>
#include <memory>

#include <ATen/ATen.h>

#include "dlo/common/error.h"
#include "dlo/io/safetensors_writer.h"

namespace dlo {

at::ScalarType to_scalar_type(DType t) {
  switch (t) {
    case DType::F64: return at::kDouble;
    case DType::F32: return at::kFloat;
    case DType::F16: return at::kHalf;
    case DType::BF16: return at::kBFloat16;
    case DType::F8_E4M3: return at::kFloat8_e4m3fn;
    case DType::F8_E5M2: return at::kFloat8_e5m2;
    case DType::I64: return at::kLong;
    case DType::I32: return at::kInt;
    case DType::I16: return at::kShort;
    case DType::I8: return at::kChar;
    case DType::U64: return at::kUInt64;
    case DType::U32: return at::kUInt32;
    case DType::U16: return at::kUInt16;
    case DType::U8: return at::kByte;
    case DType::BOOL: return at::kBool;
  }
  DLO_ASSERT(false, "unhandled dtype");
}

DType from_scalar_type(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return DType::F64;
    case at::kFloat: return DType::F32;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    case at::kFloat8_e4m3fn: return DType::F8_E4M3;
    case at::kFloat8_e5m2: return DType::F8_E5M2;
    case at::kLong: return DType::I64;
    case at::kInt: return DType::I32;
    case at::kShort: return DType::I16;
    case at::kChar: return DType::I8;
    case at::kUInt64: return DType::U64;
    case at::kUInt32: return DType::U32;
    case at::kUInt16: return DType::U16;
    case at::kByte: return DType::U8;
    case at::kBool: return DType::BOOL;
    default: break;
  }
  DLO_CHECK(false, "tensors of type ", c10::toString(t), " cannot be stored in safetensors");
}

at::Tensor tensor_view(const Checkpoint& ck, const TensorInfo& t) {
  const SafetensorsFile& file = ck.file_of(t);
  const std::byte* p = file.data(t);
  const auto options = at::TensorOptions().dtype(to_scalar_type(t.dtype)).device(at::kCPU);
  if (t.nbytes == 0) return at::empty(t.shape, options);
  if (reinterpret_cast<std::uintptr_t>(p) % dtype_size(t.dtype) != 0) {
    at::Tensor copy = at::empty(t.shape, options);
    std::memcpy(copy.data_ptr(), p, t.nbytes);
    return copy;
  }
  // The deleter owns a reference to the mapping: the view keeps it alive.
  auto keep = std::make_shared<std::shared_ptr<const MappedFile>>(file.mapping());
  return at::from_blob(const_cast<std::byte*>(p), t.shape,
                       [keep](void*) mutable { keep.reset(); }, options);
}

at::Tensor tensor_view(const Checkpoint& ck, std::string_view name) { return tensor_view(ck, ck.at(name)); }

std::map<std::string, at::Tensor> load_tensors(const Checkpoint& ck) {
  std::map<std::string, at::Tensor> out;
  for (const TensorInfo* t : ck.tensors()) out.emplace(t->name, tensor_view(ck, *t));
  return out;
}

std::map<std::string, at::Tensor> read_tensors(const std::string& path) {
  const Checkpoint ck = Checkpoint::open(path);
  std::map<std::string, at::Tensor> out;
  for (const TensorInfo* t : ck.tensors()) out.emplace(t->name, tensor_view(ck, *t).clone());
  return out;
}

void save_tensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                  const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& [name, t] : tensors)
    specs.push_back({name, from_scalar_type(t.scalar_type()), t.sizes().vec()});
  write_safetensors_file(
      path, specs,
      [&](std::size_t i, const TensorSpec& spec, std::byte* out) {
        at::Tensor c = tensors[i].second.detach().to(at::kCPU).contiguous();
        std::memcpy(out, c.data_ptr(), spec.nbytes());
      },
      metadata);
}

}  // namespace dlo
