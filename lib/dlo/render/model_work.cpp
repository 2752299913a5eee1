// The real BatchWork (render/batch_work.h): the model folder's transformer(s) through one offload
// engine each, its text encoder on the text worker, its VAE on the decode worker.
#include <optional>

#include <ATen/ATen.h>

#include "dlo/common/error.h"
#include "dlo/dist/device.h"
#include "dlo/models/umt5.h"
#include "dlo/models/wan_lora_fuse.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/models/torch_errors.h"
#include "dlo/models/wan_vae.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/offload/runner.h"
#include "dlo/render/batch_work.h"
#include "dlo/render/generate.h"
#include "dlo/render/prompt_encoder.h"
#include "dlo/text/tokenizer.h"

namespace dlo {
namespace {

// The text encoder's and the VAE's checkpoint headers, the tokenizer against the encoder's vocabulary.
void check_other_parts(const ModelInfo& model) {
  Umt5Encoder::check_checkpoint(model.parts.text_encoder());
  WanVae::check_checkpoint(model.parts.vae_weights(), model.vae);
  T5Tokenizer::load(model.parts.tokenizer()).check_fits_encoder(model.text_encoder.vocab_size);
}

class ModelWork final : public BatchWork {
 public:
  ModelWork(const MpiWorld& world, const ModelInfo& model, const GenerateOptions& options, EngineOptions engine)
      : world_(world), model_(model), o_(options), engine_options_(std::move(engine)) {}

  int experts() const override { return static_cast<int>(runners_.size()); }

  StackSize load(const WaveDevice& device, std::uint64_t& layout) override {
    device_ = device.device;
    const std::vector<WanTransformerConfig> configs = model_.expert_configs();
    const std::vector<std::string> weights = model_.expert_weights();
    for (std::size_t e = 0; e < weights.size(); ++e) {
      experts_.push_back(std::make_unique<WanTransformer>(
          WanTransformer::load(weights[e], configs[e], o_.dtype, /*load_blocks=*/false, o_.storage,
                               fused_loras_for(model_.parts.fused_loras, static_cast<int>(e), configs[e]))));
      experts_.back()->to_device(device_);
      runners_.push_back(std::make_unique<WanOffloadRunner>(*experts_.back(), world_.size()));
    }
    // The other parts are checked now (headers only), not after a job's denoise.
    check_other_parts(model_);
    // The same block layout everywhere (every expert's).
    layout = 0;
    std::vector<StackSize> sizes;
    for (std::size_t e = 0; e < runners_.size(); ++e) {
      layout = layout * 1000003u ^ runners_[e]->plan().fingerprint();
      sizes.push_back(stack_size(runners_[e]->plan()));
      sizes.back().resident_bytes = wan_non_block_bytes(configs[e], o_.dtype);
    }
    return join_stacks(sizes);
  }

  void use_aux_device(bool on_device) override { aux_device_ = on_device ? device_ : at::Device(at::kCPU); }

  void start(const StrategyChoice& choice, const StackSize& stack) override {
    EngineOptions eo = engine_options_;
    eo.keep_page_cache = o_.keep_page_cache;
    const std::vector<StrategyChoice> choices = split_choice(choice, stack);
    for (std::size_t e = 0; e < runners_.size(); ++e) start_engine(world_, *runners_[e], choices[e], device_, eo);
  }

  void prepare(JobRun& run) override {
    // On the job's device when the plan says so (its kernels on this thread's stream, the device's
    // default one, in order with the denoising kernels; the host work overlaps).
    if (!text_) text_.emplace(model_.parts, o_.dtype, aux_device_);
    prepare_job(run, *text_, model_, o_.dtype, device_);
  }

  void step(JobRun& run, int expert, unsigned pass_experts, const BlockHook& hook, const StepGroups& groups) override {
    const std::vector<BlockEngine*> pass = engines_of(pass_experts);
    denoise_step(*runners_[static_cast<std::size_t>(expert)], run, o_.dtype, hook, pass, groups);
    if (device_.is_cuda()) (void)run.latents.flatten()[0].item<float>();  // the step's time is real
    run.result.allocator_reserved_peak_bytes = device_memory(device_).allocator_reserved_peak;
  }

  void ghost(unsigned pass_experts) override {
    const std::vector<BlockEngine*> pass = engines_of(pass_experts);
    for (std::size_t e = 0; e < runners_.size(); ++e)
      if ((pass_experts & (1u << e)) != 0) {
        runners_[e]->ghost(pass);
        return;
      }
  }

  void finish(JobRun& run, const SinkFactory& open_sink, const LatentsKeeper& keep_latents) override {
    if (!vae_) {
      try {
        vae_.emplace(WanVae::load(model_.parts.vae_weights(), model_.vae, o_.vae_dtype));
        if (!aux_device_.is_cpu()) vae_->to_device(aux_device_);
      } catch (const std::exception& e) {
        vae_.reset();
        throw Error(str("loading the VAE: ", describe_exception(e)));
      }
    }
    finish_job(run, *vae_, model_, open_sink, keep_latents);
  }

  WorkFacts end() override {
    WorkFacts f;
    std::vector<EngineStats> es;
    for (const auto& r : runners_) {
      es.push_back(r->engine().stats());
      f.token_block_rows += r->token_rows();
    }
    f.engine_json = engine_stats_json(sum_engine_stats(es));
    if (es.size() > 1)
      for (const auto& s : es) f.expert_json.push_back(engine_stats_json(s));
    runners_.clear();
    experts_.clear();
    return f;
  }

 private:
  // The engines a pass streams (several: traversed together, BlockEngine::traverse_together; one:
  // its own traversal, an empty list). An expert that sits the pass out brings its block 0 in
  // behind it (once: after its own passes block 0 is already there), so the switch to it does not
  // wait for a transfer.
  std::vector<BlockEngine*> engines_of(unsigned pass_experts) {
    std::vector<BlockEngine*> pass;
    for (std::size_t e = 0; e < runners_.size(); ++e) {
      if ((pass_experts & (1u << e)) != 0)
        pass.push_back(&runners_[e]->engine());
      else
        runners_[e]->engine().prefetch_entry();
    }
    if (pass.size() == 1) pass.clear();
    return pass;
  }

  const MpiWorld& world_;
  const ModelInfo& model_;
  const GenerateOptions& o_;
  const EngineOptions engine_options_;
  at::Device device_ = at::kCPU, aux_device_ = at::kCPU;
  std::vector<std::unique_ptr<WanTransformer>> experts_;    // transformer (, transformer_2)
  std::vector<std::unique_ptr<WanOffloadRunner>> runners_;  // one engine per expert
  std::optional<PromptEncoder> text_;                       // text worker only
  std::optional<WanVae> vae_;                               // decode worker only
};

}  // namespace

void check_model_parts(const ModelInfo& model) {
  const std::vector<WanTransformerConfig> configs = model.expert_configs();
  const std::vector<std::string> weights = model.expert_weights();
  for (std::size_t e = 0; e < weights.size(); ++e)
    (void)WanTransformer::load(weights[e], configs[e], at::kFloat, /*load_blocks=*/false, LinearStorage::kAuto,
                               fused_loras_for(model.parts.fused_loras, static_cast<int>(e), configs[e]));
  check_other_parts(model);
}

std::unique_ptr<BatchWork> make_model_work(const MpiWorld& world, const ModelInfo& model, const GenerateOptions& options,
                                           EngineOptions engine) {
  return std::make_unique<ModelWork>(world, model, options, std::move(engine));
}

}  // namespace dlo
