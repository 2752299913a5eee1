// The Wan VAE's tensor-name table (config/wan_vae_names.h), the config read from a VAE's shapes
// (infer_wan_vae_config) and a VAE given as its own weights in read_model_info. The expected
// names are written out by hand from the module trees diffusers 0.42.1's
// convert_wan_vae_to_diffusers (loaders/single_file_utils.py: the Wan2.1 VAE) and the conversion
// script's convert_vae_22 (the Wan2.2 VAE) map (../shared/reference/i2v-lora-fp8-notes.md 6.4),
// not taken from the table; the parity test (tools/reference/single_file_vae_parity.py) checks
// the Wan2.1 table against diffusers' function itself.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "common/model_folder.h"
#include "common/test_util.h"
#include "dlo/config/model_info.h"
#include "dlo/config/wan_tensor_names.h"
#include "dlo/config/wan_vae_config.h"
#include "dlo/config/wan_vae_names.h"
#include "dlo/io/safetensors_writer.h"

namespace {

using dlo::WanVaeConfig;
using dlo::WanVaeKeyLayout;
using dlo::test::error_of;
using dlo::test::TempDir;

bool mentions(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The real Wan2.1 VAE (2 residual blocks per stage; the decoder's flat list holds 4 per stage:
// 3 residual blocks and the upsampler), original name -> diffusers name.
const std::vector<std::pair<std::string, std::string>> kWan21ByHand = {
    {"conv1.weight", "quant_conv.weight"},
    {"conv2.bias", "post_quant_conv.bias"},
    {"encoder.conv1.weight", "encoder.conv_in.weight"},
    {"encoder.downsamples.0.residual.0.gamma", "encoder.down_blocks.0.norm1.gamma"},
    {"encoder.downsamples.1.residual.6.bias", "encoder.down_blocks.1.conv2.bias"},
    {"encoder.downsamples.2.resample.1.weight", "encoder.down_blocks.2.resample.1.weight"},
    {"encoder.downsamples.3.shortcut.weight", "encoder.down_blocks.3.conv_shortcut.weight"},
    {"encoder.downsamples.5.time_conv.bias", "encoder.down_blocks.5.time_conv.bias"},
    {"encoder.middle.0.residual.2.weight", "encoder.mid_block.resnets.0.conv1.weight"},
    {"encoder.middle.1.to_qkv.bias", "encoder.mid_block.attentions.0.to_qkv.bias"},
    {"encoder.middle.2.residual.3.gamma", "encoder.mid_block.resnets.1.norm2.gamma"},
    {"encoder.head.0.gamma", "encoder.norm_out.gamma"},
    {"encoder.head.2.weight", "encoder.conv_out.weight"},
    {"decoder.conv1.bias", "decoder.conv_in.bias"},
    {"decoder.middle.1.norm.gamma", "decoder.mid_block.attentions.0.norm.gamma"},
    {"decoder.middle.1.proj.weight", "decoder.mid_block.attentions.0.proj.weight"},
    {"decoder.upsamples.0.residual.0.gamma", "decoder.up_blocks.0.resnets.0.norm1.gamma"},
    {"decoder.upsamples.2.residual.6.weight", "decoder.up_blocks.0.resnets.2.conv2.weight"},
    {"decoder.upsamples.3.resample.1.weight", "decoder.up_blocks.0.upsamplers.0.resample.1.weight"},
    {"decoder.upsamples.3.time_conv.bias", "decoder.up_blocks.0.upsamplers.0.time_conv.bias"},
    {"decoder.upsamples.4.shortcut.weight", "decoder.up_blocks.1.resnets.0.conv_shortcut.weight"},
    {"decoder.upsamples.7.time_conv.weight", "decoder.up_blocks.1.upsamplers.0.time_conv.weight"},
    {"decoder.upsamples.11.resample.1.bias", "decoder.up_blocks.2.upsamplers.0.resample.1.bias"},
    {"decoder.upsamples.14.residual.6.bias", "decoder.up_blocks.3.resnets.2.conv2.bias"},
    {"decoder.head.0.gamma", "decoder.norm_out.gamma"},
    {"decoder.head.2.bias", "decoder.conv_out.bias"},
};

// The real Wan2.2 VAE: stage i's blocks one level down (Down_ResidualBlock / Up_ResidualBlock),
// the resampler last among them.
const std::vector<std::pair<std::string, std::string>> kWan22ByHand = {
    {"encoder.conv1.weight", "encoder.conv_in.weight"},
    {"encoder.downsamples.0.downsamples.0.residual.0.gamma", "encoder.down_blocks.0.resnets.0.norm1.gamma"},
    {"encoder.downsamples.1.downsamples.0.shortcut.weight", "encoder.down_blocks.1.resnets.0.conv_shortcut.weight"},
    {"encoder.downsamples.1.downsamples.1.residual.2.bias", "encoder.down_blocks.1.resnets.1.conv1.bias"},
    {"encoder.downsamples.0.downsamples.2.resample.1.weight", "encoder.down_blocks.0.downsampler.resample.1.weight"},
    {"encoder.downsamples.2.downsamples.2.time_conv.bias", "encoder.down_blocks.2.downsampler.time_conv.bias"},
    {"encoder.middle.2.residual.6.weight", "encoder.mid_block.resnets.1.conv2.weight"},
    {"conv1.bias", "quant_conv.bias"},
    {"conv2.weight", "post_quant_conv.weight"},
    {"decoder.upsamples.0.upsamples.0.residual.3.gamma", "decoder.up_blocks.0.resnets.0.norm2.gamma"},
    {"decoder.upsamples.2.upsamples.2.residual.6.bias", "decoder.up_blocks.2.resnets.2.conv2.bias"},
    {"decoder.upsamples.1.upsamples.0.shortcut.bias", "decoder.up_blocks.1.resnets.0.conv_shortcut.bias"},
    {"decoder.upsamples.0.upsamples.3.time_conv.weight", "decoder.up_blocks.0.upsampler.time_conv.weight"},
    {"decoder.upsamples.2.upsamples.3.resample.1.weight", "decoder.up_blocks.2.upsampler.resample.1.weight"},
    {"decoder.head.2.weight", "decoder.conv_out.weight"},
};

WanVaeKeyLayout original_layout(bool wan22, std::int64_t num_res_blocks) {
  WanVaeKeyLayout l;
  l.original = true;
  l.wan22 = wan22;
  l.num_res_blocks = num_res_blocks;
  return l;
}

std::vector<std::string> diffusers_names(const WanVaeConfig& c) {
  std::vector<std::string> out;
  for (const auto& s : dlo::wan_vae_specs(c, dlo::DType::F32)) out.push_back(s.name);
  return out;
}

std::map<std::string, std::vector<std::int64_t>> shapes_of(const WanVaeConfig& c) {
  std::map<std::string, std::vector<std::int64_t>> out;
  for (const auto& s : dlo::wan_vae_specs(c, dlo::DType::F32)) out[s.name] = s.shape;
  return out;
}

// A VAE of `c` written to `path` in the original layout (`original`) or diffusers'; tensor i's
// bytes are all i.
void write_vae(const std::string& path, const WanVaeConfig& c, bool original) {
  auto specs = dlo::wan_vae_specs(c, dlo::DType::BF16);
  const WanVaeKeyLayout to = original_layout(c.is_residual, c.num_res_blocks);
  if (original)
    for (auto& s : specs) s.name = *dlo::wan_vae_diffusers_to_original(s.name, to);
  dlo::write_safetensors_file(path, specs, [](std::size_t i, const dlo::TensorSpec& s, std::byte* out) {
    std::memset(out, static_cast<int>(i & 0xff), s.nbytes());
  }, {});
}

}  // namespace

TEST_CASE("vae names: the original Wan2.1 and Wan2.2 VAE layouts to diffusers' and back, by hand") {
  for (const bool wan22 : {false, true}) {
    const WanVaeKeyLayout l = original_layout(wan22, 2);
    for (const auto& [original, diffusers] : wan22 ? kWan22ByHand : kWan21ByHand) {
      CAPTURE(original);
      CHECK(dlo::wan_vae_original_to_diffusers(original, l).value_or("(none)") == diffusers);
      CHECK(dlo::wan_vae_diffusers_to_original(diffusers, l).value_or("(none)") == original);
    }
  }
  const WanVaeKeyLayout w21 = original_layout(false, 2), w22 = original_layout(true, 2);
  // Not the VAE's: a slot the stage does not have, a leading zero, a module no row has, the other tree.
  for (const char* other : {"decoder.upsamples.3.residual.0.gamma", "decoder.upsamples.01.residual.0.gamma",
                            "encoder.downsamples.0.attn.weight", "encoder.conv1x.weight", "decoder.middle.3.norm.gamma",
                            "encoder.downsamples.0.downsamples.0.residual.0.gamma",
                            "decoder.conv_in.weight", "first_stage_model.decoder.conv1.weight"})
    CHECK_MESSAGE(!dlo::wan_vae_original_to_diffusers(other, w21), other);
  for (const char* other : {"encoder.downsamples.0.downsamples.3.residual.0.gamma", "encoder.downsamples.0.residual.0.gamma",
                            "decoder.upsamples.0.upsamples.4.resample.1.weight", "decoder.upsamples.0.upsamples.1.resample.1.weight"})
    CHECK_MESSAGE(!dlo::wan_vae_original_to_diffusers(other, w22), other);
  for (const char* other : {"decoder.up_blocks.0.resnets.3.norm1.gamma", "decoder.up_blocks.0.upsampler.resample.1.weight",
                            "encoder.down_blocks.0.resnets.0.norm1.gamma", "decoder.conv1.weight"})
    CHECK_MESSAGE(!dlo::wan_vae_diffusers_to_original(other, w21), other);
  for (const char* other : {"encoder.down_blocks.0.resnets.2.norm1.gamma", "decoder.up_blocks.0.upsamplers.0.resample.1.weight",
                            "encoder.down_blocks.0.norm1.gamma"})
    CHECK_MESSAGE(!dlo::wan_vae_diffusers_to_original(other, w22), other);
  // The decoder's flat index follows the blocks per stage: 1 residual block per stage makes 3 per stage.
  CHECK(dlo::wan_vae_original_to_diffusers("decoder.upsamples.5.resample.1.weight", original_layout(false, 1)).value_or("") ==
        "decoder.up_blocks.1.upsamplers.0.resample.1.weight");
}

TEST_CASE("vae names: every tensor of each known VAE, both ways, one to one, and the layout read back from the names") {
  WanVaeConfig attn = WanVaeConfig::preset("wan-vae-test");
  attn.attn_scales = {1.0, 0.5};  // attention blocks in the encoder's flat list
  std::vector<std::pair<std::string, WanVaeConfig>> configs;
  for (const auto& name : WanVaeConfig::preset_names()) configs.emplace_back(name, WanVaeConfig::preset(name));
  configs.emplace_back("wan-vae-test with encoder attention", attn);
  for (const auto& [name, c] : configs) {
    CAPTURE(name);
    const WanVaeKeyLayout l = original_layout(c.is_residual, c.num_res_blocks);
    std::set<std::string> originals;
    std::vector<std::string> original_names;
    for (const auto& n : diffusers_names(c)) {
      CAPTURE(n);
      const auto original = dlo::wan_vae_diffusers_to_original(n, l);
      REQUIRE(original.has_value());
      CHECK(originals.insert(*original).second);
      original_names.push_back(*original);
      CHECK(dlo::wan_vae_original_to_diffusers(*original, l).value_or("(none)") == n);
    }
    CHECK(originals.size() == diffusers_names(c).size());
    for (const bool original : {false, true}) {
      const WanVaeKeyLayout got = dlo::detect_wan_vae_layout(original ? original_names : diffusers_names(c), name);
      CHECK(got.original == original);
      CHECK(got.wan22 == c.is_residual);
      CHECK(got.num_res_blocks == c.num_res_blocks);
    }
  }
  CHECK(original_layout(false, 2).describe() == "original Wan2.1 VAE layout");
  CHECK(dlo::detect_wan_vae_layout(diffusers_names(WanVaeConfig::preset("wan2.2-vae")), "f").describe() ==
        "diffusers layout (Wan2.2 VAE)");
}

TEST_CASE("vae names: a VAE written in the original layouts reads as diffusers', same bytes, and bad names are refused") {
  TempDir dir;
  for (const char* preset : {"wan2.1-vae-small", "wan2.2-vae-test"}) {
    CAPTURE(preset);
    const WanVaeConfig c = WanVaeConfig::preset(preset);
    write_vae(dir.file("diffusers.safetensors"), c, false);
    write_vae(dir.file("original.safetensors"), c, true);
    const dlo::Checkpoint reference = dlo::open_wan_vae(dir.file("diffusers.safetensors"));
    const dlo::Checkpoint ck = dlo::open_wan_vae(dir.file("original.safetensors"));
    REQUIRE(ck.tensors().size() == reference.tensors().size());
    for (std::size_t i = 0; i < ck.tensors().size(); ++i) {
      const dlo::TensorInfo& t = *ck.tensors()[i];
      const dlo::TensorInfo& r = *reference.tensors()[i];
      CHECK(t.name == r.name);
      CHECK(t.shape == r.shape);
      CHECK(std::memcmp(ck.data(t), reference.data(r), t.nbytes) == 0);
    }
    std::string matched;
    CHECK(dlo::infer_wan_vae_config(dlo::tensor_shapes(ck), nullptr, "f", &matched).z_dim == c.z_dim);
    CHECK(matched == preset);
  }
  const std::string msg = error_of([] {
    dlo::wan_vae_diffusers_names({"decoder.conv1.weight", "decoder.upsamples.0.residual.0.gamma", "decoder.upsamples.1.residual.0.gamma",
                                  "decoder.upsamples.2.residual.0.gamma", "decoder.upsamples.2.lora_up.weight",
                                  "model.diffusion_model.blocks.0.ffn.0.weight"},
                                 "vae.safetensors");
  });
  CHECK_MESSAGE(mentions(msg, "vae.safetensors: 2 tensor(s) are not the Wan VAE's in the original Wan2.1 VAE layout detected (2 "
                              "residual blocks per stage): 'decoder.upsamples.2.lora_up.weight', "
                              "'model.diffusion_model.blocks.0.ffn.0.weight'"),
                msg);
  const std::string transformer = error_of([] { dlo::detect_wan_vae_layout({"patch_embedding.weight", "head.head.weight"}, "t.safetensors"); });
  CHECK(mentions(transformer, "t.safetensors: not a Wan VAE in a layout dlo knows"));
  CHECK(mentions(transformer, "'patch_embedding.weight'"));
  const std::string pickle = error_of([] { dlo::open_wan_vae("/models/Wan2.1_VAE.pth"); });
  CHECK(mentions(pickle, "python tools/pickle_to_safetensors.py '/models/Wan2.1_VAE.pth' OUT.safetensors"));
}

TEST_CASE("vae config from shapes: each known VAE, against the folder's, refused shapes, missing and extra tensors") {
  for (const auto& name : WanVaeConfig::preset_names()) {
    CAPTURE(name);
    std::string matched;
    const WanVaeConfig c = dlo::infer_wan_vae_config(shapes_of(WanVaeConfig::preset(name)), nullptr, "f", &matched);
    CHECK(matched == name);
    CHECK(c.to_json() == WanVaeConfig::preset(name).to_json());
  }
  const WanVaeConfig w21 = WanVaeConfig::preset("wan2.1-vae"), w22 = WanVaeConfig::preset("wan2.2-vae");
  // The folder's config is taken (its statistics), its shapes checked.
  WanVaeConfig folder = w21;
  folder.latents_mean[0] = 0.5;
  CHECK(dlo::infer_wan_vae_config(shapes_of(w21), &folder, "f").latents_mean[0] == 0.5);
  CHECK(mentions(error_of([&] { dlo::infer_wan_vae_config(shapes_of(w21), &w22, "vae weights 'a.safetensors'"); }),
                 "vae weights 'a.safetensors': its tensors give z_dim 16, the model folder's vae config has 48"));
  WanVaeConfig narrow = WanVaeConfig::preset("wan2.1-vae-small");
  narrow.base_dim = 24;
  const std::string unknown = error_of([&] { dlo::infer_wan_vae_config(shapes_of(narrow), nullptr, "f"); });
  CHECK_MESSAGE(mentions(unknown, "its tensors are no known VAE's (z_dim 16, is_residual false, base_dim 24, in_channels 3"), unknown);
  CHECK(mentions(unknown, "known: wan-vae-test, wan2.1-vae-small, wan2.1-vae, wan2.2-vae, wan2.2-vae-test"));
  auto shapes = shapes_of(w21);
  shapes.erase("encoder.conv_out.bias");
  shapes["decoder.up_blocks.0.resnets.0.conv1.weight"][1] = 7;
  shapes["decoder.extra.weight"] = {1};
  CHECK(mentions(error_of([&] { dlo::infer_wan_vae_config(shapes, &w21, "f"); }), "lacks 1 tensor(s) of the VAE (diffusers' names): encoder.conv_out.bias"));
  shapes["encoder.conv_out.bias"] = {32};
  CHECK(mentions(error_of([&] { dlo::infer_wan_vae_config(shapes, &w21, "f"); }),
                 "decoder.up_blocks.0.resnets.0.conv1.weight [384, 7, 3, 3, 3] (expected [384, 384, 3, 3, 3])"));
  shapes["decoder.up_blocks.0.resnets.0.conv1.weight"][1] = 384;
  CHECK(mentions(error_of([&] { dlo::infer_wan_vae_config(shapes, &w21, "f"); }), "holds 1 tensor(s) the VAE does not have (diffusers' names): decoder.extra.weight"));
}

TEST_CASE("model parts: a VAE given as a file takes the folder's vae config, or a known one's without vae/, and refuses another z_dim") {
  TempDir dir;
  const std::string model = dir.file("model");
  dlo::test::write_config_only_model(model);  // wan2.1-vae-small's vae/config.json, a 16-channel transformer
  write_vae(dir.file("small.safetensors"), WanVaeConfig::preset("wan2.1-vae-small"), true);
  write_vae(dir.file("wan22.safetensors"), WanVaeConfig::preset("wan2.2-vae-test"), true);
  WanVaeConfig stats = WanVaeConfig::preset("wan2.1-vae-small");
  stats.latents_std[3] = 9.0;
  dlo::test::write_file(model + "/vae/config.json", stats.to_json());
  dlo::ModelParts parts{model, "", "", dir.file("small.safetensors")};
  CHECK(parts.vae_weights() == dir.file("small.safetensors"));
  CHECK(dlo::read_model_info(parts).vae.latents_std[3] == 9.0);
  // The identity covers the file (and the folder's vae/config.json, whose statistics still decode).
  const std::string with_file = dlo::model_identity(parts);
  CHECK(with_file != dlo::model_identity(model));
  stats.latents_std[3] = 8.0;
  dlo::test::write_file(model + "/vae/config.json", stats.to_json());
  CHECK(dlo::model_identity(parts) != with_file);
  parts.vae_file = dir.file("wan22.safetensors");
  CHECK(mentions(error_of([&] { dlo::read_model_info(parts); }), "its tensors give z_dim 12, the model folder's vae config has 16"));
  // No vae/: the known config the shapes match; the transformer's channels must still be its z_dim.
  std::filesystem::remove_all(model + "/vae");
  CHECK(mentions(error_of([&] { dlo::read_model_info(parts); }),
                 "differ from the VAE's z_dim (12) of the vae weights '" + dir.file("wan22.safetensors") + "'"));
  parts.vae_file = dir.file("small.safetensors");
  CHECK(dlo::read_model_info(parts).vae.to_json() == WanVaeConfig::preset("wan2.1-vae-small").to_json());
  CHECK(mentions(error_of([&] { dlo::read_model_info(model); }), "lacks vae/"));
}
