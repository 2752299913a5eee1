// One forward pass of one component of a model directory (diffusers layout), by name.
// This is what `dlo-forward` runs; each component adds itself in component.cpp.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace dlo {

using TensorMap = std::map<std::string, at::Tensor>;

// What a run measured (filled by components that support it; -1 / empty otherwise).
struct ForwardStats {
  std::int64_t rss_before_load_kb = -1;
  std::int64_t rss_after_load_kb = -1;   // after building the model, before the first forward
  std::int64_t peak_rss_kb = -1;         // VmHWM over the forward passes
  std::vector<double> forward_seconds;   // one entry per pass
  std::vector<std::string> warnings;     // things the config loaders accepted with a warning (apps print)
};

struct ForwardOptions {
  at::ScalarType dtype = at::kFloat;  // compute dtype (weights kept in fp32 where diffusers keeps them)
  std::string prompt;                 // text_encoder: tokenize this instead of reading input_ids
  bool has_prompt = false;            // `prompt` was given (it may be "", the pipeline's negative prompt)
  std::string vae;                    // vae: weights given instead of <model>/vae (--vae FILE)
  int repeat = 1;                     // forward passes to run (timing); the last one's output is returned
  ForwardStats* stats = nullptr;      // filled when not null
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
