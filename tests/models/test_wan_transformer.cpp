// dlo/models/wan_transformer.h: config checks, weights as views, input checks, block interface,
// and the arithmetic against diffusers' outputs stored in tests/data/goldens (so the cpu label
// alone catches a RoPE or block bug). Wider parity runs are in
// tools/reference/wan_transformer_parity.py (label parity).
#include "common/doctest_torch.h"

#include <fstream>

#include "common/test_util.h"
#include "dlo/common/error.h"
#include "dlo/io/json_config.h"
#include "dlo/testing/make_model.h"
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
