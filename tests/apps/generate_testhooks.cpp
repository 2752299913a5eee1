// dlo-generate-testhooks: dlo-generate's main linked with the fault-injection hooks the tool-level
// tests use (app/generate_hooks.h). Never shipped; the shipped --help shows none of these flags.
//
//   --fail-job I [--fail-step S] [--fail-block B]  job I (manifest index) fails in step S at block B
//                                                  (-1: the step's inputs, before the traversal)
//   --fail-at-block B     this rank's transfer of block B fails (every pass)
//   --fail-io-at-pass P   this rank fails with an I/O error at pass boundary P (counted from 0)
//   --fail-rank R         the rank of the three above (default: every rank; --fail-io-at-pass: rank 0)
//   --slow-decode-ms MS   every decode waits this long first (a slow decoder)
//   --await-prepared      GenerateOptions::await_prepared (reproducible scheduling)
//   --test-topology-skew-rank R  rank R asks for the other CFG parallelism (the topology agreement)
#include <chrono>
#include <cstdint>
#include <thread>

#include "dlo/app/generate_cli.h"
#include "dlo/app/generate_hooks.h"
#include "dlo/common/error.h"
#include "dlo/mpi/mpi_world.h"

namespace dlo {
namespace {

struct Faults {
  std::int64_t compute_job = -1, compute_step = -1, compute_block = 0;
  int rank = -1;  // -1: every rank
  std::int64_t decode_delay_ms = 0;
};

// The model's work with a job that fails where asked and decodes that take longer.
class FaultyWork final : public BatchWork {
 public:
  FaultyWork(std::unique_ptr<BatchWork> inner, Faults f, int rank) : inner_(std::move(inner)), f_(f), rank_(rank) {}

  int experts() const override { return inner_->experts(); }
  StackSize load(const WaveDevice& device, std::uint64_t& layout) override { return inner_->load(device, layout); }
  void use_aux_device(bool on_device) override { inner_->use_aux_device(on_device); }
  void start(const StrategyChoice& choice, const StackSize& stack) override { inner_->start(choice, stack); }
  void prepare(JobRun& run) override { inner_->prepare(run); }
  void step(JobRun& run, int expert, unsigned pass_experts, const BlockHook& hook, const StepGroups& groups) override {
    const bool fails_here = run.job.index == f_.compute_job && (f_.rank < 0 || f_.rank == rank_);
    if (!fails_here) return inner_->step(run, expert, pass_experts, hook, groups);
    const Faults f = f_;
    inner_->step(run, expert, pass_experts,
                 [f, hook](std::int64_t step, std::int64_t block) {
                   if (hook) hook(step, block);
                   DLO_CHECK(!(step == f.compute_step && block == f.compute_block), "injected failure (test hook)");
                 },
                 groups);
  }
  void ghost(unsigned pass_experts) override { inner_->ghost(pass_experts); }
  void finish(JobRun& run, const SinkFactory& open_sink, const LatentsKeeper& keep_latents) override {
    if (f_.decode_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(f_.decode_delay_ms));
    inner_->finish(run, open_sink, keep_latents);
  }
  WorkFacts end() override { return inner_->end(); }

 private:
  std::unique_ptr<BatchWork> inner_;
  const Faults f_;
  const int rank_;
};

class TestHooks final : public GenerateHooks {
 public:
  void add_flags(cxxopts::Options& opts) const override {
    opts.add_options("test hooks")("fail-job", "this job (manifest index) fails in step --fail-step",
                                   cxxopts::value<std::string>())(
        "fail-step", "see --fail-job", cxxopts::value<std::string>()->default_value("1"))(
        "fail-block", "with --fail-job: the block it fails at (-1: the step's inputs, before the traversal)",
        cxxopts::value<std::string>()->default_value("0"))(
        "fail-at-block", "this rank's transfer of that block fails (every pass)", cxxopts::value<std::string>())(
        "fail-io-at-pass", "this rank fails with an I/O error at that pass boundary", cxxopts::value<std::string>())(
        "fail-rank", "the rank of --fail-job / --fail-at-block / --fail-io-at-pass (default: every rank)",
        cxxopts::value<std::string>()->default_value("-1"))(
        "slow-decode-ms", "every VAE decode waits this long first (a slow decoder)", cxxopts::value<std::string>())(
        "await-prepared", "at each pass boundary wait for this rank's next job's prompts (deterministic scheduling)")(
        "test-topology-skew-rank", "this rank asks for the other CFG parallelism (the topology agreement)",
        cxxopts::value<std::string>());
  }

  void apply(const cxxopts::ParseResult& a, const MpiWorld& world, GenerateOptions& go) const override {
    (void)integer_flag(a, "fail-rank");  // a bad value is refused before anything runs
    (void)integer_flag(a, "fail-step");
    (void)integer_flag(a, "fail-block");
    for (const char* f : {"fail-job", "fail-at-block", "fail-io-at-pass", "slow-decode-ms"})
      if (a.count(f)) (void)integer_flag(a, f);
    go.await_prepared = a.count("await-prepared") > 0;
    if (a.count("test-topology-skew-rank") && integer_flag(a, "test-topology-skew-rank") == world.rank())
      go.topology.cfg = go.topology.cfg == TopologyRequest::Cfg::kOff ? TopologyRequest::Cfg::kOn : TopologyRequest::Cfg::kOff;
  }

  std::unique_ptr<BatchWork> work(const cxxopts::ParseResult& a, const MpiWorld& world, const ModelInfo& model,
                                  const GenerateOptions& go, GenerateCallbacks& cb) const override {
    const int rank = static_cast<int>(integer_flag(a, "fail-rank"));
    const bool mine = rank < 0 || rank == world.rank();
    EngineOptions eo;
    if (a.count("fail-at-block") && mine) eo.fail_at_block = integer_flag(a, "fail-at-block");
    if (a.count("fail-io-at-pass") && world.rank() == (rank < 0 ? 0 : rank)) {
      // The stop is polled once per pass boundary on every rank: the P-th poll fails instead.
      const std::int64_t at = integer_flag(a, "fail-io-at-pass");
      cb.stop_requested = [inner = cb.stop_requested, at, pass = std::int64_t{0}]() mutable {
        if (pass == at) throw Error(str("pass ", at, ": injected I/O failure (test hook)"), ErrorKind::kIo);
        ++pass;
        return inner && inner();
      };
    }
    Faults f;
    f.rank = rank;
    if (a.count("fail-job")) {
      f.compute_job = integer_flag(a, "fail-job");
      f.compute_step = integer_flag(a, "fail-step");
      f.compute_block = integer_flag(a, "fail-block");
    }
    if (a.count("slow-decode-ms")) f.decode_delay_ms = integer_flag(a, "slow-decode-ms");
    return std::make_unique<FaultyWork>(make_model_work(world, model, go, eo), f, world.rank());
  }
};

}  // namespace

const GenerateHooks& generate_hooks() {
  static const TestHooks hooks;
  return hooks;
}

}  // namespace dlo
