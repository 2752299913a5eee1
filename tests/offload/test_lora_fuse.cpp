// models/wan_lora_fuse.h through offload/stack_plan.h: a fused LoRA is PEFT's merge on the CPU
// (written out here from peft/tuners/lora/layer.py's Linear.merge and get_delta_weight), and a
// rank that packs a range of a merged tensor gets exactly those bytes of the whole merge, whatever
// the rank count (each rank multiplies only its rows of up by down). The parity tests compare
// whole videos with diffusers' fuse_lora.
#include "common/doctest_torch.h"

#include <cstring>

#include "common/test_util.h"
#include "dlo/models/tensor_view.h"
#include "dlo/models/wan_lora_fuse.h"
#include "dlo/offload/stack_plan.h"
#include "dlo/testing/random_weights.h"

using namespace dlo;
using dlo::test::TempDir;

namespace {

LoraModule module_of(std::int64_t out, std::int64_t in, std::int64_t r, at::ScalarType file_dtype, bool bias,
                     double scaling, std::uint64_t seed) {
  at::manual_seed(seed);
  LoraModule m;
  m.down = at::randn({r, in}).to(file_dtype);
  m.up = at::randn({out, r}).to(file_dtype);
  if (bias) m.bias = at::randn({out}).to(file_dtype);
  m.scaling = scaling;
  return m;
}

// PEFT 0.21.2 on the CPU, written out: adapters moved to the base dtype; for a bf16/fp16 base the
// product in fp32, rounded back; weight += delta, then the next adapter; bias += up_bias * scaling.
at::Tensor peft_merge(at::Tensor w, const std::vector<std::pair<const LoraModule*, double>>& adapters, bool bias) {
  const at::ScalarType base = w.scalar_type();
  const bool cast = base == at::kBFloat16 || base == at::kHalf;
  w = w.clone();
  for (const auto& [m, s] : adapters) {
    if (bias) {
      w += m->bias.to(base) * s;
      continue;
    }
    at::Tensor a = m->down.to(base), b = m->up.to(base);
    if (cast) a = a.to(at::kFloat), b = b.to(at::kFloat);
    at::Tensor delta = at::matmul(b, a) * s;
    w += cast ? delta.to(base) : delta;
  }
  return w;
}

}  // namespace

TEST_CASE("fused LoRAs: PEFT's CPU merge, adapters in order, biases, bf16 and fp32 bases") {
  auto c = WanTransformerConfig::preset("wan-test");
  const std::int64_t d = c.dim();
  LoraFile a{"a.safetensors", "test", {}, {}}, b{"b.safetensors", "test", {}, {}};
  a.modules["blocks.0.attn1.to_q"] = module_of(d, d, 4, at::kBFloat16, true, 1.0, 1);
  b.modules["blocks.0.attn1.to_q"] = module_of(d, d, 2, at::kHalf, false, 2.0, 2);  // a metadata scaling of 2
  b.modules["proj_out"] = module_of(c.out_channels * c.patch_size[0] * c.patch_size[1] * c.patch_size[2], d, 3, at::kFloat, true, 1.0, 3);
  const FusedLoras fused({{a, 0.7}, {b, 0.3}}, c);
  CHECK(fused.touches("blocks.0.attn1.to_q.weight"));
  CHECK(fused.touches("blocks.0.attn1.to_q.bias"));
  CHECK_FALSE(fused.touches("blocks.0.attn1.to_k.weight"));
  CHECK_FALSE(fused.touches("blocks.1.attn1.to_q.weight"));
  const LoraModule& qa = a.modules.at("blocks.0.attn1.to_q");
  const LoraModule& qb = b.modules.at("blocks.0.attn1.to_q");
  const LoraModule& po = b.modules.at("proj_out");
  for (at::ScalarType base : {at::kBFloat16, at::kFloat}) {
    CAPTURE(base);
    at::manual_seed(7);
    const at::Tensor w = at::randn({d, d}).to(base), bias = at::randn({d}).to(base);
    at::Tensor rows = w.clone();
    fused.apply("blocks.0.attn1.to_q.weight", rows, 0);
    CHECK(at::equal(rows, peft_merge(w, {{&qa, 0.7 * 1.0}, {&qb, 0.3 * 2.0}}, false)));
    at::Tensor brows = bias.clone().view({-1, 1});
    fused.apply("blocks.0.attn1.to_q.bias", brows, 0);
    CHECK(at::equal(brows.view({-1}), peft_merge(bias, {{&qa, 0.7}}, true)));  // b has no bias there
    const at::Tensor pw = at::randn({c.out_channels * c.patch_size[0] * c.patch_size[1] * c.patch_size[2], d}).to(base);
    at::Tensor prows = pw.clone();
    fused.apply("proj_out.weight", prows, 0);
    CHECK(at::equal(prows, peft_merge(pw, {{&po, 0.3}}, false)));
    CHECK_FALSE(at::equal(prows, pw));
  }
  // The identity names each file and strength, in order (what the plan's fingerprint mixes in).
  CHECK(fused.identity() == "a.safetensors:0.69999999999999996; b.safetensors:0.29999999999999999");
  // A LoRA of another width is refused by name when the set is made.
  LoraFile wide{"wide.safetensors", "test", {}, {}};
  wide.modules["blocks.0.attn1.to_q"] = module_of(d + 1, d, 2, at::kBFloat16, false, 1.0, 4);
  CHECK_THROWS_WITH_AS(FusedLoras({{wide, 1.0}}, c), doctest::Contains("wide.safetensors"), Error);
}

TEST_CASE("fused LoRAs: each rank's packed range of a merged block equals the whole merge, 1-4 ranks, at the 1.3B's widths, bf16 and fp8 storage") {
  // Wan2.1 1.3B's q (1536 x 1536) and FFN in (8960 x 1536), rank 32: every shard boundary cuts
  // rows, and each rank multiplies only the rows of up it packs.
  const std::int64_t d = 1536, f = 8960;
  auto c = WanTransformerConfig::preset("wan2.1-t2v-1.3b");
  c.num_layers = 1;
  TempDir dir;
  std::vector<TensorSpec> specs = {{"blocks.0.attn1.to_q.weight", DType::BF16, {d, d}},
                                   {"blocks.0.attn1.to_q.bias", DType::BF16, {d}},
                                   {"blocks.0.ffn.net.0.proj.weight", DType::BF16, {f, d}}};
  write_random_checkpoint(dir.file("ck"), specs, [](const TensorSpec&) { return RandomInit{0.0, 0.02}; }, 5, {});
  const auto shared = std::make_shared<const Checkpoint>(Checkpoint::open(dir.file("ck")));
  LoraFile l{"l.safetensors", "test", {}, {}};
  l.modules["blocks.0.attn1.to_q"] = module_of(d, d, 32, at::kBFloat16, true, 1.0, 11);
  l.modules["blocks.0.ffn.net.0.proj"] = module_of(f, d, 32, at::kBFloat16, false, 1.0, 12);
  const auto fused = std::make_shared<const FusedLoras>(std::vector<FusedLora>{{l, 0.5}}, c);
  const std::vector<std::string> names = {"blocks.0.attn1.to_q.weight", "blocks.0.attn1.to_q.bias",
                                          "blocks.0.ffn.net.0.proj.weight"};
  for (DType storage : {DType::BF16, DType::F8_E4M3}) {
    CAPTURE(static_cast<int>(storage));
    const auto as = [&](const std::string& n) {
      return PackedAs(n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0 ? DType::BF16 : storage, DType::BF16, fused);
    };
    const StackPlan one(shared, {names}, as, 1);
    // The whole merge, tensor by tensor, as the resident path forms it.
    std::vector<at::Tensor> whole;
    for (const auto& t : one.block(0).tensors) whole.push_back(StackPlan::packed_values(t, tensor_view(*shared, *t.source)));
    CHECK_FALSE(at::equal(whole[0].to(at::kFloat), tensor_view(*shared, names[0]).to(at::kFloat)));  // the LoRA changed it
    for (int ranks = 1; ranks <= 4; ++ranks) {
      CAPTURE(ranks);
      const StackPlan plan(shared, {names}, as, ranks);
      std::vector<std::byte> gathered(plan.padded_bytes(0));
      for (int r = 0; r < ranks; ++r) {
        const std::uint64_t s = plan.shard_bytes(0);
        plan.pack(0, r * s, (r + 1) * s, gathered.data() + r * s, false);
      }
      const auto v = plan.views(0, gathered.data(), at::kCPU);
      for (std::size_t k = 0; k < names.size(); ++k) {
        CAPTURE(names[k]);
        CHECK(at::equal(v[k].view(at::kByte), whole[k].contiguous().view(at::kByte)));
      }
      CHECK(plan.fingerprint() != StackPlan(shared, {names}, [&](const std::string& n) {
                                    return PackedAs(as(n).dtype, DType::BF16);
                                  }, ranks).fingerprint());
    }
  }
}

TEST_CASE("the memory plan's adapter bytes: a LoRA file's header read alone gives wan_job_adapters' modules, shapes and bytes") {
  // A ComfyUI-layout file in bf16 with alpha != rank and a diff_b on q, and the time embedder's
  // first Linear (kept in fp32 by diffusers, so its adapters too), at rank 4.
  const auto c = WanTransformerConfig::preset("wan-test");
  const std::int64_t d = c.dim(), r = 4;
  TempDir dir;
  at::manual_seed(3);
  const auto bf = [](std::vector<std::int64_t> shape) { return at::randn(shape).to(at::kBFloat16); };
  save_tensors(dir.file("l.safetensors"),
               {{"diffusion_model.blocks.0.self_attn.q.lora_down.weight", bf({r, d})},
                {"diffusion_model.blocks.0.self_attn.q.lora_up.weight", bf({d, r})},
                {"diffusion_model.blocks.0.self_attn.q.alpha", at::full({}, 8.0).to(at::kBFloat16)},
                {"diffusion_model.blocks.0.self_attn.q.diff_b", bf({d})},
                {"diffusion_model.time_embedding.0.lora_down.weight", bf({r, c.freq_dim})},
                {"diffusion_model.time_embedding.0.lora_up.weight", bf({d, r})}});
  const LoraFile full = read_wan_lora(dir.file("l.safetensors"));
  const LoraFile head = read_wan_lora(dir.file("l.safetensors"), LoraRead::kShapes);
  REQUIRE(head.modules.size() == 2);
  CHECK(head.layout == full.layout);
  for (const auto& [name, m] : full.modules) {
    CAPTURE(name);
    const LoraModule& h = head.modules.at(name);
    CHECK(h.down.is_meta());
    CHECK(h.down.sizes() == m.down.sizes());
    CHECK(h.up.sizes() == m.up.sizes());
    CHECK((h.down.scalar_type() == m.down.scalar_type()));
    CHECK(h.bias.defined() == m.bias.defined());
    CHECK(h.scaling == m.scaling);
  }
  // What the adapters take on the device, counted from the tensors wan_job_adapters makes there
  // and by hand: q's down [4, d], up [d, 4] and bias [d] in bf16; the time embedder's down
  // [4, freq_dim] and up [d, 4] in fp32.
  const std::vector<LoraSpec> specs = {{dir.file("l.safetensors"), 0.5, -1}, {dir.file("l.safetensors"), 1.0, -1}};
  const auto adapters = wan_job_adapters(specs, 0, c, at::kBFloat16, at::kCPU);
  std::uint64_t made = 0;
  for (const auto& [name, list] : adapters->modules)
    for (const LinearAdapter& a : list)
      made += a.down.nbytes() + a.up.nbytes() + (a.bias.defined() ? a.bias.nbytes() : 0);
  const std::uint64_t by_hand = 2 * ((2 * r * d + d) * 2 + (r * c.freq_dim + r * d) * 4);
  CHECK(made == by_hand);
  CHECK(wan_job_adapter_bytes(specs, 0, c, at::kBFloat16) == by_hand);
  CHECK(wan_job_adapter_bytes({{dir.file("l.safetensors"), 1.0, 1}}, 0, c, at::kBFloat16) == 0);  // another expert's
  // A LoRA of another width is refused by the header read as by the full one.
  auto narrow = c;
  narrow.attention_head_dim /= 2;
  CHECK_THROWS_WITH_AS(wan_job_adapter_bytes(specs, 0, narrow, at::kBFloat16), doctest::Contains("l.safetensors"), Error);
}
