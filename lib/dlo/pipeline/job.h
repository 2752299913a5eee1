// One video to render (a job), the model folder it runs on, and the checks a job passes before any
// weight is read.
//
// Field names in messages are the job's own keys (height, frames, ...), the same words a manifest
// uses; apps turn them into flag names where the value came from a flag.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dlo/diffusion/noise_scheduler.h"
#include "dlo/models/umt5.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/models/wan_vae.h"

namespace dlo {

// What to render and where to put it. Defaults are WanPipeline's (480x832, 81 frames, 50 steps,
// guidance 5.0, negative prompt "") and Wan's 16 fps.
struct JobSpec {
  std::string id = "video";
  std::string prompt;
  std::string negative_prompt;                   // used only when guidance > 1
  std::uint64_t seed = 0;
  std::int64_t steps = 50;
  double guidance = 5.0;                         // classifier-free guidance when > 1
  std::int64_t height = 480, width = 832, frames = 81;
  std::optional<NoiseSchedulerKind> scheduler;   // unset: the model folder's scheduler
  std::optional<double> flow_shift;              // unset: the folder's flow_shift
  // Outputs. The pipeline does not interpret these; the frame sink the app opens does.
  std::string output;                            // video file, or a folder for png
  std::string format = "mp4";                    // mp4 | png | ffv1
  std::int64_t fps = 16;
  std::int64_t crf = 25;
  std::string preset = "medium";
  std::string save_latents;                      // "": none; else a .safetensors path

  bool guided() const { return guidance > 1.0; }
};

// The parts of a diffusers Wan2.1 text-to-video folder a job needs, read from their configs only
// (no weights): cheap enough for every rank before anything is loaded.
struct ModelInfo {
  std::string dir;
  WanTransformerConfig transformer;
  WanVaeConfig vae;
  Umt5Config text_encoder;
  NoiseSchedulerConfig scheduler;
  // Height and width must be multiples of this (VAE spatial factor x transformer patch), frames
  // of the form temporal * k + 1.
  std::int64_t spatial_multiple() const;
  std::int64_t temporal_factor() const;
  // Latent shape [1, C, (frames - 1) / temporal + 1, height / spatial, width / spatial].
  std::vector<std::int64_t> latent_shape(const JobSpec& job) const;
};

// Reads `dir`'s model_index.json and the configs of transformer/, vae/, text_encoder/,
// scheduler/ and checks that tokenizer/ is there, and that the parts fit together (text
// encoder width = transformer text_dim, VAE z_dim = transformer channels). Throws dlo::Error
// naming the folder, the part and the field.
ModelInfo read_model_info(const std::string& dir);

// One problem with a job's field.
struct FieldError {
  std::string field;    // the job's key, e.g. "height"
  std::string message;  // what is wrong and why, without the field name
};

// Checks everything about `job` that needs no weights: positive steps, sizes multiple of
// info.spatial_multiple(), frames of the form temporal * k + 1, a finite guidance, a finite
// positive flow_shift, fps, crf. Returns every problem (empty: the job is good). Output paths
// are checked by the app (they depend on the format).
std::vector<FieldError> validate_job(const JobSpec& job, const ModelInfo& info);

// The job's noise scheduler config: the folder's with the job's overrides.
NoiseSchedulerConfig job_scheduler_config(const JobSpec& job, const ModelInfo& info);

// The job's parameters as JSON (prompt, negative prompt, seed, steps, guidance, scheduler,
// flow_shift, height, width, frames, fps, model, dlo version), for metadata and logs; and the
// same as one human line ("prompt: ...; seed 42; ...").
std::string job_parameters_json(const JobSpec& job, const ModelInfo& info);
std::string job_parameters_text(const JobSpec& job, const ModelInfo& info);

// Jobs as JSON (every field), to share a plan between ranks, and back. jobs_from_json throws
// dlo::Error for text that is not such a list.
std::string jobs_to_json(const std::vector<JobSpec>& jobs);
std::vector<JobSpec> jobs_from_json(const std::string& text);

// dlo's version ("0.1.0").
const char* dlo_version();

}  // namespace dlo
