// The three stages of one job on the rank that renders it, as WanPipeline runs them:
//
//   prepare  the prompts through the text encoder, the seeded initial latents, the noise scheduler;
//   denoise  one step: the transformer's blocks from the offload engine (both guidance branches
//            through each block while its weights are in the slot), guidance, the scheduler step;
//   finish   the final latents kept if asked, the VAE decode into uint8 frames, the frames into the
//            job's sink and their sha256.
//
// generate() drives them for a batch (prepare and finish on worker threads, denoise on the wave);
// a test can drive them for one job (tests/render/test_render.cpp checks every step against
// WanPipeline's). Which rank runs a job never changes its video: latents come from a CPU generator
// seeded with the job's seed alone, and every strategy and rank count computes the same blocks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "dlo/config/job.h"
#include "dlo/diffusion/noise_scheduler.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/pipeline/batch_plan.h"
#include "dlo/pipeline/results.h"

namespace dlo {

class BlockEngine;
class ExchangeGroup;
class PromptEncoder;
class WanOffloadRunner;
class WanVae;

// Where the uint8 frames of one job go (a video writer, a folder of PNGs). Frames are RGB24,
// row-major [height][width][3]. finish() is called after the last frame; a sink destroyed without
// finish() must leave nothing that looks finished.
class FrameSink {
 public:
  virtual ~FrameSink() = default;
  virtual void add_frame(const std::uint8_t* rgb) = 0;
  // After the last frame: `frames_sha256` is the hash of every frame added, in order (results.jsonl's),
  // for the output's own metadata where the format can still write it.
  virtual void finish(const std::string& frames_sha256) = 0;
};

// One job on its rank, from assignment to its result.
struct JobRun {
  BatchJob job;
  JobResult result;                      // ok until a stage fails
  at::Tensor context, negative_context;  // [1, 512, text_dim], transformer dtype, on the device
  at::Tensor latents;                    // [1, C, F, h, w], fp32, on the device
  std::unique_ptr<NoiseScheduler> scheduler;
  std::int64_t steps_done = 0;
  // Two experts (Wan2.2 A14B): a step whose timestep t is >= this (boundary_ratio x
  // num_train_timesteps, compared in fp32 as WanPipeline's `t >= boundary_timestep` promotes) runs
  // expert 0 (transformer/) with guidance, the others expert 1 (transformer_2/) with guidance_2.
  // Unset: one expert. Set by prepare_job.
  std::optional<float> boundary_timestep;
  double guidance_2 = 0;
  // Wan2.2 TI2V (expand_timesteps): the step's timestep given per token, [B, L]. Set by prepare_job.
  bool per_token_timesteps = false;
  // The job's unfused LoRAs (JobSpec::loras) per expert, on the job's device; null where none
  // applies. Set by prepare_job.
  std::vector<std::shared_ptr<const WanAdapters>> adapters;

  // A run of `job` on `rank`; the result carries the job's id, index, output, parameters and
  // fingerprint.
  JobRun(BatchJob job, const ModelInfo& model, int rank);
  bool failed() const { return !result.ok(); }
  std::int64_t steps_left() const { return job.spec.steps - steps_done; }
  // The expert the next step runs (0 with one expert, or when no step is left) and its guidance
  // scale. Needs the scheduler (after prepare_job).
  int expert() const;
  double guidance_now() const { return expert() == 0 ? job.spec.guidance : guidance_2; }
  // Marks the job failed with `what` (the first failure wins).
  void fail(const std::string& what);
};

// Two experts: how many of the job's steps run expert 0 (transformer/): those whose timestep is
// at least the boundary (a prefix: timesteps fall), as JobRun::expert() decides them; one expert:
// all. For the job scheduler's expert alignment, before any job is prepared.
std::int64_t high_noise_steps(const JobSpec& job, const ModelInfo& model);

// The latents WanPipeline starts from: randn(shape) in fp32 from a CPU generator seeded with
// `seed` (torch.Generator("cpu").manual_seed(seed) + randn_tensor), on the CPU.
at::Tensor initial_latents(const std::vector<std::int64_t>& shape, std::uint64_t seed);

// diffusers' postprocess + export_to_video on one decoded chunk [1, 3, n, H, W] in [-1, 1] (VAE
// dtype): (x * 0.5 + 0.5).clamp(0, 1) in the VAE dtype, then x 255 in fp32 and a truncating
// cast; returns [n, H, W, 3] uint8, contiguous, on the CPU.
at::Tensor frames_to_uint8(const at::Tensor& chunk);

// The part of prepare that needs no model: the noise scheduler set to the job's steps, the experts'
// boundary and guidance, per-token timesteps (a fake BatchWork in the tests uses it alone).
void prepare_schedule(JobRun& run, const ModelInfo& model);

// prepare: the prompts (the negative one only with guidance) in `dtype` on `device`, the initial
// latents on `device`, the scheduler set to the job's steps, the experts' boundary and guidance. Throws dlo::Error (a prompt that is
// not valid UTF-8, ...): the job fails.
void prepare_job(JobRun& run, const PromptEncoder& text, const ModelInfo& model, at::ScalarType dtype,
                 c10::Device device);

// Called inside the traversal, before block `block` of step `step` (from 1) computes, and with block
// -1 before the traversal, among the step's inputs: a test hook that may throw to make the job's
// computation fail there.
using BlockHook = std::function<void(std::int64_t step, std::int64_t block)>;

// denoise: one step of WanPipeline's loop for `run`, through `runner`, which must be the runner of
// run.expert(): the latents in the transformer's dtype, the step's timestep, every guidance branch
// through the engine in one traversal, noise = uncond + guidance_now() (cond - uncond), the
// scheduler's step. Collective with the engine's
// other ranks (one traversal). Throws BlockComputeError when the job's own computation failed,
// anywhere in the step: the traversal was completed (as a ghost where needed), so the engine and
// the other ranks are still in step and only this job fails. Any other exception comes from the
// transfers: the collective is out of step and every rank must end.
// `pass`: the engines this pass traverses together (two experts with ranks on both; see
// BlockEngine::traverse_together), runner's among them; empty: runner's alone.
//
// `groups`: the ranks computing the job together (pipeline/topology.h), every one of them calling
// denoise_step for the same job and step: a guided job with `partners` runs its branches on the
// two CFG partners (each along the sequence over `half`, when set), any other over `group` along
// the sequence (runner.h's forward_cfg and forward_group). Every rank of the group ends the step
// with the same latents; a failure anywhere in the group (the step's inputs included) fails the
// step on every rank of it, without leaving a partner waiting.
struct StepGroups {
  const ExchangeGroup* group = nullptr;     // all the job's ranks (nullptr: this rank alone)
  const ExchangeGroup* half = nullptr;      // CFG: this rank's half of the group (nullptr: one rank)
  const ExchangeGroup* partners = nullptr;  // CFG: this rank and its partner in the other half
};
void denoise_step(WanOffloadRunner& runner, JobRun& run, at::ScalarType dtype, const BlockHook& hook = {},
                  const std::vector<BlockEngine*>& pass = {}, const StepGroups& groups = {});

// Opens the sink of a job's frames (width, height, frames); may throw (the job then fails).
using SinkFactory = std::function<std::unique_ptr<FrameSink>(const BatchJob& job, std::int64_t width,
                                                             std::int64_t height, std::int64_t frames)>;
// Keeps a job's final latents before decoding. Unset: a job with save_latents set writes them as
// .safetensors with the job's parameters as metadata.
using LatentsKeeper = std::function<void(const BatchJob& job, const at::Tensor& latents)>;

// finish: the latents kept (keeper, or save_latents), decoded chunk by chunk by `vae` into uint8
// frames, each into the sink (if any) and the frames' sha256; the output's size recorded. A
// failure fails the job (recorded in run.result); the sink then leaves nothing finished.
void finish_job(JobRun& run, const WanVae& vae, const ModelInfo& model, const SinkFactory& open_sink,
                const LatentsKeeper& keep_latents);

}  // namespace dlo
