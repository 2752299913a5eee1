// One forward pass of one component of a model directory (diffusers layout), by name.
// This is what `dlo-forward` runs; each component adds itself in component.cpp.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace dlo {

using TensorMap = std::map<std::string, at::Tensor>;

struct ForwardOptions {
  at::ScalarType dtype = at::kFloat;  // compute dtype (weights kept in fp32 where diffusers keeps them)
  std::string prompt;                 // text_encoder: tokenize this instead of reading input_ids
};

// The components run_component() knows, e.g. {"transformer", "text_encoder", "vae"}.
std::vector<std::string> component_names();

// Loads `<model_dir>/<component>` and runs it once on `inputs` (keys per component; see
// dlo-forward --help). Returns the outputs, at least "output". Throws dlo::Error naming the
// component, file and input for bad input.
TensorMap run_component(const std::string& model_dir, const std::string& component, const TensorMap& inputs,
                        const ForwardOptions& options);

// `inputs.at(key)` with a clear error naming the component and the missing key.
const at::Tensor& require_input(const TensorMap& inputs, const std::string& key, const std::string& component);

}  // namespace dlo
