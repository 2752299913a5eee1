// dlo/models/wan_vae.h: config checks, tensor list, weights as views, input checks, causal-cache
// algebra for every chunk/cache combination, frame streaming, and the decode against diffusers'
// outputs stored in tests/data/goldens (cpu label). Wider parity runs are in
// tools/reference/wan_vae_parity.py (label parity).
#include "common/doctest_torch.h"

#include <map>
#include <mutex>
#include <fstream>
#include <sstream>

#include <c10/core/CPUAllocator.h>
#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "dlo/common/error.h"
#include "dlo/io/json_config.h"
#include "dlo/testing/make_model.h"
#include "dlo/config/wan_tensor_names.h"
#include "dlo/config/wan_vae_names.h"
#include "dlo/io/safetensors_writer.h"
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

namespace {

// The CPU allocator, counting: the bytes of tensor storage held now and at the peak since reset().
// Installed for its lifetime (c10::SetCPUAllocator; mmap'ed weights are no allocations). oneDNN
// frees through raw_deleter(), so the pointers are plain (data == context) and their sizes kept in
// a table; one instance at a time.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  CountingCpuAllocator() : base_(c10::GetCPUAllocator()) {
    std::lock_guard<std::mutex> lock(mutex_);
    start_ = peak_ = now_;
    c10::SetCPUAllocator(this, kPriority);
  }
  ~CountingCpuAllocator() override {
    c10::SetCPUAllocator(base_, kPriority);
    // Storage allocated while counting but freed later goes back through release(): keep the table.
  }
  CountingCpuAllocator(const CountingCpuAllocator&) = delete;
  CountingCpuAllocator& operator=(const CountingCpuAllocator&) = delete;
  // The most bytes held at once since construction, beyond those held then.
  std::int64_t peak() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_ - start_;
  }
  c10::DataPtr allocate(std::size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    std::lock_guard<std::mutex> lock(mutex_);
    base_deleter_ = inner.get_deleter();
    (void)inner.release_context();  // freed by release()
    sizes_[data] = static_cast<std::int64_t>(n);
    now_ += static_cast<std::int64_t>(n);
    peak_ = std::max(peak_, now_);
    return {data, data, &release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

 private:
  static constexpr std::uint8_t kPriority = 200;
  static void release(void* p) {
    c10::DeleterFnPtr free_base = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = sizes_.find(p);
      if (it != sizes_.end()) {
        now_ -= it->second;
        sizes_.erase(it);
      }
      free_base = base_deleter_;
    }
    free_base(p);
  }
  c10::Allocator* base_;
  static inline std::mutex mutex_;
  static inline std::map<void*, std::int64_t> sizes_;
  static inline std::int64_t now_ = 0, peak_ = 0, start_ = 0;
  static inline c10::DeleterFnPtr base_deleter_ = nullptr;
};

}  // namespace

// The estimate against what encode allocates, measured: the CPU allocator counts every tensor's
// storage (the mmap'ed weights are none). 1 frame (chunk 0 alone) and 9 (the caches full), two
// sizes, fp32 and bf16, both VAE structures. Measured within 0.3 % (the estimate leaves out the
// small temporaries of the norms and resamplers, which do not overlap the largest conv); the bar is 3 %.
TEST_CASE("wan_vae_encode_memory: the peak encode allocates on the CPU, measured, within 3 %") {
  at::set_num_threads(1);
  TempDir dir;
  for (const std::string preset : {"wan2.1-vae-small", "wan2.2-vae-test"}) {
    const WanVaeConfig c = WanVaeConfig::preset(preset);
    write_random_wan_vae(dir.file(preset), c, DType::F32, 3, 0);
    for (const auto dt : {at::kFloat, at::kBFloat16}) {
      const auto m = WanVae::load(dir.file(preset), c, dt, WanVaeParts::kEncoder);
      for (const std::int64_t f : {1, 9}) {
        for (const auto& [h, w] : {std::pair<std::int64_t, std::int64_t>{32, 48}, {64, 32}}) {
          if (dt != at::kFloat && h != 32) continue;
          CAPTURE(preset);
          CAPTURE(dt);
          CAPTURE(f);
          CAPTURE(h);
          const at::Tensor video = (at::rand({1, 3, f, h, w}) * 2 - 1).to(dt);
          std::int64_t peak = 0;
          {
            CountingCpuAllocator counter;
            (void)m.encode(video);
            peak = counter.peak();
          }
          const auto est = wan_vae_encode_memory(c, f, h, w, static_cast<std::int64_t>(c10::elementSize(dt)));
          CHECK(est.columns > est.working);  // the CPU's column buffer is the largest part
          CHECK(static_cast<double>(est.host()) == doctest::Approx(static_cast<double>(peak)).epsilon(0.03));
        }
      }
    }
  }
  // The real Wan2.1 VAE on an 81-frame 480x832 condition video (Wan2.1 / Wan2.2 I2V), fp32: the
  // first stage's 96 channels x 27 x 4 frames of columns alone are 15.4 GiB on the CPU.
  const auto real = wan_vae_encode_memory(WanVaeConfig::preset("wan2.1-vae"), 81, 480, 832, 4);
  CHECK(real.columns == 96ull * 27 * 4 * 480 * 832 * 4);
  MESSAGE("Wan2.1 VAE encode of 81 x 480 x 832 in fp32: host ", real.host(), " B, device ", real.device(), " B");
}

// ---------------------------------------------------------------------------------------------
// The encoder

namespace {

// Encodes the golden `name`'s video with the VAE its config and seed describe, and checks the
// posterior mean and its normalisation against diffusers' (golden.h: bitwise on the CPU that made
// it, elsewhere within its bar).
void check_vae_encode_golden(const std::string& name) {
  CAPTURE(name);
  at::set_num_threads(1);
  const dlo::test::Golden g(name);
  TempDir dir;
  const auto c = WanVaeConfig::from_json(JsonConfig::parse(g.meta("config"), name));
  write_random_wan_vae(dir.file("vae"), c, g.weights_dtype(), g.seed(), 0);
  g.check_weights(dir.file("vae"));
  const auto m = WanVae::load(dir.file("vae"), g.compute_dtype(), WanVaeParts::kEncoder);
  const at::Tensor z = m.encode(g.get("video"));
  const at::Tensor want = g.get("output");
  REQUIRE(z.sizes() == want.sizes());
  REQUIRE((z.scalar_type() == want.scalar_type()));
  g.check_output(z, want);
  g.check_output(m.normalize(z), g.get("latents_normalized"));
}

}  // namespace

// diffusers' AutoencoderKLWan.encode(video).latent_dist.mode() and WanImageToVideoPipeline's
// normalisation on the same weights: 9 frames (frame 0 alone, a chunk of 4 on caches of 1 frame,
// one on full caches) of the real Wan2.1 structure at base_dim 16, and of the Wan2.2 structure
// (2x2 patchify, residual stages with AvgDown3D shortcuts, z_dim 48) at base_dim 8.
TEST_CASE("encode equals diffusers' (the I2V pipeline's) golden, Wan2.1's encoder and Wan2.2's residual one") {
  for (const std::string name : {"wan_vae_encode_fp32", "wan_vae22_encode_fp32"}) check_vae_encode_golden(name);
}

// Not bit for bit: quant_conv runs over all latent frames at once, and every conv over the batch,
// as one GEMM whose blocking (so rounding) depends on its size. Measured rel 1e-7 at most; bar 1e-5.
TEST_CASE("encoding is causal: the first 1 + 4k frames encode to the first 1 + k latent frames") {
  at::set_num_threads(1);
  TempDir dir;
  for (const std::string preset : {"wan-vae-test", "wan2.2-vae-test"}) {
    CAPTURE(preset);
    const auto c = WanVaeConfig::preset(preset);
    write_random_wan_vae(dir.file(preset), c, DType::F32, 6, 0);
    const auto m = WanVae::load(dir.file(preset), c, at::kFloat, WanVaeParts::kEncoder);
    at::manual_seed(6);
    const at::Tensor video = at::rand({2, 3, 9, 16, 32}) * 2 - 1;
    const at::Tensor all = m.encode(video);
    REQUIRE(all.sizes() == at::IntArrayRef{2, c.z_dim, 3, 16 / c.scale_factor_spatial, 32 / c.scale_factor_spatial});
    for (std::int64_t k = 0; k <= 1; ++k) {
      CAPTURE(k);
      const double err = rel_err(m.encode(video.narrow(2, 0, 1 + 4 * k)), all.narrow(2, 0, 1 + k));
      CHECK(err < 1e-5);
    }
    // Each video of a batch alone: the same latents.
    CHECK(rel_err(m.encode(video.narrow(0, 1, 1)), all.narrow(0, 1, 1)) < 1e-5);
    // A change in frame 1 leaves latent frame 0 and reaches latent frame 2 (through the caches).
    at::Tensor changed = video.clone();
    changed.narrow(2, 1, 1).fill_(0.5);
    const at::Tensor z2 = m.encode(changed);
    CHECK(rel_err(z2.narrow(2, 0, 1), all.narrow(2, 0, 1)) < 1e-5);
    CHECK(rel_err(z2.narrow(2, 2, 1), all.narrow(2, 2, 1)) > 1e-3);
  }
}

TEST_CASE("the encoder loads only when asked for: a VAE without it refuses encode, and one without the decoder decode") {
  TempDir dir;
  const auto c = WanVaeConfig::preset("wan-vae-test");
  write_random_wan_vae(dir.file("vae"), c, DType::F32, 2, 0);
  const auto dec = WanVae::load(dir.file("vae"), at::kFloat);  // text to video: the decoder only
  CHECK(dec.has_decoder());
  CHECK_FALSE(dec.has_encoder());
  CHECK_FALSE(dec.encoder().conv_in.w.defined());
  CHECK(dec.encoder().down_blocks.empty());
  const at::Tensor video = at::rand({1, 3, 5, 16, 16});
  CHECK_THROWS_WITH_AS(dec.encode(video), doctest::Contains("vae encode: the VAE was loaded without its encoder"), Error);
  const auto enc = WanVae::load(dir.file("vae"), at::kFloat, WanVaeParts::kEncoder);
  CHECK_FALSE(enc.decoder().conv_in.w.defined());
  CHECK_THROWS_WITH_AS(enc.decode(at::randn({1, 16, 1, 2, 2})), doctest::Contains("loaded without its decoder"), Error);
  const auto both = WanVae::load(dir.file("vae"), at::kFloat, WanVaeParts::kEncoderAndDecoder);
  CHECK(at::equal(both.encode(video), enc.encode(video)));
  const at::Tensor z = at::randn({1, 16, 2, 2, 2});
  CHECK(at::equal(both.decode(z), dec.decode(z)));
  // The encoder's weights in the compute dtype are views into the mapping, as the decoder's.
  const auto& map = enc.weights().checkpoint().files()[0]->mapping();
  const auto* p = static_cast<const std::byte*>(enc.encoder().down_blocks[1].time_conv.w.data_ptr());
  CHECK((p >= map->data() && p < map->data() + map->size()));
  CHECK(enc.encoder().down_blocks[0].mode == WanVaeDownsample::kSpatial);
  CHECK(enc.encoder().down_blocks[1].mode == WanVaeDownsample::kTemporal);
  CHECK(enc.encoder().down_blocks[3].mode == WanVaeDownsample::kNone);
}

TEST_CASE("bad videos are refused with the input named, before any work") {
  TempDir dir;
  write_random_wan_vae(dir.file("a"), WanVaeConfig::preset("wan-vae-test"), DType::F32, 1, 0);
  write_random_wan_vae(dir.file("b"), WanVaeConfig::preset("wan2.2-vae-test"), DType::F32, 1, 0);
  const auto m = WanVae::load(dir.file("a"), at::kFloat, WanVaeParts::kEncoder);
  const auto m22 = WanVae::load(dir.file("b"), WanVaeConfig::preset("wan2.2-vae-test"), at::kFloat, WanVaeParts::kEncoder);
  CHECK_THROWS_WITH_AS(m.encode(at::rand({1, 4, 5, 16, 16})), "video must be [B, 3, F, H, W], got [1, 4, 5, 16, 16]", Error);
  CHECK_THROWS_WITH_AS(m.encode(at::rand({3, 5, 16, 16})), doctest::Contains("video must be [B, 3, F, H, W]"), Error);
  CHECK_THROWS_WITH_AS(m.encode(at::rand({1, 3, 6, 16, 16})),
                       "video has 6 frames; the encoder takes 1 + 4k (frame 0, then chunks of 4; diffusers would drop the last 1)",
                       Error);
  CHECK_THROWS_WITH_AS(m.encode(at::rand({1, 3, 0, 16, 16})), "video is empty: [1, 3, 0, 16, 16]", Error);
  CHECK_THROWS_WITH_AS(m.encode(at::zeros({1, 3, 1, 16, 16}, at::kByte)), doctest::Contains("video must be floating point"), Error);
  CHECK_THROWS_WITH_AS(m.encode(at::rand({1, 3, 1, 7, 16})),
                       "video is 7x16 pixels; the encoder's 3 downsamplings need at least 8", Error);
  CHECK(m.encode(at::rand({1, 3, 1, 9, 13})).sizes() == at::IntArrayRef{1, 16, 1, 1, 1});  // Wan2.1: any size >= 8
  CHECK_THROWS_WITH_AS(m22.encode(at::rand({1, 3, 1, 16, 17})),
                       "video is 16x17 pixels; patch_size 2 needs multiples of 2", Error);
  CHECK_THROWS_WITH_AS(m22.encode(at::rand({1, 3, 1, 16, 24})),
                       "video is 16x24 pixels; the encoder's 3 downsamplings need multiples of 16", Error);
  // Attention in the encoder's stages (attn_scales): diffusers cannot encode with it either.
  auto attn = WanVaeConfig::preset("wan-vae-test");
  attn.attn_scales = {0.5};
  write_random_wan_vae(dir.file("c"), attn, DType::F32, 1, 0);
  CHECK_NOTHROW(WanVae::load(dir.file("c"), at::kFloat));
  CHECK_THROWS_WITH_AS(WanVae::load(dir.file("c"), at::kFloat, WanVaeParts::kEncoder),
                       doctest::Contains("the encoder has attention blocks in its stage 1 (field 'attn_scales')"), Error);
}

// --vae FILE: an original-layout single file (Wan-AI's Wan2.1_VAE / Wan2.2_VAE, ComfyUI's) holds the
// encoder under the original names too (encoder.downsamples.N[.downsamples.M].residual.K, head,
// conv1 = quant_conv); read through the name table, it encodes as the folder does.
TEST_CASE("the single-file VAE in the original Wan2.1 and Wan2.2 layouts loads its encoder and encodes as the folder") {
  at::set_num_threads(1);
  TempDir dir;
  for (const std::string preset : {"wan2.1-vae-small", "wan2.2-vae-test"}) {
    CAPTURE(preset);
    const auto c = WanVaeConfig::preset(preset);
    write_random_wan_vae(dir.file(preset + "/vae"), c, DType::F32, 4, 0);
    {
      Checkpoint ck = open_wan_vae(dir.file(preset + "/vae"));
      WanVaeKeyLayout to;
      to.original = true;
      to.wan22 = c.is_residual;
      to.num_res_blocks = c.num_res_blocks;
      ck.rename_tensors([&](const std::string& n) { return *wan_vae_diffusers_to_original(n, to); });
      WriteOptions w;
      w.base_name = "original_vae";
      copy_checkpoint(ck, dir.file(preset + "/file"), w);
    }
    const std::string file = dir.file(preset + "/file/original_vae.safetensors");
    REQUIRE(Checkpoint::open(file).find("encoder.conv1.weight") != nullptr);  // the original names
    REQUIRE(Checkpoint::open(file).find("conv1.bias") != nullptr);            // quant_conv
    std::string matched;
    const auto from_file = infer_wan_vae_config(tensor_shapes(open_wan_vae(file)), nullptr, file, &matched);
    CHECK(matched == preset);
    const auto a = WanVae::load(dir.file(preset + "/vae"), at::kFloat, WanVaeParts::kEncoder);
    const auto b = WanVae::load(file, from_file, at::kFloat, WanVaeParts::kEncoder);
    const at::Tensor video = at::rand({1, 3, 5, 32, 16}) * 2 - 1;
    CHECK(at::equal(b.encode(video), a.encode(video)));
    CHECK(at::equal(b.encoder().quant_conv.w, a.encoder().quant_conv.w));
  }
}

TEST_CASE("normalize: (latents - latents_mean) * (1 / latents_std) in fp32, by hand") {
  TempDir dir;
  const auto c = WanVaeConfig::preset("wan2.2-vae-test");
  write_random_wan_vae(dir.file("vae"), c, DType::F32, 1, 0);
  const auto m = WanVae::load(dir.file("vae"), c, at::kBFloat16, WanVaeParts::kEncoder);
  const at::Tensor lat = at::randn({2, c.z_dim, 2, 3, 3}).to(at::kBFloat16);
  const at::Tensor n = m.normalize(lat);
  CHECK((n.scalar_type() == at::kFloat));  // the pipeline's condition is fp32 whatever the VAE's dtype
  const at::Tensor mean = at::tensor(c.latents_mean).view({1, c.z_dim, 1, 1, 1});
  const at::Tensor std_ = at::tensor(c.latents_std).view({1, c.z_dim, 1, 1, 1});
  CHECK(rel_err(n, (lat.to(at::kDouble) - mean) / std_) < 1e-6);
  // The denormalisation undoes it (to rounding).
  CHECK(rel_err(m.denormalize(n).to(at::kDouble), lat.to(at::kDouble)) < 1e-2);
}
