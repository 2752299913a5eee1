// Wan2.1 text-to-video diffusion transformer, equal to diffusers' WanTransformer3DModel.
//
// Weights are data, layers are functions: WanGlobalWeights and WanBlockWeights are plain structs
// of tensors (views into the mmap'ed checkpoint when dtypes agree), and wan_block_forward() takes
// a block's weights as an argument, so an offload engine can hand it weights that live anywhere
// (a device slot filled by an AllGather, a pinned host copy, ...).
//
// The forward pass is split into begin() (patch/time/text embedding and RoPE tables), the blocks,
// and end() (output norm, projection, unpatchify), so engines can stream the blocks themselves.
// dtype policy follows diffusers: Linear/Conv/SDPA/GELU in the compute dtype; LayerNorms,
// modulation, gated residuals, RoPE, the timestep embedding and time_embedder in fp32.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/config/wan_transformer_config.h"
#include "dlo/io/dtype.h"
#include "dlo/models/weights.h"

namespace dlo {

// The dtype diffusers computes a tensor in (fp32 for the _keep_in_fp32_modules, else `compute`),
// by its name relative to the block or the model.
at::ScalarType wan_weight_dtype(const std::string& name, at::ScalarType compute);

struct WanBlockWeights {
  at::Tensor q1_w, q1_b, k1_w, k1_b, v1_w, v1_b, o1_w, o1_b, norm_q1, norm_k1;
  at::Tensor q2_w, q2_b, k2_w, k2_b, v2_w, v2_b, o2_w, o2_b, norm_q2, norm_k2;
  at::Tensor norm2_w, norm2_b;  // undefined when !cross_attn_norm
  at::Tensor ffn0_w, ffn0_b, ffn2_w, ffn2_b;
  at::Tensor scale_shift_table;  // [1, 6, D]

  // Binds tensors given in wan_block_tensor_names() order (no copies).
  static WanBlockWeights bind(const std::vector<at::Tensor>& tensors, const WanTransformerConfig& c);
};

struct WanGlobalWeights {
  at::Tensor patch_w, patch_b;
  at::Tensor time1_w, time1_b, time2_w, time2_b;  // time_embedder (fp32)
  at::Tensor time_proj_w, time_proj_b;
  at::Tensor text1_w, text1_b, text2_w, text2_b;
  at::Tensor proj_out_w, proj_out_b;
  at::Tensor scale_shift_table;  // [1, 2, D] (fp32)
};

// Per-forward state between begin() and end().
struct WanForwardState {
  at::Tensor h;        // [B, L, D] hidden tokens, compute dtype
  at::Tensor temb;     // [B, D], or [B, L, D] with per-token timesteps
  at::Tensor tproj;    // [B, 6, D], or [B, L, 6, D] with per-token timesteps
  at::Tensor context;  // [B, S, D] projected text
  at::Tensor rope_cos, rope_sin;  // [1, L, 1, head_dim] fp32
  std::int64_t batch = 0, frames = 0, height = 0, width = 0;  // post-patch grid
};

// One transformer block, in place of diffusers' WanTransformerBlock.forward. Returns the new
// hidden states. Thread-compatible (no shared state).
at::Tensor wan_block_forward(const WanBlockWeights& w, const WanForwardState& s, const at::Tensor& h,
                             const WanTransformerConfig& c);

class WanTransformer {
 public:
  // Loads `dir` (a diffusers transformer/ folder: config.json + safetensors). Non-block weights
  // are views (converted copies only where the checkpoint dtype differs from what `compute`
  // needs). With `load_blocks`, block weights are bound too (the resident case); engines that
  // stream blocks pass false and supply block weights themselves.
  static WanTransformer load(const std::string& dir, at::ScalarType compute, bool load_blocks = true);

  const WanTransformerConfig& config() const { return config_; }
  at::ScalarType compute_dtype() const { return compute_; }
  const WeightStore& weights() const { return store_; }

  // Checks inputs without computing anything (for start-up checks): hidden_states x [B, C_in, F,
  // H, W] with F, H, W multiples of patch_size; timestep [B] (0-dim refused, as diffusers'
  // timestep embedding refuses it) or [B, L], one per token (L = the post-patch F*H*W: Wan2.2
  // TI2V's expand_timesteps); context [B, S, text_dim]; one B for all three. Throws
  // dlo::Error naming the input.
  void check_inputs(const at::Tensor& x, const at::Tensor& timestep, const at::Tensor& context) const;
  // Validates inputs (check_inputs) and computes embeddings and RoPE tables.
  // x: [B, C_in, F, H, W]; timestep: [B] or [B, L]; context: [B, S, text_dim].
  WanForwardState begin(const at::Tensor& x, const at::Tensor& timestep, const at::Tensor& context) const;
  // Output head and unpatchify: [B, C_out, F, H, W] in the compute dtype.
  at::Tensor end(const WanForwardState& s) const;
  // The whole forward with the resident block weights (load_blocks must have been true).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& timestep, const at::Tensor& context) const;

  const WanBlockWeights& block(std::int64_t i) const { return blocks_.at(static_cast<std::size_t>(i)); }

  // Moves the non-block weights (and resident blocks, if loaded) and the RoPE tables to `device`.
  // begin() then moves its inputs there too.
  void to_device(at::Device device);
  at::Device device() const { return device_; }

 private:
  WanTransformer(WanTransformerConfig c, WeightStore store, at::ScalarType compute)
      : config_(c), store_(std::move(store)), compute_(compute) {}
  WanTransformerConfig config_;
  WeightStore store_;
  at::ScalarType compute_;
  WanGlobalWeights global_;
  std::vector<WanBlockWeights> blocks_;
  at::Tensor rope_cos_table_, rope_sin_table_;  // [rope_max_seq_len, head_dim] fp32
  at::Device device_ = at::kCPU;
};

}  // namespace dlo
