// The parts of a diffusers Wan2.1 text-to-video model folder a job needs, read from their configs
// only (no weights): cheap enough for every rank before anything is loaded. Torch-free.
#pragma once

#include <cstdint>
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
  WanVaeConfig vae;
  Umt5Config text_encoder;
  NoiseSchedulerConfig scheduler;
  // Height and width must be multiples of this (VAE spatial factor x transformer patch), frames
  // of the form temporal * k + 1.
  std::int64_t spatial_multiple() const;
  std::int64_t temporal_factor() const;
  // Latent shape [1, C, (frames - 1) / temporal + 1, height / spatial, width / spatial].
  std::vector<std::int64_t> latent_shape(std::int64_t frames, std::int64_t height, std::int64_t width) const;
};

// Reads `dir`'s model_index.json and the configs of transformer/, vae/, text_encoder/,
// scheduler/ and checks that tokenizer/ is there, and that the parts fit together (text
// encoder width = transformer text_dim, VAE z_dim = transformer channels). Throws dlo::Error
// naming the folder, the part and the field.
ModelInfo read_model_info(const std::string& dir);

// What a model folder holds, as 16 hex digits of a sha256: its model_index.json and every file of
// transformer/, vae/, text_encoder/, tokenizer/ and scheduler/ by name, size and content, where a
// checkpoint's content is its header and 16 samples of 4 KiB spread over its data (about 64 KiB
// read per file, whatever its size). The same files give the same identity wherever the folder
// is; new weights differ even under an unchanged header. For resume (job_fingerprint). Throws
// dlo::Error naming a file it cannot read.
std::string model_identity(const std::string& dir);

}  // namespace dlo
