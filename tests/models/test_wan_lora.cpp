// models/wan_lora.h: LoRA files read as diffusers 0.42.1 reads them (WanLoraLoaderMixin.lora_state_dict,
// _convert_non_diffusers_wan_lora_to_diffusers, _convert_musubi_wan_lora_to_diffusers) with PEFT's
// scaling. The expected values are worked out by hand here (the alpha split, bf16 roundings, the
// names in each spelling, from the Wan repository's module names and musubi-tuner's); the parity
// test (tools/reference/wan_lora_parity.py) compares whole files with diffusers and PEFT themselves.
#include "common/doctest_torch.h"

#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "common/test_util.h"
#include "dlo/common/error.h"
#include "dlo/config/wan_tensor_names.h"
#include "dlo/models/tensor_view.h"
#include "dlo/models/wan_lora.h"

using namespace dlo;
using dlo::test::error_of;
using dlo::test::TempDir;

namespace {

using Tensors = std::vector<std::pair<std::string, at::Tensor>>;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string save(const TempDir& dir, const std::string& name, const Tensors& t,
                 const std::map<std::string, std::string>& metadata = {{"format", "pt"}}) {
  const std::string path = dir.file(name);
  save_tensors(path, t, metadata);
  return path;
}

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes().vec() == b.sizes().vec() &&
         at::equal(a.contiguous().reshape(-1).view(at::kByte), b.contiguous().reshape(-1).view(at::kByte));
}

at::Tensor filled(std::vector<std::int64_t> shape, double v, at::ScalarType st = at::kBFloat16) {
  return at::full(shape, v, at::TensorOptions().dtype(st));
}

// One block Linear in the three spellings, and diffusers' name, by hand (block 7): the Wan
// repository's module names, musubi-tuner's ('_' for '.'), diffusers' WanTransformer3DModel's.
struct Spelling {
  const char* original;
  const char* musubi;
  const char* diffusers;
};
const Spelling kBlockLinears[] = {
    {"blocks.7.self_attn.q", "blocks_7_self_attn_q", "blocks.7.attn1.to_q"},
    {"blocks.7.self_attn.k", "blocks_7_self_attn_k", "blocks.7.attn1.to_k"},
    {"blocks.7.self_attn.v", "blocks_7_self_attn_v", "blocks.7.attn1.to_v"},
    {"blocks.7.self_attn.o", "blocks_7_self_attn_o", "blocks.7.attn1.to_out.0"},
    {"blocks.7.cross_attn.q", "blocks_7_cross_attn_q", "blocks.7.attn2.to_q"},
    {"blocks.7.cross_attn.k", "blocks_7_cross_attn_k", "blocks.7.attn2.to_k"},
    {"blocks.7.cross_attn.v", "blocks_7_cross_attn_v", "blocks.7.attn2.to_v"},
    {"blocks.7.cross_attn.o", "blocks_7_cross_attn_o", "blocks.7.attn2.to_out.0"},
    {"blocks.7.cross_attn.k_img", "blocks_7_cross_attn_k_img", "blocks.7.attn2.add_k_proj"},
    {"blocks.7.cross_attn.v_img", "blocks_7_cross_attn_v_img", "blocks.7.attn2.add_v_proj"},
    {"blocks.7.ffn.0", "blocks_7_ffn_0", "blocks.7.ffn.net.0.proj"},
    {"blocks.7.ffn.2", "blocks_7_ffn_2", "blocks.7.ffn.net.2"},
};

// A ComfyUI-layout module: down [r, 4], up [4, r] (and alpha, diff_b where given).
void comfy_module(Tensors& t, const std::string& module, std::int64_t r, std::optional<double> alpha = {},
                  bool diff_b = false) {
  const std::string b = "diffusion_model." + module;
  t.emplace_back(b + ".lora_down.weight", filled({r, 4}, 1.0));
  t.emplace_back(b + ".lora_up.weight", filled({4, r}, 3.0));
  if (alpha) t.emplace_back(b + ".alpha", at::scalar_tensor(*alpha, at::kFloat));
  if (diff_b) t.emplace_back(b + ".diff_b", filled({4}, 0.5));
}

}  // namespace

TEST_CASE("LoRA alpha: diffusers' power-of-two split, by hand") {
  CHECK(lora_alpha_split(8, 64) == std::pair<double, double>{0.25, 0.5});  // Wan2.2-Lightning: 0.125
  CHECK(lora_alpha_split(16, 16) == std::pair<double, double>{1.0, 1.0});
  CHECK(lora_alpha_split(1, 10) == std::pair<double, double>{0.4, 0.25});  // 0.1 -> 0.2, 0.5 -> 0.4, 0.25
  CHECK(lora_alpha_split(40, 16) == std::pair<double, double>{2.5, 1.0});
  CHECK(lora_alpha_split(1, 1024) == std::pair<double, double>{1.0 / 32, 1.0 / 32});
}

TEST_CASE("LoRA alpha baked into down and up in the file's dtype") {
  TempDir dir;
  const at::Tensor values = at::tensor({1.0, 3.0, -2.0, 0.5}, at::kFloat).to(at::kBFloat16);
  Tensors t;
  // alpha 8, rank 64: down x0.25, up x0.5, exact.
  t.emplace_back("diffusion_model.blocks.0.self_attn.q.lora_down.weight", values.repeat({64, 1}));
  t.emplace_back("diffusion_model.blocks.0.self_attn.q.lora_up.weight", values.reshape({4, 1}).repeat({1, 64}));
  t.emplace_back("diffusion_model.blocks.0.self_attn.q.alpha", at::scalar_tensor(8.0, at::kBFloat16));
  // alpha == rank: the bytes unchanged (random values, whatever their bits).
  const at::Tensor rd = at::randn({6, 4}).to(at::kBFloat16), ru = at::randn({4, 6}).to(at::kBFloat16);
  t.emplace_back("diffusion_model.blocks.0.cross_attn.k.lora_down.weight", rd);
  t.emplace_back("diffusion_model.blocks.0.cross_attn.k.lora_up.weight", ru);
  t.emplace_back("diffusion_model.blocks.0.cross_attn.k.alpha", at::scalar_tensor(6.0, at::kFloat));
  // alpha / rank = 0.1: down x0.4 rounded in bf16, up x0.25.
  t.emplace_back("diffusion_model.blocks.0.ffn.2.lora_down.weight", values.repeat({10, 1}));
  t.emplace_back("diffusion_model.blocks.0.ffn.2.lora_up.weight", values.reshape({4, 1}).repeat({1, 10}));
  t.emplace_back("diffusion_model.blocks.0.ffn.2.alpha", at::scalar_tensor(1.0, at::kBFloat16));
  const LoraFile f = read_wan_lora(save(dir, "alpha.safetensors", t));
  CHECK(f.layout == "ComfyUI/Kijai (diffusion_model.)");
  REQUIRE(f.modules.size() == 3);

  const LoraModule& q = f.modules.at("blocks.0.attn1.to_q");
  CHECK(same_bytes(q.down[0], at::tensor({0.25, 0.75, -0.5, 0.125}, at::kFloat).to(at::kBFloat16)));
  CHECK(same_bytes(q.up.select(1, 0), at::tensor({0.5, 1.5, -1.0, 0.25}, at::kFloat).to(at::kBFloat16)));
  CHECK(q.scaling == 1.0);
  CHECK(!q.bias.defined());

  const LoraModule& k = f.modules.at("blocks.0.attn2.to_k");
  CHECK(same_bytes(k.down, rd));
  CHECK(same_bytes(k.up, ru));

  // 0.4 = 1.1001100|11.. x 2^-2 rounds up to 1.1001101 x 2^-2 = 0.400390625; 1.2 -> 1.203125;
  // -0.8 -> -0.80078125; 0.2 = 1.1001100|11.. x 2^-3 -> 0.2001953125.
  const LoraModule& ffn = f.modules.at("blocks.0.ffn.net.2");
  CHECK(same_bytes(ffn.down[0], at::tensor({0.400390625, 1.203125, -0.80078125, 0.2001953125}, at::kFloat).to(at::kBFloat16)));
  CHECK(same_bytes(ffn.up.select(1, 3), at::tensor({0.25, 0.75, -0.5, 0.125}, at::kFloat).to(at::kBFloat16)));
}

TEST_CASE("LoRA names: every block Linear in the original, ComfyUI and musubi spellings, both ways") {
  for (const Spelling& s : kBlockLinears) {
    CAPTURE(s.diffusers);
    CHECK(wan_original_to_diffusers(s.original) == std::optional<std::string>(s.diffusers));
    CHECK(wan_diffusers_to_original(s.diffusers) == std::optional<std::string>(s.original));
    CHECK(wan_musubi_to_diffusers(s.musubi) == std::optional<std::string>(s.diffusers));
    CHECK(wan_diffusers_to_musubi(s.diffusers) == std::optional<std::string>(s.musubi));
    CHECK(wan_is_linear(s.diffusers));
  }
  for (const char* not_linear : {"blocks.7.norm2", "blocks.7.scale_shift_table", "blocks.7.attn1.norm_q",
                                 "blocks.7.attn2.norm_added_k", "patch_embedding", "scale_shift_table",
                                 "condition_embedder.image_embedder.norm1", "blocks.7.attn1.to_q.weight", "blocks.7.attn1"}) {
    CAPTURE(not_linear);
    CHECK(!wan_is_linear(not_linear));
    CHECK(!wan_diffusers_to_musubi(not_linear));
  }
  for (const char* linear : {"proj_out", "condition_embedder.time_proj", "condition_embedder.text_embedder.linear_1",
                             "condition_embedder.time_embedder.linear_2", "condition_embedder.image_embedder.ff.net.0.proj"})
    CHECK(wan_is_linear(linear));
  for (const char* bad : {"blocks_7_self_attn_norm_q", "blocks_7_norm3", "blocks_07_ffn_0", "blocks__ffn_0", "blocks_7_ffn_1",
                          "head_head", "blocks_7_self_attn_q_x"})
    CHECK(!wan_musubi_to_diffusers(bad));
  CHECK(!wan_diffusers_to_musubi("proj_out"));  // musubi's diffusers conversion reads blocks only

  // The same modules read from a file in each layout.
  TempDir dir;
  Tensors comfy, musubi, peft;
  for (const Spelling& s : kBlockLinears) {
    comfy_module(comfy, s.original, 2);
    musubi.emplace_back(std::string("lora_unet_") + s.musubi + ".lora_down.weight", filled({2, 4}, 1.0));
    musubi.emplace_back(std::string("lora_unet_") + s.musubi + ".lora_up.weight", filled({4, 2}, 1.0));
    musubi.emplace_back(std::string("lora_unet_") + s.musubi + ".alpha", at::scalar_tensor(2.0));
    peft.emplace_back(std::string("transformer.") + s.diffusers + ".lora_A.weight", filled({2, 4}, 1.0));
    peft.emplace_back(std::string("transformer.") + s.diffusers + ".lora_B.weight", filled({4, 2}, 1.0));
  }
  for (const char* global : {"time_projection.1", "text_embedding.0", "text_embedding.2", "time_embedding.0",
                             "time_embedding.2", "head.head", "img_emb.proj.1", "img_emb.proj.3"})
    comfy_module(comfy, global, 2);
  const LoraFile c = read_wan_lora(save(dir, "comfy.safetensors", comfy));
  const LoraFile m = read_wan_lora(save(dir, "musubi.safetensors", musubi));
  const LoraFile p = read_wan_lora(save(dir, "peft.safetensors", peft));
  CHECK(m.layout == "musubi (lora_unet_)");
  CHECK(p.layout == "diffusers/PEFT");
  std::set<std::string> want;
  for (const Spelling& s : kBlockLinears) want.insert(s.diffusers);
  std::set<std::string> got_m, got_p, got_c;
  for (const auto& [name, _] : m.modules) got_m.insert(name);
  for (const auto& [name, _] : p.modules) got_p.insert(name);
  for (const auto& [name, _] : c.modules) got_c.insert(name);
  CHECK(got_m == want);
  CHECK(got_p == want);
  for (const char* global : {"condition_embedder.time_proj", "condition_embedder.text_embedder.linear_1",
                             "condition_embedder.text_embedder.linear_2", "condition_embedder.time_embedder.linear_1",
                             "condition_embedder.time_embedder.linear_2", "proj_out",
                             "condition_embedder.image_embedder.ff.net.0.proj", "condition_embedder.image_embedder.ff.net.2"})
    want.insert(global);
  CHECK(got_c == want);
}

TEST_CASE("LoRA: head.head.diff is proj_out with down = the diff and up = the identity, and the keys diffusers ignores are listed") {
  TempDir dir;
  Tensors t;
  comfy_module(t, "blocks.0.self_attn.q", 2, 2.0, true);
  const at::Tensor diff = at::randn({16, 24}).to(at::kBFloat16), bias = at::randn({16}).to(at::kBFloat16);
  t.emplace_back("diffusion_model.head.head.diff", diff);
  t.emplace_back("diffusion_model.head.head.diff_b", bias);
  for (const char* ignored : {"blocks.0.self_attn.q.diff", "blocks.0.diff_m", "blocks.0.norm3.diff", "blocks.0.self_attn.norm_q.diff_b"})
    t.emplace_back(std::string("diffusion_model.") + ignored, filled({4}, 1.0));
  const LoraFile f = read_wan_lora(save(dir, "head.safetensors", t));
  const LoraModule& head = f.modules.at("proj_out");
  CHECK(same_bytes(head.down, diff));
  CHECK(same_bytes(head.up, at::eye(16, at::kBFloat16)));
  CHECK(same_bytes(head.bias, bias));
  CHECK(same_bytes(f.modules.at("blocks.0.attn1.to_q").bias, filled({4}, 0.5)));
  std::set<std::string> ignored(f.ignored.begin(), f.ignored.end());
  CHECK(ignored == std::set<std::string>{"diffusion_model.blocks.0.self_attn.q.diff", "diffusion_model.blocks.0.diff_m",
                                         "diffusion_model.blocks.0.norm3.diff",
                                         "diffusion_model.blocks.0.self_attn.norm_q.diff_b"});
}

TEST_CASE("LoRA scaling: PEFT's lora_alpha / r from diffusers' metadata, 1 without") {
  TempDir dir;
  Tensors t;
  for (const char* m : {"blocks.0.attn1.to_q", "blocks.1.attn1.to_q", "blocks.0.attn2.to_k"}) {
    const std::int64_t r = std::string(m) == "blocks.1.attn1.to_q" ? 2 : 4;
    t.emplace_back(std::string("transformer.") + m + ".lora_A.weight", filled({r, 4}, 1.0));
    t.emplace_back(std::string("transformer.") + m + ".lora_B.weight", filled({4, r}, 1.0));
    t.emplace_back(std::string("transformer.") + m + ".lora_B.bias", filled({4}, 1.0));
  }
  const LoraFile plain = read_wan_lora(save(dir, "plain.safetensors", t));
  for (const auto& [m, mod] : plain.modules) CHECK(mod.scaling == 1.0);

  const std::string md = R"({"transformer.r": 4, "transformer.lora_alpha": 8, "transformer.lora_bias": true,
    "transformer.rank_pattern": {"^blocks.1.attn1.to_q": 2}, "transformer.alpha_pattern": {"attn2.to_k": 3}})";
  const LoraFile f = read_wan_lora(save(dir, "meta.safetensors", t, {{"format", "pt"}, {"lora_adapter_metadata", md}}));
  CHECK(f.modules.at("blocks.0.attn1.to_q").scaling == 2.0);
  CHECK(f.modules.at("blocks.1.attn1.to_q").scaling == 4.0);
  CHECK(f.modules.at("blocks.0.attn2.to_k").scaling == 0.75);
  CHECK(f.ignored.empty());

  // use_rslora: lora_alpha / sqrt(r); no lora_bias: PEFT leaves the biases out.
  const std::string rs = R"({"transformer.r": 4, "transformer.lora_alpha": 8, "transformer.use_rslora": true,
    "transformer.rank_pattern": {"blocks.1.attn1.to_q": 2}})";
  const LoraFile g = read_wan_lora(save(dir, "rslora.safetensors", t, {{"lora_adapter_metadata", rs}}));
  CHECK(g.modules.at("blocks.0.attn1.to_q").scaling == 4.0);
  CHECK(g.modules.at("blocks.1.attn1.to_q").scaling == 8.0 / std::sqrt(2.0));
  CHECK(!g.modules.at("blocks.0.attn1.to_q").bias.defined());
  CHECK(g.ignored.size() == 3);

  const std::string wrong = R"({"transformer.r": 8, "transformer.lora_alpha": 8})";
  const std::string path = save(dir, "wrong.safetensors", t, {{"lora_adapter_metadata", wrong}});
  const std::string e = error_of([&] { read_wan_lora(path); });
  CHECK(contains(e, path));
  CHECK(contains(e, "rank 8"));
}

TEST_CASE("LoRA refusals name the file and what is wrong") {
  TempDir dir;
  const auto refused = [&](const std::string& name, const Tensors& t, const std::string& why) {
    CAPTURE(name);
    const std::string path = save(dir, name, t);
    const std::string e = error_of([&] { read_wan_lora(path); });
    CHECK(contains(e, path));
    CHECK(contains(e, why));
    return e;
  };
  // A pickle, refused by name as the transformer reader refuses one.
  const std::string pickle = dir.file("lora.pth");
  const std::string e = error_of([&] { read_wan_lora(pickle); });
  CHECK(contains(e, pickle));
  CHECK(contains(e, "pickle_to_safetensors.py"));

  Tensors ok;
  comfy_module(ok, "blocks.0.self_attn.q", 2, 4.0);
  Tensors t = ok;
  t.emplace_back("diffusion_model.blocks.0.self_attn.q.lora_mid.weight", filled({2, 2}, 1.0));
  t.emplace_back("diffusion_model.blocks.0.norm3.lora_down.weight", filled({2, 4}, 1.0));
  const std::string nothing = refused("nothing.safetensors", t, "match nothing");
  CHECK(contains(nothing, "ComfyUI"));
  CHECK(contains(nothing, "blocks.0.self_attn.q.lora_mid.weight"));
  CHECK(contains(nothing, "blocks.0.norm3.lora_down.weight"));

  refused("unprefixed.safetensors", {{"blocks.0.attn1.to_q.lora_A.weight", filled({2, 4}, 1.0)},
                                     {"blocks.0.attn1.to_q.lora_B.weight", filled({4, 2}, 1.0)}},
          "match nothing");
  refused("no_lora_in_name.safetensors", {{"transformer.blocks.0.attn1.to_q.weight", filled({4, 4}, 1.0)}}, "without 'lora'");
  refused("image_k_alone.safetensors", [] {
    Tensors x;
    comfy_module(x, "blocks.0.cross_attn.k_img", 2);  // no v_img anywhere: diffusers does not take k_img
    return x;
  }(), "match nothing");

  refused("rank.safetensors", {{"transformer.blocks.0.attn1.to_q.lora_A.weight", filled({4, 4}, 1.0)},
                               {"transformer.blocks.0.attn1.to_q.lora_B.weight", filled({4, 3}, 1.0)}},
          "one rank");
  refused("down_only.safetensors", {{"diffusion_model.blocks.0.ffn.0.lora_down.weight", filled({2, 4}, 1.0)}}, "no lora up");
  refused("up_only.safetensors", {{"lora_unet_blocks_0_ffn_0.lora_up.weight", filled({4, 2}, 1.0)},
                                  {"lora_unet_blocks_0_ffn_0.alpha", at::scalar_tensor(1.0)}},
          "no lora down");
  refused("bias_only.safetensors", [&] {
    Tensors x = ok;
    x.emplace_back("diffusion_model.blocks.1.self_attn.k.diff_b", filled({4}, 1.0));
    return x;
  }(), "no lora down");
  refused("alpha_only.safetensors", [&] {
    Tensors x = ok;
    x.emplace_back("diffusion_model.blocks.1.self_attn.k.alpha", at::scalar_tensor(1.0));
    return x;
  }(), "no lora down");

  // Alphas where diffusers raises: outside the blocks' Linears, and missing in a musubi file.
  refused("head_alpha.safetensors", [&] {
    Tensors x = ok;
    comfy_module(x, "head.head", 2, 1.0);
    return x;
  }(), "only on the blocks' Linears");
  refused("musubi_no_alpha.safetensors", {{"lora_unet_blocks_0_ffn_0.lora_down.weight", filled({2, 4}, 1.0)},
                                          {"lora_unet_blocks_0_ffn_0.lora_up.weight", filled({4, 2}, 1.0)}},
          "no .alpha");
  refused("no_blocks.safetensors", [] {
    Tensors x;
    comfy_module(x, "head.head", 2);
    return x;
  }(), "only with block keys");
  refused("head_diff_no_bias.safetensors", [&] {
    Tensors x = ok;
    x.emplace_back("diffusion_model.head.head.diff", filled({16, 24}, 1.0));
    return x;
  }(), "head.head.diff_b");
  refused("text_embedding_diff.safetensors", [&] {
    Tensors x = ok;
    x.emplace_back("diffusion_model.text_embedding.0.diff", filled({4, 4}, 1.0));
    return x;
  }(), "text_embedding.0");

  // DoRA: refused in every layout (dlo does not apply it; see wan_lora.h).
  refused("dora.safetensors", [&] {
    Tensors x = ok;
    x.emplace_back("diffusion_model.blocks.0.self_attn.q.dora_scale", filled({1, 4}, 1.0));
    return x;
  }(), "DoRA");
  refused("dora_peft.safetensors", {{"transformer.blocks.0.attn1.to_q.lora_A.weight", filled({2, 4}, 1.0)},
                                    {"transformer.blocks.0.attn1.to_q.lora_B.weight", filled({4, 2}, 1.0)},
                                    {"transformer.blocks.0.attn1.to_q.lora_magnitude_vector", filled({4}, 1.0)}},
          "DoRA");
}

TEST_CASE("check_wan_lora: a LoRA for another model size or more blocks is refused naming the module and both shapes") {
  TempDir dir;
  const WanTransformerConfig c = WanTransformerConfig::preset("wan-test");  // width 24, ffn 32, 2 blocks
  Tensors t;
  t.emplace_back("transformer.blocks.1.ffn.net.0.proj.lora_A.weight", filled({2, 24}, 1.0));
  t.emplace_back("transformer.blocks.1.ffn.net.0.proj.lora_B.weight", filled({32, 2}, 1.0));
  t.emplace_back("transformer.blocks.1.ffn.net.0.proj.lora_B.bias", filled({32}, 1.0));
  const std::string fits = save(dir, "fits.safetensors", t);
  check_wan_lora(read_wan_lora(fits), c);

  t.emplace_back("transformer.blocks.0.attn1.to_q.lora_A.weight", filled({2, 1536}, 1.0));
  t.emplace_back("transformer.blocks.0.attn1.to_q.lora_B.weight", filled({1536, 2}, 1.0));
  const std::string wider = save(dir, "wider.safetensors", t);
  std::string e = error_of([&] { check_wan_lora(read_wan_lora(wider), c); });
  CHECK(contains(e, wider));
  CHECK(contains(e, "blocks.0.attn1.to_q"));
  CHECK(contains(e, "[2, 1536]"));
  CHECK(contains(e, "[24, 24]"));

  Tensors in_only;  // ffn.net.2 is [24, 32]: an up of 24 outputs, a down of 24 inputs instead of 32
  in_only.emplace_back("transformer.blocks.0.ffn.net.2.lora_A.weight", filled({2, 24}, 1.0));
  in_only.emplace_back("transformer.blocks.0.ffn.net.2.lora_B.weight", filled({24, 2}, 1.0));
  const std::string narrow = save(dir, "narrow.safetensors", in_only);
  e = error_of([&] { check_wan_lora(read_wan_lora(narrow), c); });
  CHECK(contains(e, "blocks.0.ffn.net.2"));
  CHECK(contains(e, "[24, 32]"));

  Tensors deeper;
  comfy_module(deeper, "blocks.2.self_attn.q", 2);
  const std::string three = save(dir, "three.safetensors", deeper);
  e = error_of([&] { check_wan_lora(read_wan_lora(three), c); });
  CHECK(contains(e, three));
  CHECK(contains(e, "blocks.2.attn1.to_q"));
  CHECK(contains(e, "not one of the model's Linears"));

  Tensors bias;  // a bias of another width
  bias.emplace_back("transformer.proj_out.lora_A.weight", filled({2, 24}, 1.0));
  bias.emplace_back("transformer.proj_out.lora_B.weight", filled({16, 2}, 1.0));
  bias.emplace_back("transformer.proj_out.lora_B.bias", filled({16}, 1.0));
  check_wan_lora(read_wan_lora(save(dir, "head.safetensors", bias)), c);
  bias.back().second = filled({15}, 1.0);
  const std::string bad_bias = save(dir, "bad_bias.safetensors", bias);
  CHECK(contains(error_of([&] { read_wan_lora(bad_bias); }), "not a bias"));
}

TEST_CASE("wan_lora_peft_tensors: diffusers/PEFT names, the tensors as read") {
  TempDir dir;
  Tensors t;
  comfy_module(t, "blocks.0.self_attn.q", 2, 2.0, true);
  const LoraFile f = read_wan_lora(save(dir, "x.safetensors", t));
  const auto out = wan_lora_peft_tensors(f);
  REQUIRE(out.size() == 3);
  CHECK(out[0].first == "transformer.blocks.0.attn1.to_q.lora_A.weight");
  CHECK(out[1].first == "transformer.blocks.0.attn1.to_q.lora_B.weight");
  CHECK(out[2].first == "transformer.blocks.0.attn1.to_q.lora_B.bias");
  CHECK(same_bytes(out[0].second, f.modules.at("blocks.0.attn1.to_q").down));
}
