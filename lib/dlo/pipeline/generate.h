// Text to video on every rank at once: WanPipeline's steps (prompt encoding, seeded latents,
// denoising with guidance, VAE decode, uint8 frames) for a batch of jobs, with the transformer's
// blocks streamed by the offload engine, which all ranks drive together.
//
// One wave, one traversal of the blocks per pass; a pass is one denoising step of each rank's
// current job. At every pass boundary the ranks exchange a few numbers (one small allgather):
// a rank whose job is about to end asks for the next one, and every rank assigns the next jobs in
// rank order the same way, so a rank never waits behind another rank's longer job, and jobs may
// differ in steps, size, frames and guidance. A rank with nothing to compute joins the gathers
// without computing (a ghost pass) so no collective is left waiting.
//
// Each rank has two worker threads beside the wave: one encodes the next job's prompts while the
// current job denoises, the other decodes + writes a finished job while the next one denoises, so the
// ranks do not wait for each other's text encoding or decoding. The first job's prompts are
// encoded before the engine allocates its slots; the engine is freed before the last decodes.
//
// Which rank renders a job never changes its video: latents come from a CPU generator seeded
// with the job's seed alone, and every strategy and rank count computes the same block outputs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/pipeline/job.h"
#include "dlo/pipeline/results.h"

namespace dlo {

class MpiWorld;

// Where the uint8 frames of one job go (a video writer, a folder of PNGs). Frames are RGB24,
// row-major [height][width][3]. finish() is called after the last frame; a sink destroyed without
// finish() must leave nothing that looks finished.
class FrameSink {
 public:
  virtual ~FrameSink() = default;
  virtual void add_frame(const std::uint8_t* rgb) = 0;
  virtual void finish() = 0;
};

struct GenerateOptions {
  at::ScalarType dtype = at::kBFloat16;      // transformer and text encoder
  at::ScalarType vae_dtype = at::kFloat;     // diffusers recommends (and Wan ships) an fp32 VAE
  std::string offload = "auto";              // auto or a strategy name (strategy_name)
  std::string device = "auto";               // auto | cpu | cuda | cuda:N
  // Device memory each rank may use (auto's budget; mixed: blocks kept on the device). Unset: the
  // device's free memory (CPU: the host's, as the page cache).
  std::optional<std::uint64_t> device_budget;
  // This rank's host as NCCL sees it (NCCL_HOSTID, read by the app); empty: the hostname.
  std::string host_id;
  bool keep_page_cache = false;
  // Test hook: job `fail_job` (index) throws in its denoising step `fail_step` (from 1).
  std::int64_t fail_job = -1, fail_step = -1;
};

// Rank-local: one denoising step of this rank's job.
struct StepEvent {
  std::string job_id;
  std::int64_t job_index = 0;
  std::int64_t step = 0, steps = 0;  // step counts from 1
  double seconds = 0;
};

// Rank 0, once per pass: where the batch is.
struct ProgressEvent {
  std::int64_t pass = 0;
  std::int64_t jobs_total = 0, jobs_done = 0, jobs_failed = 0;
  std::vector<std::int64_t> rank_job;   // each rank's current job index, -1: none
  std::vector<std::int64_t> rank_step;  // its steps done
  double eta_s = -1;                    // from the measured step times; -1: not known yet
};

struct GenerateCallbacks {
  std::function<void(const std::string& phase)> on_phase;  // rank-local: "text", "denoise", "decode"
  std::function<void(const StepEvent&)> on_step;           // rank-local
  std::function<void(const ProgressEvent&)> on_progress;   // rank 0
  // Rank 0: every job's result as it reaches rank 0 (finished, or failed with its error).
  std::function<void(const JobResult&)> on_result;
  // Opens the sink of a job's frames. Called on the rank that renders the job, from its worker
  // thread; may throw (the job then fails).
  std::function<std::unique_ptr<FrameSink>(const JobSpec& job, std::int64_t width, std::int64_t height,
                                           std::int64_t frames)>
      open_sink;
  // Keeps a job's final latents before decoding (worker thread). Unset: a job with save_latents
  // set writes them as .safetensors with the job's parameters as metadata.
  std::function<void(const JobSpec& job, std::int64_t index, const at::Tensor& latents)> save_latents;
  // Polled at every pass boundary: true stops the batch on every rank (signals).
  std::function<bool()> stop_requested;
};

struct GenerateReport {
  std::string choice;           // "offload: dlo (reason); device ...; N rank(s)"
  std::vector<JobResult> jobs;  // rank 0: every job that finished or failed; others: their own
  std::string ranks_json;       // rank 0: per-rank engine, wave and memory facts (JSON array)
  bool stopped = false;         // a stop was requested: jobs not finished were left for a rerun
};

// The latents WanPipeline starts from: randn(shape) in fp32 from a CPU generator seeded with
// `seed` (torch.Generator("cpu").manual_seed(seed) + randn_tensor), on the CPU.
at::Tensor initial_latents(const std::vector<std::int64_t>& shape, std::uint64_t seed);

// diffusers' postprocess + export_to_video on one decoded chunk [1, 3, n, H, W] in [-1, 1] (VAE
// dtype): (x * 0.5 + 0.5).clamp(0, 1) in the VAE dtype, then x 255 in fp32 and a truncating
// cast; returns [n, H, W, 3] uint8, contiguous, on the CPU.
at::Tensor frames_to_uint8(const at::Tensor& chunk);

// "bf16/fp32": the compute dtypes that decide a job's bytes (for job_fingerprint).
std::string dtypes_label(const GenerateOptions& options);

// The report as JSON: {"choice", "stopped", "jobs": [results.jsonl records], "ranks": [...]}.
std::string report_json(const GenerateReport& report);

// Collective: every rank calls it with the same model, jobs (in the same order) and options.
// Bad input found before the wave (a job's fields, the device, the checkpoint) is a dlo::Error on
// every rank (the same message). A failure of one job (its text, a computation, decoding,
// writing) is recorded in its JobResult and the batch goes on. A failure of the transfers or the
// collective ends every rank (MpiWorld::abort).
GenerateReport generate(const MpiWorld& world, const ModelInfo& model, const std::vector<JobSpec>& jobs,
                        const GenerateOptions& options, const GenerateCallbacks& callbacks);

}  // namespace dlo
