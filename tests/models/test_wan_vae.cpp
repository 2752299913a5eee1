// dlo/models/wan_vae.h: config checks, tensor list, weights as views, input checks, causal-cache
// algebra for every chunk/cache combination, frame streaming, and the decode against diffusers'
// outputs stored in tests/data/goldens (cpu label). Wider parity runs are in
// tools/reference/wan_vae_parity.py (label parity).
#include "common/doctest_torch.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "dlo/common/error.h"
#include "dlo/io/json_config.h"
#include "dlo/testing/make_model.h"
#include "dlo/models/wan_vae.h"
#include "models/golden.h"

using namespace dlo;
using dlo::test::TempDir;

namespace {

std::string vae_config_error(const std::string& json) {
  try {
    WanVaeConfig::from_json(JsonConfig::parse(json, "vae/config.json"));
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::int64_t param_count(const WanVaeConfig& c, bool include_encoder = true) {
  std::int64_t n = 0;
  for (const auto& s : wan_vae_specs(c, DType::F32, include_encoder)) n += static_cast<std::int64_t>(s.nbytes() / 4);
  return n;
}

bool has_text(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>() / b.to(at::kDouble).norm().item<double>();
}

// A random conv with weights ~ N(0, 1/fan_in).
WanVaeConv random_conv(std::int64_t out, std::int64_t in, std::int64_t kt, std::int64_t kh, std::int64_t kw) {
  return {at::randn({out, in, kt, kh, kw}) / std::sqrt(static_cast<double>(in * kt * kh * kw)), at::randn({out}) * 0.1};
}

}  // namespace

TEST_CASE("config.json errors name the file and the field") {
  // Wan2.2's fields: a patch needs channels that pack into it and the spatial factor it adds.
  CHECK(vae_config_error(R"({"patch_size": 2})") ==
        "vae/config.json: field 'in_channels' (3) must be a multiple of patch_size^2 (4): patchify packs each "
        "channel's 2x2 pixels into channels");
  CHECK(has_text(vae_config_error(R"({"patch_size": 2, "in_channels": 12})"),
                 "field 'out_channels' (3) must be a multiple of patch_size^2 (4)"));
  CHECK(has_text(vae_config_error(R"({"patch_size": 2, "in_channels": 12, "out_channels": 12, "scale_factor_spatial": 8})"),
                 "field 'scale_factor_spatial' is 8, but dim_mult (3 spatial up/downsamplings) and patch_size (2) give 16"));
  CHECK(has_text(vae_config_error(R"({"patch_size": 0})"), "field 'patch_size' must be null or 1 to 16, got 0"));
  CHECK(has_text(vae_config_error(R"({"patch_size": "2"})"), "field 'patch_size' must be an integer"));
  CHECK(has_text(vae_config_error(R"({"is_residual": "yes"})"), "field 'is_residual'"));
  CHECK(has_text(vae_config_error(R"({"clip_output": 1})"), "field 'clip_output'"));
  CHECK(has_text(vae_config_error(R"({"clip_true": true})"), "vae/config.json: unknown field 'clip_true'"));
  // AvgDown3D / DupUp3D regroup channels: 4 to 12 cannot average, nor 16 to 2 (x 4 pixels) repeat
  // (the encoder's stage 2 halves time, so 1 -> 8 channels pass there, but the decoder's does not).
  CHECK(has_text(vae_config_error(R"({"is_residual": true, "base_dim": 4, "dim_mult": [1, 3], "temperal_downsample": [false]})"),
                 "encoder down block 1: its AvgDown3D shortcut needs 4 channels x 1 divisible by 12"));
  CHECK(has_text(vae_config_error(R"({"is_residual": true, "base_dim": 2, "dim_mult": [1, 1, 8, 8], "temperal_downsample": [false, false, true]})"),
                 "decoder up block 2: its DupUp3D shortcut needs 2 channels x 4 divisible by 16"));
  CHECK(vae_config_error(R"({"z_dim": "sixteen"})") == "vae/config.json: field 'z_dim' must be an integer, got \"sixteen\"");
  CHECK(vae_config_error(R"({"z_dim": 4})") == "vae/config.json: field 'latents_mean' has 16 entries, z_dim is 4");
  CHECK(has_text(vae_config_error(R"({"latents_std": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,0]})"),
                 "field 'latents_std' must hold positive numbers, got 0"));
  CHECK(has_text(vae_config_error(R"({"temperal_downsample": [false, true]})"),
                 "field 'temperal_downsample' has 2 entries; dim_mult [1, 2, 4, 4] needs 3"));
  CHECK(has_text(vae_config_error(R"({"temperal_downsample": [0, 1, 1]})"),
                 "field 'temperal_downsample' must be a list of true/false, got [0,1,1]"));
  {  // diffusers decodes such a config (the weights follow temperal_downsample): followed, with a warning
    auto w = WanVaeConfig::from_json(JsonConfig::parse(R"({"scale_factor_temporal": 8})", "vae/config.json"));
    CHECK(w.scale_factor_temporal == 4);
    REQUIRE(w.warnings.size() == 1);
    CHECK(has_text(w.warnings[0],
                   "field 'scale_factor_temporal' is 8, but temperal_downsample [false, true, true] gives 4"));
  }
  CHECK(has_text(vae_config_error(R"({"dim_mult": [1, 2, 4]})"), "'temperal_downsample' has 3 entries"));
  CHECK(has_text(vae_config_error(R"({"dim_mult": [1, 2, 4], "temperal_downsample": [true, true], "scale_factor_spatial": 8})"),
                 "field 'scale_factor_spatial' is 8, but dim_mult (2 spatial up/downsamplings) and patch_size (1) give 4"));
  CHECK(has_text(vae_config_error(R"({"base_dim": 1, "dim_mult": [1, 1, 1, 1]})"),
                 "decoder up block 0 has 1 channels; its upsampler's dim // 2 would be 0"));
  CHECK(has_text(vae_config_error(R"({"num_res_blocks": 0})"), "field 'num_res_blocks' must be a positive integer, got 0"));
  CHECK(has_text(vae_config_error(R"({"_class_name": "AutoencoderKLLTXVideo"})"), "expected 'AutoencoderKLWan'"));
  CHECK(has_text(vae_config_error(R"({"dropout": 1.5})"), "field 'dropout' must be in [0, 1), got 1.5"));
  // Absent scale factors follow the structure.
  const auto derived = WanVaeConfig::from_json(
      JsonConfig::parse(R"({"dim_mult": [1, 2, 4], "temperal_downsample": [true, false]})", "x"));
  CHECK(derived.scale_factor_spatial == 4);
  CHECK(derived.scale_factor_temporal == 2);
  CHECK(derived.output_frames(3) == 5);
  const auto derived22 = WanVaeConfig::from_json(JsonConfig::parse(
      R"({"is_residual": true, "patch_size": 2, "in_channels": 12, "out_channels": 12, "scale_factor_spatial": null})", "x"));
  CHECK(derived22.scale_factor_spatial == 16);
  // diffusers writes nulls for unset optional fields, and private "_" keys.
  CHECK(vae_config_error(R"({"decoder_base_dim": null, "patch_size": null, "is_residual": false, "_name_or_path": "x",
                         "scale_factor_temporal": null})") == "(no error)");
}

TEST_CASE("the Wan2.1 and Wan2.2 VAEs' own configs read as their presets, and presets round-trip") {
  // vae/config.json of Wan-AI/Wan2.1-T2V-1.3B-Diffusers (written by diffusers 0.33, before the
  // scale_factor_* and Wan2.2 fields existed).
  const std::string hub = R"({
    "_class_name": "AutoencoderKLWan", "_diffusers_version": "0.33.0.dev0", "attn_scales": [], "base_dim": 96,
    "dim_mult": [1, 2, 4, 4], "dropout": 0.0,
    "latents_mean": [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517,
                     -0.3632, -0.1922, -0.9497, 0.2503, -0.2921],
    "latents_std": [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579,
                    1.6382, 1.1253, 2.8251, 1.916],
    "num_res_blocks": 2, "temperal_downsample": [false, true, true], "z_dim": 16})";
  const auto c = WanVaeConfig::from_json(JsonConfig::parse(hub, "hub"));
  CHECK(c.to_json() == WanVaeConfig::preset("wan2.1-vae").to_json());
  CHECK(c.scale_factor_temporal == 4);
  CHECK(c.scale_factor_spatial == 8);
  CHECK(c.decoder_dims() == std::vector<std::int64_t>{384, 384, 384, 192, 96});
  CHECK(c.output_frames(21) == 81);
  CHECK(c.output_frames(1) == 1);
  // The Wan2.2 VAE's config as diffusers' conversion script writes it (vae22_diffusers_config,
  // with its clip_output: no AutoencoderKLWan argument, ignored as diffusers does).
  const auto v22 = WanVaeConfig::preset("wan2.2-vae");
  nlohmann::json j22 = nlohmann::json::parse(v22.to_json());
  j22["clip_output"] = false;
  const auto c22 = WanVaeConfig::from_json(JsonConfig::parse(j22.dump(), "vae/config.json"));
  CHECK(c22.to_json() == v22.to_json());
  CHECK(c22.warnings.empty());
  CHECK(c22.is_residual);
  CHECK(c22.patch() == 2);
  CHECK(c22.video_channels() == 3);
  CHECK(c22.scale_factor_spatial == 16);
  CHECK(c22.decoder_dims() == std::vector<std::int64_t>{1024, 1024, 1024, 512, 256});
  CHECK(c22.up_block_in_dim(1) == 1024);  // the residual upsamplers keep their channels (Wan2.1: halved)
  CHECK(c.up_block_in_dim(1) == 192);
  CHECK(c22.latents_mean.size() == 48);
  CHECK(c22.latents_mean[19] == 0.5109);
  CHECK(c22.latents_std[47] == 0.7744);
  CHECK(c22.output_frames(31) == 121);  // TI2V-5B's 121 frames
  for (const auto& name : WanVaeConfig::preset_names()) {
    CAPTURE(name);
    const auto p = WanVaeConfig::preset(name);
    CHECK(WanVaeConfig::from_json(JsonConfig::parse(p.to_json(), name)).to_json() == p.to_json());
  }
}

TEST_CASE("the tensor list is diffusers' AutoencoderKLWan state_dict (counts from diffusers 0.42.1)") {
  // Numbers from sum(p.numel()) / len(state_dict()) of AutoencoderKLWan(**config) in diffusers.
  const auto real = WanVaeConfig::preset("wan2.1-vae");
  CHECK(param_count(real) == 126'892'531);
  CHECK(param_count(real, false) == 73'295'603);  // decoder + post_quant_conv (wan-spec 5.3)
  CHECK(wan_vae_specs(real, DType::F32).size() == 194);
  CHECK(param_count(WanVaeConfig::preset("wan-vae-test")) == 13'861);
  CHECK(param_count(WanVaeConfig::preset("wan-vae-test"), false) == 6'581);
  CHECK(wan_vae_specs(WanVaeConfig::preset("wan-vae-test"), DType::F32).size() == 146);
  CHECK(param_count(WanVaeConfig::preset("wan2.1-vae-small")) == 3'602'371);
  // Wan2.2's VAE (residual blocks, patch 2): the real one and the test structure.
  CHECK(param_count(WanVaeConfig::preset("wan2.2-vae")) == 704'688'668);
  CHECK(param_count(WanVaeConfig::preset("wan2.2-vae"), false) == 555'051'580);
  CHECK(wan_vae_specs(WanVaeConfig::preset("wan2.2-vae"), DType::F32).size() == 196);
  CHECK(param_count(WanVaeConfig::preset("wan2.2-vae-test")) == 2'587'024);
  CHECK(param_count(WanVaeConfig::preset("wan2.2-vae-test"), false) == 2'192'056);
  auto attn = WanVaeConfig::preset("wan-vae-test");
  attn.attn_scales = {1.0, 0.25};  // encoder attention after res blocks at those scales
  CHECK(param_count(attn) == 13'963);
  CHECK(wan_vae_specs(attn, DType::F32).size() == 156);
  WanVaeConfig odd;
  odd.base_dim = 4;
  odd.decoder_base_dim = 6;
  odd.dim_mult = {1, 2, 2};
  odd.temperal_downsample = {true, false};
  odd.scale_factor_temporal = 2;
  odd.scale_factor_spatial = 4;
  odd.validate("odd");
  CHECK(param_count(odd) == 106'701);
  CHECK(wan_vae_specs(odd, DType::F32).size() == 154);
}

TEST_CASE("decoder weights in the compute dtype are views into the checkpoint mapping, not copies") {
  TempDir dir;
  write_random_wan_vae(dir.file("vae"), WanVaeConfig::preset("wan-vae-test"), DType::F32, 7, 0);
  auto m = WanVae::load(dir.file("vae"), at::kFloat);
  const auto& map = m.weights().checkpoint().files()[0]->mapping();
  auto inside = [&](const at::Tensor& t) {
    const auto* p = static_cast<const std::byte*>(t.data_ptr());
    return p >= map->data() && p + t.nbytes() <= map->data() + map->size();
  };
  const auto& w = m.decoder();
  CHECK(inside(w.conv_in.w));
  CHECK(inside(w.mid_attn.to_qkv.w));
  CHECK(inside(w.up_blocks[0].time_conv.w));
  CHECK(inside(w.up_blocks[1].resnets[0].shortcut.w));
  CHECK(inside(w.norm_out));
  CHECK(inside(w.conv_out.b));
  CHECK(w.up_blocks[0].mode == WanVaeUpsample::kTemporal);
  CHECK(w.up_blocks[2].mode == WanVaeUpsample::kSpatial);
  CHECK(w.up_blocks[3].mode == WanVaeUpsample::kNone);
  CHECK_FALSE(w.up_blocks[0].resnets[0].shortcut.w.defined());  // 3 -> 3: identity shortcut
  // Another compute dtype: converted copies.
  auto half = WanVae::load(dir.file("vae"), at::kBFloat16);
  CHECK((half.decoder().conv_in.w.scalar_type() == at::kBFloat16));
  CHECK_FALSE(inside(half.decoder().conv_in.w));
}

TEST_CASE("a checkpoint that disagrees with its config is refused, naming the tensor and the folder") {
  TempDir dir;
  auto c = WanVaeConfig::preset("wan-vae-test");
  write_random_wan_vae(dir.file("vae"), c, DType::F32, 1, 0);
  c.base_dim = 4;
  std::ofstream(dir.file("vae/config.json")) << c.to_json();
  try {
    WanVae::load(dir.file("vae"), at::kFloat);
    FAIL("expected an error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK_MESSAGE(has_text(msg, "tensor 'decoder.conv_in.weight' has shape [3, 16, 3, 3, 3], the config implies [4, 16, 3, 3, 3]"),
                  msg);
    CHECK(msg.find("loading vae '" + dir.file("vae") + "'") == 0);
  }
  // A Wan2.1 checkpoint under a Wan2.2 (residual) config: the residual upsampler's name is missing.
  std::ofstream(dir.file("vae/config.json")) << R"({"is_residual": true, "base_dim": 3, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1})";
  CHECK_THROWS_WITH_AS(WanVae::load(dir.file("vae"), at::kFloat), doctest::Contains("decoder.up_blocks.0.upsampler."), Error);
}

TEST_CASE("bad latents are refused with the input named") {
  TempDir dir;
  write_random_wan_vae(dir.file("m/vae"), WanVaeConfig::preset("wan-vae-test"), DType::F32, 1, 0);
  auto m = WanVae::load(dir.file("m/vae"), at::kFloat);
  CHECK_THROWS_WITH_AS(m.decode(at::randn({1, 15, 2, 4, 4})),
                       "latents must be [B, 16, F, H, W], got [1, 15, 2, 4, 4]", Error);
  CHECK_THROWS_WITH_AS(m.decode(at::randn({16, 2, 4, 4})), doctest::Contains("latents must be [B, 16, F, H, W]"), Error);
  CHECK_THROWS_WITH_AS(m.denormalize(at::randn({1, 16, 0, 4, 4})), "latents is empty: [1, 16, 0, 4, 4]", Error);
  CHECK_THROWS_WITH_AS(m.decode(at::zeros({1, 16, 1, 2, 2}, at::kLong)),
                       doctest::Contains("latents must be floating point"), Error);
  // Through dlo-forward's entry point (the component and the key named): tests/apps/test_hardening.sh.
}

TEST_CASE("a causal conv run chunk by chunk with its cache equals the conv over all frames with 2 zero frames in front") {
  at::manual_seed(3);
  const auto conv = random_conv(5, 4, 3, 3, 3);
  const at::Tensor x = at::randn({2, 4, 7, 5, 6});
  // By hand: zero-pad 2 frames in front, 1 pixel around, then a plain conv3d over the whole stream.
  const at::Tensor whole = at::conv3d(at::constant_pad_nd(x, {1, 1, 1, 1, 2, 0}, 0.0), conv.w, conv.b);
  WanCausalCache cache;
  std::vector<at::Tensor> parts;
  std::int64_t t = 0;
  for (std::int64_t n : {1, 1, 2, 3}) {  // chunk sizes, as the decoder's stages see them
    parts.push_back(wan_cached_causal_conv3d(x.narrow(2, t, n), conv, {1, 1, 1}, cache));
    t += n;
    CHECK(cache.frames.size(2) == std::min<std::int64_t>(t, 2));
    CHECK(at::equal(cache.frames, x.narrow(2, t - cache.frames.size(2), cache.frames.size(2))));
  }
  CHECK(rel_err(at::cat(parts, 2), whole) < 1e-6);
  // A kernel with no time extent ignores any history.
  const auto pointwise = random_conv(3, 4, 1, 1, 1);
  CHECK(at::equal(wan_causal_conv3d(x, pointwise, {0, 0, 0}, x.narrow(2, 0, 2)), wan_causal_conv3d(x, pointwise, {0, 0, 0})));
}

// Regression: no test fed a one-frame chunk to a cache already holding two frames (a wrong cache
// frame there failed 2 of 7 parity configs only). Every sequence of three chunks of 1, 2 or 4
// frames after a first chunk of 1 (the decoder's stages see 1-frame chunks at the latent rate,
// then 2 and 4 after the temporal upsamplers; a 1-frame chunk follows a full cache there), against
// the conv over the whole stream.
TEST_CASE("cached causal conv: every chunk/cache combination the decoder meets equals the whole-stream conv") {
  at::manual_seed(13);
  const auto conv = random_conv(3, 2, 3, 3, 3);
  const at::Tensor x = at::randn({1, 2, 13, 4, 3});
  const at::Tensor whole = at::conv3d(at::constant_pad_nd(x, {1, 1, 1, 1, 2, 0}, 0.0), conv.w, conv.b);
  for (std::int64_t a : {1, 2, 4}) {
    for (std::int64_t b : {1, 2, 4}) {
      for (std::int64_t c : {1, 2, 4}) {
        CAPTURE(a);
        CAPTURE(b);
        CAPTURE(c);
        WanCausalCache cache;
        std::vector<at::Tensor> parts;
        std::int64_t t = 0;
        for (std::int64_t n : {std::int64_t{1}, a, b, c}) {
          parts.push_back(wan_cached_causal_conv3d(x.narrow(2, t, n), conv, {1, 1, 1}, cache));
          t += n;
          REQUIRE(cache.frames.size(2) == std::min<std::int64_t>(t, 2));
          CHECK(at::equal(cache.frames, x.narrow(2, t - 2 < 0 ? 0 : t - 2, cache.frames.size(2))));
        }
        CHECK(rel_err(at::cat(parts, 2), whole.narrow(2, 0, t)) < 1e-6);
      }
    }
  }
}

namespace {

// Decodes the golden `name`'s latents with the VAE its config and seed describe (written by
// write_random_wan_vae, the weights checked by their sum), whole and frame by frame, and checks the
// output against diffusers' (golden.h: bitwise on the CPU that made the golden, elsewhere within
// its measured bar).
void check_vae_golden(const std::string& name) {
  CAPTURE(name);
  at::set_num_threads(1);
  const dlo::test::Golden g(name);
  TempDir dir;
  const auto c = WanVaeConfig::from_json(JsonConfig::parse(g.meta("config"), name));
  write_random_wan_vae(dir.file("vae"), c, g.weights_dtype(), g.seed(), 0);
  g.check_weights(dir.file("vae"));
  auto m = WanVae::load(dir.file("vae"), g.compute_dtype());
  const at::Tensor want = g.get("output");
  const at::Tensor z = m.denormalize(g.get("latents"));
  const at::Tensor got = m.decode(z);
  REQUIRE(got.sizes() == want.sizes());
  REQUIRE((got.scalar_type() == want.scalar_type()));
  g.check_output(got, want);
  // Streamed frame by frame: the same frames.
  std::vector<at::Tensor> parts;
  m.decode_frames(z, [&](std::int64_t, const at::Tensor& frames) { parts.push_back(frames.clone()); });
  CHECK(at::equal(at::cat(parts, 2), got));
}

}  // namespace

// diffusers' AutoencoderKLWan (+ WanPipeline's de-normalisation) on the same weights: the real
// Wan2.1 structure at base_dim 16; 4 latent frames in fp32 (every chunk/cache combination of the
// decoder, including 1-frame chunks after a 2-frame cache and the temporal upsamplers' first-chunk
// rule), 3 in bf16. Bitwise equal at 1 thread on the CPU
// that made the goldens (golden.h).
TEST_CASE("decode equals diffusers' output stored in the goldens, bit for bit, fp32 and bf16") {
  for (const std::string name : {"wan_vae_fp32", "wan_vae_bf16"}) check_vae_golden(name);
}

// The Wan2.2 (TI2V-5B) VAE's decoder: residual up blocks whose DupUp3D shortcuts regroup channels
// into 2x2 pixels (and 2 frames; the first chunk drops its leading one), the 2x2 unpatchify, z_dim
// 48, at base_dim 8 / decoder_base_dim 16; 2 latent frames of 1x2 (not square, so a swapped
// height/width in a regrouping shows) decode to 5 frames of 16x32. Without this golden only the
// parity label saw a wrong shortcut or unpatchify. fp32: the bar off the CPU that made it is
// golden.h's 1e-5 (fp32 convolutions round differently by CPU type, measured up to 1.7e-6).
TEST_CASE("Wan2.2's residual decoder (DupUp3D shortcuts, 2x2 unpatchify, z_dim 48) equals diffusers' golden") {
  check_vae_golden("wan_vae22_fp32");
}

TEST_CASE("RMS norm and de-normalisation computed by hand") {
  at::manual_seed(4);
  const at::Tensor x = at::randn({2, 6, 3, 4, 5});
  const at::Tensor gamma = 1 + 0.1 * at::randn({6, 1, 1, 1});
  const at::Tensor want = x / x.pow(2).sum(1, true).sqrt() * std::sqrt(6.0) * gamma;
  CHECK(rel_err(wan_vae_rms_norm(x, gamma), want) < 1e-6);
  // bf16 input: normalised in fp32, result in bf16.
  const at::Tensor xb = x.to(at::kBFloat16);
  CHECK((wan_vae_rms_norm(xb, gamma.to(at::kBFloat16)).scalar_type() == at::kBFloat16));
  CHECK(rel_err(wan_vae_rms_norm(xb, gamma.to(at::kBFloat16)), want) < 1e-2);
  // Regression (bf16 parity broke): sqrt(C) multiplies in fp32 unrounded, as Python's `t * 2.449...`
  // does; C++ mul_(Scalar) would first round it to bf16 (2.453125).
  const at::Tensor gb = gamma.to(at::kBFloat16);
  const at::Tensor xf = xb.to(at::kFloat);
  const at::Tensor n = (xf / xf.pow(2).sum(1, true).sqrt().clamp_min(1e-12)).to(at::kBFloat16);
  const at::Tensor by_hand =
      ((n.to(at::kFloat) * static_cast<float>(std::sqrt(6.0))).to(at::kBFloat16).to(at::kFloat) * gb.to(at::kFloat))
          .to(at::kBFloat16);
  CHECK(at::equal(wan_vae_rms_norm(xb, gb), by_hand));

  TempDir dir;
  auto c = WanVaeConfig::preset("wan-vae-test");
  write_random_wan_vae(dir.file("vae"), c, DType::F32, 1, 0);
  auto m = WanVae::load(dir.file("vae"), at::kFloat);
  const at::Tensor lat = at::randn({1, 16, 2, 3, 3});
  const at::Tensor mean = at::tensor(std::vector<double>(c.latents_mean)).view({1, 16, 1, 1, 1});
  const at::Tensor std_ = at::tensor(std::vector<double>(c.latents_std)).view({1, 16, 1, 1, 1});
  const at::Tensor z = m.denormalize(lat);
  CHECK((z.scalar_type() == at::kFloat));
  CHECK(rel_err(z, lat.to(at::kDouble) * std_ + mean) < 1e-6);
}

TEST_CASE("decoding is causal: the first k latent frames decode to the first 1 + 4 (k - 1) frames, bit for bit") {
  TempDir dir;
  write_random_wan_vae(dir.file("vae"), WanVaeConfig::preset("wan-vae-test"), DType::F32, 5, 0);
  auto m = WanVae::load(dir.file("vae"), at::kFloat);
  at::manual_seed(5);
  const at::Tensor z = m.denormalize(at::randn({2, 16, 4, 3, 5}));
  const at::Tensor all = m.decode(z);
  REQUIRE(all.sizes() == at::IntArrayRef{2, 3, 13, 24, 40});
  for (std::int64_t k = 1; k <= 3; ++k) {
    CAPTURE(k);
    CHECK(at::equal(m.decode(z.narrow(2, 0, k)), all.narrow(2, 0, 1 + 4 * (k - 1))));
  }
  // Random weights give frames that neither vanish nor saturate the clamp.
  const double sd = all.std().item<double>();
  CHECK(sd > 0.05);
  CHECK(sd < 0.7);
  CHECK(all.abs().max().item<double>() <= 1.0);
  // Streaming yields the same frames chunk by chunk: 1 frame, then 4 per latent frame.
  std::vector<std::int64_t> firsts, counts;
  std::vector<at::Tensor> parts;
  m.decode_frames(z, [&](std::int64_t first, const at::Tensor& frames) {
    firsts.push_back(first);
    counts.push_back(frames.size(2));
    parts.push_back(frames.clone());
  });
  CHECK(firsts == std::vector<std::int64_t>{0, 1, 5, 9});
  CHECK(counts == std::vector<std::int64_t>{1, 4, 4, 4});
  CHECK(at::equal(at::cat(parts, 2), all));
}

TEST_CASE("dlo-checkpoint make writes the VAE with its model_index entry, deterministic by seed") {
  TempDir dir;
  MakeModelOptions o;
  o.components = {"transformer", "scheduler", "vae"};
  o.vae = WanVaeConfig::preset("wan-vae-test");
  o.seed = 11;
  make_model(dir.file("a"), o);
  make_model(dir.file("b"), o);
  o.seed = 12;
  make_model(dir.file("c"), o);
  std::ifstream in(dir.file("a/model_index.json"));
  const auto index = nlohmann::json::parse(in);
  CHECK(index["vae"] == nlohmann::json::array({"diffusers", "AutoencoderKLWan"}));
  CHECK(index["transformer"] == nlohmann::json::array({"diffusers", "WanTransformer3DModel"}));
  auto a = WanVae::load(dir.file("a/vae"), at::kFloat);
  auto b = WanVae::load(dir.file("b/vae"), at::kFloat);
  auto c = WanVae::load(dir.file("c/vae"), at::kFloat);
  CHECK(a.config().to_json() == o.vae.to_json());
  CHECK(at::equal(a.decoder().conv_out.w, b.decoder().conv_out.w));
  CHECK_FALSE(at::equal(a.decoder().conv_out.w, c.decoder().conv_out.w));
  // The default make config has the real structure at a small width.
  const WanVaeConfig d = MakeModelOptions{}.vae;
  CHECK(d.dim_mult == std::vector<std::int64_t>{1, 2, 4, 4});
  CHECK(d.num_res_blocks == 2);
  CHECK(d.temperal_downsample == std::vector<bool>{false, true, true});
}
