// The Wan2.1 transformer's config (diffusers' WanTransformer3DModel config.json) and what follows
// from it without tensors: its checkpoint's tensor names and shapes, the tokens a latent makes and
// the working memory one forward needs. Torch-free: manifests, plans and memory estimates use it
// before (and without) libtorch; models/wan_transformer.h computes with it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dlo/io/dtype.h"
#include "dlo/io/json_config.h"
#include "dlo/io/tensor_spec.h"

namespace dlo {

struct WanTransformerConfig {
  std::array<std::int64_t, 3> patch_size{1, 2, 2};
  std::int64_t num_attention_heads = 40;
  std::int64_t attention_head_dim = 128;
  std::int64_t in_channels = 16;
  std::int64_t out_channels = 16;
  std::int64_t text_dim = 4096;
  std::int64_t freq_dim = 256;
  std::int64_t ffn_dim = 13824;
  std::int64_t num_layers = 40;
  bool cross_attn_norm = true;
  double eps = 1e-6;
  std::int64_t rope_max_seq_len = 1024;

  std::int64_t dim() const { return num_attention_heads * attention_head_dim; }

  // Reads a diffusers transformer/config.json. Throws dlo::Error naming the file and field for
  // missing, mistyped, unsupported (I2V) or inconsistent values.
  static WanTransformerConfig from_json(const JsonConfig& json);
  // "wan-test" (diffusers' model-test config), "wan2.1-t2v-1.3b", "wan2.1-t2v-14b"; and the shape of
  // each expert of the two-expert models "wan2.2-t2v-a14b" (= 14B's) and "wan2.2-a14b-test" (=
  // wan-test's); "wan2.2-ti2v-5b": TI2V-5B's transformer (48 latent channels, for the Wan2.2
  // VAE) and "wan2.2-ti2v-test" (wan-test's shape on the 12 channels of the VAE "wan2.2-vae-test").
  static WanTransformerConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  // Whether the preset names a model of two experts (transformer/ and transformer_2/).
  static bool preset_has_two_experts(const std::string& name);
  // What else the preset's model has: the VAE preset it runs on (WanVaeConfig::preset), and
  // whether its pipeline gives one timestep per token (model_index.json's expand_timesteps).
  static std::string preset_vae(const std::string& name);
  static bool preset_expands_timesteps(const std::string& name);
  // Checks consistency (positive sizes, even head dim, ...). Throws dlo::Error naming `where`.
  void validate(const std::string& where) const;
  // config.json text exactly as diffusers writes it (keys sorted, nulls for unused I2V fields).
  std::string to_json() const;
};

// A transformer's tensors: diffusers name -> shape (tensor_shapes of a checkpoint).
using TensorShapeMap = std::map<std::string, std::vector<std::int64_t>>;

// The config of the transformer whose tensors are `shapes` (named `label` in errors). The shapes
// give the width (patch_embedding), in_channels and patch_size (patch_embedding), out_channels
// (proj_out / the patch), text_dim (text_embedder.linear_1), freq_dim (time_embedder.linear_1),
// ffn_dim (blocks.0's ffn), num_layers (the highest block index + 1) and cross_attn_norm
// (blocks.0.norm2 present). What they cannot give (the heads, eps, rope_max_seq_len) comes from
// `folder` (the model folder's transformer config) when there is one, whose every field the shapes
// give must agree: a difference is an error naming the field. Without one, the shapes must be a
// known config's (`preset_names`' shapes; the real Wan models have heads of 128): `matched` gets
// its name, and a shape no known config has is refused, naming what the shapes give. Then every
// tensor the config implies must be there with its shape, and no other (the first few missing,
// unexpected or misshapen named). Throws dlo::Error.
WanTransformerConfig infer_wan_transformer_config(const TensorShapeMap& shapes, const WanTransformerConfig* folder,
                                                  const std::string& label, std::string* matched = nullptr);

// Device (or host) bytes one forward needs beyond the weights, at its peak, for a latent of
// `frames` x `height` x `width` (the latent's own size, before patching), `text_len` text tokens,
// `branches` guidance branches (run back to back through each block) and compute dtype `dtype`.
// Counted from the block's code (models/wan_transformer.cpp, wan_block_forward) with
// L = (frames/p_t)(height/p_h)(width/p_w) tokens and D = dim():
//   kept per branch while the stack runs: hidden states in and out of a block (2 L D), the
//     projected text (T D), the latent in and the output (fp32);
//   one block's intermediates, one branch at a time: self-attention L D (12 + 8 es) (the fp32
//     norm and its modulation, q, k, v, RoPE temporaries, the attention output), feed-forward
//     L D (8 + 2 es) + 2 L ffn_dim es (its two wide tensors), whichever is larger;
// where es is the dtype's size; attention itself is a fused kernel (no L x L scores). Plus 25%
// for allocator rounding and fragmentation, and a fixed 256 MiB (embeddings, RoPE tables, library
// workspaces). An estimate: dlo-forward's report prints it beside
// the allocator's measured peak.
std::uint64_t wan_forward_working_bytes(const WanTransformerConfig& c, std::int64_t frames, std::int64_t height,
                                        std::int64_t width, std::int64_t text_len, std::int64_t branches,
                                        DType dtype);
// The number of tokens a latent of that size makes (L above).
std::int64_t wan_tokens(const WanTransformerConfig& c, std::int64_t frames, std::int64_t height, std::int64_t width);

// Names of one block's tensors relative to "blocks.N.", in the fixed order used for packing.
std::vector<std::string> wan_block_tensor_names(const WanTransformerConfig& c);
// The block's tensors as specs (names relative to "blocks.N.") with their shapes and `dtype`.
std::vector<TensorSpec> wan_block_specs(const WanTransformerConfig& c, DType dtype);
// Every tensor of the transformer, full names, for a checkpoint of the given dtype.
std::vector<TensorSpec> wan_transformer_specs(const WanTransformerConfig& c, DType dtype);

}  // namespace dlo
