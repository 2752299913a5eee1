// Text to video on every rank at once: WanPipeline's steps (prompt encoding, seeded latents,
// denoising with guidance, VAE decode, uint8 frames) with the transformer's blocks streamed by the
// offload engine, which all ranks drive together.
//
// Phases, so that one large thing at a time holds memory: (1) every rank reads the model's
// configs and checks its jobs; all ranks agree nobody failed. (2) a rank with a job encodes its
// prompts with the text encoder (its weights are the checkpoint's mmap pages, shared by the ranks
// of a node), then drops it. (3) every rank builds the offload engine (shards and slots) and the
// ranks run one wave: a rank makes `steps` denoising steps of its job, and ranks with fewer or no
// steps join the gathers without computing (ghost passes), so nobody waits on a collective that
// others skip. (4) the engine's memory is freed; a rank with a job decodes its latents with the
// VAE chunk by chunk into uint8 frames and hands them to a frame sink (the app's video writer).
// (5) the ranks' results are gathered to rank 0.
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

#include "dlo/offload/engine.h"
#include "dlo/pipeline/job.h"

namespace dlo {

class MpiWorld;

// Where the uint8 frames of one job go (a video writer, a folder of PNGs, a hash). Frames are
// RGB24, row-major [height][width][3]. finish() is called after the last frame; a sink destroyed
// without finish() must leave nothing that looks finished.
class FrameSink {
 public:
  virtual ~FrameSink() = default;
  virtual void add_frame(const std::uint8_t* rgb) = 0;
  virtual void finish() = 0;
};

struct GenerateOptions {
  std::string model_dir;
  at::ScalarType dtype = at::kBFloat16;      // transformer and text encoder
  at::ScalarType vae_dtype = at::kFloat;     // diffusers recommends (and Wan ships) an fp32 VAE
  std::string offload = "auto";              // auto | resident | layerwise | dlo
  std::string device = "auto";               // auto | cpu | cuda | cuda:N
  bool keep_page_cache = false;
};

// Rank-local progress, for the app to print (the library prints nothing).
struct StepEvent {
  std::string job_id;
  std::int64_t step = 0, steps = 0;  // step counts from 1
  double seconds = 0;                // this step's wall time
};

struct JobResult {
  std::string id;
  std::string status = "ok";  // ok | failed
  std::string error;
  int rank = 0;
  std::string output;
  std::string frames_sha256;  // of the uint8 frames, in order
  std::int64_t frames = 0, height = 0, width = 0;
  double text_s = 0, denoise_s = 0, decode_s = 0;  // decode includes the sink (encoding, writing)
  std::vector<double> step_s;
  std::int64_t rss_peak_kb = -1;
  std::string parameters_json;  // job_parameters_json()
};

struct GenerateReport {
  std::string choice;              // "offload: dlo (reason); device ...; N rank(s)"
  std::vector<JobResult> jobs;     // rank 0: every rank's jobs, in rank order; others: their own
  std::string ranks_json;          // rank 0: per-rank engine and memory facts (JSON array)
};

struct GenerateCallbacks {
  std::function<void(const StepEvent&)> on_step;
  // Opens the sink of a job's frames (called on the rank that renders it, after denoising).
  std::function<std::unique_ptr<FrameSink>(const JobSpec& job, std::int64_t width, std::int64_t height,
                                           std::int64_t frames)>
      open_sink;
  // Called with each phase's name as a rank enters it ("text", "denoise", "decode").
  std::function<void(const std::string& phase)> on_phase;
};

// The latents WanPipeline starts from: randn(shape) in fp32 from a CPU generator seeded with
// `seed` (torch.Generator("cpu").manual_seed(seed) + randn_tensor), on the CPU.
at::Tensor initial_latents(const std::vector<std::int64_t>& shape, std::uint64_t seed);

// diffusers' postprocess + export_to_video on one decoded chunk [1, 3, n, H, W] in [-1, 1] (VAE
// dtype): (x * 0.5 + 0.5).clamp(0, 1) in the VAE dtype, then x 255 in fp32 and a truncating
// cast; returns [n, H, W, 3] uint8, contiguous, on the CPU.
at::Tensor frames_to_uint8(const at::Tensor& chunk);

// The report as JSON: {"choice", "jobs": [job results with their parameters], "ranks": [...]}.
std::string report_json(const GenerateReport& report);

// Collective: every rank calls it with the same model and options; `my_jobs` are the jobs this
// rank renders (at most one per rank for now; empty: the rank only lends its share of the
// weights). Bad input found before the wave is a dlo::Error on every rank (the same message).
// A failure inside the wave ends every rank (MpiWorld::abort); a failure in decoding or writing
// a job is recorded in its JobResult.
GenerateReport generate(const MpiWorld& world, const ModelInfo& model, const std::vector<JobSpec>& my_jobs,
                        const GenerateOptions& options, const GenerateCallbacks& callbacks);

}  // namespace dlo
