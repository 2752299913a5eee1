// The parts of a diffusers Wan text-to-video model folder a job needs, read from their configs only
// (no weights): cheap enough for every rank before anything is loaded. Wan2.1 (one transformer)
// and Wan2.2 T2V-A14B (two experts: transformer/ for high noise, transformer_2/ for low noise,
// switched at boundary_ratio). Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dlo/config/noise_scheduler_config.h"
#include "dlo/config/umt5_config.h"
#include "dlo/config/wan_transformer_config.h"
#include "dlo/config/wan_vae_config.h"

namespace dlo {

struct ModelInfo {
  std::string dir;
  WanTransformerConfig transformer;
  // Wan2.2 A14B: the low-noise expert (transformer_2/) and model_index.json's boundary_ratio; both
  // set or both unset. WanPipeline runs a step with `transformer` while its timestep t >=
  // boundary_ratio * num_train_timesteps, else with `transformer_2`.
  std::optional<WanTransformerConfig> transformer_2;
  std::optional<double> boundary_ratio;
  // Wan2.2 TI2V-5B (model_index.json's expand_timesteps): the transformer gets one timestep per
  // token ([B, L], WanPipeline's `mask[0][0][:, ::2, ::2] * t`), not one per sample.
  bool expand_timesteps = false;
  WanVaeConfig vae;
  Umt5Config text_encoder;
  NoiseSchedulerConfig scheduler;
  bool two_experts() const { return transformer_2.has_value(); }
  // The experts' folder names ("transformer", then "transformer_2" for two experts) and configs.
  std::vector<std::string> expert_dirs() const;
  std::vector<WanTransformerConfig> expert_configs() const;
  // Height and width must be multiples of this (VAE spatial factor x transformer patch), frames
  // of the form temporal * k + 1.
  std::int64_t spatial_multiple() const;
  std::int64_t temporal_factor() const;
  // Latent shape [1, C, (frames - 1) / temporal + 1, height / spatial, width / spatial].
  std::vector<std::int64_t> latent_shape(std::int64_t frames, std::int64_t height, std::int64_t width) const;
};

// Reads `dir`'s model_index.json and the configs of transformer/ (and transformer_2/ when the
// index names it), vae/, text_encoder/, scheduler/ and checks that tokenizer/ is there, and that
// the parts fit together (text encoder width = transformer text_dim, VAE z_dim = transformer
// channels, both experts on the same latents and text, an RGB video out of the VAE). Throws
// dlo::Error naming the folder, the part and the field.
ModelInfo read_model_info(const std::string& dir);

// What a model folder holds, as 16 hex digits of a sha256: its model_index.json and every file of
// transformer/, transformer_2/ (when there is one), vae/, text_encoder/, tokenizer/ and scheduler/ by name, size and content, where a
// checkpoint's content is its header and 16 samples of 4 KiB spread over its data (about 64 KiB
// read per file, whatever its size). The same files give the same identity wherever the folder
// is; new weights differ even under an unchanged header. For resume (job_fingerprint). Throws
// dlo::Error naming a file it cannot read.
std::string model_identity(const std::string& dir);

}  // namespace dlo
