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

WanVae WanVae::load(const std::string& dir, at::ScalarType compute) { return load(dir, folder_config(dir), compute); }

WanVae WanVae::load(const std::string& weights, const WanVaeConfig& config, at::ScalarType compute) {
  return with_context(str("loading vae '", weights, "'"), [&] {
    WanVae m(config, WeightStore(open_wan_vae(weights)), compute);
    const auto& c = m.config_;
    check_vae_tensors(m.store_, c);
    std::map<std::string, std::vector<std::int64_t>> shapes;
    for (const auto& spec : wan_vae_specs(c, DType::F32, /*include_encoder=*/false)) shapes[spec.name] = spec.shape;
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
  device_ = device;
}

at::Tensor WanVae::decode(const at::Tensor& z) const {
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

}  // namespace dlo
