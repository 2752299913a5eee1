#include "dlo/config/umt5_config.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "dlo/common/error.h"

namespace dlo {

// ---------------------------------------------------------------------------------------------
// Config

namespace {

// transformers' UMT5Config.__post_init__: act = last "-" part, gated = first part is "gated",
// and "gated-gelu" means gelu_new.
struct FfProj {
  std::string act;
  bool gated = false;
  bool valid = false;
};

FfProj parse_ff_proj(const std::string& s) {
  FfProj p;
  const auto dash = s.find('-');
  if (dash == std::string::npos) {
    p.act = s;
  } else {
    if (s.substr(0, dash) != "gated" || s.find('-', dash + 1) != std::string::npos) return p;
    p.gated = true;
    p.act = s.substr(dash + 1);
  }
  if (s == "gated-gelu") p.act = "gelu_new";
  p.valid = p.act == "gelu_new" || p.act == "gelu" || p.act == "relu";
  return p;
}

}  // namespace

bool Umt5Config::is_gated() const { return parse_ff_proj(feed_forward_proj).gated; }
std::string Umt5Config::dense_act_fn() const { return parse_ff_proj(feed_forward_proj).act; }

Umt5Config Umt5Config::from_json(const JsonConfig& j) {
  const std::string& f = j.path();
  const std::string type = j.get_string("model_type", std::string("umt5"));
  DLO_CHECK(type != "t5" && type != "mt5", f, ": model_type is '", type,
            "': T5/mT5 encoders (one relative position bias shared by all layers) are not supported; only "
            "UMT5 (model_type 'umt5', a bias per layer, as in Wan's umt5-xxl)");
  DLO_CHECK(type == "umt5", f, ": model_type is '", type, "', expected 'umt5'");
  if (j.has("is_decoder")) DLO_CHECK(!j.get_bool("is_decoder"), f, ": field 'is_decoder' is true; need an encoder");
  Umt5Config c;
  c.vocab_size = j.get_int("vocab_size", 250112);
  c.d_model = j.get_int("d_model", 512);
  c.d_kv = j.get_int("d_kv", 64);
  c.d_ff = j.get_int("d_ff", 1024);
  c.num_layers = j.get_int("num_layers", 8);
  c.num_heads = j.get_int("num_heads", 6);
  c.relative_attention_num_buckets = j.get_int("relative_attention_num_buckets", 32);
  c.relative_attention_max_distance = j.get_int("relative_attention_max_distance", 128);
  c.layer_norm_epsilon = j.get_double("layer_norm_epsilon", 1e-6);
  c.feed_forward_proj = j.get_string("feed_forward_proj", std::string("gated-gelu"));
  c.pad_token_id = j.get_int("pad_token_id", 0);
  c.eos_token_id = j.get_int("eos_token_id", 1);
  c.validate(f);
  return c;
}

void Umt5Config::validate(const std::string& where) const {
  auto positive = [&](std::int64_t v, const char* name) {
    DLO_CHECK(v > 0 && v < (1ll << 31), where, ": field '", name, "' must be a positive integer, got ", v);
  };
  positive(vocab_size, "vocab_size");
  positive(d_model, "d_model");
  positive(d_kv, "d_kv");
  positive(d_ff, "d_ff");
  positive(num_layers, "num_layers");
  positive(num_heads, "num_heads");
  positive(relative_attention_num_buckets, "relative_attention_num_buckets");
  positive(relative_attention_max_distance, "relative_attention_max_distance");
  // Bidirectional buckets: half per direction, a quarter exact; the log range must be non-empty.
  DLO_CHECK(relative_attention_num_buckets >= 4, where,
            ": field 'relative_attention_num_buckets' must be >= 4, got ", relative_attention_num_buckets);
  DLO_CHECK(relative_attention_max_distance > relative_attention_num_buckets / 4, where,
            ": field 'relative_attention_max_distance' must exceed relative_attention_num_buckets / 4 (",
            relative_attention_num_buckets / 4, "), got ", relative_attention_max_distance);
  DLO_CHECK(std::isfinite(layer_norm_epsilon) && layer_norm_epsilon > 0 && layer_norm_epsilon < 1, where,
            ": field 'layer_norm_epsilon' must be in (0, 1), got ", layer_norm_epsilon);
  const FfProj p = parse_ff_proj(feed_forward_proj);
  DLO_CHECK(p.valid, where, ": field 'feed_forward_proj' is '", feed_forward_proj,
            "'; supported: 'gated-gelu' (gelu_new), 'gated-gelu_new', 'gated-relu', 'relu', 'gelu', 'gelu_new'");
}

Umt5Config Umt5Config::preset(const std::string& name) {
  Umt5Config c;
  if (name == "umt5-test") {
    // Tiny: the tiny tokenizer's vocabulary, and d_model = the wan-test transformer's text_dim.
    c.vocab_size = 612;
    c.d_model = 16;
    c.d_kv = 8;
    c.d_ff = 64;
    c.num_layers = 2;
    c.num_heads = 4;
  } else if (name != "umt5-xxl") {
    DLO_CHECK(false, "unknown text encoder preset '", name, "' (umt5-test, umt5-xxl)");
  }
  return c;
}

std::vector<std::string> Umt5Config::preset_names() { return {"umt5-test", "umt5-xxl"}; }

std::string Umt5Config::to_json(const std::string& dtype) const {
  const FfProj p = parse_ff_proj(feed_forward_proj);
  nlohmann::ordered_json j;
  j["architectures"] = {"UMT5EncoderModel"};
  j["classifier_dropout"] = 0.0;
  j["d_ff"] = d_ff;
  j["d_kv"] = d_kv;
  j["d_model"] = d_model;
  j["decoder_start_token_id"] = pad_token_id;
  j["dense_act_fn"] = p.act;
  j["dropout_rate"] = 0.1;
  j["dtype"] = dtype;
  j["eos_token_id"] = eos_token_id;
  j["feed_forward_proj"] = feed_forward_proj;
  j["initializer_factor"] = 1.0;
  j["is_decoder"] = false;
  j["is_encoder_decoder"] = true;
  j["is_gated_act"] = p.gated;
  j["layer_norm_epsilon"] = layer_norm_epsilon;
  j["model_type"] = "umt5";
  j["num_decoder_layers"] = num_layers;
  j["num_heads"] = num_heads;
  j["num_layers"] = num_layers;
  j["pad_token_id"] = pad_token_id;
  j["relative_attention_max_distance"] = relative_attention_max_distance;
  j["relative_attention_num_buckets"] = relative_attention_num_buckets;
  j["tie_word_embeddings"] = true;
  j["tokenizer_class"] = "T5Tokenizer";
  j["transformers_version"] = "5.23.0";
  j["use_cache"] = true;
  j["vocab_size"] = vocab_size;
  return j.dump(2) + "\n";
}

// ---------------------------------------------------------------------------------------------
// Tensor names and shapes

namespace {

std::vector<std::pair<std::string, std::vector<std::int64_t>>> block_entries(const Umt5Config& c, std::int64_t i) {
  const std::string p = "encoder.block." + std::to_string(i) + ".";
  const std::int64_t D = c.d_model, I = c.inner_dim(), F = c.d_ff;
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> e = {
      {p + "layer.0.layer_norm.weight", {D}},
      {p + "layer.0.SelfAttention.q.weight", {I, D}},
      {p + "layer.0.SelfAttention.k.weight", {I, D}},
      {p + "layer.0.SelfAttention.v.weight", {I, D}},
      {p + "layer.0.SelfAttention.o.weight", {D, I}},
      {p + "layer.0.SelfAttention.relative_attention_bias.weight", {c.relative_attention_num_buckets, c.num_heads}},
      {p + "layer.1.layer_norm.weight", {D}},
  };
  if (c.is_gated()) {
    e.push_back({p + "layer.1.DenseReluDense.wi_0.weight", {F, D}});
    e.push_back({p + "layer.1.DenseReluDense.wi_1.weight", {F, D}});
  } else {
    e.push_back({p + "layer.1.DenseReluDense.wi.weight", {F, D}});
  }
  e.push_back({p + "layer.1.DenseReluDense.wo.weight", {D, F}});
  return e;
}

}  // namespace

std::vector<std::string> umt5_block_tensor_names(const Umt5Config& c, std::int64_t i) {
  std::vector<std::string> n;
  for (auto& [name, shape] : block_entries(c, i)) n.push_back(name);
  return n;
}

std::vector<TensorSpec> umt5_block_specs(const Umt5Config& c, std::int64_t i, DType dtype) {
  std::vector<TensorSpec> out;
  for (auto& [name, shape] : block_entries(c, i)) out.push_back({name, dtype, shape});
  return out;
}

std::vector<TensorSpec> umt5_encoder_specs(const Umt5Config& c, DType dtype) {
  std::vector<TensorSpec> out = {{"shared.weight", dtype, {c.vocab_size, c.d_model}}};
  for (std::int64_t i = 0; i < c.num_layers; ++i)
    for (auto& s : umt5_block_specs(c, i, dtype)) out.push_back(std::move(s));
  out.push_back({"encoder.final_layer_norm.weight", dtype, {c.d_model}});
  return out;
}

}  // namespace dlo
