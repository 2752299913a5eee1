// dlo/models/wan_transformer.h: config checks, weights as views, input checks, block interface,
// and the arithmetic against diffusers' outputs stored in tests/data/goldens (so the cpu label
// alone catches a RoPE or block bug). Wider parity runs are in
// tools/reference/wan_transformer_parity.py (label parity).
#include "common/doctest_torch.h"

#include <fstream>
#include <set>

#include "common/test_util.h"
#include "dlo/common/error.h"
#include "dlo/io/json_config.h"
#include "dlo/testing/make_model.h"
#include "dlo/models/tensor_view.h"
#include "dlo/models/wan_transformer.h"
#include "models/golden.h"

using namespace dlo;
using dlo::test::TempDir;

namespace {

std::string config_error(const std::string& json) {
  try {
    WanTransformerConfig::from_json(JsonConfig::parse(json, "cfg.json"));
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

WanTransformerConfig small_config() {
  auto c = WanTransformerConfig::preset("wan-test");
  c.num_layers = 3;
  return c;
}

}  // namespace

TEST_CASE("config.json errors name the file and the field") {
  CHECK(config_error(R"({"image_dim": 1280})").find("cfg.json: image_dim/added_kv_proj_dim are set") == 0);
  CHECK(config_error(R"({"image_dim": 1280})").find("I2V not supported yet") != std::string::npos);
  CHECK(config_error(R"({"qk_norm": "rms_norm"})").find("field 'qk_norm' is 'rms_norm'") != std::string::npos);
  CHECK(config_error(R"({"num_layers": "forty"})") == "cfg.json: field 'num_layers' must be an integer, got \"forty\"");
  CHECK(config_error(R"({"attention_head_dim": 13})").find("'attention_head_dim' must be even") != std::string::npos);
  CHECK(config_error(R"({"num_attention_heads": 0})").find("'num_attention_heads' must be a positive integer, got 0") !=
        std::string::npos);
  CHECK(config_error(R"({"patch_size": [1, 2]})").find("'patch_size' must have 3 entries") != std::string::npos);
  CHECK(config_error(R"({"_class_name": "FluxTransformer2DModel"})").find("expected 'WanTransformer3DModel'") !=
        std::string::npos);
  CHECK(config_error("{") .find("cfg.json: not valid JSON") == 0);
  // Nulls mean "default", as diffusers writes them for unused I2V fields.
  CHECK(config_error(R"({"image_dim": null, "added_kv_proj_dim": null, "pos_embed_seq_len": null})") == "(no error)");
}

TEST_CASE("config round-trips through the diffusers config.json text, and presets have the published sizes") {
  for (const auto& name : WanTransformerConfig::preset_names()) {
    CAPTURE(name);
    const auto c = WanTransformerConfig::preset(name);
    const auto back = WanTransformerConfig::from_json(JsonConfig::parse(c.to_json(), name));
    CHECK(back.to_json() == c.to_json());
  }
  // Parameter counts from wan-spec 1.1 (diffusers' own numbers).
  auto params = [](const WanTransformerConfig& c) {
    std::int64_t n = 0;
    for (const auto& s : wan_transformer_specs(c, DType::F32)) n += static_cast<std::int64_t>(s.nbytes() / 4);
    return n;
  };
  CHECK(params(WanTransformerConfig::preset("wan2.1-t2v-1.3b")) == 1'418'996'800);
  CHECK(params(WanTransformerConfig::preset("wan2.1-t2v-14b")) == 14'288'491'584);
  CHECK(params(WanTransformerConfig::preset("wan-test")) == 25'592);
  CHECK(wan_block_tensor_names(WanTransformerConfig::preset("wan-test")).size() == 27);
}

TEST_CASE("keep-in-fp32 modules follow diffusers' name rule") {
  CHECK((wan_weight_dtype("scale_shift_table", at::kBFloat16) == at::kFloat));
  CHECK((wan_weight_dtype("norm2.weight", at::kBFloat16) == at::kFloat));
  CHECK((wan_weight_dtype("condition_embedder.time_embedder.linear_1.weight", at::kBFloat16) == at::kFloat));
  CHECK((wan_weight_dtype("condition_embedder.time_proj.weight", at::kBFloat16) == at::kBFloat16));
  CHECK((wan_weight_dtype("attn1.norm_q.weight", at::kBFloat16) == at::kBFloat16));
}

TEST_CASE("weights in the compute dtype are views into the checkpoint mapping, not copies") {
  TempDir dir;
  write_random_wan_transformer(dir.file("t"), small_config(), DType::BF16, 7, 0);
  auto m = WanTransformer::load(dir.file("t"), at::kBFloat16);
  const auto& map = m.weights().checkpoint().files()[0]->mapping();
  auto inside = [&](const at::Tensor& t) {
    const auto* p = static_cast<const std::byte*>(t.data_ptr());
    return p >= map->data() && p + t.nbytes() <= map->data() + map->size();
  };
  CHECK(inside(m.block(2).ffn0_w));
  CHECK(inside(m.block(0).q1_w));
  // Kept in fp32 by the dtype policy: converted, hence not in the (bf16) mapping.
  CHECK((m.block(0).scale_shift_table.scalar_type() == at::kFloat));
  CHECK_FALSE(inside(m.block(0).scale_shift_table));
}

// The set diffusers' enable_layerwise_casting hooks on a WanTransformer3DModel (its default skips;
// listed from the hooked modules of diffusers 0.42.1): the blocks' Linears, weight and bias.
TEST_CASE("the layerwise-cast tensors are diffusers': every block Linear's weight and bias, nothing else") {
  const std::set<std::string> cast = {"attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q",
                                      "attn2.to_k", "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2"};
  const auto c = small_config();
  int n = 0;
  for (const auto& spec : wan_transformer_specs(c, DType::F32)) {
    CAPTURE(spec.name);
    std::string module = spec.name;
    if (module.rfind("blocks.", 0) == 0) module = module.substr(module.find('.', 7) + 1);
    const std::size_t leaf = module.rfind('.');
    const bool expect = spec.name.rfind("blocks.", 0) == 0 && cast.count(module.substr(0, leaf)) > 0;
    CHECK(wan_layerwise_cast(spec.name) == expect);
    n += expect;
  }
  CHECK(n == 20 * c.num_layers);
  CHECK(wan_layerwise_cast("blocks.0.attn2.add_k_proj.bias"));  // the image cross-attention's (I2V)
  CHECK_FALSE(wan_layerwise_cast("blocks.0.attn2.norm_added_k.weight"));
}

TEST_CASE("storage: fp8 rounds through the compute dtype as diffusers does, an fp8 file is kept as written, wider is refused") {
  // 1.0626 lies above the fp8 e4m3fn midpoint 1.0625 between 1.0 and 1.125, so fp8(1.0626) =
  // 1.125; bf16 rounds it to 1.0625 exactly, a tie that fp8 rounds to even: 1.0. diffusers loads in
  // bf16 first, so its fp8 weight is 1.0.
  const at::Tensor w = at::full({4}, 1.0626f);
  const WanDtypes bf16_fp8 = WanDtypes::narrow(at::kBFloat16, at::kFloat8_e4m3fn), fp32_fp8 = WanDtypes::narrow(at::kFloat, at::kFloat8_e4m3fn);
  CHECK(bf16_fp8.keep("blocks.0.attn1.to_q.weight", w).to(at::kFloat)[0].item<float>() == 1.0f);
  CHECK(fp32_fp8.keep("blocks.0.attn1.to_q.weight", w).to(at::kFloat)[0].item<float>() == 1.125f);
  // Tensors outside the set keep the dtype diffusers computes them in.
  CHECK((bf16_fp8.keep("blocks.0.norm2.weight", w).scalar_type() == at::kFloat));
  CHECK((bf16_fp8.keep("blocks.0.attn1.norm_q.weight", w).scalar_type() == at::kBFloat16));
  CHECK(bf16_fp8.describe() == "bf16 (Linears fp8 e4m3fn)");
  CHECK(WanDtypes::same(at::kBFloat16).describe() == "bf16");

  TempDir dir;
  write_random_wan_transformer(dir.file("f32"), small_config(), DType::F32, 7, 0);
  write_random_wan_transformer(dir.file("e5m2"), small_config(), DType::F8_E5M2, 7, 0);
  const auto f32 = WeightStore::open(dir.file("f32")), e5m2 = WeightStore::open(dir.file("e5m2"));
  auto storage = [](LinearStorage s, at::ScalarType compute, const WeightStore& w) {
    return resolve_wan_dtypes(s, compute, w.checkpoint(), "--storage-dtype").linear_storage;
  };
  CHECK((storage(LinearStorage::kAuto, at::kBFloat16, f32) == at::kBFloat16));  // auto never picks fp8 itself
  CHECK((storage(LinearStorage::kFp8, at::kBFloat16, f32) == at::kFloat8_e4m3fn));
  CHECK((storage(LinearStorage::kAuto, at::kBFloat16, e5m2) == at::kFloat8_e5m2));  // as written
  CHECK((storage(LinearStorage::kFp8, at::kFloat, e5m2) == at::kFloat8_e5m2));      // never rounded twice
  CHECK((storage(LinearStorage::kBF16, at::kBFloat16, e5m2) == at::kBFloat16));
  // An fp8 file's Linears are its mapping's bytes, not copies.
  const auto m = WanTransformer::load(dir.file("e5m2"), at::kBFloat16);
  const auto& map = m.weights().checkpoint().files()[0]->mapping();
  const auto* p = static_cast<const std::byte*>(m.block(1).ffn2_w.data_ptr());
  CHECK((m.block(1).ffn2_w.scalar_type() == at::kFloat8_e5m2));
  CHECK((p >= map->data() && p < map->data() + map->size()));

  CHECK_THROWS_WITH_AS(parse_linear_storage("fp32", at::kBFloat16, "--storage-dtype"),
                       doctest::Contains("--storage-dtype: fp32 is wider than the compute dtype bf16"), Error);
  CHECK_THROWS_WITH_AS(parse_linear_storage("int8", at::kBFloat16, "storage_dtype"),
                       doctest::Contains("storage_dtype: 'int8' is not auto, fp8, bf16, fp16 or fp32"), Error);
  CHECK(parse_linear_storage("fp16", at::kBFloat16, "x") == LinearStorage::kFP16);  // as wide: rounds, allowed
}

// ComfyUI's scaled fp8 numerics written out here (no diffusers reference exists): each quantised
// Linear is q = fp8(w / s), s = amax / 448 (float32), computed with w' = q.to(d) * s.to(d) in the
// dtype d it computes in. A file of q and s (and the marker) equals a file of w' in every output bit.
TEST_CASE("a scaled fp8 file computes with weight x scale in the compute dtype (the blocks' Linears kept fp8 with their scales, the rest dequantised at load)") {
  TempDir dir;
  const auto c = small_config();
  write_random_wan_transformer(dir.file("src"), c, DType::BF16, 11, 0);
  const auto src = load_tensors(WeightStore::open(dir.file("src")).checkpoint());
  std::vector<std::pair<std::string, at::Tensor>> scaled, dequantised;
  for (const auto& [name, t] : src) {
    const bool block_weight = wan_layerwise_cast(name) && name.find(".weight") != std::string::npos;
    if (!block_weight && name != "condition_embedder.text_embedder.linear_1.weight") {
      scaled.emplace_back(name, t);
      dequantised.emplace_back(name, t);
      continue;
    }
    const at::Tensor s = (t.to(at::kFloat).abs().max() / 448.0).reshape({});
    const at::Tensor q = (t.to(at::kFloat) / s).to(at::kFloat8_e4m3fn);
    scaled.emplace_back(name, q);
    scaled.emplace_back(name.substr(0, name.size() - 7) + ".scale_weight", s);
    dequantised.emplace_back(name, q.to(at::kBFloat16) * s.to(at::kBFloat16));
  }
  scaled.emplace_back("scaled_fp8", at::empty({0}, at::kFloat8_e4m3fn));
  save_tensors(dir.file("scaled.safetensors"), scaled);
  save_tensors(dir.file("dequantised.safetensors"), dequantised);
  const auto a = WanTransformer::load(dir.file("scaled.safetensors"), c, at::kBFloat16);
  const auto b = WanTransformer::load(dir.file("dequantised.safetensors"), c, at::kBFloat16);
  CHECK(a.dtypes().scaled);
  CHECK(a.dtypes().describe() == "bf16 (Linears scaled fp8 e4m3fn, biases bf16)");
  CHECK((a.block(0).ffn2_w.scalar_type() == at::kFloat8_e4m3fn));  // kept as written
  CHECK(a.block(0).ffn2_s.defined());
  const auto x = at::randn({1, 4, 2, 4, 6}), t = at::tensor({500}, at::kLong), ctx = at::randn({1, 5, 16});
  CHECK(at::equal(a.forward(x, t, ctx), b.forward(x, t, ctx)));
  CHECK_FALSE(at::equal(a.forward(x, t, ctx), WanTransformer::load(dir.file("src"), at::kBFloat16).forward(x, t, ctx)));

  // A scale missing, and a storage that would re-round the file, are refused by name.
  std::vector<std::pair<std::string, at::Tensor>> missing;
  for (const auto& [n, v] : scaled)
    if (n != "blocks.1.attn2.to_v.scale_weight") missing.emplace_back(n, v);
  save_tensors(dir.file("missing.safetensors"), missing);
  CHECK_THROWS_WITH_AS(WanTransformer::load(dir.file("missing.safetensors"), c, at::kBFloat16),
                       doctest::Contains("have no scale_weight (diffusers' names), e.g. 'blocks.1.attn2.to_v.weight'"), Error);
  CHECK_THROWS_WITH_AS(WanTransformer::load(dir.file("scaled.safetensors"), c, at::kBFloat16, true, LinearStorage::kBF16),
                       doctest::Contains("is a scaled fp8 file (its Linears fp8 with a scale each), streamed as written"), Error);
}

TEST_CASE("a checkpoint that disagrees with its config is refused, naming the tensor") {
  TempDir dir;
  auto c = small_config();
  write_random_wan_transformer(dir.file("t"), c, DType::F32, 1, 0);
  c.ffn_dim = 48;  // config says 48, weights have 32
  std::ofstream(dir.file("t/config.json")) << c.to_json();
  try {
    WanTransformer::load(dir.file("t"), at::kFloat);
    FAIL("expected an error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK_MESSAGE(msg.find("tensor 'blocks.0.ffn.net.0.proj.weight' has shape [32, 24], the config implies [48, 24]") !=
                      std::string::npos,
                  msg);
    CHECK(msg.find("loading transformer '" + dir.file("t") + "'") == 0);
  }
}

TEST_CASE("bad inputs are refused with the input named") {
  TempDir dir;
  write_random_wan_transformer(dir.file("t"), small_config(), DType::F32, 1, 0);
  auto m = WanTransformer::load(dir.file("t"), at::kFloat);
  auto x = at::randn({1, 4, 2, 4, 4});
  auto t = at::tensor({500}, at::kLong);
  auto ctx = at::randn({1, 5, 16});
  CHECK_THROWS_WITH_AS(m.forward(at::randn({1, 3, 2, 4, 4}), t, ctx), doctest::Contains("hidden_states has 3 channels"), Error);
  CHECK_THROWS_WITH_AS(m.forward(at::randn({1, 4, 2, 5, 4}), t, ctx), doctest::Contains("multiples of patch_size"), Error);
  CHECK_THROWS_WITH_AS(m.forward(x, at::tensor({1, 2}, at::kLong), ctx), doctest::Contains("timestep must be [1]"), Error);
  CHECK_THROWS_WITH_AS(m.forward(x, t, at::randn({1, 5, 8})), doctest::Contains("encoder_hidden_states must be [1, L, 16]"), Error);
  CHECK_THROWS_WITH_AS(m.forward(at::randn({1, 4, 2, 80, 4}), t, ctx), doctest::Contains("exceeds rope_max_seq_len 32"), Error);
  // Per-token timesteps: [B, L] with L the post-patch tokens (2 x 2 x 2 here), nothing else.
  CHECK_THROWS_WITH_AS(m.forward(x, at::full({1, 9}, 500, at::kLong), ctx),
                       doctest::Contains("or [1, 8] (one per token, Wan2.2's expand_timesteps)"), Error);
  CHECK_THROWS_WITH_AS(m.forward(x, at::full({1, 8, 1}, 500, at::kLong), ctx), doctest::Contains("timestep must be"),
                       Error);
}

TEST_CASE("per-token timesteps: all tokens at t equal one timestep t, tokens at different t differ where they should") {
  TempDir dir;
  write_random_wan_transformer(dir.file("t"), small_config(), DType::F32, 2, 0);
  auto m = WanTransformer::load(dir.file("t"), at::kFloat);
  auto x = at::randn({2, 4, 2, 4, 4});
  auto ctx = at::randn({2, 5, 16});
  const auto per_sample = m.forward(x, at::tensor({500, 20}, at::kLong), ctx);
  auto tokens = at::empty({2, 8}, at::kLong);
  tokens[0].fill_(500);
  tokens[1].fill_(20);
  // Not bitwise: the time embedder's GEMMs see 16 rows instead of 2, and this libtorch's kernels
  // round differently by row count (measured max |diff| 1.2e-6 on outputs of ~3.5); the bitwise
  // comparison with diffusers on the same [B, L] shapes is in the parity tests.
  auto max_diff = [](const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); };
  const double same = max_diff(m.forward(x, tokens, ctx), per_sample);
  MESSAGE("per-token = per-sample timesteps: max |diff| ", same, ", max |out| ", per_sample.abs().max().item<double>());
  CHECK(same <= 1e-5);
  // Sample 1's first frame (tokens 0-3) at 0, as WanPipeline's expand_timesteps gives a
  // conditioning frame: sample 0 is unchanged, sample 1 is not.
  tokens[1].slice(0, 0, 4).fill_(0);
  const auto mixed = m.forward(x, tokens, ctx);
  CHECK(max_diff(mixed[0], per_sample[0]) <= 1e-5);
  CHECK(max_diff(mixed[1], per_sample[1]) > 1e-2);
}

TEST_CASE("streaming blocks through begin/wan_block_forward/end equals forward(), with blocks bound from any tensors") {
  TempDir dir;
  const auto c = small_config();
  write_random_wan_transformer(dir.file("t"), c, DType::F32, 3, 0);
  auto resident = WanTransformer::load(dir.file("t"), at::kFloat);
  auto streamed = WanTransformer::load(dir.file("t"), at::kFloat, /*load_blocks=*/false);
  auto x = at::randn({2, 4, 2, 4, 6});
  auto t = at::tensor({10, 900}, at::kLong);
  auto ctx = at::randn({2, 5, 16});
  at::Tensor want = resident.forward(x, t, ctx);

  // Block weights copied into one flat buffer (as an offload slot holds them), then bound.
  auto s = streamed.begin(x, t, ctx);
  const auto names = wan_block_tensor_names(c);
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    std::int64_t total = 0;
    for (const auto& n : names) total += resident.weights().get("blocks." + std::to_string(i) + "." + n).numel();
    at::Tensor flat = at::empty({total}, at::kFloat);
    std::vector<at::Tensor> views;
    std::int64_t off = 0;
    for (const auto& n : names) {
      at::Tensor src = resident.weights().get("blocks." + std::to_string(i) + "." + n);
      at::Tensor v = flat.narrow(0, off, src.numel()).view(src.sizes());
      v.copy_(src);
      views.push_back(v);
      off += src.numel();
    }
    s.h = wan_block_forward(WanBlockWeights::bind(views, c), s, s.h, c);
  }
  CHECK(at::equal(streamed.end(s), want));
}

// diffusers' WanTransformer3DModel on the same weights (3 heads x 16, 3 layers, batch 2 with a
// timestep each, 3x6x10 and 2x4x8 latents). Bitwise equal at 1 thread: the same libtorch kernels
// run in the same order (the parity label observes the same on other shapes).
TEST_CASE("forward equals diffusers' output stored in the goldens, bit for bit, fp32 and bf16") {
  at::set_num_threads(1);
  for (const std::string name : {"wan_transformer_fp32", "wan_transformer_bf16"}) {
    CAPTURE(name);
    const dlo::test::Golden g(name);
    TempDir dir;
    const auto c = WanTransformerConfig::from_json(JsonConfig::parse(g.meta("config"), name));
    write_random_wan_transformer(dir.file("t"), c, g.weights_dtype(), g.seed(), 0);
    g.check_weights(dir.file("t"));
    auto m = WanTransformer::load(dir.file("t"), g.compute_dtype());
    const at::Tensor want = g.get("output");
    const at::Tensor got = m.forward(g.get("hidden_states"), g.get("timestep"), g.get("encoder_hidden_states"));
    REQUIRE(got.sizes() == want.sizes());
    REQUIRE((got.scalar_type() == want.scalar_type()));
    g.check_output(got, want);
  }
}
