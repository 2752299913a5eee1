#include "dlo/models/wan_vae.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <nlohmann/json.hpp>

#include "dlo/common/error.h"

namespace dlo {

// ---------------------------------------------------------------------------------------------
// Config

namespace {

// diffusers' AutoencoderKLWan defaults (the Wan2.1 VAE's statistics).
const std::vector<double> kLatentsMean = {-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,  -0.1517, 1.5508,
                                          0.4134,  -0.0715, 0.5517,  -0.3632, -0.1922, -0.9497, 0.2503,  -0.2921};
const std::vector<double> kLatentsStd = {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                                         3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160};

const std::set<std::string> kKnownFields = {
    "base_dim",    "decoder_base_dim", "z_dim",       "dim_mult",     "num_res_blocks",
    "attn_scales", "temperal_downsample", "dropout",  "latents_mean", "latents_std",
    "is_residual", "in_channels",      "out_channels", "patch_size",  "scale_factor_temporal",
    "scale_factor_spatial"};

std::vector<bool> get_bool_list(const JsonConfig& j, const std::string& key, const std::vector<bool>& def) {
  if (!j.has(key)) return def;
  const auto& v = j.json().at(key);
  bool ok = v.is_array();
  if (ok)
    for (const auto& x : v) ok = ok && x.is_boolean();
  DLO_CHECK(ok, j.path(), ": field '", key, "' must be a list of true/false, got ", v.dump());
  std::vector<bool> out;
  for (const auto& x : v) out.push_back(x.get<bool>());
  return out;
}

std::string list_str(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

WanVaeConfig::WanVaeConfig() : latents_mean(kLatentsMean), latents_std(kLatentsStd) {}

std::vector<std::int64_t> WanVaeConfig::decoder_dims() const {
  const std::int64_t d = decoder_dim();
  std::vector<std::int64_t> dims{d * dim_mult.back()};
  for (auto it = dim_mult.rbegin(); it != dim_mult.rend(); ++it) dims.push_back(d * *it);
  return dims;
}

std::vector<bool> WanVaeConfig::temperal_upsample() const {
  return std::vector<bool>(temperal_downsample.rbegin(), temperal_downsample.rend());
}

std::int64_t WanVaeConfig::output_frames(std::int64_t latent_frames) const {
  std::int64_t per = 1;
  const auto up = temperal_upsample();
  for (std::size_t i = 0; i + 1 < dim_mult.size(); ++i)
    if (up[i]) per *= 2;
  return 1 + (latent_frames - 1) * per;
}

WanVaeConfig WanVaeConfig::from_json(const JsonConfig& j) {
  const std::string& f = j.path();
  if (j.has("_class_name")) {
    const std::string cls = j.get_string("_class_name");
    DLO_CHECK(cls == "AutoencoderKLWan", f, ": _class_name is '", cls, "', expected 'AutoencoderKLWan'");
  }
  for (const auto& item : j.json().items()) {
    const std::string& key = item.key();
    DLO_CHECK(key.rfind('_', 0) == 0 || kKnownFields.count(key), f, ": unknown field '", key,
              "' (not an AutoencoderKLWan argument of diffusers 0.42)");
  }
  DLO_CHECK(!j.get_bool("is_residual", false), f,
            ": field 'is_residual' is true (the Wan2.2 VAE); only the Wan2.1 VAE is supported");
  DLO_CHECK(!j.has("patch_size"), f, ": field 'patch_size' is ", j.dump("patch_size"),
            " (the Wan2.2 VAE); only the Wan2.1 VAE (patch_size null) is supported");
  WanVaeConfig c;
  c.base_dim = j.get_int("base_dim", c.base_dim);
  if (j.has("decoder_base_dim")) c.decoder_base_dim = j.get_int("decoder_base_dim");
  c.z_dim = j.get_int("z_dim", c.z_dim);
  c.dim_mult = j.get_int_list("dim_mult", c.dim_mult);
  c.num_res_blocks = j.get_int("num_res_blocks", c.num_res_blocks);
  c.attn_scales = j.get_double_list("attn_scales", c.attn_scales);
  c.temperal_downsample = get_bool_list(j, "temperal_downsample", c.temperal_downsample);
  c.dropout = j.get_double("dropout", c.dropout);
  c.latents_mean = j.get_double_list("latents_mean", c.latents_mean);
  c.latents_std = j.get_double_list("latents_std", c.latents_std);
  c.in_channels = j.get_int("in_channels", c.in_channels);
  c.out_channels = j.get_int("out_channels", c.out_channels);
  // null means "not given" to the pipeline (it then falls back to 4 and 8); check what is given.
  if (j.has("scale_factor_temporal")) c.scale_factor_temporal = j.get_int("scale_factor_temporal");
  if (j.has("scale_factor_spatial")) c.scale_factor_spatial = j.get_int("scale_factor_spatial");
  {
    // The weights' structure decides the temporal factor (temperal_downsample), as diffusers
    // decodes: a missing factor is derived, a disagreeing one is followed with a warning.
    std::int64_t t = 1, s = 1;
    for (std::size_t i = 0; i + 1 < c.dim_mult.size() && i < c.temperal_downsample.size(); ++i) {
      s *= 2;
      if (c.temperal_downsample[i]) t *= 2;
    }
    if (j.has("scale_factor_temporal") && c.scale_factor_temporal != t) {
      std::string td = "[";
      for (std::size_t i = 0; i < c.temperal_downsample.size(); ++i)
        td += std::string(i ? ", " : "") + (c.temperal_downsample[i] ? "true" : "false");
      c.warnings.push_back(str(f, ": field 'scale_factor_temporal' is ", c.scale_factor_temporal,
                               ", but temperal_downsample ", td, "] gives ", t,
                               "; decoding follows temperal_downsample (as the weights do)"));
    }
    c.scale_factor_temporal = t;
    // A disagreeing scale_factor_spatial stays refused by validate(): the pipeline sizes the
    // latents by it, so it would render at the wrong size.
    if (!j.has("scale_factor_spatial")) c.scale_factor_spatial = s;
  }
  c.validate(f);
  return c;
}

void WanVaeConfig::validate(const std::string& where) const {
  auto positive = [&](std::int64_t v, const char* name) {
    DLO_CHECK(v > 0 && v < (1ll << 24), where, ": field '", name, "' must be a positive integer, got ", v);
  };
  positive(base_dim, "base_dim");
  if (decoder_base_dim) positive(*decoder_base_dim, "decoder_base_dim");
  positive(z_dim, "z_dim");
  positive(num_res_blocks, "num_res_blocks");
  positive(in_channels, "in_channels");
  positive(out_channels, "out_channels");
  DLO_CHECK(!dim_mult.empty() && dim_mult.size() <= 8, where, ": field 'dim_mult' must have 1 to 8 entries, got ",
            list_str(dim_mult));
  for (auto m : dim_mult)
    DLO_CHECK(m > 0 && m < (1 << 10), where, ": field 'dim_mult' must hold positive integers, got ",
              list_str(dim_mult));
  DLO_CHECK(temperal_downsample.size() == dim_mult.size() - 1, where, ": field 'temperal_downsample' has ",
            temperal_downsample.size(), " entries; dim_mult ", list_str(dim_mult), " needs ", dim_mult.size() - 1);
  DLO_CHECK(std::isfinite(dropout) && dropout >= 0 && dropout < 1, where, ": field 'dropout' must be in [0, 1), got ",
            dropout);
  DLO_CHECK(static_cast<std::int64_t>(latents_mean.size()) == z_dim, where, ": field 'latents_mean' has ",
            latents_mean.size(), " entries, z_dim is ", z_dim);
  DLO_CHECK(static_cast<std::int64_t>(latents_std.size()) == z_dim, where, ": field 'latents_std' has ",
            latents_std.size(), " entries, z_dim is ", z_dim);
  for (double m : latents_mean)
    DLO_CHECK(std::isfinite(m), where, ": field 'latents_mean' must hold finite numbers, got ", m);
  for (double s : latents_std)
    DLO_CHECK(std::isfinite(s) && s > 0, where, ": field 'latents_std' must hold positive numbers, got ", s);
  // Every upsampler halves the channels (dim // 2): there must be some left.
  const auto dims = decoder_dims();
  for (std::size_t i = 0; i + 1 < dim_mult.size(); ++i)
    DLO_CHECK(dims[i + 1] >= 2, where, ": decoder up block ", i, " has ", dims[i + 1],
              " channels; its upsampler's dim // 2 would be 0 (fields 'decoder_base_dim'/'base_dim', 'dim_mult')");
  std::int64_t t = 1, s = 1;
  for (std::size_t i = 0; i + 1 < dim_mult.size(); ++i) {
    s *= 2;
    if (temperal_downsample[i]) t *= 2;
  }
  DLO_CHECK(scale_factor_temporal == t, where, ": field 'scale_factor_temporal' is ", scale_factor_temporal,
            ", but temperal_downsample gives ", t);
  DLO_CHECK(scale_factor_spatial == s, where, ": field 'scale_factor_spatial' is ", scale_factor_spatial,
            ", but dim_mult (", dim_mult.size() - 1, " spatial up/downsamplings) gives ", s);
}

WanVaeConfig WanVaeConfig::preset(const std::string& name) {
  WanVaeConfig c;
  if (name == "wan-vae-test") {
    c.base_dim = 3;
    c.dim_mult = {1, 1, 1, 1};
    c.num_res_blocks = 1;
  } else if (name == "wan2.1-vae-small") {
    c.base_dim = 16;
  } else if (name == "wan2.1-vae") {
    // the defaults
  } else {
    DLO_CHECK(false, "unknown VAE preset '", name, "' (wan-vae-test, wan2.1-vae-small, wan2.1-vae)");
  }
  return c;
}

std::vector<std::string> WanVaeConfig::preset_names() { return {"wan-vae-test", "wan2.1-vae-small", "wan2.1-vae"}; }

std::string WanVaeConfig::to_json() const {
  nlohmann::ordered_json j;
  j["_class_name"] = "AutoencoderKLWan";
  j["_diffusers_version"] = "0.42.1";
  j["attn_scales"] = attn_scales;
  j["base_dim"] = base_dim;
  if (decoder_base_dim)
    j["decoder_base_dim"] = *decoder_base_dim;
  else
    j["decoder_base_dim"] = nullptr;
  j["dim_mult"] = dim_mult;
  j["dropout"] = dropout;
  j["in_channels"] = in_channels;
  j["is_residual"] = false;
  j["latents_mean"] = latents_mean;
  j["latents_std"] = latents_std;
  j["num_res_blocks"] = num_res_blocks;
  j["out_channels"] = out_channels;
  j["patch_size"] = nullptr;
  j["scale_factor_spatial"] = scale_factor_spatial;
  j["scale_factor_temporal"] = scale_factor_temporal;
  j["temperal_downsample"] = temperal_downsample;
  j["z_dim"] = z_dim;
  return j.dump(2) + "\n";
}

// ---------------------------------------------------------------------------------------------
// Tensor names and shapes (diffusers' module tree, in registration order)

namespace {

using Shape = std::vector<std::int64_t>;
using Shapes = std::vector<std::pair<std::string, Shape>>;

void conv_shapes(Shapes& s, const std::string& p, Shape w) {
  const std::int64_t out = w[0];
  s.push_back({p + ".weight", std::move(w)});
  s.push_back({p + ".bias", {out}});
}
void res_shapes(Shapes& s, const std::string& p, std::int64_t in, std::int64_t out) {
  s.push_back({p + ".norm1.gamma", {in, 1, 1, 1}});
  conv_shapes(s, p + ".conv1", {out, in, 3, 3, 3});
  s.push_back({p + ".norm2.gamma", {out, 1, 1, 1}});
  conv_shapes(s, p + ".conv2", {out, out, 3, 3, 3});
  if (in != out) conv_shapes(s, p + ".conv_shortcut", {out, in, 1, 1, 1});
}
void attn_shapes(Shapes& s, const std::string& p, std::int64_t c) {
  s.push_back({p + ".norm.gamma", {c, 1, 1}});
  conv_shapes(s, p + ".to_qkv", {3 * c, c, 1, 1});
  conv_shapes(s, p + ".proj", {c, c, 1, 1});
}
void mid_shapes(Shapes& s, const std::string& p, std::int64_t c) {
  attn_shapes(s, p + ".attentions.0", c);
  res_shapes(s, p + ".resnets.0", c, c);
  res_shapes(s, p + ".resnets.1", c, c);
}

Shapes vae_shapes(const WanVaeConfig& c, bool include_encoder) {
  Shapes s;
  const std::size_t n = c.dim_mult.size();
  if (include_encoder) {
    std::vector<std::int64_t> dims{c.base_dim};
    for (auto m : c.dim_mult) dims.push_back(c.base_dim * m);
    conv_shapes(s, "encoder.conv_in", {dims[0], c.in_channels, 3, 3, 3});
    int k = 0;
    double scale = 1.0;
    std::int64_t out = dims[0];
    for (std::size_t i = 0; i < n; ++i) {
      std::int64_t in = dims[i];
      out = dims[i + 1];
      for (std::int64_t r = 0; r < c.num_res_blocks; ++r) {
        res_shapes(s, "encoder.down_blocks." + std::to_string(k++), in, out);
        if (std::find(c.attn_scales.begin(), c.attn_scales.end(), scale) != c.attn_scales.end())
          attn_shapes(s, "encoder.down_blocks." + std::to_string(k++), out);
        in = out;
      }
      if (i + 1 != n) {
        const std::string p = "encoder.down_blocks." + std::to_string(k++);
        conv_shapes(s, p + ".resample.1", {out, out, 3, 3});
        if (c.temperal_downsample[i]) conv_shapes(s, p + ".time_conv", {out, out, 3, 1, 1});
        scale /= 2.0;
      }
    }
    mid_shapes(s, "encoder.mid_block", out);
    s.push_back({"encoder.norm_out.gamma", {out, 1, 1, 1}});
    conv_shapes(s, "encoder.conv_out", {2 * c.z_dim, out, 3, 3, 3});
    conv_shapes(s, "quant_conv", {2 * c.z_dim, 2 * c.z_dim, 1, 1, 1});
  }
  conv_shapes(s, "post_quant_conv", {c.z_dim, c.z_dim, 1, 1, 1});
  const auto dims = c.decoder_dims();
  const auto up = c.temperal_upsample();
  conv_shapes(s, "decoder.conv_in", {dims[0], c.z_dim, 3, 3, 3});
  mid_shapes(s, "decoder.mid_block", dims[0]);
  for (std::size_t i = 0; i < n; ++i) {
    const std::string p = "decoder.up_blocks." + std::to_string(i);
    std::int64_t in = i > 0 ? dims[i] / 2 : dims[i];
    const std::int64_t out = dims[i + 1];
    for (std::int64_t r = 0; r <= c.num_res_blocks; ++r) {
      res_shapes(s, p + ".resnets." + std::to_string(r), in, out);
      in = out;
    }
    if (i + 1 != n) {
      conv_shapes(s, p + ".upsamplers.0.resample.1", {out / 2, out, 3, 3});
      if (up[i]) conv_shapes(s, p + ".upsamplers.0.time_conv", {2 * out, out, 3, 1, 1});
    }
  }
  s.push_back({"decoder.norm_out.gamma", {dims[n], 1, 1, 1}});
  conv_shapes(s, "decoder.conv_out", {c.out_channels, dims[n], 3, 3, 3});
  return s;
}

}  // namespace

std::vector<TensorSpec> wan_vae_specs(const WanVaeConfig& c, DType dtype, bool include_encoder) {
  std::vector<TensorSpec> out;
  for (auto& [name, shape] : vae_shapes(c, include_encoder)) out.push_back({name, dtype, shape});
  return out;
}

// ---------------------------------------------------------------------------------------------
// Layers: the same ATen ops, in the same order and on the same memory layouts, as diffusers.

at::Tensor wan_causal_conv3d(at::Tensor x, const WanVaeConv& conv, std::array<std::int64_t, 3> pad,
                             const at::Tensor& history) {
  std::vector<std::int64_t> padding{pad[2], pad[2], pad[1], pad[1], 2 * pad[0], 0};
  const bool use_history = history.defined() && padding[4] > 0;
  const bool padded = pad[0] > 0 || pad[1] > 0 || pad[2] > 0;
  const auto contiguous = at::MemoryFormat::Contiguous;
  if (padded && x.suggest_memory_format() == contiguous &&
      (!use_history || history.suggest_memory_format() == contiguous)) {
    // diffusers: F.pad(torch.cat([history, x], 2), padding). Built here in one zeroed buffer with
    // the same values and the same (contiguous) layout, so conv3d sees the same input, but without
    // the intermediate cat, and with `x` released before the convolution runs.
    const std::int64_t th = use_history ? history.size(2) : 0, front = padding[4] - th;
    const std::int64_t t = x.size(2), h = x.size(3), w = x.size(4);
    DLO_CHECK(front >= 0, "causal conv: a history of ", th, " frames exceeds the causal padding of ", padding[4]);
    at::Tensor in = at::zeros({x.size(0), x.size(1), front + th + t, h + 2 * pad[1], w + 2 * pad[2]}, x.options());
    auto interior = [&](std::int64_t t0, std::int64_t n) {
      return in.narrow(2, t0, n).narrow(3, pad[1], h).narrow(4, pad[2], w);
    };
    if (th > 0) interior(front, th).copy_(history);
    interior(front + th, t).copy_(x);
    x = at::Tensor();
    return at::conv3d(in, conv.w, conv.b);
  }
  if (use_history) {
    x = at::cat({history, x}, 2);
    padding[4] -= history.size(2);
  }
  x = at::pad(x, padding);
  return at::conv3d(x, conv.w, conv.b);
}

at::Tensor wan_cached_causal_conv3d(at::Tensor x, const WanVaeConv& conv, std::array<std::int64_t, 3> pad,
                                    WanCausalCache& cache) {
  // cache_x = x[:, :, -2:].clone(); prefixed with the previous last frame if x has only one.
  at::Tensor cache_x = x.slice(2, -2).clone();
  if (cache_x.size(2) < 2 && cache.frames.defined())
    cache_x = at::cat({cache.frames.select(2, -1).unsqueeze(2), cache_x}, 2);
  at::Tensor y = wan_causal_conv3d(std::move(x), conv, pad, cache.frames);
  cache.frames = cache_x;
  return y;
}

at::Tensor wan_vae_rms_norm(const at::Tensor& x, const at::Tensor& gamma) {
  const auto dt = x.scalar_type();
  const bool fp32 = dt == at::kHalf || dt == at::kBFloat16;
  const at::Tensor in = fp32 ? x.to(at::kFloat) : x;
  // F.normalize(in, dim=1): in / linalg.vector_norm(in, 2, [1], keepdim).clamp_min(1e-12).expand_as(in)
  at::Tensor denom = at::linalg_vector_norm(in, 2.0, at::IntArrayRef{1}, true).clamp_min(1e-12).expand_as(in);
  at::Tensor out = (in / denom).to(dt);
  // `normalized * scale * gamma + bias` with bias 0.0 (x + 0.0 == x, so the add is left out). In
  // place: the same values and layout as diffusers' temporaries, without their memory. The scale
  // goes in as a wrapped-number tensor, as Python passes it: mul_(Scalar) in C++ would round it to
  // the tensor's dtype first (different bf16/fp16 results).
  const double scale = std::pow(static_cast<double>(x.size(1)), 0.5);
  return out.mul_(at::native::wrapped_scalar_tensor(scale)).mul_(gamma);
}

WanCausalCache& WanVaeDecodeState::take() {
  if (next == caches.size()) caches.emplace_back();
  return caches[next++];
}

namespace {

// [WanResidualBlock] SiLU and the residual add run in place (same values and layouts as
// diffusers' out-of-place ops); each activation is released as soon as it has been consumed.
at::Tensor res_block(const WanVaeResBlockWeights& w, const at::Tensor& x_in, WanVaeDecodeState& st) {
  const at::Tensor h = w.shortcut.w.defined() ? wan_causal_conv3d(x_in, w.shortcut, {0, 0, 0}) : x_in;
  at::Tensor x = wan_vae_rms_norm(x_in, w.norm1);
  at::silu_(x);
  x = wan_cached_causal_conv3d(std::move(x), w.conv1, {1, 1, 1}, st.take());
  x = wan_vae_rms_norm(x, w.norm2);
  at::silu_(x);
  x = wan_cached_causal_conv3d(std::move(x), w.conv2, {1, 1, 1}, st.take());
  return x.add_(h);
}

// [WanAttentionBlock] single-head attention within each frame.
at::Tensor attn_block(const WanVaeAttnWeights& w, const at::Tensor& identity) {
  const std::int64_t b = identity.size(0), c = identity.size(1), t = identity.size(2), h = identity.size(3),
                     wd = identity.size(4);
  at::Tensor x = identity.permute({0, 2, 1, 3, 4}).reshape({b * t, c, h, wd});
  x = wan_vae_rms_norm(x, w.norm);
  at::Tensor qkv = at::conv2d(x, w.to_qkv.w, w.to_qkv.b);
  qkv = qkv.reshape({b * t, 1, c * 3, -1}).permute({0, 1, 3, 2}).contiguous();
  auto q = qkv.chunk(3, -1);
  x = at::scaled_dot_product_attention(q[0], q[1], q[2]);
  x = x.squeeze(1).permute({0, 2, 1}).reshape({b * t, c, h, wd});
  x = at::conv2d(x, w.proj.w, w.proj.b);
  x = x.view({b, t, c, h, wd}).permute({0, 2, 1, 3, 4});
  return x + identity;
}

// [WanResample] upsample2d / upsample3d.
at::Tensor resample(const WanVaeUpBlockWeights& w, at::Tensor x, WanVaeDecodeState& st) {
  const std::int64_t b = x.size(0), c = x.size(1), h = x.size(3), wd = x.size(4);
  std::int64_t t = x.size(2);
  if (w.mode == WanVaeUpsample::kTemporal) {
    WanCausalCache& cache = st.take();
    if (!cache.frames.defined() && !cache.rep) {
      cache.rep = true;  // chunk 0: no time_conv, the frame count stays
    } else {
      at::Tensor cache_x = x.slice(2, -2).clone();
      if (cache_x.size(2) < 2 && !cache.rep)
        cache_x = at::cat({cache.frames.select(2, -1).unsqueeze(2), cache_x}, 2);
      if (cache_x.size(2) < 2 && cache.rep) cache_x = at::cat({at::zeros_like(cache_x), cache_x}, 2);
      x = wan_causal_conv3d(x, w.time_conv, {1, 0, 0}, cache.rep ? at::Tensor() : cache.frames);
      cache.frames = cache_x;
      cache.rep = false;
      x = x.reshape({b, 2, c, t, h, wd});
      x = at::stack({x.select(1, 0), x.select(1, 1)}, 3);
      x = x.reshape({b, c, t * 2, h, wd});
    }
  }
  t = x.size(2);
  x = x.permute({0, 2, 1, 3, 4}).reshape({b * t, c, h, wd});
  // WanUpsample: nearest-exact x2 in fp32, back to the input's dtype; then the Conv2d.
  at::Tensor u = at::_upsample_nearest_exact2d(x.to(at::kFloat), {2 * h, 2 * wd}, 2.0, 2.0).to(x.scalar_type());
  u = at::conv2d(u, w.resample.w, w.resample.b, 1, 1);
  return u.view({b, t, u.size(1), u.size(2), u.size(3)}).permute({0, 2, 1, 3, 4});
}

}  // namespace

at::Tensor wan_vae_decoder_chunk(const WanVaeDecoderWeights& w, const at::Tensor& x_in, WanVaeDecodeState& st) {
  st.next = 0;
  at::Tensor x = wan_cached_causal_conv3d(x_in, w.conv_in, {1, 1, 1}, st.take());
  x = res_block(w.mid_res0, x, st);
  x = attn_block(w.mid_attn, x);
  x = res_block(w.mid_res1, x, st);
  for (const auto& up : w.up_blocks) {
    for (const auto& r : up.resnets) x = res_block(r, x, st);
    if (up.mode != WanVaeUpsample::kNone) x = resample(up, x, st);
  }
  x = wan_vae_rms_norm(x, w.norm_out);
  at::silu_(x);
  return wan_cached_causal_conv3d(std::move(x), w.conv_out, {1, 1, 1}, st.take());
}

// ---------------------------------------------------------------------------------------------
// Model

WanVae WanVae::load(const std::string& dir, at::ScalarType compute) {
  return with_context(str("loading vae '", dir, "'"), [&] {
    auto config = WanVaeConfig::from_json(JsonConfig::load(dir + "/config.json"));
    WanVae m(config, WeightStore::open(dir), compute);
    const auto& c = m.config_;
    // The whole AutoencoderKLWan (encoder too) with its shapes, nothing else: see
    // check_checkpoint_tensors.
    {
      // The decoder's tensors first: a mismatch is reported on the part that runs.
      TensorShapes expected;
      std::set<std::string> decoder;
      for (auto& [n, s] : vae_shapes(c, /*include_encoder=*/false)) {
        expected.emplace_back(n, s);
        decoder.insert(n);
      }
      for (auto& [n, s] : vae_shapes(c, /*include_encoder=*/true))
        if (!decoder.count(n)) expected.emplace_back(n, s);
      check_checkpoint_tensors(m.store_, expected);
    }
    std::map<std::string, Shape> shapes;
    for (auto& [n, s] : vae_shapes(c, /*include_encoder=*/false)) shapes[n] = s;
    auto get = [&](const std::string& name) {
      return as_dtype(m.store_.get(name, shapes.at(name)), compute);
    };
    auto conv = [&](const std::string& p) { return WanVaeConv{get(p + ".weight"), get(p + ".bias")}; };
    auto res = [&](const std::string& p) {
      WanVaeResBlockWeights r;
      r.norm1 = get(p + ".norm1.gamma");
      r.conv1 = conv(p + ".conv1");
      r.norm2 = get(p + ".norm2.gamma");
      r.conv2 = conv(p + ".conv2");
      if (shapes.count(p + ".conv_shortcut.weight")) r.shortcut = conv(p + ".conv_shortcut");
      return r;
    };
    auto& w = m.w_;
    w.post_quant_conv = conv("post_quant_conv");
    w.conv_in = conv("decoder.conv_in");
    w.mid_res0 = res("decoder.mid_block.resnets.0");
    w.mid_attn.norm = get("decoder.mid_block.attentions.0.norm.gamma");
    w.mid_attn.to_qkv = conv("decoder.mid_block.attentions.0.to_qkv");
    w.mid_attn.proj = conv("decoder.mid_block.attentions.0.proj");
    w.mid_res1 = res("decoder.mid_block.resnets.1");
    const auto up = c.temperal_upsample();
    const std::size_t n = c.dim_mult.size();
    for (std::size_t i = 0; i < n; ++i) {
      const std::string p = "decoder.up_blocks." + std::to_string(i);
      WanVaeUpBlockWeights ub;
      for (std::int64_t r = 0; r <= c.num_res_blocks; ++r) ub.resnets.push_back(res(p + ".resnets." + std::to_string(r)));
      if (i + 1 != n) {
        ub.mode = up[i] ? WanVaeUpsample::kTemporal : WanVaeUpsample::kSpatial;
        ub.resample = conv(p + ".upsamplers.0.resample.1");
        if (up[i]) ub.time_conv = conv(p + ".upsamplers.0.time_conv");
      }
      w.up_blocks.push_back(std::move(ub));
    }
    w.norm_out = get("decoder.norm_out.gamma");
    w.conv_out = conv("decoder.conv_out");
    return m;
  });
}

void WanVae::check_latents(const at::Tensor& z) const {
  const auto& c = config_;
  DLO_CHECK(z.defined() && z.dim() == 5 && z.size(1) == c.z_dim, "latents must be [B, ", c.z_dim,
            ", F, H, W], got ", z.defined() ? z.sizes() : at::IntArrayRef{});
  DLO_CHECK(z.size(0) > 0 && z.size(2) > 0 && z.size(3) > 0 && z.size(4) > 0, "latents is empty: ", z.sizes());
  DLO_CHECK(at::isFloatingType(z.scalar_type()), "latents must be floating point, got ",
            c10::toString(z.scalar_type()));
}

at::Tensor WanVae::denormalize(const at::Tensor& latents_in) const {
  check_latents(latents_in);
  const auto& c = config_;
  const at::Tensor latents = latents_in.to(compute_);
  // torch.tensor(list of Python floats) is float32; then .view(1, z, 1, 1, 1).to(dtype).
  std::vector<float> mean(c.latents_mean.begin(), c.latents_mean.end());
  std::vector<float> std_(c.latents_std.begin(), c.latents_std.end());
  const at::Tensor m = at::tensor(mean).view({1, c.z_dim, 1, 1, 1}).to(compute_);
  // `1.0 / std` is std.reciprocal() * 1.0 in torch, in the VAE's dtype (the * 1.0 is exact).
  const at::Tensor inv_std = at::reciprocal(at::tensor(std_).view({1, c.z_dim, 1, 1, 1}).to(compute_));
  return latents / inv_std + m;
}

void WanVae::decode_frames(const at::Tensor& z_in,
                           const std::function<void(std::int64_t, const at::Tensor&)>& sink) const {
  check_latents(z_in);
  const at::Tensor z = z_in.to(compute_);
  const at::Tensor x = wan_causal_conv3d(z, w_.post_quant_conv, {0, 0, 0});
  WanVaeDecodeState st;
  std::int64_t frame = 0;
  for (std::int64_t i = 0; i < x.size(2); ++i) {
    at::Tensor out = wan_vae_decoder_chunk(w_, x.slice(2, i, i + 1), st);
    out = at::clamp(out, -1.0, 1.0);
    sink(frame, out);
    frame += out.size(2);
  }
}

at::Tensor WanVae::decode(const at::Tensor& z) const {
  check_latents(z);
  const auto& c = config_;
  at::Tensor video = at::empty({z.size(0), c.out_channels, c.output_frames(z.size(2)),
                                z.size(3) * c.scale_factor_spatial, z.size(4) * c.scale_factor_spatial},
                               at::TensorOptions().dtype(compute_));
  decode_frames(z, [&](std::int64_t first, const at::Tensor& frames) {
    DLO_ASSERT(first + frames.size(2) <= video.size(2) && frames.sizes().slice(3) == video.sizes().slice(3),
               "decoded chunk ", frames.sizes(), " does not fit the output ", video.sizes());
    video.narrow(2, first, frames.size(2)).copy_(frames);
  });
  return video;
}

}  // namespace dlo
