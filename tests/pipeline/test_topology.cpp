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
  CHECK(t.reason == "every rank its own job: 4 job(s) on 4 rank(s) (auto groups ranks only when there are fewer jobs than ranks)");
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
  // More ranks along the sequence than heads, or than a job's tokens.
  CHECK_THROWS_WITH_AS(dlo::choose_topology(request(4, Cfg::kOff), batch(4, {10}, {true}, 2)),
                       "--sp 4 --cfg-parallel off on 4 rank(s): 4 ranks along the sequence exceed the model's 2 attention heads",
                       dlo::Error);
  CHECK_THROWS_WITH_AS(dlo::choose_topology(request(4, Cfg::kOff), batch(4, {10}, {true}, 12, 3)),
                       "--sp 4 --cfg-parallel off on 4 rank(s): 4 ranks along the sequence exceed job 0's 3 tokens",
                       dlo::Error);
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
