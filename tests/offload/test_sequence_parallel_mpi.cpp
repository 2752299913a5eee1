// Ulysses sequence parallelism under mpirun (WanOffloadRunner::forward_group over groups split
// from the world: the CPU's exchange network, MPI communicators): a group of P ranks computes one forward, each rank its share of the tokens,
// while every rank of the world joins every block's gather; the output equals the resident
// one-rank forward byte for byte, with uneven tokens (27) and heads (5), guidance's two branches,
// per-sample and per-token timesteps, every group size the world allows at once (the world split
// into groups of P consecutive ranks, the last one smaller), dlo and layerwise. A P that leaves a
// rank without heads fails that group's job alone, by name, and the engine stays in step; a rank
// of a group (or a CFG partner) whose computation fails fails the forward on every rank of the
// group with its message, and nobody waits for it (it keeps joining the exchanges).
#include "common/doctest_torch.h"

#include "common/mpi_test_util.h"
#include "common/test_util.h"
#include "dlo/common/error.h"
#include "dlo/dist/collective.h"
#include "dlo/dist/exchange_group.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/offload/engine.h"
#include "dlo/offload/runner.h"
#include "dlo/offload/wave.h"
#include "dlo/pipeline/topology.h"
#include "dlo/testing/make_model.h"

#include <random>

using namespace dlo;

namespace {

using dlo::test::SharedDir;
using dlo::test::world;

// Groups as the product makes them on the CPU (collective: every rank calls it alike).
std::unique_ptr<ExchangeGroup> split(int color) {
  static const std::unique_ptr<ExchangeNetwork> net = make_exchange_network(world(), at::kCPU);
  return net->split(color, "test groups");
}

WanTransformerConfig sp_config(std::int64_t heads) {
  auto c = WanTransformerConfig::preset("wan-test");
  c.num_attention_heads = heads;  // head dim stays the preset's
  c.num_layers = 3;
  return c;
}

}  // namespace

TEST_CASE("a group of P ranks computes one forward with Ulysses: equal to one rank bit for bit, for every P at once") {
  SharedDir dir;
  const WanTransformerConfig c = sp_config(5);
  if (world().rank() == 0) write_random_wan_transformer(dir.file("t"), c, DType::F32, 21, 0);
  world().barrier();
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    CAPTURE(c10::toString(dtype));
    auto reference = WanTransformer::load(dir.file("t"), dtype);
    for (const Strategy s : {Strategy::kDlo, Strategy::kLayerwise}) {
      CAPTURE(strategy_name(s));
      auto model = WanTransformer::load(dir.file("t"), dtype, /*load_blocks=*/false);
      WanOffloadRunner runner(model, world().size());
      (void)agree_wave(world(), 1, runner.plan().fingerprint());
      EngineOptions eo;
      eo.strategy = s;
      runner.start(eo, is_sharded(s) && world().size() > 1 ? make_mpi_collective(world()) : nullptr);
      for (int p = 1; p <= world().size(); ++p) {
        CAPTURE(p);
        const auto group = split(world().rank() / p);
        CHECK(group->size() == std::min(p, world().size() - world().rank() / p * p));
        // The group's own request (the same on its ranks): 3 x 6 x 6 latents -> 27 tokens; per
        // sample and, for TI2V, per token timesteps.
        at::manual_seed(500 + 10 * p + world().rank() / p);
        const at::Tensor x = at::randn({1, 4, 3, 6, 6});
        const at::Tensor ctx = at::randn({1, 7, 16}), neg = at::randn({1, 7, 16});
        for (const at::Tensor& t : {at::tensor({700}, at::kLong), at::randint(0, 1000, {1, 27}, at::kLong)}) {
          CAPTURE(t.dim());
          const std::vector<WanBranchInputs> branches = {{x, t, ctx}, {x, t, neg}};
          const auto out = runner.forward_group(*group, branches);
          REQUIRE(out.size() == 2);
          CHECK(at::equal(out[0], reference.forward(x, t, ctx)));
          CHECK(at::equal(out[1], reference.forward(x, t, neg)));
        }
      }
    }
  }
}

TEST_CASE("a group larger than the heads fails its own job by name, the other groups compute and nothing hangs") {
  if (world().size() < 4) return;  // needs a group of 4 beside ranks alone
  SharedDir dir;
  const WanTransformerConfig c = sp_config(3);
  if (world().rank() == 0) write_random_wan_transformer(dir.file("h"), c, DType::F32, 5, 0);
  world().barrier();
  auto reference = WanTransformer::load(dir.file("h"), at::kFloat);
  auto model = WanTransformer::load(dir.file("h"), at::kFloat, /*load_blocks=*/false);
  WanOffloadRunner runner(model, world().size());
  (void)agree_wave(world(), 1, runner.plan().fingerprint());
  EngineOptions eo;
  eo.strategy = Strategy::kDlo;
  runner.start(eo, make_mpi_collective(world()));
  const at::Tensor x = at::randn({1, 4, 3, 6, 6}), t = at::tensor({300}, at::kLong), ctx = at::randn({1, 7, 16});
  {
    const auto four = split(0);  // 4 ranks for 3 heads
    CHECK_THROWS_WITH_AS(runner.forward_group(*four, {{x, t, ctx}}),
                         doctest::Contains("sequence parallelism over the attention heads: 3 cannot be split into 4 parts"),
                         BlockComputeError);
  }
  // The engine is in step: a group of 3 (3 heads, one each) and a rank alone, at once.
  const auto g = split(world().rank() < 3 ? 0 : 1);
  CHECK(at::equal(runner.forward_group(*g, {{x, t, ctx}})[0], reference.forward(x, t, ctx)));
}

TEST_CASE("a rank of a group that fails in a block or in its embeddings fails the group's forward everywhere, nobody waits") {
  if (world().size() < 3) return;
  SharedDir dir;
  const WanTransformerConfig c = sp_config(5);
  if (world().rank() == 0) write_random_wan_transformer(dir.file("f"), c, DType::F32, 9, 0);
  world().barrier();
  auto reference = WanTransformer::load(dir.file("f"), at::kFloat);
  auto model = WanTransformer::load(dir.file("f"), at::kFloat, /*load_blocks=*/false);
  WanOffloadRunner runner(model, world().size());
  (void)agree_wave(world(), 1, runner.plan().fingerprint());
  EngineOptions eo;
  eo.strategy = Strategy::kDlo;
  runner.start(eo, make_mpi_collective(world()));
  const auto g = split(0);  // every rank, one group
  const at::Tensor x = at::randn({1, 4, 3, 6, 6}), t = at::tensor({300}, at::kLong), ctx = at::randn({1, 7, 16});
  // Rank 1 fails at block 1: its own message there, its partners name it and give its message.
  const auto hook = [](std::int64_t b) {
    if (world().rank() == 1 && b == 1) throw Error("injected failure (test)");
  };
  const std::string want = world().rank() == 1 ? "block 1: injected failure (test)" : "rank 1 of this job's group: block 1: injected failure (test)";
  CHECK_THROWS_WITH_AS(runner.forward_group(*g, {{x, t, ctx}, {x, t, ctx}}, {}, hook), doctest::Contains(want.c_str()),
                       BlockComputeError);
  // Rank 2's inputs do not fit (its embeddings fail), before any exchange.
  const at::Tensor bad = world().rank() == 2 ? at::randn({1, 7, 15}) : ctx;
  CHECK_THROWS_WITH_AS(runner.forward_group(*g, {{x, t, bad}}),
                       doctest::Contains(world().rank() == 2 ? "input embeddings" : "rank 2 of this job's group: the transformer's input embeddings"),
                       BlockComputeError);
  // The engine and the group are in step: the next forward is exact.
  CHECK(at::equal(runner.forward_group(*g, {{x, t, ctx}})[0], reference.forward(x, t, ctx)));
  // CFG partners: the unconditional branch fails on its rank; both partners learn it.
  if (world().size() >= 4) {
    const auto partners = split(world().rank() % 2);
    const bool uncond_rank = partners->rank() == 1;
    const at::Tensor misfit = at::randn({1, 7, 15});
    CHECK_THROWS_WITH_AS(runner.forward_cfg(*partners, nullptr, {{x, t, ctx}, {x, t, uncond_rank ? misfit : ctx}}),
                         doctest::Contains(uncond_rank ? "input embeddings" : "of this job's group: the transformer's input embeddings"), BlockComputeError);
    const auto both = runner.forward_cfg(*partners, nullptr, {{x, t, ctx}, {x, t, ctx}});
    CHECK(at::equal(both[1], reference.forward(x, t, ctx)));
  }
}

TEST_CASE("a group's exchanges send the bytes Ulysses' formula gives, per block and per forward") {
  SharedDir dir;
  const WanTransformerConfig c = sp_config(5);
  if (world().rank() == 0) write_random_wan_transformer(dir.file("t"), c, DType::F32, 21, 0);
  world().barrier();
  auto model = WanTransformer::load(dir.file("t"), at::kFloat, /*load_blocks=*/false);
  WanOffloadRunner runner(model, world().size());
  (void)agree_wave(world(), 1, runner.plan().fingerprint());
  EngineOptions eo;
  eo.strategy = Strategy::kDlo;
  runner.start(eo, world().size() > 1 ? make_mpi_collective(world()) : nullptr);
  const auto g = split(0);  // every rank, one group
  const std::int64_t P = g->size(), r = g->rank();
  const at::Tensor x = at::randn({1, 4, 3, 6, 6}), t = at::tensor({300}, at::kLong), ctx = at::randn({1, 7, 16});
  const std::uint64_t before = g->bytes_sent();
  (void)runner.forward_group(*g, {{x, t, ctx}});
  // 27 tokens and 5 heads of head_dim d over P ranks (the first ranks one more), fp32 (4 bytes):
  // per block, q, k and v from this rank's s_r tokens to every other rank j's h_j heads, and the
  // attention output back (every other rank's s_j tokens of this rank's h_r heads); once, this
  // rank's rows of the D-wide hidden states to every other rank; and the group's three failure
  // agreements, an int32 to every other rank.
  const auto share = [](std::int64_t n, std::int64_t parts, std::int64_t i) { return n / parts + (i < n % parts ? 1 : 0); };
  const std::int64_t d = c.attention_head_dim, D = c.num_attention_heads * c.attention_head_dim;
  std::int64_t per_block = 0;
  for (std::int64_t j = 0; j < P; ++j)
    if (j != r) per_block += (3 * share(27, P, r) * share(5, P, j) + share(27, P, j) * share(5, P, r)) * d * 4;
  const std::int64_t want = c.num_layers * per_block + (P - 1) * share(27, P, r) * D * 4 + 3 * (P - 1) * 4;
  CAPTURE(P);
  CHECK(static_cast<std::int64_t>(g->bytes_sent() - before) == want);
}

// Issue 46: 6 heads and 105 tokens in fp32 at SP 3 (shares of 35: the cross-attention's query
// blocks 32 + 3) rounded differently from one rank. That shape first, then random small shapes
// (heads, head width, FFN width, tokens, text, dtype), drawn alike on every rank: every group size
// the world allows at once whose SP degree the planner accepts for the job gives one rank's
// output byte for byte, through the runner's exchanges.
TEST_CASE("random shapes through the runner's exchanges: every accepted SP degree equals one rank, byte for byte") {
  std::mt19937 rng(4600);
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int compared = 0;
  for (int shape = 0; shape < 6; ++shape) {
    WanTransformerConfig c = sp_config(6);
    std::int64_t frames = 3, height = 5, width = 7;  // 105 tokens
    at::ScalarType dtype = at::kFloat;
    if (shape > 0) {
      c.num_attention_heads = pick(2, 8);
      c.attention_head_dim = std::vector<std::int64_t>{6, 8, 12}[pick(0, 2)];
      c.ffn_dim = pick(8, 100);
      c.num_layers = pick(1, 2);
      frames = pick(1, 4), height = pick(4, 10), width = pick(4, 10);
      dtype = pick(0, 1) ? at::kFloat : at::kBFloat16;
    }
    const std::int64_t tokens = frames * height * width;
    CAPTURE(shape);
    CAPTURE(c.num_attention_heads);
    CAPTURE(c.ffn_dim);
    CAPTURE(tokens);
    CAPTURE(c10::toString(dtype));
    SharedDir dir;
    if (world().rank() == 0)
      write_random_wan_transformer(dir.file("t"), c, dtype == at::kFloat ? DType::F32 : DType::BF16, 60 + shape, 0);
    world().barrier();
    auto reference = WanTransformer::load(dir.file("t"), dtype);
    auto model = WanTransformer::load(dir.file("t"), dtype, /*load_blocks=*/false);
    WanOffloadRunner runner(model, world().size());
    (void)agree_wave(world(), 1, runner.plan().fingerprint());
    EngineOptions eo;
    eo.strategy = Strategy::kDlo;
    runner.start(eo, world().size() > 1 ? make_mpi_collective(world()) : nullptr);
    at::manual_seed(shape);
    const at::Tensor x = at::randn({1, 4, frames, 2 * height, 2 * width}), ctx = at::randn({1, pick(1, 12), 16});
    const at::Tensor t = at::tensor({pick(0, 999)}, at::kLong);
    const at::Tensor one = reference.forward(x, t, ctx);
    for (int p = 1; p <= world().size(); ++p) {
      const auto group = split(world().rank() / p);
      TopologyRequest request;
      request.sp = group->size();
      request.cfg = TopologyRequest::Cfg::kOff;
      TopologyLimits limits;
      limits.ranks = group->size();
      limits.heads = static_cast<int>(c.num_attention_heads);
      limits.steps = {1};
      limits.guided = {false};
      limits.tokens = {tokens};
      bool accepted = true;
      try {
        (void)choose_topology(request, limits);
      } catch (const Error&) {
        accepted = false;
      }
      // A refused group's ranks only join the pass's gathers (its forward fails by name) while
      // the other groups of the split compute.
      CAPTURE(group->size());
      if (!accepted) {
        CHECK_THROWS_AS(runner.forward_group(*group, {{x, t, ctx}}, {}, {}, "refused by the topology"), BlockComputeError);
        continue;
      }
      ++compared;
      CHECK(at::equal(runner.forward_group(*group, {{x, t, ctx}}).at(0), one));
    }
  }
  MESSAGE(compared, " group forwards compared with one rank's on rank ", world().rank());
}
