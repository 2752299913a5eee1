#include "dlo/models/weights.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>

#include <ATen/ATen.h>

#include "dlo/common/error.h"
#include "dlo/models/tensor_view.h"

namespace dlo {
namespace {

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

WeightStore WeightStore::open(const std::string& dir) { return WeightStore(Checkpoint::open(dir)); }

WeightStore::WeightStore(Checkpoint ck) : ck_(std::make_shared<const Checkpoint>(std::move(ck))) {}

at::Tensor WeightStore::get(const std::string& name) const { return tensor_view(*ck_, ck_->at(name)); }

at::Tensor WeightStore::get(const std::string& name, const std::vector<std::int64_t>& shape) const {
  const TensorInfo& t = ck_->at(name);
  DLO_CHECK(t.shape == shape, ck_->source(), ": tensor '", name, "' has shape ", shape_str(t.shape),
            ", the config implies ", shape_str(shape));
  return tensor_view(*ck_, t);
}

void check_checkpoint_tensors(const WeightStore& store, const TensorShapes& expected,
                              const std::vector<std::string>& optional) {
  const Checkpoint& ck = store.checkpoint();
  std::set<std::string> known(optional.begin(), optional.end());
  for (const auto& [name, shape] : expected) {
    known.insert(name);
    const TensorInfo* t = ck.find(name);
    DLO_CHECK(t != nullptr, ck.source(), ": no tensor '", name, "' (the config implies it)");
    DLO_CHECK(t->shape == shape, ck.source(), ": tensor '", name, "' has shape ", shape_str(t->shape),
              ", the config implies ", shape_str(shape));
  }
  std::vector<std::string> unused;
  long last_block = -1;
  for (const TensorInfo* t : ck.tensors()) {
    if (known.count(t->name)) continue;
    unused.push_back(t->name);
    // "blocks.N." / "encoder.block.N.": the highest block index, for the hint below.
    for (const char* prefix : {"blocks.", "encoder.block."}) {
      const std::size_t n = std::strlen(prefix);
      if (t->name.compare(0, n, prefix) == 0) last_block = std::max(last_block, std::atol(t->name.c_str() + n));
    }
  }
  if (unused.empty()) return;
  std::string list;
  for (std::size_t i = 0; i < unused.size() && i < 6; ++i) list += (i ? ", " : "") + ("'" + unused[i] + "'");
  if (unused.size() > 6) list += str(" and ", unused.size() - 6, " more");
  DLO_CHECK(false, ck.source(), ": holds ", unused.size(), " tensor(s) the config does not use: ", list,
            last_block >= 0 ? str(" (the checkpoint has blocks up to ", last_block,
                                  "; does config.json's num_layers match it?)")
                            : std::string());
}

at::Tensor as_dtype(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t : t.to(dtype);
}

at::ScalarType parse_compute_dtype(const std::string& name, const std::string& what) {
  if (name == "fp32" || name == "float32") return at::kFloat;
  if (name == "bf16" || name == "bfloat16") return at::kBFloat16;
  if (name == "fp16" || name == "float16") return at::kHalf;
  DLO_CHECK(false, what, ": unknown dtype '", name, "' (fp32, bf16 or fp16)");
}

const char* compute_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    default: return c10::toString(t);
  }
}

}  // namespace dlo
