// dlo/models/umt5.h: config checks, weights as views, relative position buckets, block interface,
// and the encoder against an independent double-precision re-derivation of the math.
// Parity with transformers is in tools/reference/umt5_parity.py (label parity).
#include "common/doctest_torch.h"

#include <cmath>
#include <fstream>

#include "common/test_util.h"
#include "dlo/testing/make_model.h"
#include "dlo/common/error.h"
#include "dlo/io/json_config.h"
#include "dlo/models/umt5.h"
#include "models/golden.h"

using namespace dlo;
using dlo::test::TempDir;

namespace {

std::string umt5_config_error(const std::string& json) {
  try {
    Umt5Config::from_json(JsonConfig::parse(json, "text_encoder/config.json"));
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

Umt5Config small_umt5_config() {
  Umt5Config c = Umt5Config::preset("umt5-test");
  c.num_layers = 3;
  c.num_heads = 3;
  c.d_kv = 5;  // inner 15 != d_model 16
  c.d_ff = 24;
  c.relative_attention_num_buckets = 8;
  c.relative_attention_max_distance = 6;  // exercised by sequences longer than 6
  return c;
}

}  // namespace

TEST_CASE("config.json errors name the file and the field") {
  CHECK(contains(umt5_config_error(R"({"model_type": "t5"})"), "text_encoder/config.json: model_type is 't5'"));
  CHECK(contains(umt5_config_error(R"({"model_type": "t5"})"), "only UMT5"));
  CHECK(contains(umt5_config_error(R"({"model_type": "bert"})"), "expected 'umt5'"));
  CHECK(umt5_config_error(R"({"d_model": "wide"})") ==
        "text_encoder/config.json: field 'd_model' must be an integer, got \"wide\"");
  CHECK(contains(umt5_config_error(R"({"num_heads": 0})"), "text_encoder/config.json: field 'num_heads' must be a positive integer, got 0"));
  CHECK(contains(umt5_config_error(R"({"feed_forward_proj": "gated-silu"})"),
                 "text_encoder/config.json: field 'feed_forward_proj' is 'gated-silu'"));
  CHECK(contains(umt5_config_error(R"({"feed_forward_proj": "gated-gelu-x"})"), "field 'feed_forward_proj'"));
  CHECK(contains(umt5_config_error(R"({"relative_attention_num_buckets": 2})"),
                 "field 'relative_attention_num_buckets' must be >= 4, got 2"));
  CHECK(contains(umt5_config_error(R"({"relative_attention_num_buckets": 32, "relative_attention_max_distance": 8})"),
                 "field 'relative_attention_max_distance' must exceed"));
  CHECK(contains(umt5_config_error(R"({"layer_norm_epsilon": -1})"), "field 'layer_norm_epsilon' must be in (0, 1)"));
  CHECK(contains(umt5_config_error(R"({"is_decoder": true})"), "field 'is_decoder' is true"));
  CHECK(umt5_config_error(R"({"model_type": "umt5", "scalable_attention": true, "dense_act_fn": "gelu_new"})") == "(no error)");
}

TEST_CASE("feed_forward_proj is read as transformers reads it") {
  Umt5Config c;
  c.feed_forward_proj = "gated-gelu";
  CHECK(c.is_gated());
  CHECK(c.dense_act_fn() == "gelu_new");
  c.feed_forward_proj = "gated-gelu_new";
  CHECK(c.dense_act_fn() == "gelu_new");
  c.feed_forward_proj = "relu";
  CHECK_FALSE(c.is_gated());
  CHECK(c.dense_act_fn() == "relu");
  c.feed_forward_proj = "gelu";
  CHECK(c.dense_act_fn() == "gelu");  // exact (erf) GELU, unlike "gated-gelu"
}

TEST_CASE("config round-trips through config.json, and umt5-xxl has the published size") {
  for (const auto& name : Umt5Config::preset_names()) {
    CAPTURE(name);
    const auto c = Umt5Config::preset(name);
    const auto back = Umt5Config::from_json(JsonConfig::parse(c.to_json(), name));
    CHECK(back.to_json() == c.to_json());
  }
  auto params = [](const Umt5Config& c) {
    std::int64_t n = 0;
    for (const auto& s : umt5_encoder_specs(c, DType::F32)) n += static_cast<std::int64_t>(s.nbytes() / 4);
    return n;
  };
  // 256384 x 4096 embedding + 24 x (4 x 4096^2 + 32 x 64 + 2 x 4096 + 3 x 10240 x 4096) + 4096
  CHECK(params(Umt5Config::preset("umt5-xxl")) == 5'680'910'336);
  const auto names = umt5_block_tensor_names(Umt5Config::preset("umt5-xxl"), 23);
  REQUIRE(names.size() == 10);
  CHECK(names[0] == "encoder.block.23.layer.0.layer_norm.weight");
  CHECK(names[5] == "encoder.block.23.layer.0.SelfAttention.relative_attention_bias.weight");
  CHECK(names[9] == "encoder.block.23.layer.1.DenseReluDense.wo.weight");
  Umt5Config relu;
  relu.feed_forward_proj = "relu";
  CHECK(umt5_block_tensor_names(relu, 0)[7] == "encoder.block.0.layer.1.DenseReluDense.wi.weight");
}

TEST_CASE("keep-in-fp32: wo is fp32 for fp16 compute only (transformers' _keep_in_fp32_modules)") {
  const std::string wo = "encoder.block.3.layer.1.DenseReluDense.wo.weight";
  CHECK((umt5_weight_dtype(wo, at::kHalf) == at::kFloat));
  CHECK((umt5_weight_dtype(wo, at::kBFloat16) == at::kBFloat16));
  CHECK((umt5_weight_dtype("encoder.block.3.layer.1.DenseReluDense.wi_0.weight", at::kHalf) == at::kHalf));
  CHECK((umt5_weight_dtype("encoder.block.3.layer.0.SelfAttention.o.weight", at::kHalf) == at::kHalf));
}

TEST_CASE("relative position buckets, computed by hand (32 buckets, max distance 128)") {
  // Bidirectional: 16 buckets per direction (+16 when the key is after the query), 8 exact, then
  // 8 + floor(log(|r| / 8) / log(128 / 8) * 8), capped at 15.
  const std::vector<std::int64_t> rel = {0, -1, 1, -7, 7, 8, -8, 20, -100, -127, -128, 200, -1000};
  const std::vector<std::int64_t> want = {0, 1, 17, 7, 23, 24, 8, 26, 15, 15, 15, 31, 15};
  // 20: log(2.5)/log(16)*8 = 2.64 -> 8+2 = 10 (+16); -100: log(12.5)/log(16)*8 = 7.29 -> 15;
  // -128: exactly 8 -> 16, capped at 15; 200: 9.29 -> 17, capped at 15 (+16).
  at::Tensor got = umt5_relative_position_bucket(at::tensor(rel, at::kLong), 32, 128);
  for (std::size_t i = 0; i < rel.size(); ++i) {
    CAPTURE(rel[i]);
    CHECK(got[static_cast<std::int64_t>(i)].item<std::int64_t>() == want[i]);
  }
  // 8 buckets, max distance 6: 4 per direction, 2 exact; |r| = 3 -> 2 + floor(log(1.5)/log(3)*2) = 2.
  at::Tensor small = umt5_relative_position_bucket(at::tensor(std::vector<std::int64_t>{3, -3, 5, -6, 50}, at::kLong), 8, 6);
  CHECK(small[0].item<std::int64_t>() == 6);  // 4 + 2
  CHECK(small[1].item<std::int64_t>() == 2);
  CHECK(small[2].item<std::int64_t>() == 7);  // log(2.5)/log(3)*2 = 1.67 -> 3, +4
  CHECK(small[3].item<std::int64_t>() == 3);  // log(3)/log(3)*2 = 2 -> 4, capped at 3
  CHECK(small[4].item<std::int64_t>() == 7);
}

TEST_CASE("weights in the compute dtype are views into the checkpoint mapping, not copies") {
  TempDir dir;
  write_random_umt5_encoder(dir.file("te"), small_umt5_config(), DType::F16, 7, 0);
  auto m = Umt5Encoder::load(dir.file("te"), at::kHalf);
  const auto& map = m.weights().checkpoint().files()[0]->mapping();
  auto inside = [&](const at::Tensor& t) {
    const auto* p = static_cast<const std::byte*>(t.data_ptr());
    return p >= map->data() && p + t.nbytes() <= map->data() + map->size();
  };
  CHECK(inside(m.global().shared));
  CHECK(inside(m.block(2).q));
  CHECK(inside(m.block(1).rel_bias));
  CHECK(inside(m.block(0).wi_1));
  // fp16: transformers keeps wo in fp32, so it is a converted copy.
  CHECK((m.block(0).wo.scalar_type() == at::kFloat));
  CHECK_FALSE(inside(m.block(0).wo));
  // bf16 compute from the fp16 checkpoint: everything is converted.
  auto b = Umt5Encoder::load(dir.file("te"), at::kBFloat16);
  CHECK((b.block(0).q.scalar_type() == at::kBFloat16));
  CHECK_FALSE(inside(b.block(0).q));
  // The embedding table stays a view in the checkpoint's dtype; begin() converts the rows it gathers.
  const auto& bmap = b.weights().checkpoint().files()[0]->mapping();
  const auto* e = static_cast<const std::byte*>(b.global().shared.data_ptr());
  CHECK((b.global().shared.scalar_type() == at::kHalf));
  CHECK((e >= bmap->data() && e + b.global().shared.nbytes() <= bmap->data() + bmap->size()));
}

TEST_CASE("a checkpoint that disagrees with its config is refused, naming the tensor") {
  TempDir dir;
  auto c = small_umt5_config();
  write_random_umt5_encoder(dir.file("te"), c, DType::F32, 1, 0);
  c.d_ff = 48;
  std::ofstream(dir.file("te/config.json")) << c.to_json();
  try {
    Umt5Encoder::load(dir.file("te"), at::kFloat);
    FAIL("expected an error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK_MESSAGE(contains(msg, "tensor 'encoder.block.0.layer.1.DenseReluDense.wi_0.weight' has shape [24, 16], "
                                "the config implies [48, 16]"),
                  msg);
    CHECK(msg.find("loading text encoder '" + dir.file("te") + "'") == 0);
  }
}

TEST_CASE("bad inputs are refused with the input named") {
  TempDir dir;
  write_random_umt5_encoder(dir.file("te"), small_umt5_config(), DType::F32, 1, 0);
  auto m = Umt5Encoder::load(dir.file("te"), at::kFloat);
  const auto ids = at::tensor(std::vector<std::int64_t>{5, 6, 7, 1}, at::kLong).view({1, 4});
  CHECK_THROWS_WITH_AS(m.forward(ids.view({4}), {}), doctest::Contains("input_ids must be [B, L]"), Error);
  CHECK_THROWS_WITH_AS(m.forward(ids.to(at::kFloat), {}), doctest::Contains("input_ids must be integers"), Error);
  CHECK_THROWS_WITH_AS(m.forward(ids + 700, {}), doctest::Contains("outside the vocabulary [0, 612)"), Error);
  CHECK_THROWS_WITH_AS(m.forward(ids, at::ones({1, 3}, at::kLong)), doctest::Contains("attention_mask must be [1, 4]"),
                       Error);
  CHECK_THROWS_WITH_AS(m.forward(ids, at::full({1, 4}, 2, at::kLong)), doctest::Contains("only 0 and 1"), Error);
}

// The encoder, re-derived in float64 from the formulas (explicit softmax(QK^T + bias + mask) V,
// no SDPA, no shared code with the library but the bucket function), then the pipeline's trim.
TEST_CASE("forward equals a float64 re-derivation of UMT5 within 1e-5, padded rows are exact zeros") {
  TempDir dir;
  const auto c = small_umt5_config();
  write_random_umt5_encoder(dir.file("te"), c, DType::F32, 11, 0);
  auto m = Umt5Encoder::load(dir.file("te"), at::kFloat);
  const std::int64_t B = 2, L = 9;
  at::Tensor ids = at::randint(3, c.vocab_size, {B, L}, at::kLong);
  at::Tensor mask = at::ones({B, L}, at::kLong);
  mask[1].narrow(0, 4, L - 4).zero_();
  ids[1].narrow(0, 4, L - 4).zero_();
  at::Tensor got = m.forward(ids, mask);

  const auto f64 = at::kDouble;
  auto W = [&](const std::string& n) { return m.weights().get(n).to(f64); };
  auto norm = [&](const at::Tensor& x, const at::Tensor& w) {
    return w * x * at::rsqrt(x.pow(2).mean(-1, true) + c.layer_norm_epsilon);
  };
  auto gelu_new = [](const at::Tensor& x) {
    return 0.5 * x * (1 + at::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  };
  at::Tensor h = W("shared.weight").index_select(0, ids.flatten()).view({B, L, c.d_model});
  const at::Tensor pos = at::arange(L, at::kLong);
  const at::Tensor bucket = umt5_relative_position_bucket(pos.unsqueeze(0) - pos.unsqueeze(1),
                                                          c.relative_attention_num_buckets,
                                                          c.relative_attention_max_distance);
  const at::Tensor neg = (1 - mask.to(f64)).view({B, 1, 1, L}) * -1e30;
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "encoder.block." + std::to_string(i) + ".layer.";
    at::Tensor n = norm(h, W(p + "0.layer_norm.weight"));
    auto heads = [&](const std::string& w) {
      return at::matmul(n, W(p + "0.SelfAttention." + w + ".weight").t()).view({B, L, c.num_heads, c.d_kv}).permute({0, 2, 1, 3});
    };
    at::Tensor q = heads("q"), k = heads("k"), v = heads("v");
    at::Tensor bias = W(p + "0.SelfAttention.relative_attention_bias.weight").index_select(0, bucket.flatten());
    bias = bias.view({L, L, c.num_heads}).permute({2, 0, 1}).unsqueeze(0);
    at::Tensor att = at::softmax(at::matmul(q, k.transpose(-1, -2)) + bias + neg, -1);
    at::Tensor o = at::matmul(att, v).permute({0, 2, 1, 3}).reshape({B, L, c.inner_dim()});
    h = h + at::matmul(o, W(p + "0.SelfAttention.o.weight").t());
    n = norm(h, W(p + "1.layer_norm.weight"));
    at::Tensor f = gelu_new(at::matmul(n, W(p + "1.DenseReluDense.wi_0.weight").t())) *
                   at::matmul(n, W(p + "1.DenseReluDense.wi_1.weight").t());
    h = h + at::matmul(f, W(p + "1.DenseReluDense.wo.weight").t());
  }
  at::Tensor want = norm(h, W("encoder.final_layer_norm.weight"));
  want[1].narrow(0, 4, L - 4).zero_();

  REQUIRE(got.sizes() == want.sizes());
  const double rel = ((got.to(f64) - want).norm() / want.norm()).item<double>();
  CHECK(rel < 1e-5);
  CHECK(got[1].narrow(0, 4, L - 4).abs().max().item<float>() == 0.0f);
  CHECK(got[0][L - 1].abs().max().item<float>() > 0.0f);

  // The valid rows do not depend on the padding: row 1 alone, unpadded, gives the same 4 rows.
  at::Tensor alone = m.forward(ids[1].narrow(0, 0, 4).unsqueeze(0), {});
  CHECK(at::allclose(alone[0], got[1].narrow(0, 0, 4), 1e-5, 1e-5));
}

TEST_CASE("streaming blocks through begin/umt5_block_forward/end equals forward(), blocks bound from any tensors") {
  TempDir dir;
  const auto c = small_umt5_config();
  write_random_umt5_encoder(dir.file("te"), c, DType::F32, 3, 0);
  auto resident = Umt5Encoder::load(dir.file("te"), at::kFloat);
  auto streamed = Umt5Encoder::load(dir.file("te"), at::kFloat, /*load_blocks=*/false);
  at::Tensor ids = at::randint(0, c.vocab_size, {2, 7}, at::kLong);
  at::Tensor mask = at::ones({2, 7}, at::kLong);
  mask[0].narrow(0, 5, 2).zero_();
  at::Tensor want = resident.forward(ids, mask);

  auto s = streamed.begin(ids, mask);
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    const auto names = umt5_block_tensor_names(c, i);
    std::int64_t total = 0;
    for (const auto& n : names) total += resident.weights().get(n).numel();
    at::Tensor flat = at::empty({total}, at::kFloat);  // one buffer, as an offload slot holds a block
    std::vector<at::Tensor> views;
    std::int64_t off = 0;
    for (const auto& n : names) {
      at::Tensor src = resident.weights().get(n);
      at::Tensor v = flat.narrow(0, off, src.numel()).view(src.sizes());
      v.copy_(src);
      views.push_back(v);
      off += src.numel();
    }
    s.h = umt5_block_forward(Umt5BlockWeights::bind(views, c), s, s.h, c);
  }
  CHECK(at::equal(streamed.end(s), want));
  CHECK(s.seq_lens == std::vector<std::int64_t>{5, 7});
}

TEST_CASE("compact mode: the blocks see only the real tokens, and same embedding up to rounding, same shape") {
  TempDir dir;
  const auto c = small_umt5_config();
  write_random_umt5_encoder(dir.file("te"), c, DType::F32, 5, 0);
  auto m = Umt5Encoder::load(dir.file("te"), at::kFloat);
  const std::int64_t L = 12;
  at::Tensor ids = at::randint(3, c.vocab_size, {2, L}, at::kLong);
  at::Tensor mask = at::zeros({2, L}, at::kLong);
  mask[0].narrow(0, 0, 5).fill_(1);
  mask[1].narrow(0, 0, 3).fill_(1);
  const at::Tensor full = m.forward(ids, mask);
  const auto s = m.begin(ids, mask, /*compact=*/true);
  CHECK(s.length == 5);
  CHECK(s.output_length == L);
  const at::Tensor compact = m.forward(ids, mask, /*compact=*/true);
  REQUIRE(compact.sizes() == full.sizes());
  CHECK(at::allclose(compact, full, 1e-5, 1e-6));
  CHECK(compact[0].narrow(0, 5, L - 5).abs().max().item<float>() == 0.0f);
  CHECK(compact[1].narrow(0, 3, L - 3).abs().max().item<float>() == 0.0f);
  // Left padding cannot be cut off the end.
  at::Tensor left = at::ones({1, L}, at::kLong);
  left[0][0] = 0;
  CHECK_THROWS_WITH_AS(m.forward(ids.narrow(0, 0, 1), left, true), doctest::Contains("needs right padding"), Error);
}

// transformers' UMT5EncoderModel on the same weights (3 heads x 10, inner 30 != d_model 24, 16
// buckets, max distance 20 < L = 60, so the log-spaced buckets are used), then WanPipeline's trim
// and zero-pad; rows of 60, 3 and 41 real tokens. Bitwise equal at 1 thread on the CPU
// that made the goldens (golden.h).
TEST_CASE("the embedding equals transformers' output stored in the goldens, bit for bit, fp32 and bf16") {
  at::set_num_threads(1);
  for (const std::string name : {"umt5_fp32", "umt5_bf16"}) {
    CAPTURE(name);
    const dlo::test::Golden g(name);
    TempDir dir;
    const auto c = Umt5Config::from_json(JsonConfig::parse(g.meta("config"), name));
    write_random_umt5_encoder(dir.file("te"), c, g.weights_dtype(), g.seed(), 0);
    g.check_weights(dir.file("te"));
    auto m = Umt5Encoder::load(dir.file("te"), g.compute_dtype());
    const at::Tensor want = g.get("output");
    const at::Tensor got = m.forward(g.get("input_ids"), g.get("attention_mask"));
    REQUIRE(got.sizes() == want.sizes());
    REQUIRE((got.scalar_type() == want.scalar_type()));
    g.check_output(got, want);

    // The batch has an unpadded row, so compact mode cuts nothing: still bitwise.
    CHECK(at::equal(m.forward(g.get("input_ids"), g.get("attention_mask"), /*compact=*/true), got));
    // Without it (rows of 3 and 41 tokens) the blocks see 41 positions instead of 60: compact mode
    // is not transformers' arithmetic, so a tolerance. Measured with the correct code: rel err
    // 2.3e-7 (fp32) and 4.6e-3 (bf16, a few bf16 roundings apart); the bars are those with a
    // margin (x4, x1.7). Bitwise equality of the uncut batch above is what catches a wrong bucket.
    const at::Tensor ids = g.get("input_ids").narrow(0, 1, 2), mask = g.get("attention_mask").narrow(0, 1, 2);
    const at::Tensor compact = m.forward(ids, mask, /*compact=*/true);
    REQUIRE(compact.sizes() == want.narrow(0, 1, 2).sizes());
    const double err = dlo::test::golden_rel_err(compact, want.narrow(0, 1, 2));
    CHECK_MESSAGE(err < (g.compute_dtype() == at::kFloat ? 1e-6 : 8e-3), "compact rel err " << err);
  }
}
