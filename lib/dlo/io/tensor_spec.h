// A tensor described before it exists: its name, dtype and shape (what a checkpoint's tensors are
// planned as: the model configs' tensor tables, the safetensors writer's input).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dlo/io/dtype.h"

namespace dlo {

struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;

  // Bytes of the tensor; throws dlo::Error naming it for a negative or overflowing shape.
  std::uint64_t nbytes() const;
};

}  // namespace dlo
