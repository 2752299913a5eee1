#include "dlo/config/wan_vae_config.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

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

// The Wan2.2 VAE's (diffusers' scripts/convert_wan_to_diffusers.py, vae22_diffusers_config).
const std::vector<double> kLatentsMean22 = {
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174,  0.1838,  0.1557,  -0.1382, 0.0542,  0.2813,  0.0891,
    0.1570,  -0.0098, 0.0375,  -0.1825, -0.2246, -0.1207, -0.0698, 0.5109,  0.2665,  -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109,  0.1567,  -0.0729, 0.0899,  -0.2799, -0.1230, -0.0313, -0.1649, 0.0117,  0.0723,
    -0.2839, -0.2083, -0.0520, 0.3748,  0.0152,  0.1957,  0.1433,  -0.2944, 0.3573,  -0.0548, -0.1681, -0.0667};
const std::vector<double> kLatentsStd22 = {
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744};

// `clip_output` is in the Wan2.2 VAE's published config but is no AutoencoderKLWan argument:
// diffusers 0.42.1 ignores it and always clamps the decoded video to [-1, 1]; so does dlo.
const std::set<std::string> kKnownFields = {"clip_output",
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

std::int64_t WanVaeConfig::up_block_in_dim(std::size_t i) const {
  const auto dims = decoder_dims();
  return i > 0 && !is_residual ? dims[i] / 2 : dims[i];
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
  WanVaeConfig c;
  c.is_residual = j.get_bool("is_residual", false);
  if (j.has("patch_size")) c.patch_size = j.get_int("patch_size");
  if (j.has("clip_output")) (void)j.get_bool("clip_output");  // type-checked, then ignored (above)
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
    if (!j.has("scale_factor_spatial")) c.scale_factor_spatial = s * c.patch();
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
  if (patch_size) {
    DLO_CHECK(*patch_size >= 1 && *patch_size <= 16, where, ": field 'patch_size' must be null or 1 to 16, got ",
              *patch_size);
    const std::int64_t p2 = *patch_size * *patch_size;
    DLO_CHECK(in_channels % p2 == 0, where, ": field 'in_channels' (", in_channels,
              ") must be a multiple of patch_size^2 (", p2, "): patchify packs each channel's ", *patch_size, "x",
              *patch_size, " pixels into channels");
    DLO_CHECK(out_channels % p2 == 0, where, ": field 'out_channels' (", out_channels,
              ") must be a multiple of patch_size^2 (", p2, "): unpatchify unpacks them into pixels");
  }
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
  const auto dims = decoder_dims();
  if (!is_residual) {
    // Every upsampler halves the channels (dim // 2): there must be some left.
    for (std::size_t i = 0; i + 1 < dim_mult.size(); ++i)
      DLO_CHECK(dims[i + 1] >= 2, where, ": decoder up block ", i, " has ", dims[i + 1],
                " channels; its upsampler's dim // 2 would be 0 (fields 'decoder_base_dim'/'base_dim', 'dim_mult')");
  } else {
    // The residual blocks' shortcuts regroup channels: AvgDown3D averages in * factor / out of
    // them, DupUp3D repeats each out * factor / in times; both must divide (diffusers asserts).
    for (std::size_t i = 0; i < dim_mult.size(); ++i) {
      const bool down = i + 1 != dim_mult.size();
      const std::int64_t in = i == 0 ? base_dim : base_dim * dim_mult[i - 1], out = base_dim * dim_mult[i];
      const std::int64_t factor = down ? (temperal_downsample[i] ? 2 : 1) * 4 : 1;
      DLO_CHECK(in * factor % out == 0, where, ": encoder down block ", i, ": its AvgDown3D shortcut needs ", in,
                " channels x ", factor, " divisible by ", out, " (fields 'base_dim', 'dim_mult')");
    }
    const auto up = temperal_upsample();
    for (std::size_t i = 0; i + 1 < dim_mult.size(); ++i) {
      const std::int64_t factor = (up[i] ? 2 : 1) * 4;
      DLO_CHECK(dims[i + 1] * factor % dims[i] == 0, where, ": decoder up block ", i, ": its DupUp3D shortcut needs ",
                dims[i + 1], " channels x ", factor, " divisible by ", dims[i],
                " (fields 'decoder_base_dim'/'base_dim', 'dim_mult')");
    }
  }
  std::int64_t t = 1, s = 1;
  for (std::size_t i = 0; i + 1 < dim_mult.size(); ++i) {
    s *= 2;
    if (temperal_downsample[i]) t *= 2;
  }
  DLO_CHECK(scale_factor_temporal == t, where, ": field 'scale_factor_temporal' is ", scale_factor_temporal,
            ", but temperal_downsample gives ", t);
  DLO_CHECK(scale_factor_spatial == s * patch(), where, ": field 'scale_factor_spatial' is ", scale_factor_spatial,
            ", but dim_mult (", dim_mult.size() - 1, " spatial up/downsamplings) and patch_size (", patch(),
            ") give ", s * patch());
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
  } else if (name == "wan2.2-vae" || name == "wan2.2-vae-test") {
    const bool real = name == "wan2.2-vae";
    c.base_dim = real ? 160 : 8;
    c.decoder_base_dim = real ? 256 : 16;
    c.z_dim = real ? 48 : 12;
    c.is_residual = true;
    c.patch_size = 2;
    c.in_channels = c.out_channels = 12;
    c.scale_factor_spatial = 16;
    if (real) {
      c.latents_mean = kLatentsMean22;
      c.latents_std = kLatentsStd22;
    } else {
      c.latents_mean.assign(kLatentsMean22.begin(), kLatentsMean22.begin() + c.z_dim);
      c.latents_std.assign(kLatentsStd22.begin(), kLatentsStd22.begin() + c.z_dim);
    }
  } else {
    DLO_CHECK(false, "unknown VAE preset '", name,
              "' (wan-vae-test, wan2.1-vae-small, wan2.1-vae, wan2.2-vae, wan2.2-vae-test)");
  }
  return c;
}

std::vector<std::string> WanVaeConfig::preset_names() {
  return {"wan-vae-test", "wan2.1-vae-small", "wan2.1-vae", "wan2.2-vae", "wan2.2-vae-test"};
}

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
  j["is_residual"] = is_residual;
  j["latents_mean"] = latents_mean;
  j["latents_std"] = latents_std;
  j["num_res_blocks"] = num_res_blocks;
  j["out_channels"] = out_channels;
  if (patch_size)
    j["patch_size"] = *patch_size;
  else
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
      if (c.is_residual) {
        // WanResidualDownBlock: resnets, then a downsampler (its AvgDown3D shortcut has no weights).
        const std::string p = "encoder.down_blocks." + std::to_string(i);
        for (std::int64_t r = 0; r < c.num_res_blocks; ++r) {
          res_shapes(s, p + ".resnets." + std::to_string(r), in, out);
          in = out;
        }
        if (i + 1 != n) {
          conv_shapes(s, p + ".downsampler.resample.1", {out, out, 3, 3});
          if (c.temperal_downsample[i]) conv_shapes(s, p + ".downsampler.time_conv", {out, out, 3, 1, 1});
        }
        continue;
      }
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
    std::int64_t in = c.up_block_in_dim(i);
    const std::int64_t out = dims[i + 1];
    for (std::int64_t r = 0; r <= c.num_res_blocks; ++r) {
      res_shapes(s, p + ".resnets." + std::to_string(r), in, out);
      in = out;
    }
    if (i + 1 != n) {
      // Wan2.1: WanUpBlock's upsamplers.0 (to dim // 2); Wan2.2: WanResidualUpBlock's upsampler
      // (to dim; its DupUp3D shortcut has no weights).
      const std::string u = p + (c.is_residual ? ".upsampler" : ".upsamplers.0");
      conv_shapes(s, u + ".resample.1", {c.is_residual ? out : out / 2, out, 3, 3});
      if (up[i]) conv_shapes(s, u + ".time_conv", {2 * out, out, 3, 1, 1});
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

WanVaeEncodeMemory wan_vae_encode_memory(const WanVaeConfig& c, std::int64_t frames, std::int64_t height,
                                         std::int64_t width, std::int64_t element_bytes) {
  // Element counts; a chunk is 4 frames (frame 0 alone when there is nothing else).
  const std::int64_t p = c.patch(), e = element_bytes, n = static_cast<std::int64_t>(c.dim_mult.size());
  std::int64_t h = height / p, w = width / p, t = frames > 1 ? 4 : 1;
  const std::int64_t cache_t = frames > 1 ? 2 : 1;  // the caches' frames (1 after frame 0 alone)
  // Frame 0 alone: only the caches of the convs before the largest moment exist then.
  std::int64_t caches = 0, best = -1, best_working = 0, best_columns = 0, best_caches = 0;
  // A cached 3x3x3 conv of `in` -> `out` channels on the current chunk while `held` elements wait.
  const auto conv = [&](std::int64_t in, std::int64_t out, std::int64_t held) {
    const std::int64_t working = held + (t + 2) * in * (h + 2) * (w + 2) + t * out * h * w + std::min<std::int64_t>(t, 2) * in * h * w;
    const std::int64_t columns = in * 27 * t * h * w;
    const std::int64_t total = working + columns + (frames > 1 ? 0 : caches);
    if (total > best) best = total, best_working = working, best_columns = columns, best_caches = caches;
    caches += cache_t * in * h * w;
  };
  std::vector<std::int64_t> dims{c.base_dim};
  for (auto m : c.dim_mult) dims.push_back(c.base_dim * m);
  // A residual block: its input (and its shortcut's output) held through both convs.
  const auto res = [&](std::int64_t in, std::int64_t out, std::int64_t stage_in) {
    const std::int64_t held = t * in * h * w + (in != out ? t * out * h * w : 0) + stage_in;
    conv(in, out, held);
    conv(out, out, held);
  };
  conv(c.in_channels, dims[0], 0);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t stage_in = t * dims[i] * h * w;  // the residual stage's input, for its shortcut
    for (std::int64_t r = 0; r < c.num_res_blocks; ++r)
      res(r == 0 ? dims[i] : dims[i + 1], dims[i + 1], c.is_residual && r > 0 ? stage_in : 0);
    if (i + 1 == n) break;
    h /= 2;
    w /= 2;
    if (c.temperal_downsample[i]) {
      caches += dims[i + 1] * h * w;  // the time_conv's last frame
      t = std::max<std::int64_t>(1, t / 2);
    }
  }
  res(dims[n], dims[n], 0);
  res(dims[n], dims[n], 0);
  conv(dims[n], 2 * c.z_dim, 0);
  const std::int64_t latent_frames = 1 + (frames - 1) / 4 * 4 / c.scale_factor_temporal;
  WanVaeEncodeMemory m;
  m.caches = static_cast<std::uint64_t>((frames > 1 ? caches : best_caches) * e);
  m.working = static_cast<std::uint64_t>(best_working * e);
  m.columns = static_cast<std::uint64_t>(best_columns * e);
  // The chunks' outputs, joined, quant_conv's output and its mean half.
  const std::int64_t latents = 2 * c.z_dim * latent_frames * h * w * 3;
  m.video = static_cast<std::uint64_t>(((p > 1 ? c.in_channels * frames * (height / p) * (width / p) : 0) + latents) * e);
  return m;
}

}  // namespace dlo

namespace dlo {
namespace {

using ShapeMap = std::map<std::string, std::vector<std::int64_t>>;

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string first_of(const std::vector<std::string>& names) {
  std::string list;
  for (std::size_t i = 0; i < names.size() && i < 5; ++i) list += (i ? ", " : "") + names[i];
  if (names.size() > 5) list += str(" and ", names.size() - 5, " more");
  return list;
}

ShapeMap spec_shapes(const WanVaeConfig& c) {
  ShapeMap out;
  for (const auto& spec : wan_vae_specs(c, DType::F32, /*include_encoder=*/true)) out[spec.name] = spec.shape;
  return out;
}

// The fields tensor shapes show, as (name, value) text pairs in config.json's terms.
std::vector<std::pair<std::string, std::string>> shown_fields(std::int64_t z_dim, std::int64_t base_dim,
                                                              std::int64_t in_channels, std::int64_t decoder_width,
                                                              std::int64_t out_channels, std::int64_t stages,
                                                              std::int64_t num_res_blocks, bool is_residual) {
  return {{"z_dim", std::to_string(z_dim)},
          {"is_residual", is_residual ? "true" : "false"},
          {"base_dim", std::to_string(base_dim)},
          {"in_channels", std::to_string(in_channels)},
          {"decoder width (decoder_base_dim x dim_mult[-1])", std::to_string(decoder_width)},
          {"out_channels", std::to_string(out_channels)},
          {"stages (dim_mult entries)", std::to_string(stages)},
          {"num_res_blocks", std::to_string(num_res_blocks)}};
}

std::vector<std::pair<std::string, std::string>> shown_fields(const WanVaeConfig& c) {
  return shown_fields(c.z_dim, c.base_dim, c.in_channels, c.decoder_dims()[0], c.out_channels,
                      static_cast<std::int64_t>(c.dim_mult.size()), c.num_res_blocks, c.is_residual);
}

}  // namespace

WanVaeConfig infer_wan_vae_config(const ShapeMap& shapes, const WanVaeConfig* folder, const std::string& label,
                                  std::string* matched) {
  return with_context(label, [&] {
    const auto shape = [&](const std::string& name) -> const std::vector<std::int64_t>& {
      const auto it = shapes.find(name);
      DLO_CHECK(it != shapes.end(), "no tensor '", name, "' (diffusers' name), which every Wan VAE has");
      DLO_CHECK(it->second.size() == 5, "tensor '", name, "' has shape ", shape_text(it->second), ", not 5 dimensions");
      return it->second;
    };
    const auto count = [&](const auto& name_of) {
      std::int64_t n = 0;
      while (shapes.count(name_of(n))) ++n;
      return n;
    };
    const auto& conv_in = shape("encoder.conv_in.weight");
    const std::int64_t resnets = count([](std::int64_t r) { return str("decoder.up_blocks.0.resnets.", r, ".norm1.gamma"); });
    const auto shown = shown_fields(
        shape("post_quant_conv.weight")[0], conv_in[0], conv_in[1], shape("decoder.conv_in.weight")[0],
        shape("decoder.conv_out.weight")[0],
        count([](std::int64_t i) { return str("decoder.up_blocks.", i, ".resnets.0.norm1.gamma"); }), resnets - 1,
        shapes.count("encoder.down_blocks.0.resnets.0.norm1.gamma") > 0);
    WanVaeConfig c;
    if (folder != nullptr) {
      const auto theirs = shown_fields(*folder);
      for (std::size_t k = 0; k < shown.size(); ++k)
        DLO_CHECK(shown[k].second == theirs[k].second, "its tensors give ", shown[k].first, " ", shown[k].second,
                  ", the model folder's vae config has ", theirs[k].second, " (the VAE of another model?)");
      c = *folder;
    } else {
      std::string known, found;
      for (const auto& name : WanVaeConfig::preset_names()) {
        const WanVaeConfig k = WanVaeConfig::preset(name);
        known += (known.empty() ? "" : ", ") + name;
        if (found.empty() && spec_shapes(k) == shapes) {
          found = name;
          c = k;
        }
      }
      std::string given;
      for (const auto& [field, value] : shown) given += (given.empty() ? "" : ", ") + field + " " + value;
      DLO_CHECK(!found.empty(), "its tensors are no known VAE's (", given, "); known: ", known,
                ". Beside a model folder's vae config of this shape it is read with that config");
      if (matched != nullptr) *matched = found;
    }
    // Every tensor the config implies, with its shape, and nothing else.
    std::vector<std::string> missing, misshapen, unexpected;
    const ShapeMap expected = spec_shapes(c);
    for (const auto& [name, s] : expected) {
      const auto it = shapes.find(name);
      if (it == shapes.end())
        missing.push_back(name);
      else if (it->second != s)
        misshapen.push_back(str(name, " ", shape_text(it->second), " (expected ", shape_text(s), ")"));
    }
    for (const auto& [name, s] : shapes)
      if (!expected.count(name)) unexpected.push_back(name);
    DLO_CHECK(missing.empty(), "lacks ", missing.size(), " tensor(s) of the VAE (diffusers' names): ", first_of(missing));
    DLO_CHECK(misshapen.empty(), misshapen.size(), " tensor(s) have another shape than the config's: ", first_of(misshapen));
    DLO_CHECK(unexpected.empty(), "holds ", unexpected.size(), " tensor(s) the VAE does not have (diffusers' names): ",
              first_of(unexpected));
    return c;
  });
}

}  // namespace dlo
