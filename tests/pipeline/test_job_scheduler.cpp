// The job scheduler alone (no MPI, no model): a small simulation of the ranks drives it as
// render/generate does (reports at each boundary, the decision applied, one traversal) and checks
// every decision against what the batch must do: assignment in order to the ranks that ask, mixed
// step counts, failed jobs, a stop, the tail, and the same decision on every rank.
#include <doctest/doctest.h>

#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "dlo/pipeline/job_scheduler.h"

namespace {

using dlo::JobScheduler;
using dlo::PassDecision;
using dlo::RankReport;

// The ranks of a batch as render/generate drives them, with a JobScheduler per rank fed the same
// reports (as every rank does after the exchange).
struct Sim {
  struct Rank {
    std::int64_t current = -1, steps_done = 0, next = -1;
    std::vector<std::pair<std::int64_t, std::int64_t>> parked;
    int next_wait = 0;  // boundaries until `next` is prepared  // expert alignment's paused jobs, steps done
    bool stop = false;
    std::int64_t pending = 0;
  };
  std::vector<std::int64_t> steps;
  std::vector<Rank> ranks;
  // Two experts: per job, its steps on expert 0 (the rest on expert 1); empty: one expert.
  std::vector<std::int64_t> high_steps;
  std::vector<JobScheduler> schedulers;
  std::vector<int> taken_by;           // per job: the rank it was given to
  std::vector<std::int64_t> computed;  // per job: steps computed
  std::set<std::int64_t> fail_in_prepare;  // jobs whose preparation fails
  std::vector<std::vector<std::int64_t>> computed_on;  // per job, per expert: steps computed there
  std::int64_t passes = 0, traversals = 0, both_experts = 0, switches = 0, ghosts = 0;
  // Boundaries a preparation takes before its job is ready (0: ready at the next boundary).
  int prep_boundaries = 0;

  Sim(std::vector<std::int64_t> s, int n, bool align = true, std::vector<std::int64_t> high = {})
      : steps(std::move(s)), ranks(static_cast<std::size_t>(n)), high_steps(std::move(high)) {
    for (int r = 0; r < n; ++r) schedulers.emplace_back(steps, n, align, high_steps);
    taken_by.assign(steps.size(), -1);
    computed.assign(steps.size(), 0);
    computed_on.assign(steps.size(), std::vector<std::int64_t>(dlo::kMaxExperts, 0));
    std::vector<std::vector<dlo::JobAssignment>> all;
    for (auto& s2 : schedulers) all.push_back(s2.initial_assignments());
    for (const auto& a : all[0]) give(a);
    for (const auto& a : all) CHECK(a.size() == all[0].size());
  }

  void give(const dlo::JobAssignment& a) {
    REQUIRE(a.ranks.size() == 1);
    const int r = a.ranks[0];
    CHECK(taken_by[static_cast<std::size_t>(a.job)] == -1);  // never given twice
    taken_by[static_cast<std::size_t>(a.job)] = r;
    CHECK(ranks[static_cast<std::size_t>(r)].next == -1);
    ranks[static_cast<std::size_t>(r)].next = a.job;
    ranks[static_cast<std::size_t>(r)].next_wait = prep_boundaries;
  }

  // One boundary and (if decided) one traversal. Returns the decision.
  PassDecision pass() {
    std::vector<RankReport> reports;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      Rank& k = ranks[r];
      // As render/generate: a failed preparation is dropped; a parked job resumes first, then
      // the prepared next one (every preparation here is ready one boundary after it was given).
      if (k.next >= 0 && fail_in_prepare.count(k.next)) {
        ++k.pending;
        k.next = -1;
      }
      if (k.current < 0 && !k.parked.empty()) {
        std::tie(k.current, k.steps_done) = k.parked.front();
        k.parked.erase(k.parked.begin());
      }
      const bool ready = k.next >= 0 && k.next_wait-- <= 0;
      if (k.current < 0 && ready) k.current = k.next, k.steps_done = 0, k.next = -1;
      RankReport rep;
      dlo::AskInputs ask;
      ask.has_current = k.current >= 0;
      ask.has_next = k.next >= 0;
      ask.current_steps_left = k.current >= 0 ? steps[static_cast<std::size_t>(k.current)] - k.steps_done : 0;
      for (const auto& [j, done] : k.parked) ask.current_steps_left += steps[static_cast<std::size_t>(j)] - done;
      if (!high_steps.empty() && k.current >= 0 && k.parked.size() < static_cast<std::size_t>(dlo::kMaxParked)) {
        ask.only_low_noise = expert_of(k.current, k.steps_done) == 1;
        for (const auto& [j, done] : k.parked) ask.only_low_noise = ask.only_low_noise && expert_of(j, done) == 1;
      }
      rep.wants_job = schedulers[r].should_ask(ask);
      rep.stop = k.stop;
      rep.pending_results = k.pending;
      rep.current = k.current;
      rep.steps_done = k.steps_done;
      rep.next = k.next;
      rep.expert = expert_of(k.current, k.steps_done);
      REQUIRE(k.parked.size() <= static_cast<std::size_t>(dlo::kMaxParked));
      for (std::size_t i = 0; i < k.parked.size(); ++i) {
        rep.parked[i] = k.parked[i].first;
        rep.parked_steps_done[i] = k.parked[i].second;
        rep.parked_expert[i] = expert_of(k.parked[i].first, k.parked[i].second);
      }
      rep.next_ready = k.next >= 0 && ready;
      rep.next_expert = expert_of(k.next, 0);
      // Through the exchange's wire format.
      std::int64_t words[RankReport::kWords];
      rep.encode(words);
      reports.push_back(RankReport::decode(words));
    }
    std::vector<PassDecision> ds;
    for (auto& s : schedulers) ds.push_back(s.schedule(reports));
    for (const auto& d : ds) {  // every rank decided the same
      CHECK(d.pass == ds[0].pass);
      CHECK(d.stop == ds[0].stop);
      CHECK(d.finished == ds[0].finished);
      CHECK(d.traverse == ds[0].traverse);
      CHECK(d.collect_results == ds[0].collect_results);
      CHECK(d.assignments.size() == ds[0].assignments.size());
      CHECK(d.rank_job == ds[0].rank_job);
      CHECK(d.rank_expert == ds[0].rank_expert);
      CHECK(d.experts == ds[0].experts);
    }
    const PassDecision& d = ds[0];
    if (d.collect_results)
      for (auto& k : ranks) k.pending = 0;
    if (d.stop) return d;
    for (const auto& a : d.assignments) give(a);
    if (d.finished || !d.traverse) return d;
    ++traversals;
    both_experts += d.experts == 3u;
    unsigned needed = 0;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      Rank& k = ranks[r];
      // The decided job becomes current: the parked one (swapped), or the next one started early.
      const std::int64_t want = d.rank_job[r];
      CHECK((want >= 0) == (k.current >= 0));  // every rank with work computes
      if (want >= 0 && want != k.current) {
        ++switches;
        const auto p = std::find_if(k.parked.begin(), k.parked.end(), [&](const auto& e) { return e.first == want; });
        if (p != k.parked.end()) {  // resumed; the current one parked last
          const auto resumed = *p;
          k.parked.erase(p);
          k.parked.emplace_back(k.current, k.steps_done);
          std::tie(k.current, k.steps_done) = resumed;
        } else {  // the next one started early
          REQUIRE(want == k.next);
          CHECK(k.parked.size() < static_cast<std::size_t>(dlo::kMaxParked));
          k.parked.emplace_back(k.current, k.steps_done);
          k.current = k.next, k.steps_done = 0, k.next = -1;
        }
      }
      if (k.current < 0) {
        ++ghosts;
        continue;
      }
      const int e = expert_of(k.current, k.steps_done);
      CHECK(d.rank_expert[r] == e);
      CHECK(d.rank_step[r] == k.steps_done);
      needed |= 1u << e;
      CHECK((d.experts & (1u << e)) != 0);  // the pass streams the expert this step needs
      ++computed_on[static_cast<std::size_t>(k.current)][static_cast<std::size_t>(e)];
      ++computed[static_cast<std::size_t>(k.current)];
      if (++k.steps_done == steps[static_cast<std::size_t>(k.current)]) {
        k.current = -1;
        ++k.pending;  // decoded behind, its result reported
      }
    }
    CHECK(d.experts == needed);  // and no expert that no rank needs
    ++passes;
    return d;
  }

  int expert_of(std::int64_t job, std::int64_t steps_done) const {
    if (high_steps.empty() || job < 0) return 0;
    return steps_done < high_steps[static_cast<std::size_t>(job)] ? 0 : 1;
  }

  // Until the batch is finished (bounded).
  void run() {
    for (int guard = 0; guard < 10000; ++guard)
      if (pass().finished) return;
    FAIL("the batch never finished");
  }
};

}  // namespace

TEST_CASE("the first jobs go to ranks 0, 1, ... before the wave, never more than there are jobs") {
  JobScheduler s({5, 5, 5, 5, 5}, 2);
  const auto a = s.initial_assignments();
  REQUIRE(a.size() == 2);
  CHECK(a[0].job == 0);
  CHECK(a[0].ranks == std::vector<int>{0});
  CHECK(a[1].job == 1);
  CHECK(a[1].ranks == std::vector<int>{1});
  CHECK(s.state(0) == dlo::JobState::kAssigned);
  CHECK(s.state(2) == dlo::JobState::kQueued);
  JobScheduler few({3, 3}, 4);
  CHECK(few.initial_assignments().size() == 2);
}

TEST_CASE("a batch of equal jobs: every job once, every step computed, both ranks busy every pass") {
  Sim sim({4, 4, 4, 4, 4, 4}, 2);
  sim.run();
  for (std::size_t j = 0; j < sim.steps.size(); ++j) {
    CAPTURE(j);
    CHECK(sim.taken_by[j] >= 0);
    CHECK(sim.computed[j] == sim.steps[j]);
  }
  CHECK(sim.traversals == 12);  // 24 steps on 2 ranks, no idle pass
}

TEST_CASE("mixed step counts: a rank whose job ends takes the next, no rank waits behind a longer job") {
  // Rank 0 gets a 20-step job; rank 1 works through the short ones meanwhile.
  Sim sim({20, 2, 2, 2, 2, 2, 2, 2, 2, 2}, 2);
  sim.run();
  for (std::size_t j = 0; j < sim.steps.size(); ++j) CHECK(sim.computed[j] == sim.steps[j]);
  int on_rank1 = 0;
  for (std::size_t j = 1; j < sim.steps.size(); ++j) on_rank1 += sim.taken_by[j] == 1;
  CHECK(on_rank1 >= 8);             // the short jobs went to the free rank
  CHECK(sim.traversals <= 21 + 1);  // bounded by the longest chain, not by the sum of steps
}

TEST_CASE("jobs are handed out in order, to the asking ranks in rank order") {
  Sim sim({1, 1, 1, 1, 1, 1, 1, 1, 1}, 3);
  std::vector<std::int64_t> order;
  std::vector<int> to;
  for (int guard = 0; guard < 100; ++guard) {
    const PassDecision d = sim.pass();
    for (const auto& a : d.assignments) {
      order.push_back(a.job);
      to.push_back(a.ranks[0]);
    }
    if (d.finished) break;
  }
  for (std::size_t i = 1; i < order.size(); ++i) CHECK(order[i] == order[i - 1] + 1);
  CHECK(order.front() == 3);  // 0..2 went out before the wave
}

TEST_CASE("a job whose preparation fails is finished, its rank asks again and the batch goes on") {
  Sim sim({3, 3, 3, 3}, 2);
  sim.fail_in_prepare = {1};
  sim.run();
  CHECK(sim.computed[1] == 0);
  CHECK(sim.computed[0] == 3);
  CHECK(sim.computed[2] == 3);
  CHECK(sim.computed[3] == 3);
  CHECK(sim.schedulers[0].state(1) == dlo::JobState::kFinished);
}

TEST_CASE("a stop on any rank stops every rank at the boundary, without handing out jobs") {
  Sim sim({5, 5, 5, 5}, 2);
  sim.pass();
  sim.pass();
  sim.ranks[1].stop = true;
  const PassDecision d = sim.pass();
  CHECK(d.stop);
  CHECK(d.assignments.empty());
  CHECK_FALSE(d.finished);
}

TEST_CASE("results waiting anywhere make every rank join the gather to rank 0") {
  Sim sim({1, 1}, 2);
  PassDecision d = sim.pass();  // both compute their one step
  CHECK_FALSE(d.collect_results);
  d = sim.pass();  // the two results are pending now
  CHECK(d.collect_results);
}

TEST_CASE("the tail: with fewer jobs left than ranks a rank asks only when its job is about to end") {
  JobScheduler s({10, 10, 10}, 2);
  (void)s.initial_assignments();
  dlo::AskInputs in;
  in.has_current = true;
  in.current_steps_left = 9;
  CHECK_FALSE(s.should_ask(in));  // 1 job left for 2 ranks: not yet
  in.current_steps_left = 1;
  CHECK(s.should_ask(in));        // its last step
  in.step_s = 1.0;
  in.text_s = 2.5;
  in.current_steps_left = 3;
  CHECK(s.should_ask(in));        // 3 steps of 1 s <= preparing (2.5 s) + one step
  in.current_steps_left = 4;
  CHECK_FALSE(s.should_ask(in));
  in.has_next = true;
  in.current_steps_left = 0;
  CHECK_FALSE(s.should_ask(in));  // never while a prepared job waits
  dlo::AskInputs idle;
  CHECK(s.should_ask(idle));      // a rank without work always asks
  JobScheduler many({1, 1, 1, 1, 1, 1}, 2);
  (void)many.initial_assignments();
  const dlo::AskInputs busy{true, false, 9, 0, 0};
  CHECK(many.should_ask(busy));   // more jobs waiting than ranks: ask at once
}

TEST_CASE("the tail ends: fewer jobs than ranks finish, then the batch is finished everywhere") {
  Sim sim({2}, 3);  // one job, three ranks: two ghost ranks
  sim.run();
  CHECK(sim.computed[0] == 2);
  CHECK(sim.traversals == 2);
}

TEST_CASE("steps left and the ETA follow the reports") {
  JobScheduler s({4, 6}, 2);
  (void)s.initial_assignments();
  CHECK(s.steps_left() == 10);
  CHECK(s.eta_s(0) == -1);
  std::vector<RankReport> r(2);
  r[0].current = 0, r[0].steps_done = 1;
  r[1].current = 1, r[1].steps_done = 2;
  s.schedule(r);
  CHECK(s.steps_left() == 3 + 4);
  CHECK(s.eta_s(2.0) == doctest::Approx(7 * 2.0 / 2));
  r[0] = RankReport{};  // job 0 is done
  s.schedule(r);
  CHECK(s.state(0) == dlo::JobState::kFinished);
  CHECK(s.steps_left() == 4);
}

TEST_CASE("a report survives the exchange's integers") {
  RankReport r;
  r.wants_job = true;
  r.stop = true;
  r.pending_results = 3;
  r.current = 7;
  r.steps_done = 12;
  r.next = 9;
  r.expert = 1;
  std::int64_t w[RankReport::kWords];
  r.encode(w);
  const RankReport b = RankReport::decode(w);
  CHECK(b.wants_job);
  CHECK(b.stop);
  CHECK(b.pending_results == 3);
  CHECK(b.current == 7);
  CHECK(b.steps_done == 12);
  CHECK(b.next == 9);
  CHECK(b.expert == 1);
}

TEST_CASE("two experts: each pass streams exactly the experts its ranks' steps need, ranks on different experts meet") {
  // Jobs of 6, 3, 4 and 5 steps whose first 2, 1, 3 and 5 steps run expert 0 (different
  // boundaries and step counts): at 2 ranks some passes need both experts.
  Sim sim({6, 3, 4, 5}, 2, false, {2, 1, 3, 5});
  sim.run();
  for (std::size_t j = 0; j < sim.steps.size(); ++j) {
    CAPTURE(j);
    CHECK(sim.computed_on[j][0] == sim.high_steps[j]);  // every step once, on its own expert
    CHECK(sim.computed_on[j][1] == sim.steps[j] - sim.high_steps[j]);
  }
  CHECK(sim.both_experts >= 1);
  CHECK(sim.schedulers[0].passes_streaming_all_experts() == sim.both_experts);
  CHECK(sim.schedulers[1].passes_streaming_all_experts() == sim.both_experts);
  // One expert: every pass streams expert 0 alone.
  Sim one({3, 3, 3}, 2);
  one.run();
  CHECK(one.both_experts == 0);
  CHECK(one.schedulers[0].passes_streaming_all_experts() == 0);
}

TEST_CASE("two experts: alignment keeps a drifting batch on one expert per pass, every step once and in order") {
  // 12 jobs alternating as Wan2.2 A14B's boundary 0.875 splits UniPC schedules: 8 steps at
  // shift 12 (6 high-noise steps) and 3 steps at shift 3 (1 high-noise step), so ranks drift.
  std::vector<std::int64_t> steps, high;
  for (int j = 0; j < 12; ++j) {
    steps.push_back(j % 2 ? 3 : 8);
    high.push_back(j % 2 ? 1 : 6);
  }
  for (const int n : {2, 3}) {
    CAPTURE(n);
    Sim off(steps, n, false, high), on(steps, n, true, high);
    off.run();
    on.run();
    for (const Sim* sim : {&off, &on})
      for (std::size_t j = 0; j < steps.size(); ++j) {
        CAPTURE(j);
        CHECK(sim->computed_on[j][0] == high[j]);  // each step once, on its own expert (order: Sim)
        CHECK(sim->computed_on[j][1] == steps[j] - high[j]);
      }
    MESSAGE(n, " ranks: passes streaming both experts ", off.both_experts, " of ", off.passes, " without alignment, ",
            on.both_experts, " of ", on.passes, " with it (", on.switches, " parks or early starts)");
    CHECK(off.both_experts > 0);
    CHECK(on.both_experts < off.both_experts);
    if (n == 2) CHECK(on.both_experts == 0);  // (3 ranks: 4 of 25)
    CHECK(on.switches > 0);
    CHECK(off.switches == 0);
    CHECK(on.schedulers[0].passes_streaming_all_experts() == on.both_experts);
  }
  // One expert: alignment changes nothing (no parking, no early start).
  Sim one({3, 5, 2, 4}, 2, true);
  one.run();
  CHECK(one.switches == 0);
  CHECK(one.both_experts == 0);
}
TEST_CASE("two experts: alignment on random mixed batches (12 jobs of 3-12 steps, 30-80% high-noise) at 2-4 ranks") {
  unsigned seed = 1;
  auto rnd = [&]() {
    seed = seed * 1103515245u + 12345u;
    return static_cast<int>((seed >> 16) & 0x7fff);
  };
  for (const int n : {2, 3, 4}) {
    CAPTURE(n);
    std::int64_t off_both = 0, off_passes = 0, on_both = 0, on_passes = 0;
    for (int trial = 0; trial < 30; ++trial) {
      std::vector<std::int64_t> steps, high;
      for (int j = 0; j < 12; ++j) {
        const int st = 3 + rnd() % 10;
        steps.push_back(st);
        high.push_back(std::max(1, static_cast<int>(st * (0.3 + 0.5 * (rnd() % 100) / 100.0))));
      }
      Sim off(steps, n, false, high), on(steps, n, true, high);
      off.run();
      on.run();
      for (std::size_t j = 0; j < steps.size(); ++j) {  // each step once, on its own expert
        CHECK(on.computed_on[j][0] == high[j]);
        CHECK(on.computed_on[j][1] == steps[j] - high[j]);
      }
      off_both += off.both_experts, off_passes += off.passes, on_both += on.both_experts, on_passes += on.passes;
    }
    MESSAGE(n, " ranks, 30 batches: passes streaming both experts ", off_both, " of ", off_passes,
            " without alignment, ", on_both, " of ", on_passes, " with it");
    CHECK(on_both * 2 < off_both);                   // at least halved
    CHECK(on_passes * 100 <= off_passes * 104);      // at most 4% more passes (ranks holding more jobs at the tail)
    if (n == 2) CHECK(on_both * 20 <= on_passes);    // the goal at 2 ranks: at most 5%
  }
}
TEST_CASE("two experts: with preparations that take passes, alignment adds no ghost pass") {
  // The 12-job batch of tools/bench/bench_experts.py's case D: 16 steps at shift 12 (10 high-noise) and 8
  // at shift 3 (2 high-noise), alternating; a job is ready 0, 2 or 4 boundaries after it was given.
  std::vector<std::int64_t> steps, high;
  for (int j = 0; j < 12; ++j) {
    steps.push_back(j % 2 ? 8 : 16);
    high.push_back(j % 2 ? 2 : 10);
  }
  for (const int prep : {0, 2, 4})
    for (const int n : {2, 3}) {
      CAPTURE(prep);
      CAPTURE(n);
      Sim off(steps, n, false, high), on(steps, n, true, high);
      off.prep_boundaries = on.prep_boundaries = prep;
      off.run();
      on.run();
      MESSAGE("prep ", prep, ", ", n, " ranks: both experts ", off.both_experts, " -> ", on.both_experts, ", passes ",
              off.passes, " -> ", on.passes, ", ghost steps ", off.ghosts, " -> ", on.ghosts);
      CHECK(on.both_experts < off.both_experts);
      CHECK(on.ghosts <= off.ghosts);
      CHECK(on.passes <= off.passes);
      for (std::size_t j = 0; j < steps.size(); ++j) CHECK(on.computed[j] == steps[j]);
    }
}
