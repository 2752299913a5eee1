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

// A LoRA fused into a transformer's weights for a whole run (--fuse-lora, the manifest's
// `fuse_loras`), written `[high=|low=]PATH[:STRENGTH]`: `high=`/`low=` choose Wan2.2's expert
// (transformer/ denoises the high-noise steps, transformer_2/ the low-noise ones) and are needed
// for a two-expert model and refused for another; STRENGTH (default 1) scales the LoRA's change.
struct LoraSpec {
  std::string path;
  double strength = 1.0;
  int expert = -1;  // -1: the one transformer; 0: transformer/ (high=); 1: transformer_2/ (low=)
  bool operator==(const LoraSpec&) const = default;
};
// Parses `[high=|low=]PATH[:STRENGTH]` (the strength: the text after the last ':', when it reads
// as a finite number). Throws dlo::Error naming `what` (the flag or key) for an empty path.
LoraSpec parse_lora_spec(const std::string& text, const std::string& what);
// The spec written back in that form (the strength to 17 digits: it reads back the same).
std::string lora_spec_text(const LoraSpec& s);
// A list of specs written "A:0.8, low=B" (the job field `loras`: entries split at commas, blanks
// around them dropped; "" is none). Throws dlo::Error naming `what` for an empty entry.
std::vector<LoraSpec> parse_lora_list(const std::string& text, const std::string& what);
std::string lora_list_text(const std::vector<LoraSpec>& specs);
// What a file holds, as 16 hex digits (model_identity's reading of one file: a checkpoint's header
// and samples of its data). Throws dlo::Error naming the file.
std::string file_identity(const std::string& path);

// Where a model's parts are: a diffusers model folder's sub-folders, except a transformer given
// as its own weights (--transformer FILE: a single .safetensors file, an index, or a folder of
// shards, in diffusers', the original Wan or ComfyUI's names) and a VAE given so (--vae FILE, in
// diffusers' or the original Wan2.1 / Wan2.2 VAE names). Every path to a part is asked of this,
// not composed elsewhere.
struct ModelParts {
  std::string dir;                         // the diffusers model folder
  std::string transformer, transformer_2;  // weights given instead of transformer/, transformer_2/ ("": none)
  std::string vae_file{};                  // weights given instead of vae/'s ("": none)
  std::vector<LoraSpec> fused_loras{};     // LoRAs fused into the transformer(s) for the run, in merge order

  std::string index() const { return dir + "/model_index.json"; }
  // The transformer's weights: the file given, else the folder's transformer/ (and so for
  // transformer_2). What WanTransformer::load and open_wan_transformer read.
  std::string transformer_weights() const { return transformer.empty() ? folder("transformer") : transformer; }
  std::string transformer_2_weights() const { return transformer_2.empty() ? folder("transformer_2") : transformer_2; }
  // The folder's vae/ (its config.json, where there is one), and the VAE's weights: the file
  // given, else vae/. What WanVae::load and open_wan_vae read.
  std::string vae() const { return folder("vae"); }
  std::string vae_weights() const { return vae_file.empty() ? vae() : vae_file; }
  std::string text_encoder() const { return folder("text_encoder"); }
  std::string tokenizer() const { return folder("tokenizer"); }
  std::string scheduler() const { return folder("scheduler"); }
  // `dir`/`part`: a part's folder (its config.json there, whether or not its weights are).
  std::string folder(const std::string& part) const { return dir + "/" + part; }
};

struct ModelInfo {
  ModelParts parts;
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
  // The experts' weights (ModelParts::transformer_weights, then transformer_2's for two experts)
  // and configs.
  std::vector<std::string> expert_weights() const;
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
// channels, both experts on the same latents and text, an RGB video out of the VAE). A transformer
// given as its own weights (ModelParts::transformer, transformer_2) has its config from its
// tensors' shapes (infer_wan_transformer_config, headers only), checked against the folder's
// transformer config where the folder has one (then the folder may lack the weights, or the
// sub-folder altogether); transformer_2 given for a model of one transformer is an error, and so
// is a fused LoRA whose file is not there or whose expert selector does not fit the model. A VAE
// given as its own weights (ModelParts::vae_file) has its config as read_vae_config reads it.
// Throws dlo::Error naming the folder or file, the part and the field.
ModelInfo read_model_info(const ModelParts& parts);
// The VAE's config as read_model_info reads it: vae/config.json, or for weights given, their
// shapes' (infer_wan_vae_config, headers only; checked against vae/config.json when there is one).
// Throws dlo::Error naming the file.
WanVaeConfig read_vae_config(const ModelParts& parts);
// One expert's config as read_model_info reads it (`second`: transformer_2): its folder's
// config.json, or for weights given, their shapes' (checked against the folder's config.json when
// there is one). Throws dlo::Error naming the file.
WanTransformerConfig read_expert_config(const ModelParts& parts, bool second);
inline ModelInfo read_model_info(const std::string& dir) { return read_model_info(ModelParts{dir, "", ""}); }

// What a model folder holds, as 16 hex digits of a sha256: its model_index.json and every file of
// transformer/, transformer_2/ (when there is one), vae/, text_encoder/, tokenizer/ and scheduler/ by name, size and content, where a
// checkpoint's content is its header and 16 samples of 4 KiB spread over its data (about 64 KiB
// read per file, whatever its size). The same files give the same identity wherever the folder
// is; new weights differ even under an unchanged header. For resume (job_fingerprint). Throws
// dlo::Error naming a file it cannot read. A transformer given as its own weights
// (ModelParts::transformer, transformer_2) stands in for its sub-folder: its file, or every file
// of its folder, by name and content as above (so another file, or the same file's weights
// changed, give another identity; the folder's own transformer/ no longer counts); so does a VAE
// given (ModelParts::vae_file) for vae/. Each fused LoRA adds its file by content, with its expert
// and strength, in order.
std::string model_identity(const ModelParts& parts);
inline std::string model_identity(const std::string& dir) { return model_identity(ModelParts{dir, "", ""}); }

}  // namespace dlo
