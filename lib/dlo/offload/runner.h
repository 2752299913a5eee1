// Running a model's forward passes through the offload engine: a model's block stack with its
// plan, collective and engine (OffloadStack), and the Wan transformer's forwards through it. How the ranks start a wave together is offload/wave.h.
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
class ExchangeGroup;
class WanTransformer;
struct WanAdapters;

// One branch of a Wan forward: latents, timestep and text context of one request.
struct WanBranchInputs {
  at::Tensor hidden_states, timestep, encoder_hidden_states;
  std::shared_ptr<const WanAdapters> adapters{};  // the job's unfused LoRAs on this transformer, or null
};

// A model's block stack with its plan, collective and engine: what every runner shares.
class OffloadStack {
 public:
  // Plans `blocks` (full tensor names per block) of `ck` for `ranks` ranks.
  OffloadStack(std::shared_ptr<const Checkpoint> ck, const std::vector<std::vector<std::string>>& blocks,
               const std::function<PackedAs(const std::string&)>& packed_dtype, int ranks);
  const StackPlan& plan() const { return *plan_; }
  // Creates the engine (after agree_wave has checked the layout). Keeps `collective` (if given)
  // alive until the engine is gone: the engine's last prefetch still uses it.
  void start(EngineOptions options, std::unique_ptr<Collective> collective = nullptr);
  BlockEngine& engine() { return *engine_; }
  // Joins one forward's transfers without computing; with `pass` (the engines of a pass that
  // traverses several, this one among them: BlockEngine::traverse_together), all of them.
  void ghost(const std::vector<BlockEngine*>& pass = {});

 private:
  std::unique_ptr<StackPlan> plan_;
  std::unique_ptr<Collective> collective_;  // declared before engine_: destroyed after it
  std::unique_ptr<BlockEngine> engine_;
};

// The Wan transformer's blocks through the engine.
class WanOffloadRunner : public OffloadStack {
 public:
  // `model` loaded with load_blocks=false; blocks packed in the dtypes the model keeps them in
  // (WanDtypes::stored, rounded as WanDtypes::keep rounds).
  WanOffloadRunner(const WanTransformer& model, int ranks);
  WanOffloadRunner(WanTransformer&&, int) = delete;  // the runner keeps the model: never a temporary
  // One forward of every branch (e.g. conditional and unconditional for guidance): each block's
  // weights are brought in once and every branch runs through it back to back, so guidance
  // streams the weights once per step. Outputs per branch, equal to separate forwards.
  // `before_block(i)`, if given, runs before block i computes (a test hook: it may throw).
  // A failure of the computation (the embeddings, a block, the output head, a failed allocation)
  // throws BlockComputeError after the traversal was completed without computing, so the other
  // ranks' gathers go on; any other exception is the transfers' (the collective is out of step).
  // `pass`: the engines the pass traverses together, in the order every rank uses, this runner's
  // among them (empty: this one alone); its blocks compute, the others' are joined as a ghost.
  std::vector<at::Tensor> forward(const std::vector<WanBranchInputs>& branches,
                                  const std::function<void(std::int64_t block)>& before_block = {},
                                  const std::vector<BlockEngine*>& pass = {});
  // The same forward computed by a group of P ranks with Ulysses sequence parallelism (the
  // models/wan_transformer.h seam): every rank of `group` passes the same branches; each computes
  // its contiguous share of the tokens through every block, exchanging q, k, v (tokens to heads)
  // and the attention output (heads to tokens) with the group around self-attention, and the
  // tokens are gathered once before the output head, so every rank of the group returns the
  // whole output. Uneven token and head splits. A computation that fails on any rank of the
  // group (P > heads or P > tokens included, refused by name before the blocks) fails the forward
  // on every rank of the group with BlockComputeError (that rank's message; its partners name it),
  // after the pass was completed: a failing rank keeps joining the group's exchanges, so nobody
  // waits. An exchange that does not finish (a partner gone or stuck) ends every rank, as a
  // gather that does not. One group of size 1 is forward(). `before_block`: as forward()'s.
  // `inputs_failed`: this rank could not make its inputs (the reason): it computes nothing, and
  // the group fails the forward with that reason, in step.
  std::vector<at::Tensor> forward_group(const ExchangeGroup& group, const std::vector<WanBranchInputs>& branches,
                                        const std::vector<BlockEngine*>& pass = {},
                                        const std::function<void(std::int64_t block)>& before_block = {},
                                        const std::string& inputs_failed = {});
  // CFG parallelism: the guidance branches on partner ranks. `partners` holds one rank per branch
  // (the conditional branch on partner 0, the unconditional on partner 1); each computes its own
  // branch (through `sp`, its sequence-parallel group, when given: CFG x SP), then the partners
  // exchange their predictions, so every one returns every branch's output, as forward() does.
  // Collective over the partners (and sp). branches.size() == partners.size(). A branch that
  // fails fails the forward on every partner (BlockComputeError), after the pass, without waits.
  // `before_block`, `inputs_failed`: as forward_group's, on each partner's own branch.
  std::vector<at::Tensor> forward_cfg(const ExchangeGroup& partners, const ExchangeGroup* sp, const std::vector<WanBranchInputs>& branches,
                                      const std::vector<BlockEngine*>& pass = {},
                                      const std::function<void(std::int64_t block)>& before_block = {},
                                      const std::string& inputs_failed = {});

  // The token rows this rank has computed through a block so far, over every forward, branch and
  // block (a branch of L tokens through B blocks adds L x B; a rank of an SP group its share):
  // how the work was split, for the run's report.
  std::int64_t token_rows() const { return token_rows_; }

 private:
  std::int64_t token_rows_ = 0;
  // compute over this runner's blocks: alone, or in `pass` (see forward).
  void traverse(const std::function<void(std::int64_t, const std::vector<at::Tensor>&)>& compute,
                const std::vector<BlockEngine*>& pass);
  const WanTransformer& model_;
};

}  // namespace dlo
