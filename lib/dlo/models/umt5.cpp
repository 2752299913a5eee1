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

namespace dlo {

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

namespace {

// Every tensor with its shape, and none the config does not use (see check_checkpoint_tensors);
// the embedding may be stored as shared.weight, encoder.embed_tokens.weight or both (tied).
void check_umt5_tensors(const WeightStore& store, const Umt5Config& c) {
  TensorShapes expected;
  for (const auto& s : umt5_encoder_specs(c, DType::F32))
    if (s.name != "shared.weight") expected.emplace_back(s.name, s.shape);
  for (const char* emb : {"shared.weight", "encoder.embed_tokens.weight"})
    if (const TensorInfo* t = store.checkpoint().find(emb))
      DLO_CHECK(t->shape == (std::vector<std::int64_t>{c.vocab_size, c.d_model}), store.checkpoint().source(),
                ": tensor '", emb, "' is not [vocab_size ", c.vocab_size, ", d_model ", c.d_model, "]");
  check_checkpoint_tensors(store, expected, {"shared.weight", "encoder.embed_tokens.weight"});
}

}  // namespace

void Umt5Encoder::check_checkpoint(const std::string& dir) {
  with_context(str("loading text encoder '", dir, "'"), [&] {
    check_umt5_tensors(WeightStore::open(dir), Umt5Config::from_json(JsonConfig::load(dir + "/config.json")));
  });
}

Umt5Encoder Umt5Encoder::load(const std::string& dir, at::ScalarType compute, bool load_blocks) {
  return with_context(str("loading text encoder '", dir, "'"), [&] {
    DLO_CHECK(compute == at::kFloat || compute == at::kBFloat16 || compute == at::kHalf,
              "compute dtype must be fp32, bf16 or fp16");
    auto config = Umt5Config::from_json(JsonConfig::load(dir + "/config.json"));
    Umt5Encoder m(config, WeightStore::open(dir), compute);
    const auto& c = m.config_;
    check_umt5_tensors(m.store_, c);
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
        for (const auto& spec : umt5_block_specs(c, i, DType::F32)) t.push_back(get(spec.name, spec.shape));
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
  if (!device_.is_cpu()) {  // the small inputs to the device once, not per block
    s.bucket = s.bucket.to(device_);
    if (s.key_mask.defined()) s.key_mask = keep.to(device_).view({B, 1, 1, L}).expand({B, 1, L, L});
  }
  s.h = at::embedding(global_.shared, ids.to(global_.shared.device())).to(compute_);
  return s;
}

void Umt5Encoder::to_device(at::Device device) {
  if (device == device_) return;
  for (at::Tensor* t : {&global_.shared, &global_.final_norm}) *t = t->to(device);
  for (auto& b : blocks_)
    for (at::Tensor* t : {&b.ln1, &b.q, &b.k, &b.v, &b.o, &b.rel_bias, &b.ln2, &b.wi_0, &b.wi_1, &b.wo})
      if (t->defined()) *t = t->to(device);
  device_ = device;
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

}  // namespace dlo
