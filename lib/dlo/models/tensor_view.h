// Checkpoint tensors as at::Tensor, and at::Tensor to safetensors.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/io/dtype.h"
#include "dlo/io/safetensors.h"
#include "dlo/io/tensor_spec.h"

namespace dlo {

at::ScalarType to_scalar_type(DType t);
// Throws dlo::Error for scalar types safetensors cannot store (complex, quantized, ...).
DType from_scalar_type(at::ScalarType t);

// A CPU tensor viewing `t`'s bytes in the checkpoint's mapping: no copy, no allocation of data.
// The view keeps the mapping alive, so it may outlive the Checkpoint object. The memory is
// read-only: writing through the view is a bug and faults. In the rare case that a tensor's
// offset is not a multiple of its element size (a valid but unusual file), the tensor is copied
// instead, so the result is always correctly aligned. Thread-safe.
at::Tensor tensor_view(const Checkpoint& ck, const TensorInfo& t);
at::Tensor tensor_view(const Checkpoint& ck, std::string_view name);

// Writes named tensors (any device; copied to the CPU one at a time) to `path` as one file.
void save_tensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                  const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Reads every tensor of a single file or checkpoint as views, by name.
std::map<std::string, at::Tensor> load_tensors(const Checkpoint& ck);

// Reads every tensor of the checkpoint at `path` into private memory (copies) and closes it: for
// small inputs read once, which a later change of the file (truncated, rewritten) cannot reach.
// Throws dlo::Error as Checkpoint::open does (a FIFO is refused without blocking).
std::map<std::string, at::Tensor> read_tensors(const std::string& path);

}  // namespace dlo
