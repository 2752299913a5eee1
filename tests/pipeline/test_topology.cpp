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
  CHECK(t.reason.rfind("every rank its own job: 4 job(s) on 4 rank(s), predicted 10.00", 0) == 0);
  // Three jobs on two ranks: DP 20 steps (a tail of one job on one rank), CFG pairs 3 x 10 / 1.84.
  const Topology tail = dlo::choose_topology(request(0), batch(2, {10, 10, 10}, {true, true, true}));
  CHECK(tail.group_size == 2);
  CHECK(tail.predicted == doctest::Approx(30 / 1.84));
  CHECK(tail.predicted_dp == doctest::Approx(20));
}

TEST_CASE("topology, the list schedule follows the jobs' steps") {
  // 3 ranks, jobs of 30, 10, 10, 10 steps: DP ends at 30 (the long job); groups of 3 do not pay.
  const Topology t = dlo::choose_topology(request(0), batch(3, {30, 10, 10, 10}, {false, false, false, false}));
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
