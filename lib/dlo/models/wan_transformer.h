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
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/common/partition.h"
#include "dlo/config/wan_transformer_config.h"
#include "dlo/io/dtype.h"
#include "dlo/models/tensor_edits.h"
#include "dlo/models/weights.h"

namespace dlo {

// The dtype diffusers computes a tensor in (fp32 for the _keep_in_fp32_modules, else `compute`),
// by its name relative to the block or the model.
at::ScalarType wan_weight_dtype(const std::string& name, at::ScalarType compute);

// ---- Storage narrower than compute (diffusers' layerwise casting) ----------------------------
// Whether tensor `name` (relative to the model or its block) is one diffusers'
// enable_layerwise_casting keeps in the storage dtype: with its default skips (patch_embedding,
// condition_embedder, norms, proj_out, the fp32 modules), exactly the blocks' Linears, weight and
// bias: attn1/attn2 to_q, to_k, to_v, to_out.0 (and the image cross-attention's add_k_proj,
// add_v_proj), ffn.net.0.proj and ffn.net.2.
bool wan_layerwise_cast(const std::string& name);

// --storage-dtype: what those Linears are kept in.
enum class LinearStorage { kAuto, kFp8, kBF16, kFP16, kFP32 };
// "auto", "fp8", "bf16", "fp16", "fp32" for computing in `compute`. Throws dlo::Error naming `what`
// (the flag or key) for anything else, and for a storage wider than `compute` (the same frames at
// more bytes).
LinearStorage parse_linear_storage(const std::string& name, at::ScalarType compute, const std::string& what);
const char* linear_storage_name(LinearStorage s);

// A transformer's dtypes: what it computes in, and what its layerwise-cast Linears' weights and
// biases are kept in (host shards, gathers, device slots, resident blocks); every other tensor is
// kept in wan_weight_dtype. A narrower storage is cast to the compute dtype on the device just before the
// Linear's matmul (the one seam: the block's linear()): exactly from fp8, and from bf16 or fp16 to
// fp32; fp16 to bf16 rounds, as diffusers' cast does.
struct WanDtypes {
  at::ScalarType compute = at::kBFloat16;
  at::ScalarType linear_storage = at::kBFloat16;  // the Linears' weights
  at::ScalarType bias_storage = at::kBFloat16;    // and biases
  // A ComfyUI scaled fp8 file (wan_tensor_names.h): every block Linear's weight is kept as written
  // (fp8) with its float32 scale_weight beside it in the block (wan_scaled_block_tensor_names), and
  // used as weight.to(compute) * scale.to(compute) (the multiply in the compute dtype, as
  // ComfyUI's scaled fp8 ops dequantise); the Linears outside the blocks are dequantised so at load.
  bool scaled = false;
  static WanDtypes same(at::ScalarType compute) { return {compute, compute, compute, false}; }
  static WanDtypes narrow(at::ScalarType compute, at::ScalarType storage) { return {compute, storage, storage, false}; }
  // The dtype tensor `name` is kept in, and the one it is rounded through on the way there (the
  // dtype diffusers loads it in: the one it computes in; a scale stays float32).
  at::ScalarType stored(const std::string& name) const;
  at::ScalarType via(const std::string& name) const;
  // A checkpoint tensor `t` of `name` as kept: rounded as diffusers rounds it (loaded in the
  // dtype it computes in, then cast to the storage dtype: two roundings where the checkpoint is
  // wider than both), and not converted at all where the checkpoint already holds the stored
  // dtype (an fp8 file's tensors are kept as written, never rounded twice). No copy then.
  // With `edits` that change it: formed in via(name), changed there, then rounded to stored(name).
  at::Tensor keep(const std::string& name, const at::Tensor& t, const TensorEdits* edits = nullptr) const;
  // "bf16", or "bf16 (Linears fp8 e4m3fn)" where they are kept narrower ("..., biases bf16" where
  // those differ; "scaled fp8 e4m3fn" for a scaled file).
  std::string describe() const;
};

// The names of a block's tensors, relative to "blocks.N.", in packing order: wan_block_tensor_names,
// and for a scaled file the scale_weight of each of the block's 10 Linears after them.
std::vector<std::string> wan_block_names(const WanTransformerConfig& c, const WanDtypes& d);

// The dtypes the layerwise-cast Linears of checkpoint `ck` are kept in when computing in `compute`,
// for their weights and, apart, their biases (fp8 files keep biases wide):
//   auto  the checkpoint's fp8 dtype where it stores all of them in one fp8 dtype (kept as written:
//         the frames are those of upcasting them at load), else `compute`;
//   fp8   that fp8 dtype likewise, else float8_e4m3fn (e4m3fn, as diffusers' layerwise casting);
//   bf16, fp16, fp32: that dtype (no wider than `compute`: parse_linear_storage).
// A scaled fp8 file (its marker, or any scale_weight) is kept as written: auto or fp8 only, and
// every block Linear's weight fp8 with its scale. Throws dlo::Error naming `what` (the flag) and the
// file.
WanDtypes resolve_wan_dtypes(LinearStorage storage, at::ScalarType compute, const Checkpoint& ck, const std::string& what);

// ---- A job's unfused LoRAs (--lora, the job field `loras`) --------------------------------------
// Applied beside a Linear as PEFT's unfused forward does (peft/tuners/lora/layer.py, Linear.forward):
//   y = base(x); for each adapter in order: x = x.to(down's dtype); y = y + up(down(x)) * scaling
//   (up's bias, a diff_b, inside up(...)); then y.to(base's result dtype).
// Adapters are kept in the dtype PEFT moves them to: the adapted weight's (the compute dtype, fp32
// for diffusers' fp32 modules). The shared weights are untouched: ranks rendering jobs with other
// LoRAs, or none, join the same gathers.
struct LinearAdapter {
  at::Tensor down, up, bias;  // [r, in], [out, r], [out] or undefined
  double scaling = 1.0;       // the strength times the module's own (PEFT's scaling)
};
// One job's adapters on one transformer, by module name ("blocks.3.attn1.to_q", "proj_out", ...).
struct WanAdapters {
  std::map<std::string, std::vector<LinearAdapter>> modules;
  // Module `name`'s adapters in order, or nullptr.
  const std::vector<LinearAdapter>* of(const std::string& name) const;
  std::uint64_t bytes() const;
};

struct WanBlockWeights {
  std::int64_t index = -1;  // the block's place in the stack: a job's adapters are found by it
  at::Tensor q1_w, q1_b, k1_w, k1_b, v1_w, v1_b, o1_w, o1_b, norm_q1, norm_k1;
  at::Tensor q2_w, q2_b, k2_w, k2_b, v2_w, v2_b, o2_w, o2_b, norm_q2, norm_k2;
  at::Tensor norm2_w, norm2_b;  // undefined when !cross_attn_norm
  at::Tensor ffn0_w, ffn0_b, ffn2_w, ffn2_b;
  at::Tensor scale_shift_table;  // [1, 6, D]
  // A scaled fp8 file's per-tensor scales of the Linears' weights (WanDtypes::scaled); undefined
  // otherwise.
  at::Tensor q1_s, k1_s, v1_s, o1_s, q2_s, k2_s, v2_s, o2_s, ffn0_s, ffn2_s;

  // Binds tensors given in wan_block_names() order (no copies) as block `index`.
  static WanBlockWeights bind(const std::vector<at::Tensor>& tensors, const WanTransformerConfig& c, std::int64_t index = -1);
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
  // The rows of h are the whole's tokens [first_row, first_row + L) of frames * height * width
  // (a sequence-parallel share: wan_state_rows).
  std::int64_t first_row = 0;
  // The job's unfused LoRAs on this transformer (begin()'s), or null.
  std::shared_ptr<const WanAdapters> adapters;
  std::int64_t tokens() const { return frames * height * width; }
  bool is_share() const { return h.size(1) != tokens(); }
};

// One transformer block, in place of diffusers' WanTransformerBlock.forward. Returns the new
// hidden states. Thread-compatible (no shared state).
at::Tensor wan_block_forward(const WanBlockWeights& w, const WanForwardState& s, const at::Tensor& h,
                             const WanTransformerConfig& c);

// ---- The sequence-parallel seam (Ulysses) ----------------------------------------------------
// Self-attention is the block's only operation across tokens. A group of P ranks that each hold a
// contiguous shard of the tokens (wan_state_rows: rows of h, of the RoPE tables at their global
// positions, and of per-token timesteps) runs a block as:
//   1. wan_block_self_attn_inputs on its rows: q, k, v [B, s_r, H, d] (RMSNorm over all heads of
//      a token, so before any exchange, then RoPE);
//   2. all-to-all, sequence-split to head-split: rank r sends group g split_by(q, 2, heads)[g];
//      group g joins what arrives with at::cat(..., 1): [B, S, H_g, d], every token;
//   3. wan_self_attention on that; all-to-all back: split_by(o, 1, tokens)[r] to rank r, which
//      joins the groups' parts with at::cat(..., 2);
//   4. wan_block_finish on its rows: o-proj, gated residual, cross-attention on the whole text,
//      FFN.
// wan_block_forward is exactly 1, 3 and 4 with P = 1. Two of the block's CPU kernels round a row
// by the size of the tensor it is in, not by the row alone: SDPA splits the queries into blocks
// whose size follows the query count (blocks of <= 3 rows take another GEMM path), and ATen's
// elementwise loops (GELU) compute each thread's chunk of the flattened tensor in SIMD blocks and
// its remainder in scalar code (another tanh). So on a share (WanForwardState::is_share) step 4
// computes the cross-attention and the FFN's GELU on a tensor of every token (the share's rows at
// their places, the others zero) and keeps its rows: the same tensors as one rank's, whatever the
// share, at the price of the whole's cross-attention and GELU on every rank. Then a group's result
// is the one-rank result wherever the GEMMs give the same rows on row subsets (fp32 MKL: shares of
// >= 12 rows; pipeline/topology.h's kMinShareTokens) and SDPA the same heads on head subsets
// (tests/models/test_sequence_parallel.cpp: the probe and the randomized identity test).
struct WanBlockModulation {
  at::Tensor shift_msa, scale_msa, gate_msa, c_shift, c_scale, c_gate;  // fp32, [B, 1, D] or [B, L, D]
};
// The block's scale_shift_table plus the timestep projection, computed once per block.
WanBlockModulation wan_block_modulation(const WanBlockWeights& w, const WanForwardState& s);
struct WanSelfAttnInputs {
  at::Tensor q, k, v;  // [B, L, H, d] in the compute dtype
};
WanSelfAttnInputs wan_block_self_attn_inputs(const WanBlockWeights& w, const WanForwardState& s,
                                             const WanBlockModulation& mod, const at::Tensor& h,
                                             const WanTransformerConfig& c);
// SDPA over the tokens of q, k, v [B, L, H_g, d]: [B, L, H_g, d].
at::Tensor wan_self_attention(const WanSelfAttnInputs& qkv);
// The rest of the block from the self-attention output `attn` [B, L, H, d] of the rows of h.
at::Tensor wan_block_finish(const WanBlockWeights& w, const WanForwardState& s, const WanBlockModulation& mod,
                            const at::Tensor& h, const at::Tensor& attn, const WanTransformerConfig& c);

// The rows [offset, offset + length) of a forward state: hidden tokens, RoPE rows at their global
// positions, per-token temb/tproj rows (per-sample ones are shared), first_row; context and the
// grid are the full ones (end() needs every row: gather first). Views, no copies.
WanForwardState wan_state_rows(const WanForwardState& s, std::int64_t offset, std::int64_t length);

// The parts of x along `dim`, one per part of `p` (views): Ulysses' send buffers.
std::vector<at::Tensor> split_by(const at::Tensor& x, std::int64_t dim, const Partition& p);

class WanTransformer {
 public:
  // Loads `dir` (a diffusers transformer/ folder: config.json + safetensors). Non-block weights
  // are views (converted copies only where the checkpoint dtype differs from what `compute`
  // needs). With `load_blocks`, block weights are bound too (the resident case); engines that
  // stream blocks pass false and supply block weights themselves.
  static WanTransformer load(const std::string& dir, at::ScalarType compute, bool load_blocks = true);
  // The same for weights of `config` at `weights`: anything open_wan_transformer opens (a folder,
  // a single file, an index; diffusers', original Wan or ComfyUI's names, read as diffusers'), its
  // layerwise-cast Linears kept as `storage` resolves (resolve_wan_dtypes; "--storage-dtype" in
  // its errors), changed by `edits` (fused LoRAs) where they are formed: the non-block weights and
  // resident blocks here, streamed blocks as the engine packs them (edits()).
  static WanTransformer load(const std::string& weights, const WanTransformerConfig& config, at::ScalarType compute,
                             bool load_blocks = true, LinearStorage storage = LinearStorage::kAuto,
                             std::shared_ptr<const TensorEdits> edits = nullptr);

  const WanTransformerConfig& config() const { return config_; }
  at::ScalarType compute_dtype() const { return dtypes_.compute; }
  const WanDtypes& dtypes() const { return dtypes_; }
  // The changes made to its weights as they are formed (fused LoRAs), or null.
  const std::shared_ptr<const TensorEdits>& edits() const { return edits_; }
  const WeightStore& weights() const { return store_; }

  // Checks inputs without computing anything (for start-up checks): hidden_states x [B, C_in, F,
  // H, W] with F, H, W multiples of patch_size; timestep [B] (0-dim refused, as diffusers'
  // timestep embedding refuses it) or [B, L], one per token (L = the post-patch F*H*W: Wan2.2
  // TI2V's expand_timesteps); context [B, S, text_dim]; one B for all three. Throws
  // dlo::Error naming the input.
  void check_inputs(const at::Tensor& x, const at::Tensor& timestep, const at::Tensor& context) const;
  // Validates inputs (check_inputs) and computes embeddings and RoPE tables.
  // x: [B, C_in, F, H, W]; timestep: [B] or [B, L]; context: [B, S, text_dim]. `adapters`: the
  // job's unfused LoRAs, applied in this forward (the state carries them to the blocks and end()).
  WanForwardState begin(const at::Tensor& x, const at::Tensor& timestep, const at::Tensor& context,
                        std::shared_ptr<const WanAdapters> adapters = nullptr) const;
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
  WanTransformer(WanTransformerConfig c, WeightStore store, WanDtypes dtypes)
      : config_(c), store_(std::move(store)), dtypes_(dtypes) {}
  WanTransformerConfig config_;
  WeightStore store_;
  WanDtypes dtypes_;
  std::shared_ptr<const TensorEdits> edits_;
  WanGlobalWeights global_;
  std::vector<WanBlockWeights> blocks_;
  at::Tensor rope_cos_table_, rope_sin_table_;  // [rope_max_seq_len, head_dim] fp32
  at::Device device_ = at::kCPU;
};

}  // namespace dlo
