// What a batch asks of the model on one rank: the work of the stages (render/stages.h) behind an
// interface, so that generate() (render/generate.h) can drive a batch over a fake model in a unit
// test, and so that a test build can wrap the real work in a decorator that fails on purpose.
//
// generate() calls, on every rank, in this order: load (before the memory plan), use_aux_device
// (the plan's placement of the text encoder and VAE), prepare for the first jobs, start (the
// engines, collective), then per pass step or ghost (collective: every rank traverses the same
// engines together), finish for each job this rank decodes, and end after the wave. prepare runs
// on the text worker thread and finish on the decode worker thread, each alone on its thread
// (one job at a time), while step and ghost run on the wave's thread: an implementation keeps
// what each thread uses apart.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlo/offload/memory_model.h"
#include "dlo/offload/wave.h"
#include "dlo/render/stages.h"

namespace dlo {

class MpiWorld;
struct GenerateOptions;

// What the work says of itself after the wave (rank facts of the report, generate.h).
struct WorkFacts {
  std::int64_t token_block_rows = 0;  // the token rows this rank computed through a block (runner.h)
  std::string engine_json;            // the engines' statistics, summed (a JSON object), "" for none
  std::vector<std::string> expert_json;  // with several experts: each one's statistics (JSON objects)
};

class BatchWork {
 public:
  virtual ~BatchWork() = default;

  // The experts the model has (1, or 2 for Wan2.2 A14B); valid after load.
  virtual int experts() const = 0;
  // Loads what the wave needs on `device` (blocks planned, not yet packed) and checks the other
  // parts' files; returns the stack's sizes for the memory plan and sets `layout` to a fingerprint
  // that every rank must agree on. Throws dlo::Error (the caller makes it the same on every rank).
  virtual StackSize load(const WaveDevice& device, std::uint64_t& layout) = 0;
  // Where the text encoder and VAE run (the memory plan's aux_on_device); before any prepare.
  virtual void use_aux_device(bool on_device) = 0;
  // Collective: starts the engines with the plan's strategy split over the experts.
  virtual void start(const StrategyChoice& choice, const StackSize& stack) = 0;

  // Text worker: the job's prompts, latents and scheduler (prepare_job). Throws: the job fails.
  virtual void prepare(JobRun& run) = 0;
  // Wave, collective: one denoising step of `run` through expert `expert` in a pass that streams
  // the experts of the bit mask `pass_experts` (PassDecision::experts). Throws BlockComputeError
  // when the job's own computation failed (the pass was completed, the ranks are in step); any
  // other exception is the transfers' and must end every rank. `hook`: denoise_step's.
  virtual void step(JobRun& run, int expert, unsigned pass_experts, const BlockHook& hook,
                    const StepGroups& groups) = 0;
  // Wave, collective: the pass without a job on this rank (the gathers joined, nothing computed).
  virtual void ghost(unsigned pass_experts) = 0;
  // Decode worker: the job's latents kept and decoded into its sink (finish_job). Records a
  // failure in run.result; throws only when the decoder itself cannot be had.
  virtual void finish(JobRun& run, const SinkFactory& open_sink, const LatentsKeeper& keep_latents) = 0;
  // After the wave, before the last decodes: frees the engines and says what they did.
  virtual WorkFacts end() = 0;
};

// Every part of the model folder a run reads, checked without loading any block: the
// transformer(s) (configs against tensors), the text encoder's and the VAE's checkpoint headers,
// the tokenizer against the text encoder's vocabulary, the fused LoRAs against their expert. What
// load() checks first, for a caller that
// must refuse before it writes anything. Throws dlo::Error naming the part and the file.
void check_model_parts(const ModelInfo& model);

// The real work: the model folder's transformer(s) through the offload engine, its text encoder
// and VAE. `world`, `model` and `options` must outlive it. `engine`: the engines' options beyond
// those GenerateOptions sets (a test build's fault injection: EngineOptions::fail_at_block).
std::unique_ptr<BatchWork> make_model_work(const MpiWorld& world, const ModelInfo& model, const GenerateOptions& options,
                                           EngineOptions engine = {});

}  // namespace dlo
