// LoRAs fused into a Wan transformer's weights for a whole run (--fuse-lora), exactly as diffusers
// fuses them on the CPU: WanPipeline.load_lora_weights (into transformer or transformer_2) per
// file, set_adapters(names, strengths), fuse_lora(). PEFT then, per Linear and adapter in the order
// given (peft/tuners/lora/layer.py, Linear.merge and get_delta_weight):
//   down, up   moved to the base weight's dtype when loaded (the file's dtype -> the compute dtype,
//              or fp32 for the modules diffusers keeps in fp32);
//   delta      (up @ down) * scaling, in fp32 when the base is bf16/fp16 (PEFT's CPU merge casts
//              both up and down to fp32 and the product back), scaling = strength * lora_alpha / r;
//   weight     += delta in the base dtype (one rounding per adapter);
//   bias       += up_bias * scaling, both in the base dtype (a diff_b).
// A rank forms only the rows it packs (TensorEdits: rows of up times down), so no rank holds a
// whole merged block. A narrower storage (fp8) rounds the merged weight: merge first, then quantise.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dlo/config/model_info.h"
#include "dlo/config/wan_transformer_config.h"
#include "dlo/models/tensor_edits.h"
#include "dlo/models/wan_lora.h"
#include "dlo/models/wan_transformer.h"

namespace dlo {

// One LoRA file fused at a strength; `identity` names its content for fingerprints (the run's
// model identity hashes the file itself: model_identity).
struct FusedLora {
  LoraFile file;
  double strength = 1.0;
};

class FusedLoras final : public TensorEdits {
 public:
  // `loras` in the order they are merged, each checked against config `c` (check_wan_lora).
  // Throws dlo::Error naming the file.
  FusedLoras(std::vector<FusedLora> loras, const WanTransformerConfig& c);

  bool touches(const std::string& name) const override { return by_tensor_.count(name) != 0; }
  void apply(const std::string& name, at::Tensor& rows, std::int64_t first_row) const override;
  // Each file's path and strength, in order.
  std::string identity() const override;

 private:
  struct Part {
    const LoraModule* module;
    double scaling;  // strength * the module's own (lora_alpha / r)
    bool bias;       // the Linear's bias (up's bias), else its weight
  };
  std::vector<FusedLora> loras_;
  std::map<std::string, std::vector<Part>> by_tensor_;  // "blocks.0.attn1.to_q.weight" -> its changes, in order
};

// The LoRAs of `specs` that apply to expert `expert` (0: transformer/, 1: transformer_2/; a spec
// without an expert applies to the one transformer), read (read_wan_lora) and checked against its
// config `c`, in order; null when none applies. Throws dlo::Error naming the file.
std::shared_ptr<const FusedLoras> fused_loras_for(const std::vector<LoraSpec>& specs, int expert,
                                                  const WanTransformerConfig& c);
// A job's unfused LoRAs (the job field `loras`) on expert `expert` of config `c`: each file of
// `specs` that applies to it read (read_wan_lora) and checked (check_wan_lora), in order, its
// adapters on `device` in the dtype PEFT moves them to (that of the weight they adapt:
// wan_weight_dtype, so `compute` or fp32), with scaling = strength x the module's own; null when
// none applies. Throws dlo::Error naming the file.
std::shared_ptr<const WanAdapters> wan_job_adapters(const std::vector<LoraSpec>& specs, int expert,
                                                    const WanTransformerConfig& c, at::ScalarType compute,
                                                    at::Device device);

// The bytes wan_job_adapters(specs, expert, c, compute, device) puts on the device (down, up and
// bias of every module, each in the dtype it takes there), from the files' headers
// (read_wan_lora kShapes), after the same checks; 0 when none applies. Throws as wan_job_adapters.
std::uint64_t wan_job_adapter_bytes(const std::vector<LoraSpec>& specs, int expert, const WanTransformerConfig& c,
                                    at::ScalarType compute);

// For the app to print: per LoRA of `specs` whose file has keys diffusers ignores (full-weight
// .diff deltas and the like), a line naming the file and the first few keys. Throws as
// read_wan_lora.
std::vector<std::string> lora_ignored_notes(const std::vector<LoraSpec>& specs);

}  // namespace dlo
