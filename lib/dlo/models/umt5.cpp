#include "dlo/models/umt5.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numbers>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/models/random_weights.h"

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

at::ScalarType umt5_weight_dtype(const std::string& name, at::ScalarType compute) {
  if (compute != at::kHalf) return compute;
  // _keep_in_fp32_modules = ["wo"], matched as a module name.
  std::size_t start = 0;
  while (start <= name.size()) {
    const std::size_t dot = name.find('.', start);
    if (name.compare(start, dot == std::string::npos ? std::string::npos : dot - start, "wo") == 0) return at::kFloat;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return compute;
}

Umt5BlockWeights Umt5BlockWeights::bind(const std::vector<at::Tensor>& t, const Umt5Config& c) {
  const std::size_t expected = c.is_gated() ? 10 : 9;
  DLO_ASSERT(t.size() == expected, "block has ", t.size(), " tensors, expected ", expected);
  Umt5BlockWeights w;
  std::size_t i = 0;
  for (at::Tensor* dst : {&w.ln1, &w.q, &w.k, &w.v, &w.o, &w.rel_bias, &w.ln2, &w.wi_0}) *dst = t[i++];
  if (c.is_gated()) w.wi_1 = t[i++];
  w.wo = t[i++];
  return w;
}

// ---------------------------------------------------------------------------------------------
// Math (transformers' modeling_umt5.py + integrations/sdpa_attention.py, op for op)

at::Tensor umt5_relative_position_bucket(const at::Tensor& relative_position, std::int64_t num_buckets,
                                         std::int64_t max_distance) {
  // Encoder: bidirectional.
  num_buckets /= 2;
  at::Tensor buckets = (relative_position > 0).to(at::kLong) * num_buckets;
  at::Tensor rel = at::abs(relative_position);
  const std::int64_t max_exact = num_buckets / 2;
  at::Tensor is_small = rel < max_exact;
  at::Tensor log_ratio = at::log(rel.to(at::kFloat) / max_exact) /
                         std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact));
  log_ratio = log_ratio * (num_buckets - max_exact);
  at::Tensor if_large = max_exact + log_ratio.to(at::kLong);
  if_large = at::min(if_large, at::full_like(if_large, num_buckets - 1));
  return buckets + at::where(is_small, rel, if_large);
}

namespace {

// UMT5LayerNorm: variance in fp32; cast back to the weight's dtype when it is half/bf16.
at::Tensor rms_norm(const at::Tensor& h, const at::Tensor& w, double eps) {
  at::Tensor variance = h.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true);
  at::Tensor y = h * at::rsqrt(variance + eps);
  if (w.scalar_type() == at::kHalf || w.scalar_type() == at::kBFloat16) y = y.to(w.scalar_type());
  return w * y;
}

at::Tensor activation(const at::Tensor& x, const std::string& act) {
  if (act == "gelu_new") {
    // NewGELUActivation, written as transformers writes it.
    return 0.5 * x * (1.0 + at::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * at::pow(x, 3.0))));
  }
  if (act == "gelu") return at::gelu(x);
  return at::relu(x);
}

double dtype_min(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return std::numeric_limits<float>::lowest();
    case at::kDouble: return std::numeric_limits<double>::lowest();
    case at::kBFloat16: return -3.3895313892515355e+38;
    case at::kHalf: return -65504.0;
    default: break;
  }
  DLO_CHECK(false, "unsupported compute dtype ", t);
  return 0;
}

// The fp16 guard after each sub-layer (UMT5Block): clamp to +-(max - 1000) if anything is inf.
at::Tensor clamp_fp16(const at::Tensor& h) {
  if (h.scalar_type() != at::kHalf) return h;
  const double max = 65504.0;
  at::Tensor clamp_value = at::where(at::isinf(h).any(), at::Scalar(max - 1000), at::Scalar(max));
  return at::clamp(h, -clamp_value, clamp_value);
}

}  // namespace

at::Tensor umt5_block_forward(const Umt5BlockWeights& w, const Umt5ForwardState& s, const at::Tensor& h_in,
                              const Umt5Config& c) {
  const std::int64_t B = s.batch, L = s.length, H = c.num_heads, dk = c.d_kv;
  at::Tensor h = h_in;

  // Self-attention (UMT5LayerSelfAttention + UMT5Attention + sdpa_attention_forward).
  at::Tensor n = rms_norm(h, w.ln1, c.layer_norm_epsilon);
  at::Tensor q = at::linear(n, w.q).view({B, -1, H, dk}).transpose(1, 2);
  at::Tensor k = at::linear(n, w.k).view({B, -1, H, dk}).transpose(1, 2);
  at::Tensor v = at::linear(n, w.v).view({B, -1, H, dk}).transpose(1, 2);
  // (.to(device): no-ops when the block's weights live where begin() ran, e.g. all on the CPU.)
  at::Tensor bias = at::embedding(w.rel_bias, s.bucket.to(w.rel_bias.device())).permute({2, 0, 1}).unsqueeze(0);
  at::Tensor mask = s.key_mask.defined()
                        ? at::where(s.key_mask.to(bias.device()), bias, at::Scalar(dtype_min(k.scalar_type())))
                        : bias;  // [1 or B, H, L, L]
  mask = mask.contiguous();
  at::Tensor a = at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0, /*is_causal=*/false,
                                                  /*scale=*/1.0);
  a = a.transpose(1, 2).contiguous();
  a = a.reshape({B, L, -1}).contiguous();
  h = h + at::linear(a, w.o);
  h = clamp_fp16(h);

  // Feed-forward (UMT5LayerFF + UMT5DenseGatedActDense / UMT5DenseActDense).
  n = rms_norm(h, w.ln2, c.layer_norm_epsilon);
  const std::string act = c.dense_act_fn();
  at::Tensor f = c.is_gated() ? activation(at::linear(n, w.wi_0), act) * at::linear(n, w.wi_1)
                              : activation(at::linear(n, w.wi_0), act);
  if (f.scalar_type() != w.wo.scalar_type()) f = f.to(w.wo.scalar_type());
  h = h + at::linear(f, w.wo);
  return clamp_fp16(h);
}

// ---------------------------------------------------------------------------------------------
// Model

Umt5Encoder Umt5Encoder::load(const std::string& dir, at::ScalarType compute, bool load_blocks) {
  return with_context(str("loading text encoder '", dir, "'"), [&] {
    DLO_CHECK(compute == at::kFloat || compute == at::kBFloat16 || compute == at::kHalf,
              "compute dtype must be fp32, bf16 or fp16");
    auto config = Umt5Config::from_json(JsonConfig::load(dir + "/config.json"));
    Umt5Encoder m(config, WeightStore::open(dir), compute);
    const auto& c = m.config_;
    // Every tensor with its shape, and none the config does not use (see check_checkpoint_tensors);
    // the embedding may be stored as shared.weight, encoder.embed_tokens.weight or both (tied).
    {
      TensorShapes expected;
      for (const auto& s : umt5_encoder_specs(c, DType::F32))
        if (s.name != "shared.weight") expected.emplace_back(s.name, s.shape);
      for (const char* emb : {"shared.weight", "encoder.embed_tokens.weight"})
        if (const TensorInfo* t = m.store_.checkpoint().find(emb))
          DLO_CHECK(t->shape == (std::vector<std::int64_t>{c.vocab_size, c.d_model}), m.store_.checkpoint().source(),
                    ": tensor '", emb, "' is not [vocab_size ", c.vocab_size, ", d_model ", c.d_model, "]");
      check_checkpoint_tensors(m.store_, expected, {"shared.weight", "encoder.embed_tokens.weight"});
    }
    auto get = [&](const std::string& name, const std::vector<std::int64_t>& shape) {
      return as_dtype(m.store_.get(name, shape), umt5_weight_dtype(name, compute));
    };
    // transformers ties encoder.embed_tokens to shared; checkpoints usually hold shared.weight.
    const std::string emb = m.store_.has("shared.weight") || !m.store_.has("encoder.embed_tokens.weight")
                                ? "shared.weight"
                                : "encoder.embed_tokens.weight";
    // The embedding stays a view in the checkpoint's dtype; begin() converts the rows it gathers
    // (the same values as converting the table first, without a copy of 256384 x 4096 values).
    m.global_.shared = m.store_.get(emb, {c.vocab_size, c.d_model});
    m.global_.final_norm = get("encoder.final_layer_norm.weight", {c.d_model});
    if (load_blocks) {
      for (std::int64_t i = 0; i < c.num_layers; ++i) {
        std::vector<at::Tensor> t;
        for (auto& [name, shape] : block_entries(c, i)) t.push_back(get(name, shape));
        m.blocks_.push_back(Umt5BlockWeights::bind(t, c));
      }
    }
    return m;
  });
}

Umt5ForwardState Umt5Encoder::begin(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                     bool compact) const {
  const auto& c = config_;
  DLO_CHECK(input_ids.defined() && input_ids.dim() == 2, "input_ids must be [B, L], got ",
            input_ids.defined() ? input_ids.sizes() : at::IntArrayRef{});
  DLO_CHECK(at::isIntegralType(input_ids.scalar_type(), /*includeBool=*/false), "input_ids must be integers, got ",
            input_ids.scalar_type());
  const std::int64_t B = input_ids.size(0);
  std::int64_t L = input_ids.size(1);
  DLO_CHECK(B > 0 && L > 0, "input_ids is empty: ", input_ids.sizes());
  at::Tensor ids = input_ids.to(at::kLong);
  const std::int64_t lo = ids.min().item<std::int64_t>(), hi = ids.max().item<std::int64_t>();
  DLO_CHECK(lo >= 0 && hi < c.vocab_size, "input_ids has values in [", lo, ", ", hi,
            "], outside the vocabulary [0, ", c.vocab_size, ")");
  at::Tensor mask;
  if (attention_mask.defined()) {
    DLO_CHECK(attention_mask.sizes() == input_ids.sizes(), "attention_mask must be [", B, ", ", L, "] like input_ids, got ",
              attention_mask.sizes());
    DLO_CHECK(at::isIntegralType(attention_mask.scalar_type(), /*includeBool=*/true),
              "attention_mask must be integer or bool, got ", attention_mask.scalar_type());
    mask = attention_mask.to(at::kLong);
    DLO_CHECK(at::logical_or(mask == 0, mask == 1).all().item<bool>(), "attention_mask must hold only 0 and 1");
  } else {
    mask = at::ones({B, L}, at::kLong);
  }

  Umt5ForwardState s;
  s.batch = B;
  s.length = s.output_length = L;
  const at::Tensor lens = mask.gt(0).sum(1).to(at::kLong).contiguous();
  s.seq_lens.assign(lens.data_ptr<std::int64_t>(), lens.data_ptr<std::int64_t>() + B);
  if (compact) {
    const std::int64_t n = std::max<std::int64_t>(1, *std::max_element(s.seq_lens.begin(), s.seq_lens.end()));
    const at::Tensor prefix = at::arange(L, at::kLong).unsqueeze(0) < lens.unsqueeze(1);
    DLO_CHECK(at::equal(mask.to(at::kBool), prefix), "compact mode needs right padding: every attention_mask row "
              "must be ones then zeros");
    ids = ids.narrow(1, 0, n);
    mask = mask.narrow(1, 0, n);
    s.length = L = n;
  }
  // transformers' sdpa mask: None when nothing is padded, else bool [B, 1, L, L] (key positions).
  const at::Tensor keep = mask.to(at::kBool);
  if (!keep.all().item<bool>()) s.key_mask = keep.view({B, 1, 1, L}).expand({B, 1, L, L});
  // compute_bias: relative_position = memory_position - context_position.
  const at::Tensor context = at::arange(L, at::kLong).unsqueeze(1);
  const at::Tensor memory = at::arange(L, at::kLong).unsqueeze(0);
  s.bucket = umt5_relative_position_bucket(memory - context, c.relative_attention_num_buckets,
                                           c.relative_attention_max_distance);
  s.h = at::embedding(global_.shared, ids).to(compute_);
  return s;
}

at::Tensor Umt5Encoder::final_norm(const Umt5ForwardState& s) const {
  return rms_norm(s.h, global_.final_norm, config_.layer_norm_epsilon);
}

at::Tensor trim_and_zero_pad(const at::Tensor& x, const std::vector<std::int64_t>& seq_lens, std::int64_t length) {
  DLO_CHECK(x.dim() == 3 && x.size(0) == static_cast<std::int64_t>(seq_lens.size()),
            "trim_and_zero_pad: need [B, L, D] and B lengths");
  if (length < 0) length = x.size(1);
  DLO_CHECK(length >= x.size(1), "trim_and_zero_pad: length ", length, " is below the ", x.size(1), " rows");
  at::Tensor out = at::zeros({x.size(0), length, x.size(2)}, x.options());
  out.narrow(1, 0, x.size(1)).copy_(x);
  for (std::int64_t b = 0; b < x.size(0); ++b) {
    const std::int64_t n = std::clamp<std::int64_t>(seq_lens[b], 0, length);
    out[b].narrow(0, n, length - n).zero_();
  }
  return out;
}

at::Tensor Umt5Encoder::end(const Umt5ForwardState& s) const {
  return trim_and_zero_pad(final_norm(s), s.seq_lens, s.output_length);
}

at::Tensor Umt5Encoder::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask, bool compact) const {
  DLO_CHECK(static_cast<std::int64_t>(blocks_.size()) == config_.num_layers,
            "forward() needs the block weights; load with load_blocks=true");
  Umt5ForwardState s = begin(input_ids, attention_mask, compact);
  for (const auto& b : blocks_) s.h = umt5_block_forward(b, s, s.h, config_);
  return end(s);
}

// ---------------------------------------------------------------------------------------------
// Random weights

WriteResult write_random_umt5_encoder(const std::string& dir, const Umt5Config& c, DType dtype, std::uint64_t seed,
                                      std::uint64_t shard_bytes) {
  c.validate("text encoder config");
  make_folders(dir);
  WriteOptions w;
  w.base_name = "model";
  w.max_shard_bytes = shard_bytes;
  w.metadata = {{"format", "pt"}};
  const double D = static_cast<double>(c.d_model);
  auto ends_with = [](const std::string& s, const char* suffix) {
    const std::size_t n = std::strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
  };
  // transformers' UMT5PreTrainedModel._init_weights (initializer_factor 1), except the norms.
  auto init = [&](const TensorSpec& s) -> RandomInit {
    if (s.name == "shared.weight") return {0.0, 1.0};
    if (ends_with(s.name, ".q.weight")) return {0.0, 1.0 / std::sqrt(D * static_cast<double>(c.d_kv))};
    if (ends_with(s.name, ".k.weight") || ends_with(s.name, ".v.weight")) return {0.0, 1.0 / std::sqrt(D)};
    if (ends_with(s.name, ".o.weight")) return {0.0, 1.0 / std::sqrt(static_cast<double>(c.inner_dim()))};
    if (ends_with(s.name, "relative_attention_bias.weight")) return {0.0, 1.0 / std::sqrt(D)};
    if (ends_with(s.name, ".wo.weight")) return {0.0, 1.0 / std::sqrt(static_cast<double>(c.d_ff))};
    if (s.name.find(".wi") != std::string::npos) return {0.0, 1.0 / std::sqrt(D)};
    return default_init(s);  // layer norms: 1 + N(0, 0.02^2)
  };
  auto r = write_random_checkpoint(dir, umt5_encoder_specs(c, dtype), init, seed, w);
  const char* name = dtype == DType::F32 ? "float32" : dtype == DType::F16 ? "float16" : "bfloat16";
  write_file_atomic(dir + "/config.json", c.to_json(name));
  return r;
}

}  // namespace dlo
