// A model component's weights, by name, as views into its mmap'ed checkpoint.
//
// "Weights are data, layers are functions": model code asks a WeightStore for named tensors once,
// keeps them in plain structs, and passes those structs to forward functions. Nothing here copies
// weight data unless a dtype conversion is asked for.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/io/safetensors.h"

namespace dlo {

class WeightStore {
 public:
  // Opens the checkpoint in `dir` (a component folder such as "<model>/transformer", holding an
  // index or a single .safetensors file). Throws dlo::Error naming the folder.
  static WeightStore open(const std::string& dir);
  explicit WeightStore(Checkpoint ck);

  bool has(const std::string& name) const { return ck_->find(name) != nullptr; }
  // A view of tensor `name`. Throws dlo::Error naming the checkpoint and tensor if it is missing
  // or (when `shape` is given) its shape differs.
  at::Tensor get(const std::string& name) const;
  at::Tensor get(const std::string& name, const std::vector<std::int64_t>& shape) const;

  const Checkpoint& checkpoint() const { return *ck_; }
  std::shared_ptr<const Checkpoint> shared() const { return ck_; }

 private:
  std::shared_ptr<const Checkpoint> ck_;
};

// The tensors a model expects from its checkpoint: full name and shape.
using TensorShapes = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;

// Checks at load time that `store`'s checkpoint holds exactly the tensors `expected` lists, with
// those shapes (a wrong ffn_dim or block width is caught here, before any work), and nothing
// else: tensors the config does not use (num_layers smaller than the checkpoint's blocks, another
// model's weights) are an error naming them, since running without them would be a different
// model. `optional` names may be present or absent (a tied copy such as encoder.embed_tokens).
// Throws dlo::Error naming the checkpoint and the tensors.
void check_checkpoint_tensors(const WeightStore& store, const TensorShapes& expected,
                              const std::vector<std::string>& optional = {});

// `t` as `dtype`: the tensor itself when it already is (no copy), else a converted copy.
at::Tensor as_dtype(const at::Tensor& t, at::ScalarType dtype);

// "fp32" | "bf16" | "fp16" (also "float32", "bfloat16", "float16") -> scalar type; throws dlo::Error
// naming `what` otherwise.
at::ScalarType parse_compute_dtype(const std::string& name, const std::string& what);
const char* compute_dtype_name(at::ScalarType t);

}  // namespace dlo
