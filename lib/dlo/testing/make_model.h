// Writes random-weight model directories in the diffusers layout (dlo-checkpoint make).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dlo/io/dtype.h"
#include "dlo/config/umt5_config.h"
#include "dlo/config/wan_transformer_config.h"
#include "dlo/config/wan_vae_config.h"
#include "dlo/io/safetensors_writer.h"

namespace dlo {

struct MakeModelOptions {
  DType dtype = DType::BF16;
  std::uint64_t seed = 0;
  std::uint64_t shard_bytes = kDiffusersShardBytes;  // per component; 0: one file
  WanTransformerConfig transformer = WanTransformerConfig::preset("wan-test");
  // When the transformer and the VAE are both written, the parts must fit (WanPipeline runs the
  // transformer on the VAE's latents): true writes the transformer with in/out_channels = vae.z_dim;
  // false requires transformer.in/out_channels to equal it already (else dlo::Error).
  bool channels_follow_vae = true;
  // The VAE: small, but with the real Wan2.1 structure (dim_mult [1,2,4,4], 2 res blocks, temporal
  // upsampling). Written in fp32 unless vae_dtype says otherwise, as the real repos ship it.
  WanVaeConfig vae = WanVaeConfig::preset("wan2.1-vae-small");
  DType vae_dtype = DType::F32;
  // The text encoder (UMT5EncoderModel); its d_model must equal transformer.text_dim when both
  // are written. "umt5-test": tiny, for the tiny tokenizer (vocab 612) and wan-test (text_dim 16).
  Umt5Config text_encoder = Umt5Config::preset("umt5-test");
  // Components to write; the known ones: "transformer", "transformer_2" (Wan2.2 A14B's low-noise
  // expert: the transformer's shape, weights drawn with seed + kSecondExpertSeed; needs
  // "transformer"), "scheduler", "vae", "text_encoder", "tokenizer" (a SentencePiece model trained
  // on a built-in text; see dlo/text/tokenizer.h) (plus model_index.json, with boundary_ratio when
  // transformer_2 is written).
  std::vector<std::string> components{"transformer", "scheduler", "vae", "text_encoder", "tokenizer"};
  double boundary_ratio = 0.875;  // model_index.json's, with transformer_2 (Wan2.2 T2V-A14B's value)
  // model_index.json's expand_timesteps (Wan2.2 TI2V-5B: one timestep per token).
  bool expand_timesteps = false;
  double flow_shift = 3.0;  // the scheduler's (3.0: Wan2.1 and the converted A14B; 5.0: TI2V-5B)
};

// What transformer_2's seed adds to MakeModelOptions::seed (its tensors have the same names as the
// first expert's, so the same seed would draw the same weights).
inline constexpr std::uint64_t kSecondExpertSeed = 0x2e2;

struct MakeModelResult {
  std::vector<std::string> written;  // component folders
  std::uint64_t bytes = 0;           // tensor bytes written
};

// Checks everything make_model() can refuse before it writes: known components, each listed once;
// valid configs; parts that fit together (transformer in/out_channels == VAE z_dim when both are
// written); `dir` can be created or written (not a file); the write's peak memory (the largest
// tensor) fits what is available. Throws dlo::Error naming the problem. Writes nothing.
void check_make_model(const std::string& dir, const MakeModelOptions& options);

// Writes `<dir>/<component>/...` for each requested component and `<dir>/model_index.json`,
// after check_make_model(). Each component's checkpoint replaces the one its folder held (see
// WriteOptions::replace_folder); every file is written atomically. Memory stays bounded by the
// largest tensor. Throws dlo::Error on bad options (before writing) or I/O failure.
MakeModelResult make_model(const std::string& dir, const MakeModelOptions& options);

// Only the transformer: `dir` gets config.json + safetensors (+ index when sharded).
WriteResult write_random_wan_transformer(const std::string& dir, const WanTransformerConfig& c, DType dtype,
                                         std::uint64_t seed, std::uint64_t shard_bytes);

// Only the VAE: `dir` gets config.json + safetensors (a complete AutoencoderKLWan: encoder too).
// Convolutions ~ N(0, 1/fan_in) (conv_out 0.5/fan_in, so that the decoded frames mostly stay inside
// the [-1, 1] clamp), RMS norm gammas 1 + N(0, 0.1^2), biases N(0, 0.02^2); values depend only on
// (seed, tensor name).
WriteResult write_random_wan_vae(const std::string& dir, const WanVaeConfig& c, DType dtype, std::uint64_t seed,
                                 std::uint64_t shard_bytes);

// Random-weight text_encoder/ folder: config.json + model.safetensors (or shards + index when
// the tensors exceed shard_bytes; 0: one file). Values depend only on (seed, tensor name);
// scales as transformers' UMT5 init (shared ~ N(0,1), q ~ N(0, (d_model d_kv)^-1/2), ...), norm
// weights 1 + N(0, 0.02^2).
WriteResult write_random_umt5_encoder(const std::string& dir, const Umt5Config& c, DType dtype, std::uint64_t seed,
                                      std::uint64_t shard_bytes);

}  // namespace dlo
