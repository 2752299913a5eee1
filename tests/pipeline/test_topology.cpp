// The batch topology alone (pipeline/topology.h): auto's choices against cost-model values worked
// out by hand, the explicit requests, and the refusals.
#include <doctest/doctest.h>

#include <cmath>

#include "dlo/common/error.h"
#include "dlo/pipeline/topology.h"

namespace {

using dlo::Topology;
using dlo::TopologyLimits;
using dlo::TopologyRequest;

TopologyLimits batch(int ranks, std::vector<std::int64_t> steps, std::vector<bool> guided, int heads = 12,
                     std::int64_t tokens = 1000) {
  TopologyLimits l;
  l.ranks = ranks;
  l.heads = heads;
  l.steps = std::move(steps);
  l.guided = std::move(guided);
  l.tokens.assign(l.steps.size(), tokens);
  return l;
}

TopologyRequest request(int sp, TopologyRequest::Cfg cfg = TopologyRequest::Cfg::kAuto) {
  TopologyRequest r;
  r.sp = sp;
  r.cfg = cfg;
  return r;
}

}  // namespace

TEST_CASE("topology, the cost model's speedups are the measured ones") {
  CHECK(dlo::predicted_speedup(1, false) == doctest::Approx(1.0));
  CHECK(dlo::predicted_speedup(2, false) == doctest::Approx(1.38));
  CHECK(dlo::predicted_speedup(4, false) == doctest::Approx(1.38 * 1.38));
  CHECK(dlo::predicted_speedup(1, true) == doctest::Approx(1.84));
  CHECK(dlo::predicted_speedup(2, true) == doctest::Approx(1.84 * 1.38));
}

TEST_CASE("topology, auto gives a single prompt every rank") {
  // One guided job of 10 steps on 4 ranks: CFG pairs x SP 2 (10 / (1.84 x 1.38) = 3.94 steps).
  Topology t = dlo::choose_topology(request(0), batch(4, {10}, {true}));
  CHECK(t.group_size == 4);
  CHECK(t.cfg);
  CHECK(t.label(true) == "cfg 2 x sp 2");
  CHECK(t.predicted == doctest::Approx(10 / (1.84 * 1.38)));
  CHECK(t.predicted_dp == doctest::Approx(10));
  CHECK(t.reason.find("1 group(s) of 4 ranks (guided jobs cfg 2 x sp 2)") != std::string::npos);
  // Unguided: SP over all four.
  t = dlo::choose_topology(request(0), batch(4, {10}, {false}));
  CHECK(t.group_size == 4);
  CHECK(t.label(false) == "sp 4");
  // Two ranks, one guided job: a CFG pair (1.84x) beats SP 2 (1.38x).
  t = dlo::choose_topology(request(0), batch(2, {10}, {true}));
  CHECK(t.group_size == 2);
  CHECK(t.cfg);
  CHECK(t.label(true) == "cfg 2");
}

TEST_CASE("topology, auto keeps a full batch data parallel") {
  // Four equal jobs on four ranks: DP takes 10 steps; CFG pairs 2 x 10 / 1.84 = 10.87.
  const Topology t = dlo::choose_topology(request(0), batch(4, {10, 10, 10, 10}, {true, true, true, true}));
  CHECK(t.group_size == 1);
  CHECK(!t.cfg);
  CHECK(t.label(true) == "dp");
  CHECK(t.reason == "every rank its own job: 4 job(s) on 4 rank(s)");
  // Three jobs on two ranks: data parallel, though the cost model alone would pair the ranks (DP
  // 20 steps with a tail of one job on one rank, CFG pairs 3 x 10 / 1.84 = 16.3): measured on the
  // CPU the two tie (docs/benchmarks.md), the decodes running beside the steps.
  CHECK(dlo::choose_topology(request(0), batch(2, {10, 10, 10}, {true, true, true})).group_size == 1);
  // Asked for, CFG pairs: the cost model's figures.
  const Topology tail = dlo::choose_topology(request(0, TopologyRequest::Cfg::kOn), batch(2, {10, 10, 10}, {true, true, true}));
  CHECK(tail.group_size == 2);
  CHECK(tail.predicted == doctest::Approx(30 / 1.84));
  CHECK(tail.predicted_dp == doctest::Approx(20));
  // Three jobs on four ranks: equal ones stay data parallel (DP 10 steps; two CFG pairs 10/1.84,
  // then the third after one of them, 10.9); with a long first job two CFG pairs win (DP 30;
  // pairs 30/1.84 = 16.3 on one, 10/1.84 twice on the other).
  CHECK(dlo::choose_topology(request(0), batch(4, {10, 10, 10}, {true, true, true})).group_size == 1);
  const Topology three = dlo::choose_topology(request(0), batch(4, {30, 10, 10}, {true, true, true}));
  CHECK(three.group_size == 2);
  CHECK(three.cfg);
  CHECK(three.predicted == doctest::Approx(30 / 1.84));
}

TEST_CASE("topology, the list schedule follows the jobs' steps") {
  // 3 ranks, unguided jobs of 30, 10 steps: DP ends at 30 (the long job); SP 3 (3 ranks along the
  // sequence, 3^0.4645 = 1.666x) ends at 40 / 1.666 = 24.0.
  Topology t = dlo::choose_topology(request(0), batch(3, {30, 10}, {false, false}, 12));
  CHECK(t.group_size == 3);
  CHECK(t.predicted == doctest::Approx(40 / std::pow(3.0, std::log2(1.38))));
  // Jobs of 30, 30: DP 30, SP 3 36.
  t = dlo::choose_topology(request(0), batch(3, {30, 30}, {false, false}, 12));
  CHECK(t.group_size == 1);
  CHECK(t.predicted == doctest::Approx(30));
}

TEST_CASE("topology, explicit requests") {
  using Cfg = TopologyRequest::Cfg;
  // --sp 1 --cfg-parallel off: data parallel even for one job.
  Topology t = dlo::choose_topology(request(1, Cfg::kOff), batch(4, {10}, {true}));
  CHECK(t.group_size == 1);
  CHECK(t.reason.find("(--sp 1 --cfg-parallel off)") != std::string::npos);
  // --sp 2 --cfg-parallel on: groups of 4 even for a full batch.
  t = dlo::choose_topology(request(2, Cfg::kOn), batch(4, {10, 10, 10, 10}, {true, false, true, true}));
  CHECK(t.group_size == 4);
  CHECK(t.cfg);
  CHECK(t.label(false) == "sp 4");  // an unguided job uses the whole group along the sequence
  // --sp 3 on 4 ranks: does not divide.
  CHECK_THROWS_WITH_AS(dlo::choose_topology(request(3, Cfg::kOff), batch(4, {10}, {true})),
                       "--sp 3 --cfg-parallel off on 4 rank(s): groups of 3 rank(s) do not divide 4 rank(s)", dlo::Error);
  // More ranks along the sequence than heads, or a job's shares under 16 tokens (the second job
  // here: 63 tokens over 4 ranks, 15-16 each; 64 would do).
  CHECK_THROWS_WITH_AS(dlo::choose_topology(request(4, Cfg::kOff), batch(4, {10}, {true}, 2)),
                       "--sp 4 --cfg-parallel off on 4 rank(s): job 0 (guided, sp 4): 4 ranks along the sequence exceed the model's 2 attention heads",
                       dlo::Error);
  TopologyLimits l = batch(4, {10, 10}, {true, true}, 12);
  l.tokens = {64, 63};
  CHECK_THROWS_WITH_AS(dlo::choose_topology(request(4, Cfg::kOff), l),
                       "--sp 4 --cfg-parallel off on 4 rank(s): job 1: 63 tokens give 4 ranks along the sequence fewer "
                       "than 16 each (shares that small can round differently from one rank)",
                       dlo::Error);
  l.names = {"first", "second"};  // the batch's ids name the job
  CHECK_THROWS_WITH_AS(dlo::choose_topology(request(4, Cfg::kOff), l),
                       "--sp 4 --cfg-parallel off on 4 rank(s): job 'second': 63 tokens give 4 ranks along the sequence "
                       "fewer than 16 each (shares that small can round differently from one rank)",
                       dlo::Error);
  // An unguided job beside guided ones in CFG 2 x SP 2 runs SP 4: more than 2 heads, named.
  l = batch(4, {10, 10}, {true, false}, 2);
  l.names = {"guided", "plain"};
  CHECK_THROWS_WITH_AS(dlo::choose_topology(request(2, Cfg::kOn), l),
                       "--sp 2 --cfg-parallel on on 4 rank(s): job 'plain' (unguided, sp 4): 4 ranks along the sequence "
                       "exceed the model's 2 attention heads",
                       dlo::Error);
  // Groups larger than the world say so (not that they "do not divide" it).
  CHECK_THROWS_WITH_AS(dlo::choose_topology(request(0, Cfg::kOn), batch(1, {10}, {true})),
                       "--sp auto --cfg-parallel on on 1 rank(s): 2 ranks per job (a CFG pair) > 1 rank(s)", dlo::Error);
  l = batch(4, {10, 10}, {true, true}, 12);
  l.tokens = {64, 64};
  CHECK(dlo::choose_topology(request(4, Cfg::kOff), l).group_size == 4);
  // Auto never splits a job below the floor: one 31-token job on 2 ranks stays on one rank, whose
  // guided branches may still pair up (CFG moves no tokens).
  t = dlo::choose_topology(request(0), batch(2, {10}, {false}, 12, 31));
  CHECK(t.group_size == 1);
  t = dlo::choose_topology(request(0), batch(2, {10}, {true}, 12, 31));
  CHECK(t.label(true) == "cfg 2");
  // Auto stays within the limits: two heads on 4 ranks, one guided job: CFG pairs x SP 2.
  t = dlo::choose_topology(request(0), batch(4, {10}, {true}, 2));
  CHECK(t.group_size == 4);
  CHECK(t.cfg);
}

TEST_CASE("topology, a device without the exchange refuses groups by name, auto stays data parallel") {
  TopologyLimits l = batch(2, {10}, {true});
  l.groups_supported = false;
  l.unsupported_why = "the exchange over NCCL is not built yet";
  const Topology t = dlo::choose_topology(request(0), l);
  CHECK(t.group_size == 1);
  CHECK(t.reason == "every rank its own job (the exchange over NCCL is not built yet)");
  CHECK_THROWS_WITH_AS(dlo::choose_topology(request(2), l),
                       "--sp 2 --cfg-parallel auto: the exchange over NCCL is not built yet", dlo::Error);
  CHECK_NOTHROW(dlo::choose_topology(request(1, TopologyRequest::Cfg::kOff), l));
}

TEST_CASE("topology, flags") {
  CHECK(dlo::parse_sp("auto", "--sp") == 0);
  CHECK(dlo::parse_sp("3", "--sp") == 3);
  CHECK_THROWS_WITH_AS(dlo::parse_sp("0", "--sp"), "--sp: '0' is not auto or a rank count (1 or more)", dlo::Error);
  CHECK_THROWS_WITH_AS(dlo::parse_sp("2x", "--sp"), "--sp: '2x' is not auto or a rank count (1 or more)", dlo::Error);
  CHECK(dlo::parse_cfg_parallel("on", "--cfg-parallel") == TopologyRequest::Cfg::kOn);
  CHECK_THROWS_WITH_AS(dlo::parse_cfg_parallel("yes", "--cfg-parallel"), "--cfg-parallel: 'yes' is not on, off or auto",
                       dlo::Error);
}

TEST_CASE("topology, auto gives a data-parallel batch's tail groups when the cost model says so, worked out by hand") {
  // 3 guided jobs of 10 steps on 2 ranks: data parallel 20 steps (the third alone); the first two
  // data parallel (10), then the third as a CFG pair (10 / 1.84 = 5.43): 15.43.
  dlo::TopologyPlan p = dlo::plan_topology(request(0), batch(2, {10, 10, 10}, {true, true, true}));
  REQUIRE(p.phases.size() == 2);
  CHECK(p.phases[0].first == 0);
  CHECK(p.phases[0].count == 2);
  CHECK(p.phases[0].topology.group_size == 1);
  CHECK(p.phases[1].first == 2);
  CHECK(p.phases[1].count == 1);
  CHECK(p.phases[1].topology.group_size == 2);
  CHECK(p.phases[1].topology.cfg);
  CHECK(p.predicted == doctest::Approx(10 + 10 / 1.84));
  CHECK(p.predicted_dp == doctest::Approx(20));
  CHECK(p.reason == "every rank its own job, then the last 1 job(s) on 1 group(s) of 2 ranks (guided jobs cfg 2) "
                    "once the others are done: predicted 15.43 single-rank step times vs 20.00 data parallel throughout");
  // Unguided: the tail along the sequence (10 / 1.38 = 7.25).
  p = dlo::plan_topology(request(0), batch(2, {10, 10, 10}, {false, false, false}));
  REQUIRE(p.phases.size() == 2);
  CHECK(p.phases[1].topology.label(false) == "sp 2");
  CHECK(p.predicted == doctest::Approx(10 + 10 / 1.38));
  // 5 on 4 ranks: the fifth on all four (10 / (1.84 x 1.38) = 3.94); a tail of 2 would leave
  // the first phase 3 jobs for 4 ranks, not considered.
  p = dlo::plan_topology(request(0), batch(4, std::vector<std::int64_t>(5, 10), std::vector<bool>(5, true)));
  REQUIRE(p.phases.size() == 2);
  CHECK(p.phases[1].count == 1);
  CHECK(p.phases[1].topology.label(true) == "cfg 2 x sp 2");
  CHECK(p.predicted == doctest::Approx(10 + 10 / (1.84 * 1.38)));
}

TEST_CASE("topology, no tail phase where it does not pay, for explicit requests, or for batches that fit the ranks") {
  // 8 jobs on 4 ranks: a tail of 1 gives 20 + 3.94, of 2 gives 20 + 5.43, of 3 would stay data
  // parallel; data parallel throughout takes 20.
  dlo::TopologyPlan p = dlo::plan_topology(request(0), batch(4, std::vector<std::int64_t>(8, 10), std::vector<bool>(8, true)));
  REQUIRE(p.phases.size() == 1);
  CHECK(p.phases[0].count == 8);
  CHECK(p.phases[0].topology.group_size == 1);
  CHECK(p.reason == "every rank its own job: 8 job(s) on 4 rank(s) (no tail phase on groups predicts 5% less than data "
                    "parallel throughout)");
  // A short last job: 10, 10, 2 on 2 ranks: data parallel 12; a CFG tail 10 + 1.09 = 11.09 (0.92 of 12, below 0.95).
  p = dlo::plan_topology(request(0), batch(2, {10, 10, 2}, {true, true, true}));
  CHECK(p.phases.size() == 2);
  // 10, 10, 1: data parallel 11; the tail 10.54, more than 0.95 x 11 = 10.45: one phase.
  p = dlo::plan_topology(request(0), batch(2, {10, 10, 1}, {true, true, true}));
  CHECK(p.phases.size() == 1);
  // Explicit requests: one phase, whatever the batch.
  p = dlo::plan_topology(request(1), batch(2, {10, 10, 10}, {true, true, true}));
  CHECK(p.phases.size() == 1);
  p = dlo::plan_topology(request(0, TopologyRequest::Cfg::kOff), batch(2, {10, 10, 10}, {true, true, true}));
  CHECK(p.phases.size() == 1);
  // As many jobs as ranks, or one rank: one phase.
  CHECK(dlo::plan_topology(request(0), batch(2, {10, 10}, {true, true})).phases.size() == 1);
  CHECK(dlo::plan_topology(request(0), batch(1, {10, 10, 10}, {true, true, true})).phases.size() == 1);
  // Fewer jobs than ranks: one phase on groups, as choose_topology.
  p = dlo::plan_topology(request(0), batch(4, {10}, {true}));
  REQUIRE(p.phases.size() == 1);
  CHECK(p.phases[0].topology.group_size == 4);
}

TEST_CASE("topology, the cost figures are the device kind's: the CPU's measured, CUDA's not yet") {
  const dlo::TopologyCosts cpu = dlo::topology_costs("cpu");
  CHECK(cpu.measured);
  CHECK(cpu.sp_efficiency == 0.69);
  CHECK(cpu.cfg_efficiency == 0.92);
  CHECK_FALSE(dlo::topology_costs("cuda").measured);
  // Other figures give other speedups: SP 2 at efficiency 0.9 is 1.8x.
  dlo::TopologyCosts fast;
  fast.sp_efficiency = 0.9;
  CHECK(dlo::predicted_speedup(2, false, fast) == doctest::Approx(1.8));
}

TEST_CASE("topology, auto without measured figures: every rank its own job, or one group of all for a single job") {
  auto unmeasured = [](TopologyLimits l) {
    l.costs = dlo::topology_costs("cuda");
    return l;
  };
  // A short batch (2 guided jobs on 4 ranks), which the CPU's figures put on CFG pairs (10 / 1.84
  // = 5.4 against 10 steps): every rank its own job.
  dlo::TopologyPlan p = dlo::plan_topology(request(0), unmeasured(batch(4, {10, 10}, {true, true})));
  REQUIRE(p.phases.size() == 1);
  CHECK(p.phases[0].topology.group_size == 1);
  CHECK(p.reason.find("no topology cost figures for cuda yet") != std::string::npos);
  CHECK(dlo::plan_topology(request(0), batch(4, {10, 10}, {true, true})).phases[0].topology.group_size == 2);
  // A single guided job: one group of all four, the CFG pair (x SP 2); unguided: SP 4.
  Topology t = dlo::choose_topology(request(0), unmeasured(batch(4, {10}, {true})));
  CHECK(t.group_size == 4);
  CHECK(t.label(true) == "cfg 2 x sp 2");
  CHECK(t.reason.find("a single job on every rank (no topology cost figures for cuda yet") != std::string::npos);
  t = dlo::choose_topology(request(0), unmeasured(batch(4, {10}, {false})));
  CHECK(t.group_size == 4);
  CHECK(t.label(false) == "sp 4");
  // When all the ranks cannot hold it (2 heads, 4 ranks, unguided), no smaller group is weighed.
  t = dlo::choose_topology(request(0), unmeasured(batch(4, {10}, {false}, 2)));
  CHECK(t.group_size == 1);
  CHECK(t.reason.find("one group of all 4 ranks does not fit") != std::string::npos);
  // A full batch that the CPU's figures would end with a tail on groups: no tail.
  const TopologyLimits tail = batch(4, {10, 10, 10, 10, 10}, {true, true, true, true, true});
  CHECK(dlo::plan_topology(request(0), tail).phases.size() == 2);
  CHECK(dlo::plan_topology(request(0), unmeasured(tail)).phases.size() == 1);
  // An explicit request is still the user's: --sp 2 on a short batch.
  t = dlo::choose_topology(request(2), unmeasured(batch(4, {10, 10}, {false, false})));
  CHECK(t.group_size == 2);
}

TEST_CASE("topology, --sp larger than the ranks says so (not 'no topology fits')") {
  CHECK_THROWS_WITH_AS(dlo::choose_topology(request(4), batch(2, {10}, {true})),
                       "--sp 4 --cfg-parallel auto on 2 rank(s): 4 ranks along the sequence > 2 rank(s)", dlo::Error);
}
