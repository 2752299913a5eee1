// A whole batch through generate() (render/generate.h) over a fake model (render/batch_work.h), at
// 1-3 ranks in seconds: which rank or group steps which job when, failures, expert alignment, the
// tail phase, a stop. The fake's step is the job's own noise scheduler stepped with a noise made
// from the job's index, so a job's final latents say whether every one of its steps ran once, in
// order: they are checked against the same scheduler stepped here by hand. Every rank logs the
// steps it computed; rank 0 checks them all.
#include "common/doctest_torch.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "common/mpi_test_util.h"
#include "dlo/common/error.h"
#include "dlo/diffusion/noise_scheduler.h"
#include "dlo/offload/memory_model.h"
#include "dlo/render/batch_work.h"
#include "dlo/render/generate.h"
#include "dlo/testing/make_model.h"

namespace {

using dlo::test::world;

// The noise the fake model predicts for a job: the same at every step, different per job.
at::Tensor fake_noise(std::int64_t index) { return at::full({1, 1, 1, 1, 1}, 0.25 * static_cast<double>(index + 1), at::kFloat); }
at::Tensor fake_start(std::uint64_t seed) { return at::full({1, 1, 1, 1, 1}, static_cast<double>(seed % 97), at::kFloat); }

// What a job's latents end as when each of its steps runs once, in order (computed here, by hand).
float expected_latents(const dlo::BatchJob& job, const dlo::ModelInfo& model) {
  auto sched = dlo::make_noise_scheduler(dlo::job_scheduler_config(job.spec, model));
  sched->set_timesteps(job.spec.steps);
  at::Tensor x = fake_start(job.spec.seed);
  for (std::int64_t i = 0; i < job.spec.steps; ++i) x = sched->step(fake_noise(job.index), x);
  return x.item<float>();
}

// The expert a job's step (from 1) must run on: 0 while its timestep is at least the boundary.
int expected_expert(const dlo::BatchJob& job, const dlo::ModelInfo& model, std::int64_t step) {
  if (!model.two_experts()) return 0;
  auto sched = dlo::make_noise_scheduler(dlo::job_scheduler_config(job.spec, model));
  sched->set_timesteps(job.spec.steps);
  const double t = sched->timesteps()[step - 1].item<double>();
  const double boundary = job.spec.boundary_ratio.value_or(*model.boundary_ratio) * 1000.0;
  return static_cast<float>(t) >= static_cast<float>(boundary) ? 0 : 1;
}

struct Fault {
  std::int64_t job = -1, step = -1;  // this job fails in this step (from 1), on every rank computing it
};

class FakeWork final : public dlo::BatchWork {
 public:
  FakeWork(const dlo::ModelInfo& model, Fault fault) : model_(model), fault_(fault) {}

  int experts() const override { return model_.two_experts() ? 2 : 1; }
  dlo::StackSize load(const dlo::WaveDevice&, std::uint64_t& layout) override {
    layout = 7;
    std::vector<dlo::StackSize> sizes;
    for (const auto& c : model_.expert_configs()) sizes.push_back(dlo::config_stack_size(c, dlo::WanDtypes::same(at::kFloat), world().size()));
    return dlo::join_stacks(sizes);
  }
  void use_aux_device(bool) override {}
  void start(const dlo::StrategyChoice&, const dlo::StackSize&) override {}
  void prepare(dlo::JobRun& run) override {
    dlo::prepare_schedule(run, model_);
    run.latents = fake_start(run.job.spec.seed);
  }
  void step(dlo::JobRun& run, int expert, unsigned pass_experts, const dlo::BlockHook&, const dlo::StepGroups&) override {
    const std::int64_t step = run.scheduler->step_index() + 1;
    log_ << run.job.index << ' ' << step << ' ' << expert << ' ' << run.expert() << ' ' << pass_experts << '\n';
    if (run.job.index == fault_.job && step == fault_.step) throw dlo::BlockComputeError("injected failure");
    run.latents = run.scheduler->step(fake_noise(run.job.index), run.latents);
  }
  void ghost(unsigned) override {}
  void finish(dlo::JobRun& run, const dlo::SinkFactory&, const dlo::LatentsKeeper&) override {
    std::ostringstream v;
    v.precision(9);
    v << run.latents.item<float>();
    run.result.frames_sha256 = v.str();  // the final latents, as text
  }
  dlo::WorkFacts end() override { return {}; }

  std::string log() const { return log_.str(); }

 private:
  const dlo::ModelInfo& model_;
  const Fault fault_;
  std::ostringstream log_;  // "job step expert run.expert() pass-experts", one line per step computed
};

struct StepDone {
  std::int64_t job, step;
  int expert, job_expert;
  unsigned pass;
  int rank;
};

// A tiny model folder (one or two experts; only its configs are read here).
const dlo::ModelInfo& model(bool two_experts) {
  static dlo::test::SharedDir dir;
  static std::map<bool, dlo::ModelInfo> models;
  auto it = models.find(two_experts);
  if (it == models.end()) {
    const std::string path = dir.file(two_experts ? "m2" : "m1");
    if (world().rank() == 0) {
      dlo::MakeModelOptions o;
      o.dtype = dlo::DType::F32;
      if (two_experts) o.components.push_back("transformer_2");
      o.boundary_ratio = 0.9;
      dlo::make_model(path, o);
    }
    world().barrier();
    it = models.emplace(two_experts, dlo::read_model_info(path)).first;
  }
  return it->second;
}

std::vector<dlo::BatchJob> jobs_of(const std::vector<std::int64_t>& steps, double guidance = 1.0) {
  std::vector<dlo::BatchJob> jobs;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    dlo::BatchJob j;
    j.index = static_cast<std::int64_t>(i);
    j.spec.id = "j" + std::to_string(i);
    j.spec.seed = 11 + 13 * i;
    j.spec.steps = steps[i];
    j.spec.guidance = guidance;
    j.spec.height = 16;
    j.spec.width = 16;
    j.spec.frames = 5;
    jobs.push_back(j);
  }
  return jobs;
}

struct Batch {
  dlo::GenerateReport report;
  std::vector<StepDone> steps;  // rank 0: every rank's
};

Batch run_batch(const dlo::ModelInfo& m, const std::vector<dlo::BatchJob>& jobs, dlo::GenerateOptions o, Fault fault = {},
                dlo::GenerateCallbacks cb = {}) {
  o.dtype = at::kFloat;
  o.device.kind = dlo::DeviceRequest::Kind::kCpu;
  FakeWork work(m, fault);
  Batch b;
  b.report = dlo::generate(world(), m, jobs, o, cb, work);
  const auto logs = world().gather_strings(work.log(), 0, "test logs");
  for (std::size_t r = 0; r < logs.size(); ++r) {
    std::istringstream in(logs[r]);
    StepDone s{};
    while (in >> s.job >> s.step >> s.expert >> s.job_expert >> s.pass) {
      s.rank = static_cast<int>(r);
      b.steps.push_back(s);
    }
  }
  return b;
}

// Rank 0: every job recorded once, in order, ok but `failed`, with the latents of all its steps
// run once in order; each step computed by exactly the ranks its result names, on the expert its
// timestep asks for.
void check_batch(const Batch& b, const std::vector<dlo::BatchJob>& jobs, const dlo::ModelInfo& m,
                 const std::set<std::int64_t>& failed = {}) {
  if (world().rank() != 0) return;
  REQUIRE(b.report.jobs.size() == jobs.size());
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const dlo::JobResult& r = b.report.jobs[i];
    CAPTURE(r.id);
    CHECK(r.index == static_cast<std::int64_t>(i));
    if (failed.count(r.index)) {
      CHECK_FALSE(r.ok());
      continue;
    }
    REQUIRE(r.ok());
    std::ostringstream v;
    v.precision(9);
    v << expected_latents(jobs[i], m);
    CHECK(r.frames_sha256 == v.str());
    const std::set<int> ranks = r.ranks.empty() ? std::set<int>{r.rank} : std::set<int>(r.ranks.begin(), r.ranks.end());
    std::map<std::int64_t, std::set<int>> by_step;
    for (const StepDone& s : b.steps)
      if (s.job == r.index) {
        by_step[s.step].insert(s.rank);
        CHECK(s.expert == s.job_expert);  // the runner of the job's own expert
        CHECK(s.expert == expected_expert(jobs[i], m, s.step));
        CHECK((s.pass & (1u << s.expert)) != 0);
      }
    CHECK(static_cast<std::int64_t>(by_step.size()) == jobs[i].spec.steps);
    for (const auto& [step, who] : by_step) {
      CAPTURE(step);
      CHECK(who == ranks);  // once, by the job's group (a re-run would add another group's ranks)
    }
  }
}

// Every rank made the same number of traversals (they stream the weights together).
void check_traversals_agree(const Batch& b) {
  if (world().rank() != 0) return;
  const auto ranks = nlohmann::json::parse(b.report.ranks_json);
  REQUIRE(ranks.size() == static_cast<std::size_t>(world().size()));
  for (const auto& r : ranks) CHECK(r.at("traversals") == ranks[0].at("traversals"));
}

}  // namespace

TEST_CASE("a batch of mixed steps: every job once, all its steps in order, by one rank or group") {
  const auto& m = model(false);
  const auto jobs = jobs_of({3, 5, 2, 4, 6, 3, 2});
  const Batch b = run_batch(m, jobs, {});
  check_batch(b, jobs, m);
  check_traversals_agree(b);
  CHECK_FALSE(b.report.stopped);
}

TEST_CASE("a job that fails in a step fails alone, its rank goes on with the batch") {
  const auto& m = model(false);
  const auto jobs = jobs_of({3, 4, 3, 2, 5, 3, 2, 4});
  const Batch b = run_batch(m, jobs, {}, Fault{1, 2});
  check_batch(b, jobs, m, {1});
  if (world().rank() != 0) return;
  const dlo::JobResult& r = b.report.jobs[1];
  CHECK(r.error == "job 1 ('j1'): denoising step 2: injected failure");
  // With one rank, the jobs after it are that rank's: a failed job does not take its rank out.
  if (world().size() == 1)
    for (const StepDone& s : b.steps) CHECK(s.rank == 0);
}

TEST_CASE("two experts, aligned: parked jobs resume on their own expert, each step on the expert its timestep asks") {
  const auto& m = model(true);
  auto jobs = jobs_of({6, 3, 7, 4, 5, 8, 3}, 1.0);
  jobs[2].spec.boundary_ratio = 0.5;  // a job's own boundary over the folder's 0.9
  jobs[5].spec.boundary_ratio = 0.5;
  dlo::GenerateOptions o;
  o.await_prepared = true;  // the same passes every run
  const Batch b = run_batch(m, jobs, o);
  check_batch(b, jobs, m);
  check_traversals_agree(b);
  if (world().rank() != 0 || world().size() == 1) return;
  // Alignment did work: some rank parked a job or started one early (one rank never needs to).
  std::int64_t switches = 0;
  for (const auto& r : nlohmann::json::parse(b.report.ranks_json)) switches += r.value("expert_alignment_switches", 0);
  CHECK(switches > 0);
}

TEST_CASE("two experts, not aligned: passes that stream both experts step each job on its own") {
  const auto& m = model(true);
  const auto jobs = jobs_of({6, 3, 7, 4, 5, 8, 3}, 1.0);
  dlo::GenerateOptions o;
  o.align_experts = false;
  const Batch b = run_batch(m, jobs, o);
  check_batch(b, jobs, m);
  check_traversals_agree(b);
}

TEST_CASE("guided jobs on groups and a tail phase regrouped: no job computed twice") {
  const auto& m = model(false);
  // More jobs than groups of any size: a tail phase forms where the ranks outnumber the jobs left.
  const auto jobs = jobs_of({3, 2, 4, 3, 2}, 4.0);
  const Batch b = run_batch(m, jobs, {});
  check_batch(b, jobs, m);
  check_traversals_agree(b);
  if (world().rank() != 0 || world().size() != 2) return;
  // Two ranks: four jobs one per rank, then the fifth on a CFG pair (a phase of its own).
  const auto ranks = nlohmann::json::parse(b.report.ranks_json);
  CHECK(ranks[0].at("phases") == 2);
  CHECK(b.report.jobs[4].ranks == std::vector<int>{0, 1});
  CHECK(b.report.jobs[4].parallel == "cfg 2");
}

TEST_CASE("a stop requested on one rank stops every rank, what was recorded is whole") {
  const auto& m = model(false);
  const auto jobs = jobs_of({3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3});
  dlo::GenerateCallbacks cb;
  int polls = 0;
  const int stopper = world().size() - 1;
  cb.stop_requested = [&] { return world().rank() == stopper && ++polls > 5; };
  const Batch b = run_batch(m, jobs, {}, {}, cb);
  CHECK(b.report.stopped);
  if (world().rank() != 0) return;
  CHECK(b.report.jobs.size() < jobs.size());
  for (const dlo::JobResult& r : b.report.jobs) {
    CHECK(r.ok());
    std::ostringstream v;
    v.precision(9);
    v << expected_latents(jobs[static_cast<std::size_t>(r.index)], m);
    CHECK(r.frames_sha256 == v.str());
  }
}

TEST_CASE("one rank: an I/O error at a pass boundary ends the batch with that error") {
  if (world().size() != 1) return;  // with several ranks it ends the process (MpiWorld::abort): the tool tests
  const auto& m = model(false);
  const auto jobs = jobs_of({3, 3, 3});
  dlo::GenerateCallbacks cb;
  int polls = 0;
  cb.stop_requested = [&]() -> bool {
    if (++polls == 4) throw dlo::Error("pass 3: disk full", dlo::ErrorKind::kIo);
    return false;
  };
  try {
    (void)run_batch(m, jobs, {}, {}, cb);
    FAIL("no error");
  } catch (const dlo::Error& e) {
    CHECK(std::string(e.what()) == "pass 3: disk full");
    CHECK((e.kind() == dlo::ErrorKind::kIo));
  }
}

TEST_CASE("two experts: a job without guidance_2 guides the low-noise expert with its guidance, as WanPipeline does") {
  // WanPipeline.__call__: "if guidance_scale_2 is None: guidance_scale_2 = guidance_scale".
  const auto& m = model(true);
  auto jobs = jobs_of({8}, 4.0);
  dlo::JobRun run(jobs[0], m, 0);
  dlo::prepare_schedule(run, m);
  run.latents = fake_start(1);
  std::vector<double> seen;
  while (run.steps_left() > 0) {
    seen.push_back(run.expert() == 0 ? -run.guidance_now() : run.guidance_now());  // negative: the high-noise expert
    run.latents = run.scheduler->step(fake_noise(0), run.latents);
    ++run.steps_done;
  }
  CHECK(std::count(seen.begin(), seen.end(), 4.0) > 0);   // low-noise steps, guided with 4
  CHECK(std::count(seen.begin(), seen.end(), -4.0) > 0);  // high-noise steps, guided with 4
  CHECK(std::count(seen.begin(), seen.end(), 4.0) + std::count(seen.begin(), seen.end(), -4.0) == 8);
  jobs[0].spec.guidance_2 = 2.5;
  dlo::JobRun own(jobs[0], m, 0);
  dlo::prepare_schedule(own, m);
  CHECK(own.guidance_2 == 2.5);
}
