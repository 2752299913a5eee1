// The UMT5 text encoder's config (transformers' UMT5EncoderModel config.json) and its checkpoint's
// tensor names and shapes. Torch-free; models/umt5.h encodes with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dlo/io/dtype.h"
#include "dlo/io/json_config.h"
#include "dlo/io/tensor_spec.h"

namespace dlo {

struct Umt5Config {
  std::int64_t vocab_size = 256384;
  std::int64_t d_model = 4096;
  std::int64_t d_kv = 64;
  std::int64_t d_ff = 10240;
  std::int64_t num_layers = 24;
  std::int64_t num_heads = 64;
  std::int64_t relative_attention_num_buckets = 32;
  std::int64_t relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  // transformers' feed_forward_proj: "gated-gelu" (-> gelu_new, gated), "gated-<act>" or "<act>",
  // act one of gelu_new, gelu, relu.
  std::string feed_forward_proj = "gated-gelu";
  std::int64_t pad_token_id = 0;
  std::int64_t eos_token_id = 1;

  std::int64_t inner_dim() const { return num_heads * d_kv; }
  bool is_gated() const;           // feed_forward_proj starts with "gated-"
  std::string dense_act_fn() const;  // as transformers derives it ("gated-gelu" -> "gelu_new")

  // Reads a transformers text_encoder/config.json (model_type "umt5"). Throws dlo::Error naming
  // the file and field for missing, mistyped, unsupported (T5's shared bias) or bad values.
  static Umt5Config from_json(const JsonConfig& json);
  // "umt5-test" (tiny, for the tiny tokenizer and the wan-test transformer: d_model 16),
  // "umt5-xxl" (Wan2.1's text encoder).
  static Umt5Config preset(const std::string& name);
  static std::vector<std::string> preset_names();
  // Checks consistency. Throws dlo::Error naming `where` and the field.
  void validate(const std::string& where) const;
  // config.json text as transformers writes a UMT5EncoderModel's (keys sorted); `dtype` is the
  // checkpoint's dtype name ("float32", "bfloat16", "float16").
  std::string to_json(const std::string& dtype = "float32") const;
};

// Full names of block i's tensors ("encoder.block.i. ..."), in the fixed order used for packing
// and by Umt5BlockWeights::bind.
std::vector<std::string> umt5_block_tensor_names(const Umt5Config& c, std::int64_t i);
// Block i's tensors as specs (full names) with their shapes and `dtype`.
std::vector<TensorSpec> umt5_block_specs(const Umt5Config& c, std::int64_t i, DType dtype);
// Every tensor of a UMT5EncoderModel checkpoint (shared.weight, the blocks, the final norm).
std::vector<TensorSpec> umt5_encoder_specs(const Umt5Config& c, DType dtype);

}  // namespace dlo
