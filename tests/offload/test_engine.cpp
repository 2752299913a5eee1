// The offload engine under mpirun -np 1..4: every strategy (resident, device-shards, mixed with 1 and
// n-1 device blocks, dlo, layerwise) gives bitwise the same result as the resident model, with
// guidance, over consecutive passes, with ranks that have less or no work; what each keeps and
// moves per pass equals what the plan says by hand; blocks of different sizes and dtypes are
// gathered exactly; two engines (two experts) traversed together stay exact and in step.
#include "common/doctest_torch.h"

#include <filesystem>

#include "common/mpi_test_util.h"
#include "common/test_util.h"
#include "dlo/common/error.h"
#include "dlo/dist/collective.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/io/safetensors_writer.h"
#include "dlo/models/tensor_view.h"
#include "dlo/testing/make_model.h"
#include "dlo/testing/random_weights.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/offload/engine.h"
#include "dlo/offload/runner.h"
#include "dlo/offload/wave.h"

using namespace dlo;

namespace {

using dlo::test::SharedDir;
using dlo::test::world;

std::unique_ptr<Collective> collective_for(Strategy s) {
  return is_sharded(s) && world().size() > 1 ? make_mpi_collective(world()) : nullptr;
}

// A strategy as the tests run it: mixed twice, with the fewest and the most device-held blocks.
struct Mode {
  Strategy strategy;
  std::int64_t device_blocks = 0;
  std::string label;
};

std::vector<Mode> every_mode(std::int64_t blocks) {
  return {{Strategy::kResident, 0, "resident"},
          {Strategy::kDeviceShards, 0, "device-shards"},
          {Strategy::kMixed, 1, "mixed, 1 block on the device"},
          {Strategy::kMixed, blocks - 1, "mixed, all but 1 block on the device"},
          {Strategy::kDlo, 0, "dlo"},
          {Strategy::kLayerwise, 0, "layerwise"}};
}

EngineOptions options_for(const Mode& m) {
  EngineOptions eo;
  eo.strategy = m.strategy;
  eo.device_blocks = m.device_blocks;
  return eo;
}

// What an engine must keep and move, by hand from the plan (engine.h's rules, not its code):
// - device-held blocks: all for device-shards, 0..device_blocks-1 for mixed; their shard lives in
//   device memory, every other streamed block's part (shard, or the whole block padded to 256 bytes
//   for layerwise) in host memory;
// - every non-resident block goes through the two slots, except device-held blocks at one rank,
//   which are used in place;
// - each visit of a block through a slot moves the block's bytes into the slot, copies its part
//   from host memory (unless device-held), and gathers shard * (ranks - 1) bytes (sharded only);
// - the ring prefetches one block ahead, so with more than two slot blocks every pass refills each
//   of them once (and the last prefetch brings block 0 once more when it is a slot block); with at
//   most two they stay in the slots after their first visit.
struct Expected {
  std::uint64_t host_bytes = 0, device_shard_bytes = 0, slot_bytes = 0;
  std::vector<bool> slotted;  // [block] goes through the slots
  std::vector<std::uint64_t> streamed, h2d, gathered;  // [block] per visit through a slot
  bool refilled_every_pass = false;

  // A counter after `passes` traversals from a cold start.
  std::uint64_t total(const std::vector<std::uint64_t>& per_visit, std::uint64_t passes) const {
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < per_visit.size(); ++i)
      if (slotted[i]) sum += per_visit[i];
    if (!refilled_every_pass) return sum;
    return passes * sum + (slotted[0] ? per_visit[0] : 0);
  }
  // The counter's increase over one pass in steady state.
  std::uint64_t per_pass(const std::vector<std::uint64_t>& per_visit) const {
    return refilled_every_pass ? total(per_visit, 1) - (slotted[0] ? per_visit[0] : 0) : 0;
  }
};

Expected expected(const StackPlan& plan, const Mode& m, int ranks) {
  Expected e;
  const bool sharded = m.strategy == Strategy::kDeviceShards || m.strategy == Strategy::kMixed ||
                       m.strategy == Strategy::kDlo;
  std::int64_t slot_blocks = 0;
  for (std::int64_t i = 0; i < plan.num_blocks(); ++i) {
    const std::uint64_t shard = plan.shard_bytes(i), bytes = plan.block(i).bytes;
    const bool on_device = m.strategy == Strategy::kDeviceShards || (m.strategy == Strategy::kMixed && i < m.device_blocks);
    const bool slotted = m.strategy != Strategy::kResident && !(on_device && ranks == 1);
    const std::uint64_t part = sharded ? shard : bytes;
    if (m.strategy != Strategy::kResident) {
      if (on_device) e.device_shard_bytes += shard;
      else e.host_bytes += sharded ? shard : (bytes + 255) / 256 * 256;
    }
    if (slotted) {
      ++slot_blocks;
      e.slot_bytes = std::max({e.slot_bytes, shard * static_cast<std::uint64_t>(ranks), std::uint64_t{256}});
    }
    e.slotted.push_back(slotted);
    e.streamed.push_back(bytes);
    e.h2d.push_back(on_device ? 0 : part);
    e.gathered.push_back(sharded ? shard * static_cast<std::uint64_t>(ranks - 1) : 0);
  }
  e.refilled_every_pass = slot_blocks > 2;
  return e;
}

}  // namespace

TEST_CASE("Wan forward through every strategy equals the resident model bit for bit, stats as planned") {
  SharedDir dir;
  auto c = WanTransformerConfig::preset("wan-test");
  c.num_layers = 5;  // odd: slot parity flips between passes
  if (world().rank() == 0) write_random_wan_transformer(dir.file("t"), c, DType::F32, 11, 4096);  // sharded files
  world().barrier();

  // This rank's own request: different latents per rank, two guidance branches.
  at::manual_seed(100 + world().rank());
  WanBranchInputs cond{at::randn({1, 4, 2, 4, 6}), at::tensor({100 + 200 * world().rank()}, at::kLong), at::randn({1, 5, 16})};
  WanBranchInputs uncond{cond.hidden_states, cond.timestep, at::randn({1, 5, 16})};

  auto reference = WanTransformer::load(dir.file("t"), at::kFloat);
  const at::Tensor want_cond = reference.forward(cond.hidden_states, cond.timestep, cond.encoder_hidden_states);
  const at::Tensor want_uncond = reference.forward(uncond.hidden_states, uncond.timestep, uncond.encoder_hidden_states);

  for (const Mode& m : every_mode(c.num_layers)) {
    CAPTURE(m.label);
    const Strategy s = m.strategy;
    auto model = WanTransformer::load(dir.file("t"), at::kFloat, /*load_blocks=*/false);
    WanOffloadRunner runner(model, world().size());
    // Rank r has r % 3 passes (2 alone): some ranks compute 2, some 1, some none (ghosts).
    const std::int64_t mine = world().size() == 1 ? 2 : world().rank() % 3;
    const WaveSchedule wave = agree_wave(world(), mine, runner.plan().fingerprint());
    CHECK(wave.length == world().allreduce_max(mine));
    runner.start(options_for(m), collective_for(s));
    for (std::int64_t p = 0; p < wave.length; ++p) {
      if (p < mine) {
        auto out = runner.forward({cond, uncond});
        CHECK(at::equal(out[0], want_cond));
        CHECK(at::equal(out[1], want_uncond));
      } else {
        runner.ghost();
      }
    }
    // A second wave in which every rank computes, one branch only: still equal.
    CHECK(at::equal(runner.forward({cond})[0], want_cond));

    // Counted, not derived from the stats: wave.length traversals (guidance included: both
    // branches share one), plus the second wave's one.
    const EngineStats st = runner.engine().stats();
    const auto traversals = static_cast<std::uint64_t>(wave.length + 1);
    const Expected want = expected(runner.plan(), m, world().size());
    CHECK(st.strategy == strategy_name(s));
    CHECK(st.blocks_acquired == traversals * static_cast<std::uint64_t>(c.num_layers));
    CHECK(st.bytes_streamed == want.total(want.streamed, traversals));
    CHECK(st.h2d_bytes == want.total(want.h2d, traversals));
    CHECK(st.bytes_gathered == want.total(want.gathered, traversals));
    CHECK(st.host_bytes == want.host_bytes);
    CHECK(st.pinned_bytes == 0);
    CHECK(st.device_shard_bytes == want.device_shard_bytes);
    CHECK(st.slot_bytes == want.slot_bytes);
    CHECK(st.device_bytes == 2 * want.slot_bytes + want.device_shard_bytes);
    if (s == Strategy::kResident) CHECK(st.bytes_streamed == 0);
    if (s == Strategy::kDlo) CHECK(st.host_bytes * world().size() < runner.plan().total_bytes() + 1024 * world().size() * c.num_layers);
    if (s == Strategy::kDeviceShards) CHECK(st.h2d_bytes == 0);
    if (s == Strategy::kDeviceShards && world().size() > 1) CHECK(st.bytes_gathered > 0);
  }
}

// Regression: the guidance check used to divide bytes by traversals, so a runner that streamed
// the weights once per branch (twice per step) passed. Counted per denoising step here.
TEST_CASE("guidance streams each block once per denoising step: bytes and blocks per step equal those without") {
  SharedDir dir;
  auto c = WanTransformerConfig::preset("wan-test");
  c.num_layers = 4;
  if (world().rank() == 0) write_random_wan_transformer(dir.file("g"), c, DType::F32, 12, 0);
  world().barrier();
  at::manual_seed(300 + world().rank());
  WanBranchInputs cond{at::randn({1, 4, 2, 4, 4}), at::tensor({500}, at::kLong), at::randn({1, 6, 16})};
  WanBranchInputs uncond{cond.hidden_states, cond.timestep, at::randn({1, 6, 16})};
  auto reference = WanTransformer::load(dir.file("g"), at::kFloat);
  const at::Tensor want_cond = reference.forward(cond.hidden_states, cond.timestep, cond.encoder_hidden_states);
  const at::Tensor want_uncond = reference.forward(uncond.hidden_states, uncond.timestep, uncond.encoder_hidden_states);
  constexpr int kSteps = 3;
  const auto layers = static_cast<std::uint64_t>(c.num_layers);

  for (const Mode& m : every_mode(c.num_layers)) {
    CAPTURE(m.label);
    const Strategy s = m.strategy;
    auto model = WanTransformer::load(dir.file("g"), at::kFloat, /*load_blocks=*/false);
    WanOffloadRunner runner(model, world().size());
    agree_wave(world(), 1 + 3 * kSteps, runner.plan().fingerprint());
    runner.start(options_for(m), collective_for(s));
    const StackPlan& plan = runner.plan();
    const Expected want = expected(plan, m, world().size());
    runner.forward({cond});  // warm-up: the cold start brings block 0 one extra time

    struct Step {
      std::uint64_t blocks, bytes, gathered, h2d;
    };
    // One denoising step; `guidance`: both branches.
    auto step = [&](bool guidance) {
      const EngineStats before = runner.engine().stats();
      auto out = guidance ? runner.forward({cond, uncond}) : runner.forward({cond});
      const EngineStats after = runner.engine().stats();
      REQUIRE(out.size() == (guidance ? 2u : 1u));
      CHECK(at::equal(out[0], want_cond));
      if (guidance) CHECK(at::equal(out[1], want_uncond));
      return Step{after.blocks_acquired - before.blocks_acquired, after.bytes_streamed - before.bytes_streamed,
                  after.bytes_gathered - before.bytes_gathered, after.h2d_bytes - before.h2d_bytes};
    };
    std::vector<Step> plain, guided;
    for (int k = 0; k < kSteps; ++k) plain.push_back(step(false));
    for (int k = 0; k < kSteps; ++k) guided.push_back(step(true));
    for (int k = 0; k < kSteps; ++k) {
      CAPTURE(k);
      CHECK(guided[k].blocks == plain[k].blocks);
      CHECK(guided[k].bytes == plain[k].bytes);
      CHECK(guided[k].gathered == plain[k].gathered);
      CHECK(guided[k].h2d == plain[k].h2d);
      // And what one step must cost: every block once, by hand from the plan.
      CHECK(guided[k].blocks == layers);
      CHECK(guided[k].bytes == want.per_pass(want.streamed));
      CHECK(guided[k].gathered == want.per_pass(want.gathered));
      CHECK(guided[k].h2d == want.per_pass(want.h2d));
    }
    // The plain cases, spelled out: dlo and layerwise move the whole stack each step; device
    // shards copy nothing from the host; mixed copies exactly the host-held blocks' shards.
    std::uint64_t host_held_shards = 0, gathered_all = 0;
    for (std::int64_t i = 0; i < plan.num_blocks(); ++i) {
      if (i >= m.device_blocks) host_held_shards += plan.shard_bytes(i);
      gathered_all += plan.shard_bytes(i) * static_cast<std::uint64_t>(world().size() - 1);
    }
    if (s == Strategy::kDlo || s == Strategy::kLayerwise) CHECK(guided[0].bytes == plan.total_bytes());
    if (s == Strategy::kDlo) CHECK(guided[0].gathered == gathered_all);
    if (s == Strategy::kDeviceShards) CHECK(guided[0].h2d == 0);
    if (s == Strategy::kMixed && m.device_blocks == 1) CHECK(guided[0].h2d == host_held_shards);
    if (is_sharded(s) && world().size() > 1) {
      CHECK(guided[0].bytes == plan.total_bytes());
      CHECK(guided[0].gathered == gathered_all);
      if (s == Strategy::kMixed) CHECK(guided[0].h2d == host_held_shards);
    }
    // Mixed: even ranks guide, odd ranks do not. Each rank still makes one traversal per step;
    // a rank that made two would leave the others in a gather (the test watchdog ends that run).
    for (int k = 0; k < kSteps; ++k) {
      const Step st = step(world().rank() % 2 == 0);
      CHECK(st.blocks == layers);
    }
  }
}

TEST_CASE("blocks of different sizes and dtypes are gathered exactly, padding and odd rank counts included") {
  SharedDir dir;
  // Block i: F32 [7+i, 13], BF16 [3*i+1], I64 [i+2], U8 [101*i+3]: sizes not multiples of anything.
  std::vector<TensorSpec> specs;
  std::vector<std::vector<std::string>> blocks;
  for (int i = 0; i < 7; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    std::vector<TensorSpec> b = {{p + "w", DType::F32, {7 + i, 13}},
                                 {p + "b", DType::BF16, {3 * i + 1}},
                                 {p + "ids", DType::I64, {i + 2}},
                                 {p + "bytes", DType::U8, {101 * i + 3}}};
    blocks.emplace_back();
    for (auto& s : b) {
      blocks.back().push_back(s.name);
      specs.push_back(s);
    }
  }
  if (world().rank() == 0) {
    WriteOptions w;
    w.max_shard_bytes = 1500;
    write_random_checkpoint(dir.file("het"), specs, [](const TensorSpec&) { return RandomInit{0.5, 3.0}; }, 5, w);
  }
  world().barrier();
  const auto shared_ck = std::make_shared<const Checkpoint>(Checkpoint::open(dir.file("het")));
  const Checkpoint& ck = *shared_ck;
  // The BF16 biases are packed as F32 (converted while packing; exact), the rest as stored.
  StackPlan exact(shared_ck, blocks, [&](const std::string& n) {
    if (n.size() > 2 && n.compare(n.size() - 2, 2, ".b") == 0) return DType::F32;
    return ck.at(n).dtype;
  }, world().size());
  std::uint64_t largest = 0;
  for (std::int64_t i = 0; i < exact.num_blocks(); ++i) largest = std::max(largest, exact.padded_bytes(i));
  CHECK(exact.slot_bytes() == largest);

  for (const Mode& m : every_mode(exact.num_blocks())) {
    if (m.strategy == Strategy::kResident) continue;
    CAPTURE(m.label);
    const Strategy s = m.strategy;
    auto coll = collective_for(s);
    EngineOptions eo = options_for(m);
    eo.collective = coll.get();
    BlockEngine engine(exact, eo);
    CHECK(engine.stats().slot_bytes == expected(exact, m, world().size()).slot_bytes);
    if (world().size() > 1 || !(s == Strategy::kDeviceShards || s == Strategy::kMixed))
      CHECK(engine.stats().slot_bytes == std::max<std::uint64_t>(largest, kShardAlign));
    for (int pass = 0; pass < 3; ++pass) {
      engine.traverse([&](std::int64_t i, const std::vector<at::Tensor>& w) {
        const auto& names = blocks[static_cast<std::size_t>(i)];
        REQUIRE(w.size() == names.size());
        for (std::size_t k = 0; k < names.size(); ++k) {
          at::Tensor want = tensor_view(ck, names[k]);
          if (want.scalar_type() != w[k].scalar_type()) want = want.to(w[k].scalar_type());
          CHECK_MESSAGE(at::equal(w[k], want), names[k] << " pass " << pass);
        }
      });
    }
  }
}

TEST_CASE("mixed needs 0 < device_blocks < blocks, every rank refuses 0 and all with the same message") {
  SharedDir dir;
  auto c = WanTransformerConfig::preset("wan-test");
  c.num_layers = 3;
  if (world().rank() == 0) write_random_wan_transformer(dir.file("m"), c, DType::F32, 13, 0);
  world().barrier();
  auto model = WanTransformer::load(dir.file("m"), at::kFloat, /*load_blocks=*/false);
  WanOffloadRunner runner(model, world().size());
  for (std::int64_t k : {std::int64_t{0}, std::int64_t{3}, std::int64_t{-1}, std::int64_t{4}}) {
    CAPTURE(k);
    auto coll = collective_for(Strategy::kMixed);
    EngineOptions eo;
    eo.strategy = Strategy::kMixed;
    eo.device_blocks = k;
    eo.collective = coll.get();
    CHECK_THROWS_WITH_AS(BlockEngine(runner.plan(), eo),
                         doctest::Contains(str("needs 0 < device_blocks < 3 (the number of blocks); got device_blocks = ", k).c_str()),
                         dlo::Error);
  }
  // device-shards and dlo ignore device_blocks.
  for (Strategy s : {Strategy::kDeviceShards, Strategy::kDlo}) {
    auto coll = collective_for(s);
    EngineOptions eo;
    eo.strategy = s;
    eo.device_blocks = 7;
    eo.collective = coll.get();
    BlockEngine engine(runner.plan(), eo);
    engine.traverse(nullptr);
    CHECK(engine.stats().blocks_acquired == 3);
  }
}

TEST_CASE("ranks that planned different layouts are refused on every rank") {
  const std::uint64_t print = world().rank() == world().size() - 1 && world().size() > 1 ? 2 : 1;
  if (world().size() == 1) {
    CHECK(agree_wave(world(), 1, print).length == 1);
  } else {
    CHECK_THROWS_WITH_AS(agree_wave(world(), 1, print), doctest::Contains("planned a different block layout"), dlo::Error);
  }
}

TEST_CASE("two engines traversed together (two experts, ranks on different ones): exact blocks, in order, failures local") {
  SharedDir dir;
  // Expert A: 4 blocks, expert B: 3 (different counts: the longer one finishes alone).
  std::vector<TensorSpec> specs;
  std::vector<std::vector<std::string>> a_blocks, b_blocks;
  for (int i = 0; i < 7; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    auto& blocks = i < 4 ? a_blocks : b_blocks;
    blocks.push_back({p + "w", p + "b"});
    specs.push_back({p + "w", DType::F32, {5 + i, 11}});
    specs.push_back({p + "b", DType::BF16, {2 * i + 3}});
  }
  if (world().rank() == 0)
    write_random_checkpoint(dir.file("two"), specs, [](const TensorSpec&) { return RandomInit{0.5, 3.0}; }, 9, WriteOptions{});
  world().barrier();
  const auto shared_ck = std::make_shared<const Checkpoint>(Checkpoint::open(dir.file("two")));
  const Checkpoint& ck = *shared_ck;
  const auto stored = [&](const std::string& n) { return ck.at(n).dtype; };
  StackPlan pa(shared_ck, a_blocks, stored, world().size()), pb(shared_ck, b_blocks, stored, world().size());
  for (const auto& [sa, sb] : {std::pair{Strategy::kDlo, Strategy::kDlo}, std::pair{Strategy::kDlo, Strategy::kLayerwise},
                               std::pair{Strategy::kDeviceShards, Strategy::kMixed}}) {
    CAPTURE(strategy_name(sa));
    CAPTURE(strategy_name(sb));
    auto ca = collective_for(sa), cb = collective_for(sb);
    EngineOptions oa = options_for({sa, 0, ""}), ob = options_for({sb, 1, ""});
    oa.collective = ca.get();
    ob.collective = cb.get();
    BlockEngine ea(pa, oa), eb(pb, ob);
    const std::vector<BlockEngine*> both = {&ea, &eb};
    for (int pass = 0; pass < 6; ++pass) {
      CAPTURE(pass);
      // Rank r computes in expert (r + pass) % 2; every third pass rank 1 has no job (a ghost).
      int computing = (world().rank() + pass) % 2;
      if (pass % 3 == 2 && world().rank() == 1) computing = -1;
      const auto& names = computing == 1 ? b_blocks : a_blocks;
      std::vector<std::int64_t> seen;
      const bool fail_here = pass == 4 && world().rank() == 0;
      const auto visit = [&](std::int64_t i, const std::vector<at::Tensor>& w) {
        seen.push_back(i);
        if (fail_here && i == 1) throw Error("injected failure (test)");
        const auto& n = names[static_cast<std::size_t>(i)];
        REQUIRE(w.size() == n.size());
        for (std::size_t k = 0; k < n.size(); ++k) CHECK_MESSAGE(at::equal(w[k], tensor_view(ck, n[k])), n[k]);
      };
      if (fail_here) {
        CHECK_THROWS_WITH_AS(BlockEngine::traverse_together(both, computing, visit),
                             doctest::Contains("block 1: injected failure"), BlockComputeError);
        CHECK(seen == std::vector<std::int64_t>{0, 1});  // the rest of the pass without computing
        continue;
      }
      BlockEngine::traverse_together(both, computing, visit);
      std::vector<std::int64_t> want;
      if (computing >= 0)
        for (std::size_t i = 0; i < names.size(); ++i) want.push_back(static_cast<std::int64_t>(i));
      CHECK(seen == want);
    }
    // Each engine alone still works after passes together (the rings stayed in order).
    ea.traverse(nullptr);
    eb.traverse(nullptr);
    if (world().size() > 1 && is_sharded(sa)) CHECK(ea.stats().bytes_gathered > 0);
  }
}

TEST_CASE("an engine that sits passes out brings its block 0 in once (prefetch_entry): exact weights, a cold start's bytes") {
  SharedDir dir;
  std::vector<TensorSpec> specs;
  std::vector<std::vector<std::string>> a_blocks, b_blocks;
  for (int i = 0; i < 6; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    (i < 3 ? a_blocks : b_blocks).push_back({p + "w", p + "b"});
    specs.push_back({p + "w", DType::F32, {7 + i, 9}});
    specs.push_back({p + "b", DType::BF16, {i + 5}});
  }
  if (world().rank() == 0)
    write_random_checkpoint(dir.file("e"), specs, [](const TensorSpec&) { return RandomInit{0.5, 3.0}; }, 4, WriteOptions{});
  world().barrier();
  const auto shared_ck = std::make_shared<const Checkpoint>(Checkpoint::open(dir.file("e")));
  const Checkpoint& ck = *shared_ck;
  const auto stored = [&](const std::string& n) { return ck.at(n).dtype; };
  StackPlan pa(shared_ck, a_blocks, stored, world().size()), pb(shared_ck, b_blocks, stored, world().size());
  for (const Mode& m : every_mode(3)) {
    CAPTURE(m.label);
    auto ca = collective_for(Strategy::kDlo), cb = collective_for(m.strategy);
    EngineOptions oa = options_for({Strategy::kDlo, 0, ""}), ob = options_for(m);
    oa.collective = ca.get();
    ob.collective = cb.get();
    BlockEngine ea(pa, oa), eb(pb, ob);
    const Expected want = expected(pb, m, world().size());
    const auto moved = [](const EngineStats& s) {
      return std::vector<std::uint64_t>{s.blocks_acquired, s.bytes_streamed, s.h2d_bytes, s.bytes_gathered};
    };
    const std::vector<std::uint64_t> none = {0, 0, 0, 0};
    // B sits out A's passes: the first call starts block 0's transfer (a slot block's bytes, once),
    // the others find it there or on its way.
    const std::vector<std::uint64_t> entry =
        want.slotted[0] ? std::vector<std::uint64_t>{0, want.streamed[0], want.h2d[0], want.gathered[0]} : none;
    for (int pass = 0; pass < 3; ++pass) {
      eb.prefetch_entry();
      ea.traverse(nullptr);
      CHECK(moved(eb.stats()) == entry);
    }
    // B's passes: the weights exact; in all, what a cold start moves (block 0 moved earlier, not twice).
    constexpr std::uint64_t kPasses = 2;
    for (std::uint64_t pass = 0; pass < kPasses; ++pass)
      eb.traverse([&](std::int64_t i, const std::vector<at::Tensor>& w) {
        const auto& n = b_blocks[static_cast<std::size_t>(i)];
        REQUIRE(w.size() == n.size());
        for (std::size_t k = 0; k < n.size(); ++k) CHECK_MESSAGE(at::equal(w[k], tensor_view(ck, n[k])), n[k]);
      });
    const EngineStats s = eb.stats();
    CHECK(s.blocks_acquired == kPasses * pb.num_blocks());
    CHECK(s.bytes_streamed == want.total(want.streamed, kPasses));
    CHECK(s.h2d_bytes == want.total(want.h2d, kPasses));
    CHECK(s.bytes_gathered == want.total(want.gathered, kPasses));
    // One entry wait per pass where block 0 comes through a slot; after the ring's last prefetch
    // the entry is in place and a call moves nothing.
    CHECK(s.entry_wait_s.size() == (want.slotted[0] ? kPasses : 0));
    eb.prefetch_entry();
    CHECK(moved(eb.stats()) == moved(s));
    CHECK(ea.stats().entry_wait_s.size() == 3);
  }
}
