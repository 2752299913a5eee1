#include "dlo/models/wan_transformer.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/config/wan_tensor_names.h"
#include "dlo/models/tensor_view.h"

namespace dlo {

at::ScalarType wan_weight_dtype(const std::string& name, at::ScalarType compute) {
  // diffusers' _keep_in_fp32_modules: any dot-separated component equal to one of these.
  static const char* keep[] = {"rope", "time_embedder", "scale_shift_table", "norm1", "norm2", "norm3"};
  std::size_t start = 0;
  while (start <= name.size()) {
    const std::size_t dot = name.find('.', start);
    const std::string part = name.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    for (const char* k : keep)
      if (part == k) return at::kFloat;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return compute;
}

bool wan_layerwise_cast(const std::string& name) {
  // Relative to the block: drop "blocks.N." when the name is the model's.
  std::string rel = name;
  if (rel.rfind("blocks.", 0) == 0) {
    const std::size_t dot = rel.find('.', 7);
    if (dot == std::string::npos) return false;
    rel = rel.substr(dot + 1);
  }
  static const char* const kLinears[] = {"attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                                         "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0",
                                         "attn2.add_k_proj", "attn2.add_v_proj", "ffn.net.0.proj", "ffn.net.2"};
  for (const char* l : kLinears)
    for (const char* leaf : {".weight", ".bias"})
      if (rel == std::string(l) + leaf) return true;
  return false;
}

namespace {

constexpr std::pair<LinearStorage, const char*> kStorageNames[] = {{LinearStorage::kAuto, "auto"},
                                                                  {LinearStorage::kFp8, "fp8"},
                                                                  {LinearStorage::kBF16, "bf16"},
                                                                  {LinearStorage::kFP16, "fp16"},
                                                                  {LinearStorage::kFP32, "fp32"}};

bool is_fp8(at::ScalarType t) { return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2; }

const char* dtype_label(at::ScalarType t) {
  if (t == at::kFloat8_e4m3fn) return "fp8 e4m3fn";
  if (t == at::kFloat8_e5m2) return "fp8 e5m2";
  return compute_dtype_name(t);
}

}  // namespace

LinearStorage parse_linear_storage(const std::string& name, at::ScalarType compute, const std::string& what) {
  for (const auto& [s, n] : kStorageNames)
    if (name == n) {
      const std::size_t bytes = s == LinearStorage::kFP32 ? 4 : s == LinearStorage::kBF16 || s == LinearStorage::kFP16 ? 2 : 0;
      DLO_CHECK(bytes <= c10::elementSize(compute), what, ": ", n, " is wider than the compute dtype ",
                compute_dtype_name(compute), ": the same frames at more bytes (give one no wider than --dtype, or auto)");
      return s;
    }
  DLO_CHECK(false, what, ": '", name, "' is not auto, fp8, bf16, fp16 or fp32");
}

const char* linear_storage_name(LinearStorage s) {
  for (const auto& [k, n] : kStorageNames)
    if (k == s) return n;
  DLO_ASSERT(false, "unnamed storage");
}

at::ScalarType WanDtypes::stored(const std::string& name) const {
  if (scaled && wan_scaled_weight_of(name)) return at::kFloat;
  if (!wan_layerwise_cast(name)) return wan_weight_dtype(name, compute);
  return name.compare(name.size() - 5, 5, ".bias") == 0 ? bias_storage : linear_storage;
}

namespace {

// The block's 10 Linears' weights, relative to the block, in packing order.
std::vector<std::string> block_linear_weights(const WanTransformerConfig& c) {
  std::vector<std::string> out;
  for (const auto& n : wan_block_tensor_names(c))
    if (wan_layerwise_cast(n) && n.compare(n.size() - 7, 7, ".weight") == 0) out.push_back(n);
  return out;
}

std::string scale_of(const std::string& weight) { return weight.substr(0, weight.size() - 7) + ".scale_weight"; }

}  // namespace

std::vector<std::string> wan_block_names(const WanTransformerConfig& c, const WanDtypes& d) {
  std::vector<std::string> names = wan_block_tensor_names(c);
  if (d.scaled)
    for (const auto& w : block_linear_weights(c)) names.push_back(scale_of(w));
  return names;
}

at::ScalarType WanDtypes::via(const std::string& name) const {
  return scaled && wan_scaled_weight_of(name) ? at::kFloat : wan_weight_dtype(name, compute);
}

at::Tensor WanDtypes::keep(const std::string& name, const at::Tensor& t, const TensorEdits* edits) const {
  const at::ScalarType to = stored(name);
  if (edits && edits->touches(name)) {
    const std::int64_t cols = t.dim() > 1 ? t.numel() / t.size(0) : 1;
    return edited_rows(*edits, name, t, cols, via(name), to, 0);
  }
  if (t.scalar_type() == to) return t;
  return as_dtype(as_dtype(t, via(name)), to);
}

std::string WanDtypes::describe() const {
  if (linear_storage == compute && bias_storage == compute) return compute_dtype_name(compute);
  return str(compute_dtype_name(compute), " (Linears ", scaled ? "scaled " : "", dtype_label(linear_storage),
             bias_storage != linear_storage ? str(", biases ", dtype_label(bias_storage)) : std::string(), ")");
}

WanDtypes resolve_wan_dtypes(LinearStorage storage, at::ScalarType compute, const Checkpoint& ck, const std::string& what) {
  (void)parse_linear_storage(linear_storage_name(storage), compute, what);  // no wider than compute
  // The fp8 dtype the checkpoint keeps every layerwise-cast weight (bias) in, if it is one.
  auto file_fp8 = [&](bool biases) -> std::optional<at::ScalarType> {
    std::optional<at::ScalarType> kind;
    for (const TensorInfo* t : ck.tensors()) {
      if (!wan_layerwise_cast(t->name) || (t->name.compare(t->name.size() - 5, 5, ".bias") == 0) != biases) continue;
      const at::ScalarType d = to_scalar_type(t->dtype);
      if (!is_fp8(d) || (kind && *kind != d)) return std::nullopt;
      kind = d;
    }
    return kind;
  };
  auto kept = [&](std::optional<at::ScalarType> file) {
    switch (storage) {
      case LinearStorage::kAuto: return file ? *file : compute;
      case LinearStorage::kFp8: return file ? *file : at::kFloat8_e4m3fn;
      case LinearStorage::kBF16: return at::kBFloat16;
      case LinearStorage::kFP16: return at::kHalf;
      case LinearStorage::kFP32: return at::kFloat;
    }
    return compute;
  };
  WanDtypes d = WanDtypes::same(compute);
  d.linear_storage = kept(file_fp8(false));
  d.bias_storage = kept(file_fp8(true));
  std::vector<std::string> unscaled;
  for (const TensorInfo* t : ck.tensors()) {
    d.scaled |= t->name == kScaledFp8Marker || (wan_scaled_weight_of(t->name) && t->name.find(".scale_weight") != std::string::npos);
    if (t->name.rfind("blocks.", 0) == 0 && wan_layerwise_cast(t->name) && t->name.compare(t->name.size() - 7, 7, ".weight") == 0 &&
        !ck.find(scale_of(t->name)))
      unscaled.push_back(t->name);
  }
  if (d.scaled) {
    DLO_CHECK(storage == LinearStorage::kAuto || storage == LinearStorage::kFp8, what, ": ", linear_storage_name(storage),
              ": '", ck.source(), "' is a scaled fp8 file (its Linears fp8 with a scale each), streamed as written: give fp8 or auto");
    DLO_CHECK(file_fp8(false).has_value(), "'", ck.source(), "' is a scaled fp8 file, but its block Linears' weights are not all ",
              "in one fp8 dtype");
    DLO_CHECK(unscaled.empty(), "'", ck.source(), "' is a scaled fp8 file, but ", unscaled.size(),
              " block Linear weight(s) have no scale_weight (diffusers' names), e.g. '", unscaled.empty() ? "" : unscaled[0], "'");
  }
  return d;
}

const std::vector<LinearAdapter>* WanAdapters::of(const std::string& name) const {
  const auto it = modules.find(name);
  return it == modules.end() ? nullptr : &it->second;
}

std::uint64_t WanAdapters::bytes() const {
  std::uint64_t n = 0;
  for (const auto& [name, list] : modules)
    for (const auto& a : list)
      for (const at::Tensor* t : {&a.down, &a.up, &a.bias})
        if (t->defined()) n += static_cast<std::uint64_t>(t->numel() * t->element_size());
  return n;
}

WanBlockWeights WanBlockWeights::bind(const std::vector<at::Tensor>& t, const WanTransformerConfig& c, std::int64_t index) {
  const std::size_t expected = wan_block_tensor_names(c).size();
  DLO_ASSERT(t.size() == expected || t.size() == expected + 10, "block has ", t.size(), " tensors, expected ", expected,
             " (or ", expected + 10, " with the scales of a scaled fp8 file)");
  WanBlockWeights w;
  w.index = index;
  std::size_t i = 0;
  for (at::Tensor* dst : {&w.q1_w, &w.q1_b, &w.k1_w, &w.k1_b, &w.v1_w, &w.v1_b, &w.o1_w, &w.o1_b, &w.norm_q1,
                          &w.norm_k1, &w.q2_w, &w.q2_b, &w.k2_w, &w.k2_b, &w.v2_w, &w.v2_b, &w.o2_w, &w.o2_b,
                          &w.norm_q2, &w.norm_k2})
    *dst = t[i++];
  if (c.cross_attn_norm) {
    w.norm2_w = t[i++];
    w.norm2_b = t[i++];
  }
  for (at::Tensor* dst : {&w.ffn0_w, &w.ffn0_b, &w.ffn2_w, &w.ffn2_b, &w.scale_shift_table}) *dst = t[i++];
  if (i < t.size())  // wan_block_names' order: the Linears' scales
    for (at::Tensor* dst : {&w.q1_s, &w.k1_s, &w.v1_s, &w.o1_s, &w.q2_s, &w.k2_s, &w.v2_s, &w.o2_s, &w.ffn0_s, &w.ffn2_s})
      *dst = t[i++];
  return w;
}

// ---------------------------------------------------------------------------------------------
// Math

namespace {

// The one place a weight kept narrower than the compute dtype (WanDtypes) is cast to it: on the
// device, just before its matmul, as diffusers' layerwise casting's pre_forward does; a scaled fp8
// weight is then multiplied by its scale in the compute dtype (ComfyUI's dequantisation).
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& scale = {},
                  const std::vector<LinearAdapter>* adapters = nullptr) {
  const auto dt = x.scalar_type();
  const at::Tensor weight = scale.defined() ? as_dtype(w, dt) * scale.to(dt) : as_dtype(w, dt);
  at::Tensor y = at::linear(x, weight, as_dtype(b, dt));
  if (!adapters) return y;
  // PEFT's unfused LoRA forward (wan_transformer.h: LinearAdapter), op for op.
  const auto result_dtype = y.scalar_type();
  at::Tensor xa = x;
  for (const LinearAdapter& a : *adapters) {
    xa = as_dtype(xa, a.down.scalar_type());
    y = y + at::linear(at::linear(xa, a.down), a.up, a.bias) * a.scaling;
  }
  return y.to(result_dtype);
}

// The job's adapters of module `module` of block w ("attn1.to_q"), or nullptr.
const std::vector<LinearAdapter>* adapters_of(const WanForwardState& s, const WanBlockWeights& w, const char* module) {
  if (!s.adapters || s.adapters->modules.empty()) return nullptr;
  return s.adapters->of(str("blocks.", w.index, ".", module));
}
const std::vector<LinearAdapter>* adapters_of(const WanForwardState& s, const char* module) {
  return s.adapters ? s.adapters->of(module) : nullptr;
}

// diffusers' FP32LayerNorm: layer_norm in fp32, result cast back to the input's dtype.
at::Tensor fp32_layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps) {
  const auto D = x.size(-1);
  return at::layer_norm(x.to(at::kFloat), {D}, w.defined() ? as_dtype(w, at::kFloat) : at::Tensor(),
                        b.defined() ? as_dtype(b, at::kFloat) : at::Tensor(), eps)
      .to(x.scalar_type());
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // x: [B, L, H, d]; pairs (0,1), (2,3), ... rotate together.
  auto pairs = x.unflatten(-1, {-1, 2}).unbind(-1);
  const at::Tensor& x1 = pairs[0];
  const at::Tensor& x2 = pairs[1];
  at::Tensor c = cos.slice(-1, 0, c10::nullopt, 2);
  at::Tensor s = sin.slice(-1, 1, c10::nullopt, 2);
  at::Tensor out = at::empty_like(x);
  out.slice(-1, 0, c10::nullopt, 2).copy_(x1 * c - x2 * s);
  out.slice(-1, 1, c10::nullopt, 2).copy_(x1 * s + x2 * c);
  return out;
}

// A share's rows x [B, L_s, ...] at their places in a zero tensor of every token of s's whole
// [B, L, ...] (the sequence-parallel seam in the header: kernels that round a row by its tensor's
// size); rows_of() takes them back.
at::Tensor as_whole(const at::Tensor& x, const WanForwardState& s) {
  std::vector<std::int64_t> shape = x.sizes().vec();
  shape[1] = s.tokens();
  at::Tensor whole = at::zeros(shape, x.options());
  whole.narrow(1, s.first_row, x.size(1)).copy_(x);
  return whole;
}
at::Tensor rows_of(const at::Tensor& whole, const WanForwardState& s) {
  return whole.narrow(1, s.first_row, s.h.size(1));
}

// GELU (tanh) of the FFN's hidden rows, rounded as one rank rounds them (a share: on the whole).
// CUDA's elementwise kernels run one code per element, so only the CPU needs the whole.
at::Tensor ffn_gelu(const at::Tensor& x, const WanForwardState& s) {
  if (!s.is_share() || !x.is_cpu()) return at::gelu(x, "tanh");
  at::Tensor whole = as_whole(x, s);
  return rows_of(at::gelu_(whole, "tanh"), s);
}

// Cross-attention of x's tokens on the text context (no RoPE): q from x, k and v from ctx. A
// share's queries attend at their places among every token's (the others zero: SDPA's query
// blocks as one rank's).
at::Tensor cross_attention(const at::Tensor& x, const WanForwardState& s, const WanBlockWeights& w,
                           const WanTransformerConfig& c) {
  const at::Tensor& ctx = s.context;
  const auto D = c.dim();
  at::Tensor q = linear(x, w.q2_w, w.q2_b, w.q2_s, adapters_of(s, w, "attn2.to_q"));
  at::Tensor k = linear(ctx, w.k2_w, w.k2_b, w.k2_s, adapters_of(s, w, "attn2.to_k"));
  at::Tensor v = linear(ctx, w.v2_w, w.v2_b, w.v2_s, adapters_of(s, w, "attn2.to_v"));
  // torch.nn.RMSNorm over the whole D (across heads).
  q = at::rms_norm(q, {D}, as_dtype(w.norm_q2, q.scalar_type()), c.eps);
  k = at::rms_norm(k, {D}, as_dtype(w.norm_k2, k.scalar_type()), c.eps);
  q = q.unflatten(2, {c.num_attention_heads, -1});
  k = k.unflatten(2, {c.num_attention_heads, -1});
  v = v.unflatten(2, {c.num_attention_heads, -1});
  const bool whole = s.is_share();
  if (whole) q = as_whole(q, s);
  at::Tensor o = at::scaled_dot_product_attention(q.permute({0, 2, 1, 3}), k.permute({0, 2, 1, 3}),
                                                  v.permute({0, 2, 1, 3}));
  o = o.permute({0, 2, 1, 3});
  if (whole) o = rows_of(o, s);
  return linear(o.flatten(2, 3).to(q.scalar_type()), w.o2_w, w.o2_b, w.o2_s, adapters_of(s, w, "attn2.to_out.0"));
}

// diffusers' get_timestep_embedding(flip_sin_to_cos=True, downscale_freq_shift=0, scale=1), fp32.
at::Tensor timestep_embedding(const at::Tensor& t, std::int64_t dim) {
  const std::int64_t half = dim / 2;
  at::Tensor exponent = at::arange(0, half, at::TensorOptions().dtype(at::kFloat).device(t.device())) * (-std::log(10000.0));
  exponent = exponent / static_cast<double>(half);
  at::Tensor emb = at::exp(exponent);
  emb = t.unsqueeze(1).to(at::kFloat) * emb.unsqueeze(0);
  emb = at::cat({at::sin(emb), at::cos(emb)}, -1);
  return at::cat({emb.slice(1, half), emb.slice(1, 0, half)}, -1);
}

// diffusers' get_1d_rotary_pos_embed(use_real=True, repeat_interleave_real=True, float64).
std::pair<at::Tensor, at::Tensor> rope_1d(std::int64_t dim, std::int64_t max_len) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor freqs = 1.0 / at::pow(10000.0, at::arange(0, dim, 2, f64) / static_cast<double>(dim));
  freqs = at::outer(at::arange(max_len, f64), freqs);
  return {freqs.cos().repeat_interleave(2, 1).to(at::kFloat), freqs.sin().repeat_interleave(2, 1).to(at::kFloat)};
}

}  // namespace

WanBlockModulation wan_block_modulation(const WanBlockWeights& w, const WanForwardState& s) {
  // tproj [B, 6, D] gives [B, 1, D] per term; per-token tproj [B, L, 6, D] (Wan2.2 TI2V's expanded
  // timesteps) gives [B, L, D], as diffusers' block squeezes it.
  const at::Tensor table = as_dtype(w.scale_shift_table, at::kFloat);
  const bool per_token = s.tproj.dim() == 4;
  std::vector<at::Tensor> m = per_token ? (table.unsqueeze(0) + s.tproj.to(at::kFloat)).chunk(6, 2)
                                        : (table + s.tproj.to(at::kFloat)).chunk(6, 1);
  if (per_token)
    for (auto& t : m) t = t.squeeze(2);
  return {m[0], m[1], m[2], m[3], m[4], m[5]};
}

WanSelfAttnInputs wan_block_self_attn_inputs(const WanBlockWeights& w, const WanForwardState& s,
                                             const WanBlockModulation& mod, const at::Tensor& h,
                                             const WanTransformerConfig& c) {
  const auto dt = h.scalar_type();
  const at::Tensor none;
  const at::Tensor n =
      (fp32_layer_norm(h.to(at::kFloat), none, none, c.eps) * (1 + mod.scale_msa) + mod.shift_msa).to(dt);
  const auto D = c.dim();
  at::Tensor q = linear(n, w.q1_w, w.q1_b, w.q1_s, adapters_of(s, w, "attn1.to_q"));
  at::Tensor k = linear(n, w.k1_w, w.k1_b, w.k1_s, adapters_of(s, w, "attn1.to_k"));
  at::Tensor v = linear(n, w.v1_w, w.v1_b, w.v1_s, adapters_of(s, w, "attn1.to_v"));
  // torch.nn.RMSNorm over the whole D (across heads): needs every head of a token.
  q = at::rms_norm(q, {D}, as_dtype(w.norm_q1, q.scalar_type()), c.eps).unflatten(2, {c.num_attention_heads, -1});
  k = at::rms_norm(k, {D}, as_dtype(w.norm_k1, k.scalar_type()), c.eps).unflatten(2, {c.num_attention_heads, -1});
  v = v.unflatten(2, {c.num_attention_heads, -1});
  return {apply_rope(q, s.rope_cos, s.rope_sin), apply_rope(k, s.rope_cos, s.rope_sin), v};
}

at::Tensor wan_self_attention(const WanSelfAttnInputs& a) {
  at::Tensor o = at::scaled_dot_product_attention(a.q.permute({0, 2, 1, 3}), a.k.permute({0, 2, 1, 3}),
                                                  a.v.permute({0, 2, 1, 3}));
  return o.permute({0, 2, 1, 3});
}

at::Tensor wan_block_finish(const WanBlockWeights& w, const WanForwardState& s, const WanBlockModulation& mod,
                            const at::Tensor& h_in, const at::Tensor& attn, const WanTransformerConfig& c) {
  at::Tensor h = h_in;
  const auto dt = h.scalar_type();
  const at::Tensor &gate_msa = mod.gate_msa, &c_shift = mod.c_shift, &c_scale = mod.c_scale, &c_gate = mod.c_gate;
  const at::Tensor none;

  // 1. (continued) Self-attention's output projection, gated residual in fp32.
  at::Tensor a = linear(attn.flatten(2, 3).to(dt), w.o1_w, w.o1_b, w.o1_s, adapters_of(s, w, "attn1.to_out.0"));
  h = (h.to(at::kFloat) + a * gate_msa).to(dt);

  // 2. Cross-attention on the text context, plain residual in the compute dtype.
  at::Tensor n = c.cross_attn_norm ? fp32_layer_norm(h.to(at::kFloat), w.norm2_w, w.norm2_b, c.eps).to(dt) : h;
  a = cross_attention(n, s, w, c);
  h = h + a;

  // 3. Feed-forward (GELU tanh), gated residual in fp32.
  n = (fp32_layer_norm(h.to(at::kFloat), none, none, c.eps) * (1 + c_scale) + c_shift).to(dt);
  at::Tensor f = linear(ffn_gelu(linear(n, w.ffn0_w, w.ffn0_b, w.ffn0_s, adapters_of(s, w, "ffn.net.0.proj")), s),
                        w.ffn2_w, w.ffn2_b, w.ffn2_s, adapters_of(s, w, "ffn.net.2"));
  return (h.to(at::kFloat) + f.to(at::kFloat) * c_gate).to(dt);
}

at::Tensor wan_block_forward(const WanBlockWeights& w, const WanForwardState& s, const at::Tensor& h,
                             const WanTransformerConfig& c) {
  const WanBlockModulation mod = wan_block_modulation(w, s);  // once per block
  return wan_block_finish(w, s, mod, h, wan_self_attention(wan_block_self_attn_inputs(w, s, mod, h, c)), c);
}

WanForwardState wan_state_rows(const WanForwardState& s, std::int64_t offset, std::int64_t length) {
  DLO_ASSERT(offset >= 0 && length > 0 && offset + length <= s.h.size(1), "rows [", offset, ", ", offset + length,
             ") of ", s.h.size(1));
  WanForwardState r = s;
  r.first_row = s.first_row + offset;
  r.h = s.h.narrow(1, offset, length);
  r.rope_cos = s.rope_cos.narrow(1, offset, length);
  r.rope_sin = s.rope_sin.narrow(1, offset, length);
  if (s.temb.dim() == 3) r.temb = s.temb.narrow(1, offset, length);
  if (s.tproj.dim() == 4) r.tproj = s.tproj.narrow(1, offset, length);
  return r;
}

std::vector<at::Tensor> split_by(const at::Tensor& x, std::int64_t dim, const Partition& p) {
  std::vector<at::Tensor> out;
  for (std::int64_t r = 0; r < p.parts(); ++r) out.push_back(x.narrow(dim, p.offset[r], p.size[r]));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Model

WanTransformer WanTransformer::load(const std::string& dir, at::ScalarType compute, bool load_blocks) {
  const auto config =
      with_context(str("loading transformer '", dir, "'"), [&] { return WanTransformerConfig::from_json(JsonConfig::load(dir + "/config.json")); });
  return load(dir, config, compute, load_blocks);
}

WanTransformer WanTransformer::load(const std::string& weights, const WanTransformerConfig& config,
                                    at::ScalarType compute, bool load_blocks, LinearStorage storage,
                                    std::shared_ptr<const TensorEdits> edits) {
  return with_context(str("loading transformer '", weights, "'"), [&] {
    WeightStore store(open_wan_transformer(weights));
    const WanDtypes dtypes = resolve_wan_dtypes(storage, compute, store.checkpoint(), "--storage-dtype");
    WanTransformer m(config, std::move(store), dtypes);
    // A scaled file's weight is fp8 x scale: a change to it would need a new scale (not done).
    DLO_CHECK(!(edits && dtypes.scaled), "a LoRA cannot be fused into a scaled fp8 file (its weights are fp8 times a "
              "per-tensor scale); fuse it into the bf16 or plain fp8 weights, or apply it unfused");
    m.edits_ = std::move(edits);
    const auto& c = m.config_;
    // Every tensor, blocks included (the engine streams them later), with its shape, and no
    // tensor the config does not use: a mismatch is found here, not mid-run.
    TensorShapes expected;
    std::vector<std::string> scales = {kScaledFp8Marker};  // a scaled file's (resolve_wan_dtypes checks them)
    for (const auto& s : wan_transformer_specs(c, DType::F32)) {
      expected.emplace_back(s.name, s.shape);
      if (s.name.size() > 7 && s.name.compare(s.name.size() - 7, 7, ".weight") == 0)
        for (const char* tail : {".scale_weight", ".scale_input"}) scales.push_back(s.name.substr(0, s.name.size() - 7) + tail);
    }
    check_checkpoint_tensors(m.store_, expected, scales);
    auto get = [&](const std::string& name, const std::vector<std::int64_t>& shape) {
      at::Tensor t = m.dtypes_.keep(name, m.store_.get(name, shape), m.edits_.get());
      // A scaled file's Linears outside the blocks: dequantised once, here (the blocks' at their matmul).
      const std::string scale = name.size() > 7 ? name.substr(0, name.size() - 7) + ".scale_weight" : "";
      if (m.dtypes_.scaled && name.rfind("blocks.", 0) != 0 && !scale.empty() && m.store_.has(scale))
        t = t * m.store_.get(scale).to(t.scalar_type());
      return t;
    };
    std::map<std::string, at::Tensor> g;
    std::map<std::string, std::vector<std::int64_t>> shape_of;
    for (const auto& s : wan_transformer_specs(c, DType::F32)) shape_of[s.name] = s.shape;
    for (const auto& [name, shape] : shape_of)
      if (name.rfind("blocks.", 0) != 0) g[name] = get(name, shape);
    auto& gw = m.global_;
    gw.patch_w = g["patch_embedding.weight"];
    gw.patch_b = g["patch_embedding.bias"];
    gw.time1_w = g["condition_embedder.time_embedder.linear_1.weight"];
    gw.time1_b = g["condition_embedder.time_embedder.linear_1.bias"];
    gw.time2_w = g["condition_embedder.time_embedder.linear_2.weight"];
    gw.time2_b = g["condition_embedder.time_embedder.linear_2.bias"];
    gw.time_proj_w = g["condition_embedder.time_proj.weight"];
    gw.time_proj_b = g["condition_embedder.time_proj.bias"];
    gw.text1_w = g["condition_embedder.text_embedder.linear_1.weight"];
    gw.text1_b = g["condition_embedder.text_embedder.linear_1.bias"];
    gw.text2_w = g["condition_embedder.text_embedder.linear_2.weight"];
    gw.text2_b = g["condition_embedder.text_embedder.linear_2.bias"];
    gw.proj_out_w = g["proj_out.weight"];
    gw.proj_out_b = g["proj_out.bias"];
    gw.scale_shift_table = g["scale_shift_table"];
    if (load_blocks) {
      const auto names = wan_block_names(c, m.dtypes_);
      for (std::int64_t i = 0; i < c.num_layers; ++i) {
        std::vector<at::Tensor> t;
        for (const auto& n : names) {
          const std::string full = "blocks." + std::to_string(i) + "." + n;
          t.push_back(wan_scaled_weight_of(full) ? m.dtypes_.keep(full, m.store_.get(full)) : get(full, shape_of.at(full)));
        }
        m.blocks_.push_back(WanBlockWeights::bind(t, c, i));
      }
    }
    // RoPE tables, as diffusers' WanRotaryPosEmbed builds its buffers.
    const std::int64_t d = c.attention_head_dim, hw = 2 * (d / 6), t = d - 2 * hw;
    std::vector<at::Tensor> cos, sin;
    for (std::int64_t part : {t, hw, hw}) {
      auto [pc, ps] = rope_1d(part, c.rope_max_seq_len);
      cos.push_back(pc);
      sin.push_back(ps);
    }
    m.rope_cos_table_ = at::cat(cos, 1);
    m.rope_sin_table_ = at::cat(sin, 1);
    return m;
  });
}

void WanTransformer::check_inputs(const at::Tensor& x_in, const at::Tensor& timestep,
                                  const at::Tensor& context_in) const {
  const auto& c = config_;
  const auto& p = c.patch_size;
  DLO_CHECK(x_in.defined() && timestep.defined() && context_in.defined(), "an input tensor is missing");
  DLO_CHECK(x_in.dim() == 5, "hidden_states must be [B, C, F, H, W], got ", x_in.sizes());
  const std::int64_t B = x_in.size(0);
  DLO_CHECK(B > 0, "hidden_states has batch size 0");
  DLO_CHECK(x_in.size(1) == c.in_channels, "hidden_states has ", x_in.size(1), " channels; the model takes ",
            c.in_channels);
  DLO_CHECK(x_in.size(2) % p[0] == 0 && x_in.size(3) % p[1] == 0 && x_in.size(4) % p[2] == 0,
            "hidden_states frames/height/width ", x_in.sizes().slice(2), " must be multiples of patch_size [", p[0],
            ", ", p[1], ", ", p[2], "]");
  const std::int64_t frames = x_in.size(2) / p[0], height = x_in.size(3) / p[1], width = x_in.size(4) / p[2];
  DLO_CHECK(frames > 0 && height > 0 && width > 0, "hidden_states is empty: ", x_in.sizes());
  DLO_CHECK(std::max({frames, height, width}) <= c.rope_max_seq_len, "latent grid ", frames, "x", height, "x", width,
            " exceeds rope_max_seq_len ", c.rope_max_seq_len);
  const std::int64_t L = frames * height * width;
  DLO_CHECK((timestep.dim() == 1 && timestep.size(0) == B) ||
                (timestep.dim() == 2 && timestep.size(0) == B && timestep.size(1) == L),
            "timestep must be [", B, "] (one per batch entry of hidden_states) or [", B, ", ", L,
            "] (one per token, Wan2.2's expand_timesteps), got ", timestep.sizes());
  DLO_CHECK(!timestep.is_complex() && timestep.scalar_type() != at::kBool, "timestep must be numbers, got ",
            c10::toString(timestep.scalar_type()));
  DLO_CHECK(context_in.dim() == 3 && context_in.size(0) == B && context_in.size(2) == c.text_dim,
            "encoder_hidden_states must be [", B, ", L, ", c.text_dim, "] (batch ", B,
            " as hidden_states), got ", context_in.sizes());
  DLO_CHECK(context_in.size(1) > 0, "encoder_hidden_states has no tokens: ", context_in.sizes());
}

WanForwardState WanTransformer::begin(const at::Tensor& x_in, const at::Tensor& timestep,
                                      const at::Tensor& context_in, std::shared_ptr<const WanAdapters> adapters) const {
  const auto& c = config_;
  const auto& p = c.patch_size;
  check_inputs(x_in, timestep, context_in);
  WanForwardState s;
  s.adapters = std::move(adapters);
  s.batch = x_in.size(0);
  s.frames = x_in.size(2) / p[0];
  s.height = x_in.size(3) / p[1];
  s.width = x_in.size(4) / p[2];

  const auto dt = dtypes_.compute;
  const at::Tensor x = x_in.to(device_, dt);
  const at::Tensor context = context_in.to(device_, dt);
  const at::Tensor tsteps = timestep.to(device_);

  // RoPE for the F x H x W grid: [1, L, 1, d].
  const std::int64_t d = c.attention_head_dim, hw = 2 * (d / 6), t = d - 2 * hw;
  auto grid = [&](const at::Tensor& table) {
    auto parts = table.split_with_sizes({t, hw, hw}, 1);
    auto f = parts[0].slice(0, 0, s.frames).view({s.frames, 1, 1, -1}).expand({s.frames, s.height, s.width, -1});
    auto h = parts[1].slice(0, 0, s.height).view({1, s.height, 1, -1}).expand({s.frames, s.height, s.width, -1});
    auto w = parts[2].slice(0, 0, s.width).view({1, 1, s.width, -1}).expand({s.frames, s.height, s.width, -1});
    return at::cat({f, h, w}, -1).reshape({1, s.frames * s.height * s.width, 1, -1});
  };
  s.rope_cos = grid(rope_cos_table_);
  s.rope_sin = grid(rope_sin_table_);

  const auto& g = global_;
  at::Tensor h = at::conv3d(x, as_dtype(g.patch_w, dt), as_dtype(g.patch_b, dt), {p[0], p[1], p[2]});
  s.h = h.flatten(2).transpose(1, 2).contiguous();

  // One timestep per sample ([B] -> temb [B, D], tproj [B, 6, D]) or per token ([B, L] -> temb
  // [B, L, D], tproj [B, L, 6, D]), as diffusers' condition embedder (it embeds the flattened
  // timesteps, then restores [B, L]).
  const bool per_token = tsteps.dim() == 2;
  at::Tensor ts = timestep_embedding(tsteps.flatten(), c.freq_dim);
  if (per_token) ts = ts.unflatten(0, {s.batch, -1});
  ts = ts.to(g.time1_w.scalar_type());
  at::Tensor temb = linear(at::silu(linear(ts, g.time1_w, g.time1_b, {}, adapters_of(s, "condition_embedder.time_embedder.linear_1"))),
                           g.time2_w, g.time2_b, {}, adapters_of(s, "condition_embedder.time_embedder.linear_2"));
  s.temb = temb.to(dt);
  s.tproj = linear(at::silu(s.temb), g.time_proj_w, g.time_proj_b, {}, adapters_of(s, "condition_embedder.time_proj"))
                .unflatten(per_token ? 2 : 1, {6, -1});
  s.context = linear(at::gelu(linear(context, g.text1_w, g.text1_b, {}, adapters_of(s, "condition_embedder.text_embedder.linear_1")), "tanh"),
                     g.text2_w, g.text2_b, {}, adapters_of(s, "condition_embedder.text_embedder.linear_2"));
  return s;
}

void WanTransformer::to_device(at::Device device) {
  if (device == device_) return;
  auto& g = global_;
  for (at::Tensor* t : {&g.patch_w, &g.patch_b, &g.time1_w, &g.time1_b, &g.time2_w, &g.time2_b, &g.time_proj_w,
                        &g.time_proj_b, &g.text1_w, &g.text1_b, &g.text2_w, &g.text2_b, &g.proj_out_w, &g.proj_out_b,
                        &g.scale_shift_table, &rope_cos_table_, &rope_sin_table_})
    *t = t->to(device);
  for (auto& b : blocks_)
    for (at::Tensor* t : {&b.q1_w, &b.q1_b, &b.k1_w, &b.k1_b, &b.v1_w, &b.v1_b, &b.o1_w, &b.o1_b, &b.norm_q1, &b.norm_k1,
                          &b.q2_w, &b.q2_b, &b.k2_w, &b.k2_b, &b.v2_w, &b.v2_b, &b.o2_w, &b.o2_b, &b.norm_q2, &b.norm_k2,
                          &b.norm2_w, &b.norm2_b, &b.ffn0_w, &b.ffn0_b, &b.ffn2_w, &b.ffn2_b, &b.scale_shift_table})
      if (t->defined()) *t = t->to(device);
  device_ = device;
}

at::Tensor WanTransformer::end(const WanForwardState& s) const {
  const auto& c = config_;
  const auto& p = c.patch_size;
  const auto dt = s.h.scalar_type();
  const at::Tensor table = as_dtype(global_.scale_shift_table, at::kFloat);
  std::vector<at::Tensor> ss = s.temb.dim() == 3 ? (table.unsqueeze(0) + s.temb.unsqueeze(2)).chunk(2, 2)
                                                 : (table + s.temb.unsqueeze(1)).chunk(2, 1);
  if (s.temb.dim() == 3)
    for (auto& v : ss) v = v.squeeze(2);
  at::Tensor h = (fp32_layer_norm(s.h.to(at::kFloat), {}, {}, c.eps) * (1 + ss[1]) + ss[0]).to(dt);
  h = linear(h, global_.proj_out_w, global_.proj_out_b, {}, adapters_of(s, "proj_out"));
  h = h.reshape({s.batch, s.frames, s.height, s.width, p[0], p[1], p[2], -1}).permute({0, 7, 1, 4, 2, 5, 3, 6});
  return h.flatten(6, 7).flatten(4, 5).flatten(2, 3);
}

at::Tensor WanTransformer::forward(const at::Tensor& x, const at::Tensor& timestep, const at::Tensor& context) const {
  DLO_CHECK(static_cast<std::int64_t>(blocks_.size()) == config_.num_layers,
            "forward() needs the block weights; load with load_blocks=true");
  WanForwardState s = begin(x, timestep, context);
  for (const auto& b : blocks_) s.h = wan_block_forward(b, s, s.h, config_);
  return end(s);
}

}  // namespace dlo
