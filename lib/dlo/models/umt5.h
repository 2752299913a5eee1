// The Wan text encoder: transformers' UMT5EncoderModel (google/umt5-xxl's encoder), with the
// prompt-embedding post-processing of diffusers' WanPipeline._get_t5_prompt_embeds.
//
// Weights are data, layers are functions (as in wan_transformer.h): Umt5GlobalWeights and
// Umt5BlockWeights are plain structs of tensors (views into the mmap'ed checkpoint when dtypes
// agree), and umt5_block_forward() takes a block's weights as an argument, so an offload engine
// can stream the blocks. The forward is begin() (embedding, attention mask), the blocks, end()
// (final RMS norm; trim to each prompt's real tokens and zero-pad, as the pipeline does).
//
// Math and dtypes follow transformers 5.x with its default "sdpa" attention: T5 RMS norm
// (variance in fp32), per-layer relative position bias (UMT5: every layer has its own), no 1/sqrt(d)
// scaling (SDPA with scale 1 and the bias + padding mask as a float attn_mask), gated GELU
// feed-forward (gelu_new: the tanh formula, written out as transformers writes it). Compute dtype
// = the load dtype; for fp16, `wo` is kept in fp32 (transformers' _keep_in_fp32_modules applies
// to fp16 only), which makes the residual stream fp32 by type promotion, as in transformers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/config/umt5_config.h"
#include "dlo/io/dtype.h"
#include "dlo/models/weights.h"

namespace dlo {

// The dtype transformers holds a weight in: fp32 for "wo" when `compute` is fp16, else `compute`.
at::ScalarType umt5_weight_dtype(const std::string& name, at::ScalarType compute);

// transformers' UMT5Attention._relative_position_bucket for an encoder (bidirectional), on an
// int64 tensor of relative positions (memory - query). Same ops, same float32 log.
at::Tensor umt5_relative_position_bucket(const at::Tensor& relative_position, std::int64_t num_buckets,
                                         std::int64_t max_distance);

struct Umt5BlockWeights {
  at::Tensor ln1;          // layer.0.layer_norm.weight [d_model]
  at::Tensor q, k, v;      // [inner, d_model]
  at::Tensor o;            // [d_model, inner]
  at::Tensor rel_bias;     // relative_attention_bias.weight [num_buckets, num_heads]
  at::Tensor ln2;          // layer.1.layer_norm.weight [d_model]
  at::Tensor wi_0, wi_1;   // gated: wi_0 (activation branch), wi_1 [d_ff, d_model]; plain: wi_0 = wi
  at::Tensor wo;           // [d_model, d_ff]

  // Binds tensors given in umt5_block_tensor_names() order (no copies).
  static Umt5BlockWeights bind(const std::vector<at::Tensor>& tensors, const Umt5Config& c);
};

struct Umt5GlobalWeights {
  at::Tensor shared;      // shared.weight [vocab, d_model] (or encoder.embed_tokens.weight), always a
                          // view in the checkpoint's dtype: gathered rows are converted in begin()
  at::Tensor final_norm;  // encoder.final_layer_norm.weight [d_model]
};

// Per-forward state between begin() and end().
struct Umt5ForwardState {
  at::Tensor h;              // [B, L, d_model] hidden states (compute dtype; fp32 after the first FF for fp16)
  at::Tensor key_mask;       // [B, 1, L, L] bool (true: attend), undefined when nothing is padded
  at::Tensor bucket;         // [L, L] int64 relative position buckets
  std::vector<std::int64_t> seq_lens;  // real tokens per row (attention_mask sum)
  std::int64_t batch = 0, length = 0;  // length: the sequence the blocks see
  std::int64_t output_length = 0;      // the input's L, which end() pads back to
};

// One encoder block (UMT5Block.forward), returning the new hidden states. Thread-compatible.
at::Tensor umt5_block_forward(const Umt5BlockWeights& w, const Umt5ForwardState& s, const at::Tensor& h,
                              const Umt5Config& c);

class Umt5Encoder {
 public:
  // Loads `dir` (a transformers text_encoder/ folder: config.json + safetensors or shards +
  // index). Weights are views when the checkpoint dtype is the one transformers would compute in,
  // else converted copies. With `load_blocks` false, block weights are left to an engine.
  static Umt5Encoder load(const std::string& dir, at::ScalarType compute, bool load_blocks = true);
  // The checks load() makes of the folder (its config, every tensor's name and shape), reading the
  // checkpoint's header only: for the start of a batch, before any work. Throws as load().
  static void check_checkpoint(const std::string& dir);

  const Umt5Config& config() const { return config_; }
  at::ScalarType compute_dtype() const { return compute_; }
  const WeightStore& weights() const { return store_; }
  // Moves the weights (the embedding table, the final norm and every loaded block) to `device`:
  // begin() then embeds there and puts the attention bias inputs there, so the whole forward runs
  // on the device. The copies are private memory (no longer the checkpoint's pages).
  void to_device(at::Device device);
  at::Device device() const { return device_; }

  // Validates inputs (naming the bad one) and embeds. input_ids: [B, L] integer, values in
  // [0, vocab_size); attention_mask: [B, L] of 0/1 (integer or bool), or undefined for all ones.
  // `compact` (opt-in, not transformers' arithmetic): the blocks see only the first
  // max(seq_lens) positions instead of all L, and end() pads back with zeros. The real tokens'
  // outputs are the same up to float rounding (padded keys get zero attention weight either way),
  // and a short prompt padded to 512 costs a fraction. Needs right padding (each mask row 1...1 0...0).
  Umt5ForwardState begin(const at::Tensor& input_ids, const at::Tensor& attention_mask, bool compact = false) const;
  // last_hidden_state: the final RMS norm of the hidden states, [B, s.length, d_model].
  at::Tensor final_norm(const Umt5ForwardState& s) const;
  // The pipeline's prompt embedding: last_hidden_state with rows past each prompt's length set to
  // exact zeros ([B, L, d_model] with the input's L, compute dtype).
  at::Tensor end(const Umt5ForwardState& s) const;
  // begin, every resident block, end (load_blocks must have been true).
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask, bool compact = false) const;

  const Umt5BlockWeights& block(std::int64_t i) const { return blocks_.at(static_cast<std::size_t>(i)); }
  const Umt5GlobalWeights& global() const { return global_; }

 private:
  Umt5Encoder(Umt5Config c, WeightStore store, at::ScalarType compute)
      : config_(std::move(c)), store_(std::move(store)), compute_(compute) {}
  Umt5Config config_;
  WeightStore store_;
  at::ScalarType compute_;
  at::Device device_ = at::kCPU;
  Umt5GlobalWeights global_;
  std::vector<Umt5BlockWeights> blocks_;
};

// The pipeline's trim + zero-pad: rows r >= seq_lens[b] of `last_hidden_state` [B, L, D] become
// zeros, and the result is padded with zero rows to `length` rows (-1: L); the same values as
// `torch.cat([u[:n], u.new_zeros(length - n, D)])`.
at::Tensor trim_and_zero_pad(const at::Tensor& last_hidden_state, const std::vector<std::int64_t>& seq_lens,
                             std::int64_t length = -1);

}  // namespace dlo
