#include "dlo/models/component.h"

#include <ATen/ATen.h>

#include "dlo/common/error.h"
#include "dlo/models/wan_transformer.h"

namespace dlo {

const at::Tensor& require_input(const TensorMap& inputs, const std::string& key, const std::string& component) {
  auto it = inputs.find(key);
  DLO_CHECK(it != inputs.end(), component, ": inputs lack '", key, "'");
  return it->second;
}

std::vector<std::string> component_names() { return {"transformer"}; }

TensorMap run_component(const std::string& model_dir, const std::string& component, const TensorMap& inputs,
                        const ForwardOptions& options) {
  const std::string dir = model_dir + "/" + component;
  if (component == "transformer") {
    auto model = WanTransformer::load(dir, options.dtype);
    const at::Tensor& x = require_input(inputs, "hidden_states", component);
    const at::Tensor& t = require_input(inputs, "timestep", component);
    const at::Tensor& ctx = require_input(inputs, "encoder_hidden_states", component);
    at::Tensor out = with_context("transformer forward", [&] { return model.forward(x, t, ctx); });
    return {{"output", out}};
  }
  DLO_CHECK(false, "unknown component '", component, "'");
}

}  // namespace dlo
