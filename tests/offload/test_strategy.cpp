// The offload strategy "auto" picks, and the working memory it decides with (issue 11, A3/A4).
#include "common/doctest_torch.h"

#include "dlo/common/error.h"
#include "dlo/dist/device.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/offload/strategy.h"

using namespace dlo;

namespace {

constexpr std::uint64_t MB = 1000 * 1000;

// `n` blocks of `block_mb` MB; a shard is 1/ranks of a block; one slot holds a block.
StackSize blocks(int n, std::uint64_t block_mb, int ranks) {
  StackSize s;
  s.ranks = ranks;
  s.slot_bytes = block_mb * MB;
  for (int i = 0; i < n; ++i) {
    s.block_bytes.push_back(block_mb * MB);
    s.shard_bytes.push_back(block_mb * MB / static_cast<std::uint64_t>(ranks));
  }
  return s;
}

MemoryBudget device_budget(std::uint64_t device, std::uint64_t host) {
  MemoryBudget b;
  b.device_is_host = false;
  b.device = device;
  b.device_why = "test";
  b.host = host;
  b.host_why = "test";
  return b;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("Wan token counts for the real shapes: 1.3B at 480x832 and 14B at 720x1280, 81 frames") {
  // Latents: 81 frames -> 21, /8 spatially; patches 1x2x2. diffusers: (21/1)*(60/2)*(104/2) = 32760.
  CHECK(wan_tokens(WanTransformerConfig::preset("wan2.1-t2v-1.3b"), 21, 60, 104) == 32760);
  CHECK(wan_tokens(WanTransformerConfig::preset("wan2.1-t2v-14b"), 21, 90, 160) == 75600);
}

TEST_CASE("the real shapes' parameter counts equal diffusers' WanTransformer3DModel of the same config") {
  // sum(p.numel() for p in WanTransformer3DModel(**config).parameters()), diffusers 0.42.1 on the
  // meta device: 14288491584 for an A14B expert (= Wan2.1 14B), 4999787712 for TI2V-5B.
  const auto params = [](const std::string& preset) {
    std::uint64_t n = 0;
    for (const auto& s : wan_transformer_specs(WanTransformerConfig::preset(preset), DType::BF16)) {
      std::uint64_t e = 1;
      for (auto d : s.shape) e *= static_cast<std::uint64_t>(d);
      n += e;
    }
    return n;
  };
  CHECK(params("wan2.2-t2v-a14b") == 14288491584ull);
  CHECK(params("wan2.1-t2v-14b") == 14288491584ull);
  CHECK(params("wan2.2-ti2v-5b") == 4999787712ull);
  CHECK(WanTransformerConfig::preset_has_two_experts("wan2.2-t2v-a14b"));
  CHECK(!WanTransformerConfig::preset_has_two_experts("wan2.2-ti2v-5b"));
}

TEST_CASE("working memory of one forward, counted by hand for Wan 1.3B bf16 with guidance at 480p") {
  const auto c = WanTransformerConfig::preset("wan2.1-t2v-1.3b");
  // L = 32760, D = 1536, ffn 8960, T = 512, text_dim 4096, es = 2, latent 21*60*104 = 131040.
  // kept per branch: 2 L D es + T D es + T 4096 es + latent 16 es + latent 16 * 4 = 219,624,448
  // self-attention: L D (12 + 16) = 1,408,942,080; feed-forward: L D 12 + 2 L ffn 2 = 1,777,950,720
  // 1.25 * (2 * 219,624,448 + 1,777,950,720) + 256 MiB = 2,771,499,520 + 268,435,456
  CHECK(wan_forward_working_bytes(c, 21, 60, 104, 512, 2, DType::BF16) == 3039934976ULL);
  // The review's figure for the old estimate was 140.1 GiB (16x the tokens, fp32 for everything).
  CHECK(wan_forward_working_bytes(c, 21, 60, 104, 512, 2, DType::BF16) < 4ULL << 30);
  // Guidance adds a branch's kept tensors, not a second block's intermediates.
  const auto one = wan_forward_working_bytes(c, 21, 60, 104, 512, 1, DType::BF16);
  CHECK(wan_forward_working_bytes(c, 21, 60, 104, 512, 2, DType::BF16) - one == 274530560ULL);  // 1.25 * kept
  // fp32 intermediates are larger.
  CHECK(wan_forward_working_bytes(c, 21, 60, 104, 512, 2, DType::F32) > one * 3 / 2);
  // 14B at 720p: self-attention dominates, L D (12 + 16) = 10,838,016,000; 17,514,408,960 + 256 MiB.
  const auto big = WanTransformerConfig::preset("wan2.1-t2v-14b");
  CHECK(wan_forward_working_bytes(big, 21, 90, 160, 512, 2, DType::BF16) == 17782844416ULL);
}

TEST_CASE("auto prefers resident, then device shards, mixed, dlo, layerwise, and says why") {
  // 10 blocks of 100 MB at 2 ranks: shards 500 MB, two slots 200 MB; working 10 MB; 10% margin.
  const StackSize s2 = blocks(10, 100, 2);
  const std::uint64_t w = 10 * MB, host = 100000 * MB;
  // 1000 + 10 (+101) fit 1200.
  auto c = choose_strategy(StrategyRequest{}, s2, w, device_budget(1200 * MB, host));
  CHECK((c.strategy == Strategy::kResident));
  CHECK(has(c.reason, "fit the device budget"));
  // Resident needs 1111 > 800; shards 500 + slots 200 + 10 = 710 (+71) fit.
  c = choose_strategy(StrategyRequest{}, s2, w, device_budget(800 * MB, host));
  CHECK((c.strategy == Strategy::kDeviceShards));
  CHECK(c.device_blocks == 10);
  // 210 + 4 x 50 = 410 (+41 = 451) fits 500; a fifth shard (460 + 46) does not.
  c = choose_strategy(StrategyRequest{}, s2, w, device_budget(500 * MB, host));
  CHECK((c.strategy == Strategy::kMixed));
  CHECK(c.device_blocks == 4);
  CHECK(has(c.reason, "4 of 10 blocks"));
  // Room for the slots and the working memory (231) but no shard (286): host shards.
  c = choose_strategy(StrategyRequest{}, s2, w, device_budget(240 * MB, host));
  CHECK((c.strategy == Strategy::kDlo));
  // ... unless the host cannot keep the shards (500 MB) or the stack either: nothing fits.
  CHECK_THROWS_WITH_AS(choose_strategy(StrategyRequest{}, s2, w, device_budget(240 * MB, 400 * MB)),
                       doctest::Contains("fit neither"), Error);
  // Mixed needs the host to keep the other blocks' shards (300 MB): not with 90 MB.
  CHECK_THROWS_WITH_AS(choose_strategy(StrategyRequest{}, s2, w, device_budget(500 * MB, 90 * MB)),
                       doctest::Contains("fit neither"), Error);
  // Not even two slots and the activations.
  CHECK_THROWS_WITH_AS(choose_strategy(StrategyRequest{}, s2, 500 * MB, device_budget(240 * MB, host)),
                       doctest::Contains("cannot hold even two block slots"), Error);
  // One rank: "device shards" would be the resident blocks plus slots, so never chosen; mixed keeps
  // whole blocks (210 + 100 = 310, +31 <= 440; 410 + 41 > 440); then layerwise.
  const StackSize s1 = blocks(10, 100, 1);
  c = choose_strategy(StrategyRequest{}, s1, w, device_budget(440 * MB, host));
  CHECK((c.strategy == Strategy::kMixed));
  CHECK(c.device_blocks == 1);
  c = choose_strategy(StrategyRequest{}, s1, w, device_budget(240 * MB, host));
  CHECK((c.strategy == Strategy::kLayerwise));
}

TEST_CASE("explicit strategies: mixed takes its block count from the budget, clamped, the host part is checked") {
  const StackSize s2 = blocks(10, 100, 2);
  auto c = choose_strategy(Strategy::kMixed, s2, 10 * MB, device_budget(500 * MB, 0));
  CHECK((c.strategy == Strategy::kMixed));
  CHECK(c.device_blocks == 4);
  CHECK(choose_strategy(Strategy::kMixed, s2, 0, device_budget(1, 0)).device_blocks == 1);
  CHECK(choose_strategy(Strategy::kMixed, s2, 0, device_budget(100000 * MB, 0)).device_blocks == 9);
  CHECK(choose_strategy(Strategy::kDeviceShards, s2, 0, device_budget(1, 0)).device_blocks == 10);
  CHECK((choose_strategy(Strategy::kResident, s2, 0, device_budget(1, 0)).strategy == Strategy::kResident));
  CHECK_THROWS_WITH_AS(choose_strategy(Strategy::kDlo, s2, 0, device_budget(1, 100 * MB)),
                       doctest::Contains("of shards per rank on the host"), Error);
  CHECK_THROWS_WITH_AS(choose_strategy(Strategy::kLayerwise, s2, 0, device_budget(1, 100 * MB)),
                       doctest::Contains("keeps the whole stack"), Error);
  // A name is read once, where it enters: the request carries the strategy, not its text.
  CHECK_THROWS_WITH_AS(parse_strategy_request("fast", "--offload"),
                       "--offload: 'fast' is not auto, resident, device-shards, mixed, dlo or layerwise", Error);
  CHECK(parse_strategy_request("auto", "offload").is_auto());
  CHECK((parse_strategy_request("device-shards", "offload").strategy == Strategy::kDeviceShards));
  CHECK_THROWS_WITH_AS(choose_strategy(Strategy::kMixed, blocks(1, 100, 2), 0, device_budget(1, 0)),
                       doctest::Contains("at least 2 blocks"), Error);
}

TEST_CASE("on the CPU without a device budget: the page cache, shared by the node's ranks") {
  // 20 blocks of 50 MB: 1000 MB; at 4 ranks shards 250 MB, slots 100 MB.
  MemoryBudget b;  // device_is_host
  b.host_why = "test";
  b.host = 2000 * MB;
  b.ranks_per_node = 1;
  auto c = choose_strategy(StrategyRequest{}, blocks(20, 50, 4), 50 * MB, b);
  CHECK((c.strategy == Strategy::kResident));
  CHECK(has(c.reason, "shared by the ranks of a node"));
  // 1000 + 50 (+105) > 600; shards 250 + slots 100 + 50 = 400 (+40) fit.
  b.host = 600 * MB;
  c = choose_strategy(StrategyRequest{}, blocks(20, 50, 4), 50 * MB, b);
  CHECK((c.strategy == Strategy::kDlo));
  // Working memory counts once per rank of the node: 2 x 600 = 1200 < 1000 + 2 x 150 (+130).
  b.ranks_per_node = 2;
  c = choose_strategy(StrategyRequest{}, blocks(20, 50, 4), 150 * MB, b);
  CHECK((c.strategy == Strategy::kDlo));
  b.host = 2000 * MB;
  CHECK((choose_strategy(StrategyRequest{}, blocks(20, 50, 4), 150 * MB, b).strategy == Strategy::kResident));
  // One rank and too little memory: refused, naming the way to run it anyway.
  b.ranks_per_node = 1;
  b.host = 600 * MB;
  CHECK_THROWS_WITH_AS(choose_strategy(StrategyRequest{}, blocks(20, 50, 1), 50 * MB, b), doctest::Contains("do not fit this node"),
                       Error);
}

TEST_CASE("agreed budget: a device budget makes the CPU a device of that size, the host figure is set") {
  int argc = 0;
  char** argv = nullptr;
  static MpiWorld world(&argc, &argv);
  const DeviceSharing sharing = device_sharing(world, c10::kCPU, "");
  CHECK(sharing.ranks_on_device == 1);
  CHECK(sharing.id == world.host() + "/cpu");
  check_exclusive_devices(world, c10::kCPU, sharing);  // the CPU is never exclusive; no throw
  MemoryBudget b = agree_memory_budget(world, c10::kCPU, sharing, 123 * MB);
  CHECK_FALSE(b.device_is_host);
  CHECK(b.device == 123 * MB);
  CHECK(b.host > 0);
  b = agree_memory_budget(world, c10::kCPU, sharing, std::nullopt);
  CHECK(b.device_is_host);
  CHECK(b.device == 0);
}

TEST_CASE("two experts: joined stacks count both experts' blocks and two slots per expert, mixed splits over them") {
  const StackSize joined = join_stacks({blocks(5, 100, 2), blocks(5, 100, 2)});
  CHECK(joined.stacks() == 2);
  CHECK(joined.total() == 1000 * MB);
  CHECK(joined.shards_total() == 500 * MB);
  CHECK(joined.slots_total() == 400 * MB);  // 2 slots of 100 MB per expert
  CHECK(blocks(10, 100, 2).slots_total() == 200 * MB);
  // By hand, 500 MB device, 10 MB working, 10% margin (need <= 454.5 MB): one stack of 10 blocks
  // fits 2 slots + 4 shards (200 + 10 + 200); two experts' 4 slots + 10 leave no room for a 50 MB
  // shard (460): host shards.
  const MemoryBudget b = device_budget(500 * MB, 4000 * MB);
  CHECK(choose_strategy(StrategyRequest{}, blocks(10, 100, 2), 10 * MB, b).device_blocks == 4);
  const StrategyChoice c = choose_strategy(StrategyRequest{}, joined, 10 * MB, b);
  CHECK((c.strategy == Strategy::kDlo));
  CHECK_THROWS_WITH_AS(choose_strategy(StrategyRequest{}, joined, 10 * MB, device_budget(350 * MB, 4000 * MB)),
                       doctest::Contains("cannot hold even 4 block slots (2 per expert)"), Error);
  // Mixed's device blocks count from the first expert's block 0.
  StrategyChoice m{Strategy::kMixed, 7, "test"};
  auto per = split_choice(m, joined);
  REQUIRE(per.size() == 2);
  CHECK((per[0].strategy == Strategy::kDeviceShards));
  CHECK(per[0].device_blocks == 5);
  CHECK((per[1].strategy == Strategy::kMixed));
  CHECK(per[1].device_blocks == 2);
  m.device_blocks = 3;
  per = split_choice(m, joined);
  CHECK((per[0].strategy == Strategy::kMixed));
  CHECK(per[0].device_blocks == 3);
  CHECK((per[1].strategy == Strategy::kDlo));
  per = split_choice({Strategy::kDeviceShards, 10, "test"}, joined);
  CHECK(per[0].device_blocks == 5);
  CHECK(per[1].device_blocks == 5);
  per = split_choice({Strategy::kDlo, 0, "test"}, joined);
  CHECK((per[0].strategy == Strategy::kDlo && per[1].strategy == Strategy::kDlo));
  CHECK(split_choice(m, blocks(10, 100, 2)).size() == 1);
}
