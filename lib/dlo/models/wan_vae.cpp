#include "dlo/models/wan_vae.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/config/wan_vae_names.h"

namespace dlo {

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

// [DupUp3D] repeat_interleave over channels, then each group of 2 x 2 (x 2 frames) channels
// unpacked into pixels (and frames); the first chunk drops the extra leading frame.
at::Tensor dup_up(const WanVaeUpBlockWeights& w, const at::Tensor& in, bool first_chunk) {
  const std::int64_t ft = w.mode == WanVaeUpsample::kTemporal ? 2 : 1, fs = 2;
  at::Tensor x = in.repeat_interleave(w.shortcut_repeats, 1);
  const std::int64_t b = x.size(0), t = x.size(2), h = x.size(3), wd = x.size(4);
  x = x.view({b, w.shortcut_out, ft, fs, fs, t, h, wd}).permute({0, 1, 5, 2, 6, 3, 7, 4}).contiguous();
  x = x.view({b, w.shortcut_out, t * ft, h * fs, wd * fs});
  if (first_chunk) x = x.slice(2, ft - 1);
  return x;
}

// [unpatchify] [B, C p p, T, H, W] -> [B, C, T, H p, W p].
at::Tensor unpatchify(const at::Tensor& x, std::int64_t p) {
  if (p == 1) return x;
  const std::int64_t b = x.size(0), c = x.size(1) / (p * p), t = x.size(2), h = x.size(3), w = x.size(4);
  return x.view({b, c, p, p, t, h, w}).permute({0, 1, 4, 5, 3, 6, 2}).contiguous().view({b, c, t, h * p, w * p});
}

}  // namespace

at::Tensor wan_vae_decoder_chunk(const WanVaeDecoderWeights& w, const at::Tensor& x_in, WanVaeDecodeState& st) {
  st.next = 0;
  at::Tensor x = wan_cached_causal_conv3d(x_in, w.conv_in, {1, 1, 1}, st.take());
  x = res_block(w.mid_res0, x, st);
  x = attn_block(w.mid_attn, x);
  x = res_block(w.mid_res1, x, st);
  for (const auto& up : w.up_blocks) {
    const at::Tensor in = up.shortcut ? x : at::Tensor();
    for (const auto& r : up.resnets) x = res_block(r, x, st);
    if (up.mode != WanVaeUpsample::kNone) x = resample(up, x, st);
    if (up.shortcut) x = x + dup_up(up, in, st.chunks == 0);
  }
  x = wan_vae_rms_norm(x, w.norm_out);
  at::silu_(x);
  x = wan_cached_causal_conv3d(std::move(x), w.conv_out, {1, 1, 1}, st.take());
  ++st.chunks;
  return x;
}

namespace {

// [WanResample] downsample2d / downsample3d: per frame, zero-pad right and bottom, a Conv2d of
// stride 2; then (3d) the causal time_conv of stride 2 over the last frame before the chunk and
// the chunk's, but for chunk 0, whose frame is only stored.
at::Tensor downsample(const WanVaeDownBlockWeights& w, const at::Tensor& in, WanVaeEncodeState& st) {
  const std::int64_t b = in.size(0), c = in.size(1), t = in.size(2), h = in.size(3), wd = in.size(4);
  at::Tensor x = in.permute({0, 2, 1, 3, 4}).reshape({b * t, c, h, wd});
  x = at::conv2d(at::pad(x, {0, 1, 0, 1}), w.resample.w, w.resample.b, 2);
  x = x.view({b, t, x.size(1), x.size(2), x.size(3)}).permute({0, 2, 1, 3, 4});
  if (w.mode == WanVaeDownsample::kTemporal) {
    WanCausalCache& cache = st.take();
    if (!cache.frames.defined()) {
      cache.frames = x.clone();
    } else {
      at::Tensor cache_x = x.slice(2, -1).clone();
      x = at::conv3d(at::cat({cache.frames.slice(2, -1), x}, 2), w.time_conv.w, w.time_conv.b, {2, 1, 1});
      cache.frames = cache_x;
    }
  }
  return x;
}

// [AvgDown3D] zero frames in front up to a multiple of factor_t, then each group of
// channels x factor_t frames x factor_s^2 pixels averaged into one of shortcut_out channels.
at::Tensor avg_down(const WanVaeDownBlockWeights& w, const at::Tensor& in) {
  const std::int64_t ft = w.factor_t, fs = w.factor_s;
  const std::int64_t pad_t = (ft - in.size(2) % ft) % ft;
  const at::Tensor x = pad_t > 0 ? at::pad(in, {0, 0, 0, 0, pad_t, 0}) : in;
  const std::int64_t b = x.size(0), c = x.size(1), t = x.size(2) / ft, h = x.size(3) / fs, wd = x.size(4) / fs;
  const std::int64_t group = c * ft * fs * fs / w.shortcut_out;
  return x.view({b, c, t, ft, h, fs, wd, fs})
      .permute({0, 1, 3, 5, 7, 2, 4, 6})
      .contiguous()
      .view({b, w.shortcut_out, group, t, h, wd})
      .mean(2);
}

}  // namespace

at::Tensor wan_vae_encoder_chunk(const WanVaeEncoderWeights& w, const at::Tensor& x_in, WanVaeEncodeState& st) {
  st.next = 0;
  at::Tensor x = wan_cached_causal_conv3d(x_in, w.conv_in, {1, 1, 1}, st.take());
  for (const auto& down : w.down_blocks) {
    const at::Tensor in = down.shortcut ? x : at::Tensor();
    for (const auto& r : down.resnets) x = res_block(r, x, st);
    if (down.mode != WanVaeDownsample::kNone) x = downsample(down, x, st);
    if (down.shortcut) x = x + avg_down(down, in);
  }
  x = res_block(w.mid_res0, x, st);
  x = attn_block(w.mid_attn, x);
  x = res_block(w.mid_res1, x, st);
  x = wan_vae_rms_norm(x, w.norm_out);
  at::silu_(x);
  x = wan_cached_causal_conv3d(std::move(x), w.conv_out, {1, 1, 1}, st.take());
  ++st.chunks;
  return x;
}

at::Tensor wan_vae_patchify(const at::Tensor& x, std::int64_t p) {
  if (p == 1) return x;
  const std::int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3) / p, w = x.size(4) / p;
  return x.view({b, c, t, h, p, w, p}).permute({0, 1, 6, 4, 2, 3, 5}).contiguous().view({b, c * p * p, t, h, w});
}

// ---------------------------------------------------------------------------------------------
// Model

namespace {

// The whole AutoencoderKLWan (encoder too) with its shapes, nothing else: see
// check_checkpoint_tensors. The decoder's tensors first: a mismatch is reported on the part that runs.
void check_vae_tensors(const WeightStore& store, const WanVaeConfig& c) {
  TensorShapes expected;
  std::set<std::string> decoder;
  for (const auto& spec : wan_vae_specs(c, DType::F32, /*include_encoder=*/false)) {
    expected.emplace_back(spec.name, spec.shape);
    decoder.insert(spec.name);
  }
  for (const auto& spec : wan_vae_specs(c, DType::F32, /*include_encoder=*/true))
    if (!decoder.count(spec.name)) expected.emplace_back(spec.name, spec.shape);
  check_checkpoint_tensors(store, expected);
}

}  // namespace

namespace {
WanVaeConfig folder_config(const std::string& dir) {
  return with_context(str("loading vae '", dir, "'"), [&] { return WanVaeConfig::from_json(JsonConfig::load(dir + "/config.json")); });
}
}  // namespace

void WanVae::check_checkpoint(const std::string& dir) { check_checkpoint(dir, folder_config(dir)); }

void WanVae::check_checkpoint(const std::string& weights, const WanVaeConfig& config) {
  with_context(str("loading vae '", weights, "'"), [&] { check_vae_tensors(WeightStore(open_wan_vae(weights)), config); });
}

WanVae WanVae::load(const std::string& dir, at::ScalarType compute, WanVaeParts parts) {
  return load(dir, folder_config(dir), compute, parts);
}

namespace {

// The encoder's stage (dim_mult entry) whose residual blocks diffusers follows with a
// WanAttentionBlock (attn_scales), if any: diffusers 0.42.1's encode calls it with the chunk
// cache it does not take (a TypeError), so no reference exists for it.
std::optional<std::size_t> encoder_attention_stage(const WanVaeConfig& c) {
  if (c.is_residual) return std::nullopt;  // WanResidualDownBlock has no attention
  double scale = 1.0;
  for (std::size_t i = 0; i < c.dim_mult.size(); ++i, scale /= 2.0)
    if (std::find(c.attn_scales.begin(), c.attn_scales.end(), scale) != c.attn_scales.end()) return i;
  return std::nullopt;
}

}  // namespace

WanVae WanVae::load(const std::string& weights, const WanVaeConfig& config, at::ScalarType compute, WanVaeParts parts) {
  return with_context(str("loading vae '", weights, "'"), [&] {
    WanVae m(config, WeightStore(open_wan_vae(weights)), compute, parts);
    const auto& c = m.config_;
    check_vae_tensors(m.store_, c);
    std::map<std::string, std::vector<std::int64_t>> shapes;
    for (const auto& spec : wan_vae_specs(c, DType::F32, /*include_encoder=*/true)) shapes[spec.name] = spec.shape;
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
    const std::size_t n = c.dim_mult.size();
    if (m.has_decoder()) {
      auto& w = m.w_;
      w.post_quant_conv = conv("post_quant_conv");
      w.conv_in = conv("decoder.conv_in");
      w.mid_res0 = res("decoder.mid_block.resnets.0");
      w.mid_attn.norm = get("decoder.mid_block.attentions.0.norm.gamma");
      w.mid_attn.to_qkv = conv("decoder.mid_block.attentions.0.to_qkv");
      w.mid_attn.proj = conv("decoder.mid_block.attentions.0.proj");
      w.mid_res1 = res("decoder.mid_block.resnets.1");
      const auto up = c.temperal_upsample();
      for (std::size_t i = 0; i < n; ++i) {
        const std::string p = "decoder.up_blocks." + std::to_string(i);
        WanVaeUpBlockWeights ub;
        for (std::int64_t r = 0; r <= c.num_res_blocks; ++r) ub.resnets.push_back(res(p + ".resnets." + std::to_string(r)));
        if (i + 1 != n) {
          const std::string u = p + (c.is_residual ? ".upsampler" : ".upsamplers.0");
          ub.mode = up[i] ? WanVaeUpsample::kTemporal : WanVaeUpsample::kSpatial;
          ub.resample = conv(u + ".resample.1");
          if (up[i]) ub.time_conv = conv(u + ".time_conv");
          if (c.is_residual) {
            const auto dims = c.decoder_dims();
            ub.shortcut = true;
            ub.shortcut_out = dims[i + 1];
            ub.shortcut_repeats = dims[i + 1] * (up[i] ? 8 : 4) / dims[i];
          }
        }
        w.up_blocks.push_back(std::move(ub));
      }
      w.norm_out = get("decoder.norm_out.gamma");
      w.conv_out = conv("decoder.conv_out");
    }
    if (m.has_encoder()) {
      const auto attn = encoder_attention_stage(c);
      DLO_CHECK(!attn, "the encoder has attention blocks in its stage ", attn.value_or(0), " (field 'attn_scales'), ",
                "which diffusers 0.42.1 cannot encode with (WanAttentionBlock takes no chunk cache); dlo does not ",
                "encode with them either");
      auto& e = m.enc_;
      e.conv_in = conv("encoder.conv_in");
      std::int64_t k = 0;  // Wan2.1: the index in diffusers' flat down_blocks
      for (std::size_t i = 0; i < n; ++i) {
        const bool down = i + 1 != n;
        const std::string stage = "encoder.down_blocks." + std::to_string(i);
        WanVaeDownBlockWeights db;
        for (std::int64_t r = 0; r < c.num_res_blocks; ++r)
          db.resnets.push_back(res(c.is_residual ? stage + ".resnets." + std::to_string(r)
                                                 : "encoder.down_blocks." + std::to_string(k++)));
        if (down) {
          const std::string d = c.is_residual ? stage + ".downsampler" : "encoder.down_blocks." + std::to_string(k++);
          db.mode = c.temperal_downsample[i] ? WanVaeDownsample::kTemporal : WanVaeDownsample::kSpatial;
          db.resample = conv(d + ".resample.1");
          if (c.temperal_downsample[i]) db.time_conv = conv(d + ".time_conv");
        }
        if (c.is_residual) {
          db.shortcut = true;
          db.shortcut_out = c.base_dim * c.dim_mult[i];
          db.factor_t = down && c.temperal_downsample[i] ? 2 : 1;
          db.factor_s = down ? 2 : 1;
        }
        e.down_blocks.push_back(std::move(db));
      }
      e.mid_res0 = res("encoder.mid_block.resnets.0");
      e.mid_attn.norm = get("encoder.mid_block.attentions.0.norm.gamma");
      e.mid_attn.to_qkv = conv("encoder.mid_block.attentions.0.to_qkv");
      e.mid_attn.proj = conv("encoder.mid_block.attentions.0.proj");
      e.mid_res1 = res("encoder.mid_block.resnets.1");
      e.norm_out = get("encoder.norm_out.gamma");
      e.conv_out = conv("encoder.conv_out");
      e.quant_conv = conv("quant_conv");
    }
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
  const at::Tensor latents = latents_in.to(device_, compute_);
  // torch.tensor(list of Python floats) is float32; then .view(1, z, 1, 1, 1).to(dtype).
  std::vector<float> mean(c.latents_mean.begin(), c.latents_mean.end());
  std::vector<float> std_(c.latents_std.begin(), c.latents_std.end());
  const at::Tensor m = at::tensor(mean).view({1, c.z_dim, 1, 1, 1}).to(device_, compute_);
  // `1.0 / std` is std.reciprocal() * 1.0 in torch, in the VAE's dtype (the * 1.0 is exact).
  const at::Tensor inv_std = at::reciprocal(at::tensor(std_).view({1, c.z_dim, 1, 1, 1}).to(device_, compute_));
  return latents / inv_std + m;
}

void WanVae::decode_frames(const at::Tensor& z_in,
                           const std::function<void(std::int64_t, const at::Tensor&)>& sink) const {
  DLO_CHECK(has_decoder(), "vae decode: the VAE was loaded without its decoder (WanVaeParts::kEncoder)");
  check_latents(z_in);
  const at::Tensor z = z_in.to(device_, compute_);
  const at::Tensor x = wan_causal_conv3d(z, w_.post_quant_conv, {0, 0, 0});
  WanVaeDecodeState st;
  std::int64_t frame = 0;
  for (std::int64_t i = 0; i < x.size(2); ++i) {
    at::Tensor out = unpatchify(wan_vae_decoder_chunk(w_, x.slice(2, i, i + 1), st), config_.patch());
    out = at::clamp(out, -1.0, 1.0);
    sink(frame, out);
    frame += out.size(2);
  }
}

void WanVae::to_device(at::Device device) {
  if (device == device_) return;
  const auto move = [&](at::Tensor& t) {
    if (t.defined()) t = t.to(device);
  };
  const auto conv = [&](WanVaeConv& c) {
    move(c.w);
    move(c.b);
  };
  const auto res = [&](WanVaeResBlockWeights& r) {
    move(r.norm1);
    move(r.norm2);
    conv(r.conv1);
    conv(r.conv2);
    conv(r.shortcut);
  };
  conv(w_.post_quant_conv);
  conv(w_.conv_in);
  res(w_.mid_res0);
  res(w_.mid_res1);
  move(w_.mid_attn.norm);
  conv(w_.mid_attn.to_qkv);
  conv(w_.mid_attn.proj);
  for (auto& u : w_.up_blocks) {
    for (auto& r : u.resnets) res(r);
    conv(u.resample);
    conv(u.time_conv);
  }
  move(w_.norm_out);
  conv(w_.conv_out);
  conv(enc_.conv_in);
  for (auto& d : enc_.down_blocks) {
    for (auto& r : d.resnets) res(r);
    conv(d.resample);
    conv(d.time_conv);
  }
  res(enc_.mid_res0);
  res(enc_.mid_res1);
  move(enc_.mid_attn.norm);
  conv(enc_.mid_attn.to_qkv);
  conv(enc_.mid_attn.proj);
  move(enc_.norm_out);
  conv(enc_.conv_out);
  conv(enc_.quant_conv);
  device_ = device;
}

at::Tensor WanVae::decode(const at::Tensor& z) const {
  DLO_CHECK(has_decoder(), "vae decode: the VAE was loaded without its decoder (WanVaeParts::kEncoder)");
  check_latents(z);
  const auto& c = config_;
  at::Tensor video = at::empty({z.size(0), c.video_channels(), c.output_frames(z.size(2)),
                                z.size(3) * c.scale_factor_spatial, z.size(4) * c.scale_factor_spatial},
                               at::TensorOptions().dtype(compute_));
  decode_frames(z, [&](std::int64_t first, const at::Tensor& frames) {
    DLO_ASSERT(first + frames.size(2) <= video.size(2) && frames.sizes().slice(3) == video.sizes().slice(3),
               "decoded chunk ", frames.sizes(), " does not fit the output ", video.sizes());
    video.narrow(2, first, frames.size(2)).copy_(frames);
  });
  return video;
}

void WanVae::check_video(const at::Tensor& v) const {
  const auto& c = config_;
  const std::int64_t p = c.patch(), channels = c.in_channels / (p * p);
  DLO_CHECK(v.defined() && v.dim() == 5 && v.size(1) == channels, "video must be [B, ", channels, ", F, H, W], got ",
            v.defined() ? v.sizes() : at::IntArrayRef{});
  DLO_CHECK(v.size(0) > 0 && v.size(2) > 0 && v.size(3) > 0 && v.size(4) > 0, "video is empty: ", v.sizes());
  DLO_CHECK(at::isFloatingType(v.scalar_type()), "video must be floating point, got ", c10::toString(v.scalar_type()));
  DLO_CHECK((v.size(2) - 1) % 4 == 0, "video has ", v.size(2), " frames; the encoder takes 1 + 4k (frame 0, then ",
            "chunks of 4; diffusers would drop the last ", (v.size(2) - 1) % 4, ")");
  // diffusers' chunks of 4 frames leave 4 / scale_factor_temporal latent frames each.
  DLO_CHECK(c.scale_factor_temporal <= 4, "the encoder of a VAE with scale_factor_temporal ", c.scale_factor_temporal,
            " > 4 cannot run in diffusers' chunks of 4 frames");
  // Every stride-2 downsampler needs 2 rows and columns; the residual VAE's AvgDown3D needs them even.
  const std::int64_t stages = static_cast<std::int64_t>(c.dim_mult.size()) - 1, least = p << stages;
  for (std::int64_t d : {v.size(3), v.size(4)}) {
    DLO_CHECK(d % p == 0, "video is ", v.size(3), "x", v.size(4), " pixels; patch_size ", p, " needs multiples of ", p);
    DLO_CHECK(d >= least && (!c.is_residual || d % least == 0), "video is ", v.size(3), "x", v.size(4),
              " pixels; the encoder's ", stages, " downsamplings need ", c.is_residual ? "multiples of " : "at least ",
              least);
  }
}

at::Tensor WanVae::encode(const at::Tensor& video) const {
  DLO_CHECK(has_encoder(), "vae encode: the VAE was loaded without its encoder (load it with WanVaeParts::kEncoder ",
            "or kEncoderAndDecoder)");
  check_video(video);
  // diffusers' _encode: patchify, frame 0 alone, then chunks of 4 frames, the caches carried;
  // quant_conv over the joined chunks; the posterior's mode is the mean half of its channels.
  const at::Tensor x = wan_vae_patchify(video.to(device_, compute_).contiguous(), config_.patch());
  WanVaeEncodeState st;
  std::vector<at::Tensor> out;
  for (std::int64_t i = 0; i < 1 + (x.size(2) - 1) / 4; ++i)
    out.push_back(wan_vae_encoder_chunk(enc_, i == 0 ? x.slice(2, 0, 1) : x.slice(2, 1 + 4 * (i - 1), 1 + 4 * i), st));
  const at::Tensor enc = wan_causal_conv3d(out.size() == 1 ? out[0] : at::cat(out, 2), enc_.quant_conv, {0, 0, 0});
  return enc.narrow(1, 0, config_.z_dim).contiguous();
}

at::Tensor WanVae::normalize(const at::Tensor& latents_in) const {
  check_latents(latents_in);
  const auto& c = config_;
  const at::Tensor latents = latents_in.to(device_, at::kFloat);
  // torch.tensor(list of Python floats) is float32; `1.0 / std` is std.reciprocal() * 1.0 (exact).
  const std::vector<float> mean(c.latents_mean.begin(), c.latents_mean.end());
  const std::vector<float> std_(c.latents_std.begin(), c.latents_std.end());
  const at::Tensor m = at::tensor(mean).view({1, c.z_dim, 1, 1, 1}).to(device_);
  const at::Tensor inv_std = at::reciprocal(at::tensor(std_).view({1, c.z_dim, 1, 1, 1}).to(device_));
  return (latents - m) * inv_std;
}

}  // namespace dlo
