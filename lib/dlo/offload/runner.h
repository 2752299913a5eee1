// Running a model's forward passes through the offload engine on every rank at once.
//
// A wave is a set of forward passes that all ranks run in lockstep: rank r has its own inputs
// and P_r passes (different prompts, different step counts, or none at all). Before the wave the
// ranks agree on the schedule (every P_r and the layout fingerprint); then every rank runs
// max(P_r) traversals, computing in the first P_r and joining the gathers without computing
// ("ghost" passes) in the rest. No rank repeats another's work and none waits on a collective the
// others will never join.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/dist/collective.h"
#include "dlo/io/dtype.h"
#include "dlo/offload/engine.h"
#include "dlo/offload/stack_plan.h"

namespace dlo {

class MpiWorld;
class Collective;
class WanTransformer;
class Umt5Encoder;

// Everyone's view of the wave, agreed collectively.
struct WaveSchedule {
  std::vector<std::int64_t> passes;  // per rank
  std::int64_t length = 0;           // max over ranks: traversals every rank makes
};
// Collective: gathers each rank's pass count and layout fingerprint. Throws dlo::Error on every
// rank (the same message) if the fingerprints differ.
WaveSchedule agree_wave(const MpiWorld& world, std::int64_t my_passes, std::uint64_t fingerprint);

// One branch of a Wan forward: latents, timestep and text context of one request.
struct WanBranchInputs {
  at::Tensor hidden_states, timestep, encoder_hidden_states;
};

// A model's block stack with its plan, collective and engine: what every runner shares.
class OffloadStack {
 public:
  // Plans `blocks` (full tensor names per block) of `ck` for `ranks` ranks.
  OffloadStack(const Checkpoint& ck, const std::vector<std::vector<std::string>>& blocks,
               const std::function<DType(const std::string&)>& packed_dtype, int ranks);
  const StackPlan& plan() const { return *plan_; }
  // Creates the engine (after agree_wave has checked the layout). Keeps `collective` (if given)
  // alive until the engine is gone: the engine's last prefetch still uses it.
  void start(EngineOptions options, std::unique_ptr<Collective> collective = nullptr);
  BlockEngine& engine() { return *engine_; }
  // Joins one forward's transfers without computing.
  void ghost() { engine_->traverse(nullptr); }

 private:
  std::unique_ptr<StackPlan> plan_;
  std::unique_ptr<Collective> collective_;  // declared before engine_: destroyed after it
  std::unique_ptr<BlockEngine> engine_;
};

// The Wan transformer's blocks through the engine.
class WanOffloadRunner : public OffloadStack {
 public:
  // `model` loaded with load_blocks=false; blocks packed in the dtypes the model computes them in.
  WanOffloadRunner(const WanTransformer& model, int ranks);
  // One forward of every branch (e.g. conditional and unconditional for guidance): each block's
  // weights are brought in once and every branch runs through it back to back, so guidance
  // streams the weights once per step. Outputs per branch, equal to separate forwards.
  std::vector<at::Tensor> forward(const std::vector<WanBranchInputs>& branches);

 private:
  const WanTransformer& model_;
};

// The UMT5 text encoder's blocks through the engine (an 11 GB encoder need not fit one device).
class Umt5OffloadRunner : public OffloadStack {
 public:
  Umt5OffloadRunner(const Umt5Encoder& encoder, int ranks);
  // The pipeline's prompt embeddings, as Umt5Encoder::forward computes them.
  at::Tensor encode(const at::Tensor& input_ids, const at::Tensor& attention_mask);

 private:
  const Umt5Encoder& encoder_;
};

}  // namespace dlo
