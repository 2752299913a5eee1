// The Wan transformer's tensor-name table (config/wan_tensor_names.h) and the config read from a
// transformer's shapes (infer_wan_transformer_config). The expected names are written out by hand
// from diffusers 0.42.1's convert_wan_transformer_to_diffusers (loaders/single_file_utils.py,
// ../shared/reference/i2v-lora-fp8-notes.md section 6.2), not taken from the table; the parity
// test (tools/reference/single_file_parity.py) checks the table against that function itself.
#include <doctest/doctest.h>

#include <cstring>
#include <set>

#include "common/test_util.h"
#include "dlo/config/wan_tensor_names.h"
#include "dlo/config/wan_transformer_config.h"
#include "dlo/io/safetensors_writer.h"

namespace {

using dlo::test::error_of;
using dlo::test::TempDir;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Original name -> diffusers name, by hand, for block 7 and the rest.
const std::vector<std::pair<std::string, std::string>> kByHand = {
    {"patch_embedding.weight", "patch_embedding.weight"},
    {"patch_embedding.bias", "patch_embedding.bias"},
    {"text_embedding.0.weight", "condition_embedder.text_embedder.linear_1.weight"},
    {"text_embedding.2.bias", "condition_embedder.text_embedder.linear_2.bias"},
    {"time_embedding.0.bias", "condition_embedder.time_embedder.linear_1.bias"},
    {"time_embedding.2.weight", "condition_embedder.time_embedder.linear_2.weight"},
    {"time_projection.1.weight", "condition_embedder.time_proj.weight"},
    {"head.head.weight", "proj_out.weight"},
    {"head.head.bias", "proj_out.bias"},
    {"head.modulation", "scale_shift_table"},
    {"img_emb.proj.0.weight", "condition_embedder.image_embedder.norm1.weight"},
    {"img_emb.proj.1.bias", "condition_embedder.image_embedder.ff.net.0.proj.bias"},
    {"img_emb.proj.3.weight", "condition_embedder.image_embedder.ff.net.2.weight"},
    {"img_emb.proj.4.bias", "condition_embedder.image_embedder.norm2.bias"},
    {"img_emb.emb_pos", "condition_embedder.image_embedder.pos_embed"},
    {"blocks.7.modulation", "blocks.7.scale_shift_table"},
    {"blocks.7.self_attn.q.weight", "blocks.7.attn1.to_q.weight"},
    {"blocks.7.self_attn.k.bias", "blocks.7.attn1.to_k.bias"},
    {"blocks.7.self_attn.v.weight", "blocks.7.attn1.to_v.weight"},
    {"blocks.7.self_attn.o.bias", "blocks.7.attn1.to_out.0.bias"},
    {"blocks.7.self_attn.norm_q.weight", "blocks.7.attn1.norm_q.weight"},
    {"blocks.7.self_attn.norm_k.weight", "blocks.7.attn1.norm_k.weight"},
    {"blocks.7.cross_attn.q.bias", "blocks.7.attn2.to_q.bias"},
    {"blocks.7.cross_attn.k.weight", "blocks.7.attn2.to_k.weight"},
    {"blocks.7.cross_attn.v.bias", "blocks.7.attn2.to_v.bias"},
    {"blocks.7.cross_attn.o.weight", "blocks.7.attn2.to_out.0.weight"},
    {"blocks.7.cross_attn.norm_q.weight", "blocks.7.attn2.norm_q.weight"},
    {"blocks.7.cross_attn.norm_k.weight", "blocks.7.attn2.norm_k.weight"},
    {"blocks.7.cross_attn.k_img.weight", "blocks.7.attn2.add_k_proj.weight"},
    {"blocks.7.cross_attn.v_img.bias", "blocks.7.attn2.add_v_proj.bias"},
    {"blocks.7.cross_attn.norm_k_img.weight", "blocks.7.attn2.norm_added_k.weight"},
    {"blocks.7.norm3.weight", "blocks.7.norm2.weight"},
    {"blocks.7.norm3.bias", "blocks.7.norm2.bias"},
    {"blocks.7.ffn.0.weight", "blocks.7.ffn.net.0.proj.weight"},
    {"blocks.7.ffn.0.bias", "blocks.7.ffn.net.0.proj.bias"},
    {"blocks.7.ffn.2.weight", "blocks.7.ffn.net.2.weight"},
    {"blocks.7.ffn.2.bias", "blocks.7.ffn.net.2.bias"},
    // Tails are kept: a scaled fp8 file's scales, a LoRA's factors.
    {"blocks.7.self_attn.q.scale_weight", "blocks.7.attn1.to_q.scale_weight"},
    {"blocks.12.ffn.2.lora_A.weight", "blocks.12.ffn.net.2.lora_A.weight"},
};

// Every tensor name of a transformer of `c`, in diffusers' layout.
std::vector<std::string> diffusers_names(const dlo::WanTransformerConfig& c) {
  std::vector<std::string> out;
  for (const auto& s : dlo::wan_transformer_specs(c, dlo::DType::F32)) out.push_back(s.name);
  return out;
}

dlo::TensorShapeMap shapes_of(const dlo::WanTransformerConfig& c) {
  dlo::TensorShapeMap out;
  for (const auto& s : dlo::wan_transformer_specs(c, dlo::DType::F32)) out[s.name] = s.shape;
  return out;
}

// A transformer of `c` written to `path` with its names through `rename`; tensor i's bytes are all i.
void write_transformer(const std::string& path, const dlo::WanTransformerConfig& c,
                       const std::function<std::string(const std::string&)>& rename) {
  auto specs = dlo::wan_transformer_specs(c, dlo::DType::F32);
  for (auto& s : specs) s.name = rename(s.name);
  dlo::write_safetensors_file(path, specs, [](std::size_t i, const dlo::TensorSpec& s, std::byte* out) {
    std::memset(out, static_cast<int>(i & 0xff), s.nbytes());
  }, {});
}

}  // namespace

TEST_CASE("tensor names: the original Wan layout to diffusers' and back, by hand") {
  for (const auto& [original, diffusers] : kByHand) {
    CAPTURE(original);
    CHECK(dlo::wan_original_to_diffusers(original).value_or("(none)") == diffusers);
    CHECK(dlo::wan_diffusers_to_original(diffusers).value_or("(none)") == original);
  }
  // Names no row maps: not the transformer's (a VAE's, an unknown module, an index that is not one).
  for (const char* other : {"decoder.conv_in.weight", "blocks.1.self_attn.qq.weight", "blocks.x.ffn.0.weight",
                            "blocks.01.ffn.0.weight", "head", "blocks.3", "head.headx.weight", "modulation"})
    CHECK_MESSAGE(!dlo::wan_original_to_diffusers(other), other);
  // A diffusers name is not an original one where the layouts differ (a file in one is never read as the other).
  CHECK(!dlo::wan_original_to_diffusers("blocks.0.attn1.to_q.weight"));
  CHECK(!dlo::wan_diffusers_to_original("blocks.0.self_attn.q.weight"));
}

TEST_CASE("tensor names: every tensor of a tiny transformer, both ways, one to one") {
  dlo::WanTransformerConfig c = dlo::WanTransformerConfig::preset("wan-test");
  c.num_layers = 3;
  std::set<std::string> originals;
  for (const auto& name : diffusers_names(c)) {
    CAPTURE(name);
    const auto original = dlo::wan_diffusers_to_original(name);
    REQUIRE(original.has_value());
    CHECK(originals.insert(*original).second);
    CHECK(dlo::wan_original_to_diffusers(*original).value_or("(none)") == name);
  }
  CHECK(originals.size() == diffusers_names(c).size());
}

TEST_CASE("tensor names: a tiny transformer written in the original and ComfyUI layouts reads as diffusers', same bytes") {
  TempDir dir;
  const dlo::WanTransformerConfig c = dlo::WanTransformerConfig::preset("wan-test");
  const auto to_original = [](const std::string& n) { return *dlo::wan_diffusers_to_original(n); };
  write_transformer(dir.file("diffusers.safetensors"), c, [](const std::string& n) { return n; });
  write_transformer(dir.file("original.safetensors"), c, to_original);
  write_transformer(dir.file("comfyui.safetensors"), c, [&](const std::string& n) { return "model.diffusion_model." + to_original(n); });
  write_transformer(dir.file("prefixed.safetensors"), c, [&](const std::string& n) { return "diffusion_model." + to_original(n); });
  const dlo::Checkpoint reference = dlo::open_wan_transformer(dir.file("diffusers.safetensors"));
  for (const char* file : {"original", "comfyui", "prefixed"}) {
    CAPTURE(file);
    const dlo::Checkpoint ck = dlo::open_wan_transformer(dir.file(std::string(file) + ".safetensors"));
    REQUIRE(ck.tensors().size() == reference.tensors().size());
    for (std::size_t i = 0; i < ck.tensors().size(); ++i) {
      const dlo::TensorInfo& t = *ck.tensors()[i];
      const dlo::TensorInfo& r = *reference.tensors()[i];
      CHECK(t.name == r.name);
      CHECK(t.shape == r.shape);
      CHECK(std::memcmp(ck.data(t), reference.data(r), t.nbytes) == 0);
      // A name map, no copy: the tensor is where the file has it.
      const auto& map = ck.file_of(t).mapping();
      CHECK((ck.data(t) >= map->data() && ck.data(t) + t.nbytes <= map->data() + map->size()));
    }
    CHECK(ck.find("blocks.1.attn2.to_out.0.weight") != nullptr);
  }
  CHECK(dlo::detect_wan_key_layout({"model.diffusion_model.patch_embedding.weight", "model.diffusion_model.head.head.weight"}, "f")
            .describe() == "ComfyUI layout (original Wan names under 'model.diffusion_model.')");
  CHECK(dlo::detect_wan_key_layout({"patch_embedding.weight", "proj_out.weight"}, "f").describe() == "diffusers layout");
}

TEST_CASE("tensor names: unknown names listed with the layout detected, not a transformer, a pickle") {
  std::vector<std::string> names = {"model.diffusion_model.patch_embedding.weight", "model.diffusion_model.head.head.weight",
                                    "model.diffusion_model.blocks.0.self_attn.q.weight", "model.diffusion_model.blocks.0.lora.up",
                                    "first_stage_model.decoder.conv_in.weight", "model.diffusion_model.blocks.0.attn1.to_q.weight"};
  const std::string msg = error_of([&] { dlo::wan_diffusers_names(names, "x.safetensors"); });
  CHECK(contains(msg, "x.safetensors: 3 tensor(s) are not the Wan transformer's in the ComfyUI layout (original Wan names "
                      "under 'model.diffusion_model.') detected: 'model.diffusion_model.blocks.0.lora.up', "
                      "'first_stage_model.decoder.conv_in.weight', 'model.diffusion_model.blocks.0.attn1.to_q.weight'"));
  const std::string vae = error_of([] { dlo::wan_diffusers_names({"decoder.conv_in.weight", "encoder.conv_in.bias"}, "vae.safetensors"); });
  CHECK(contains(vae, "vae.safetensors: not a Wan transformer in a layout dlo knows"));
  CHECK(contains(vae, "'decoder.conv_in.weight'"));
  // Both heads: ambiguous, refused.
  CHECK(contains(error_of([] { dlo::detect_wan_key_layout({"patch_embedding.weight", "proj_out.weight", "head.head.weight"}, "f"); }),
                 "not a Wan transformer"));
  const std::string pickle = error_of([] { dlo::open_wan_transformer("/models/wan2.1_t2v_1.3B.pth"); });
  CHECK(contains(pickle, "'/models/wan2.1_t2v_1.3B.pth' is a PyTorch pickle"));
  CHECK(contains(pickle, "python tools/pickle_to_safetensors.py '/models/wan2.1_t2v_1.3B.pth' OUT.safetensors"));
}

TEST_CASE("config from shapes: each known config, from its tensors' shapes alone") {
  // The real models' fields by hand (diffusers' configs: heads of 128, eps 1e-6, text 4096, freq 256).
  struct Known {
    const char* name;
    std::int64_t heads, ffn, layers, in, out;
  };
  for (const Known k : {Known{"wan2.1-t2v-1.3b", 12, 8960, 30, 16, 16}, Known{"wan2.1-t2v-14b", 40, 13824, 40, 16, 16},
                        Known{"wan2.2-ti2v-5b", 24, 14336, 30, 48, 48}}) {
    CAPTURE(k.name);
    dlo::WanTransformerConfig c;
    c.num_attention_heads = k.heads;
    c.ffn_dim = k.ffn;
    c.num_layers = k.layers;
    c.in_channels = k.in;
    c.out_channels = k.out;
    std::string matched;
    const dlo::WanTransformerConfig got = dlo::infer_wan_transformer_config(shapes_of(c), nullptr, "f", &matched);
    CHECK(matched == k.name);
    CHECK(got.num_attention_heads == k.heads);
    CHECK(got.attention_head_dim == 128);
    CHECK(got.ffn_dim == k.ffn);
    CHECK(got.num_layers == k.layers);
    CHECK(got.in_channels == k.in);
    CHECK(got.out_channels == k.out);
    CHECK(got.text_dim == 4096);
    CHECK(got.freq_dim == 256);
    CHECK(got.eps == 1e-6);
    CHECK(got.cross_attn_norm);
  }
  // Each preset (the test shapes too) is found again from its shapes; A14B's experts read as 14B's shape.
  for (const auto& name : dlo::WanTransformerConfig::preset_names()) {
    CAPTURE(name);
    const dlo::WanTransformerConfig p = dlo::WanTransformerConfig::preset(name);
    std::string matched;
    const dlo::WanTransformerConfig got = dlo::infer_wan_transformer_config(shapes_of(p), nullptr, "f", &matched);
    CHECK(got.to_json() == p.to_json());
    CHECK(dlo::WanTransformerConfig::preset(matched).to_json() == p.to_json());
  }
}

TEST_CASE("config from shapes: against the folder's config, refused shapes, missing and extra tensors") {
  dlo::WanTransformerConfig folder = dlo::WanTransformerConfig::preset("wan-test");
  folder.num_layers = 3;
  folder.rope_max_seq_len = 64;
  folder.eps = 1e-5;
  // Agreeing shapes: the folder's config, with what shapes cannot show (heads, eps, RoPE length).
  CHECK(dlo::infer_wan_transformer_config(shapes_of(folder), &folder, "f").to_json() == folder.to_json());
  // Each field the shapes show, changed in the file: an error naming it.
  const auto differs = [&](const std::function<void(dlo::WanTransformerConfig&)>& change, const std::string& field) {
    dlo::WanTransformerConfig file = folder;
    change(file);
    const std::string msg = error_of([&] { dlo::infer_wan_transformer_config(shapes_of(file), &folder, "t.safetensors"); });
    CHECK_MESSAGE(contains(msg, "t.safetensors: its tensors give " + field), msg);
    CHECK(contains(msg, "the model folder's transformer config has"));
  };
  differs([](auto& c) { c.in_channels = 36; }, "in_channels 36");
  differs([](auto& c) { c.out_channels = 8; }, "out_channels 8");
  differs([](auto& c) { c.num_attention_heads = 3; }, "width (num_attention_heads x attention_head_dim) 36");
  differs([](auto& c) { c.ffn_dim = 40; }, "ffn_dim 40");
  differs([](auto& c) { c.num_layers = 2; }, "num_layers 2");
  differs([](auto& c) { c.text_dim = 32; }, "text_dim 32");
  differs([](auto& c) { c.freq_dim = 64; }, "freq_dim 64");
  differs([](auto& c) { c.patch_size = {1, 1, 1}; }, "patch_size [1, 1, 1]");
  differs([](auto& c) { c.cross_attn_norm = false; }, "cross_attn_norm false");
  // No folder config and no known shape: refused, naming what the shapes give.
  const std::string odd = error_of([&] { dlo::infer_wan_transformer_config(shapes_of(folder), nullptr, "t.safetensors"); });
  CHECK(contains(odd, "t.safetensors: its tensors give a transformer no known config has (in_channels 4, out_channels 4, "
                      "width (num_attention_heads x attention_head_dim) 24, ffn_dim 32, num_layers 3"));
  CHECK(contains(odd, "known: wan-test, wan2.1-t2v-1.3b"));
  // Missing, misshapen and extra tensors: the first few named.
  auto shapes = shapes_of(folder);
  shapes.erase("blocks.1.attn1.to_q.weight");
  shapes.erase("blocks.2.ffn.net.2.bias");
  CHECK(contains(error_of([&] { dlo::infer_wan_transformer_config(shapes, &folder, "t"); }),
                 "t: lacks 2 tensor(s) of the transformer (diffusers' names): blocks.1.attn1.to_q.weight, blocks.2.ffn.net.2.bias"));
  shapes = shapes_of(folder);
  shapes["blocks.2.attn2.to_k.weight"] = {24, 16};
  CHECK(contains(error_of([&] { dlo::infer_wan_transformer_config(shapes, &folder, "t"); }),
                 "t: 1 tensor(s) have another shape than the config's: blocks.2.attn2.to_k.weight [24, 16] (expected [24, 24])"));
  shapes = shapes_of(folder);
  shapes["blocks.0.attn2.add_k_proj.weight"] = {24, 24};
  CHECK(contains(error_of([&] { dlo::infer_wan_transformer_config(shapes, &folder, "t"); }),
                 "t: holds 1 tensor(s) a Wan text-to-video transformer does not have (diffusers' names): "
                 "blocks.0.attn2.add_k_proj.weight"));
  shapes = shapes_of(folder);
  shapes.erase("proj_out.weight");
  CHECK(contains(error_of([&] { dlo::infer_wan_transformer_config(shapes, &folder, "t"); }),
                 "t: no tensor 'proj_out.weight' (diffusers' name), which every Wan transformer has"));
}
