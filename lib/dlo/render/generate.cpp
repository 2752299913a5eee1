#include "dlo/render/generate.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "dlo/common/bytes.h"
#include "dlo/common/clock.h"
#include "dlo/common/error.h"
#include "dlo/common/memory.h"
#include "dlo/config/wan_tensor_names.h"
#include "dlo/dist/device.h"
#include "dlo/models/torch_errors.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/offload/wave.h"
#include "dlo/pipeline/job_scheduler.h"
#include "dlo/render/batch_parts.h"
#include "dlo/render/batch_work.h"
#include "dlo/render/held_jobs.h"
#include "dlo/render/phase_groups.h"

namespace dlo {
namespace {

using Clock = SteadyClock;
using ojson = nlohmann::ordered_json;

// Finished jobs a rank may have waiting for (or in) its VAE before it takes no new job. Two keep
// the decoder busy while denoising goes on; after a stop a rank still decodes at most this many
// plus the two jobs it holds (docs/slurm.md's margin).
constexpr int kDecodeBacklog = 2;


// The agreed memory plan (collective; a refusal is the same error on every rank).
BatchMemoryPlan agree_memory_plan(const MpiWorld& world, const ModelInfo& model, const std::vector<BatchJob>& jobs,
                                  const GenerateOptions& o, const WaveDevice& dev, const StackSize& stack) {
  const MemoryBudget budget = agree_memory_budget(world, dev.device, dev.sharing, o.device_budget);
  std::vector<JobSpec> specs;
  for (const auto& j : jobs) specs.push_back(j.spec);
  BatchMemoryPlan plan;
  std::string error;
  try {
    DLO_CHECK(o.text_vae != AuxPlacement::kDevice || dev.device.is_cuda(),
              "--text-vae-device cuda: the transformer runs on ", dev.device.str(), ", not on a CUDA device");
    // Beside its job a rank holds the next one, prepared, and with two experts aligned up to
    // kMaxParked parked ones (generate's parked_).
    const int held = 1 + (model.two_experts() && o.align_experts ? kMaxParked : 0);
    // The jobs' unfused LoRAs: their adapters' bytes from the files' headers, or why the job is refused.
    const std::vector<JobAdapters> adapters = jobs_adapters(model, specs, o.dtype);
    auto plan_with = [&](const StackSize& s) {
      return plan_batch_memory(model, specs, o.offload, s, budget, o.dtype, held,
                               dev.device.is_cuda() ? o.text_vae : AuxPlacement::kHost, o.vae_dtype, adapters);
    };
    try {
      plan = plan_with(stack);
    } catch (const Error& e) {
      // Would the blocks' Linears in fp8 make it fit? Say so (never chosen silently: it changes the frames).
      std::vector<StackSize> fp8;
      for (const auto& c : model.expert_configs())
        fp8.push_back(config_stack_size(c, WanDtypes::narrow(o.dtype, at::kFloat8_e4m3fn), stack.ranks));
      const StackSize smaller = join_stacks(fp8);
      if (smaller.total() >= stack.total()) throw;
      std::string fits;
      try {
        fits = str("; with --storage-dtype fp8 (the blocks' Linears in fp8: ", human_bytes(smaller.total()),
                   " of blocks instead of ", human_bytes(stack.total()), ") it fits, with ",
                   strategy_name(plan_with(smaller).choice.strategy), " (fp8 changes the frames: diffusers' layerwise casting)");
      } catch (const Error&) {
      }
      if (fits.empty()) throw;
      throw Error(e.what() + fits, e.kind());
    }
  } catch (const Error& e) {
    error = e.what();
  }
  world.check_all(error, "memory plan");
  return plan;
}

// The batch's topology plan over the jobs that fit: its phases (every rank computes the same from
// the same input).
TopologyPlan batch_topology(const ModelInfo& model, const std::vector<BatchJob>& jobs, const BatchMemoryPlan& memory,
                            int ranks, const GenerateOptions& o, const WaveDevice& dev) {
  std::vector<const JobSpec*> runnable;
  for (std::size_t i = 0; i < jobs.size(); ++i)
    if (std::find(memory.refused.begin(), memory.refused.end(), static_cast<std::int64_t>(i)) == memory.refused.end())
      runnable.push_back(&jobs[i].spec);
  return plan_topology(o.topology, topology_limits(model, runnable, ranks, topology_costs(dev.device.is_cuda() ? "cuda" : "cpu")));
}

// The memory plan and the topology's phases every rank agrees on (collective; a refusal is the
// same error on every rank, before the engine).
RenderPlan agree_plan(const MpiWorld& world, const ModelInfo& model, const std::vector<BatchJob>& jobs,
                      const GenerateOptions& o, const WaveDevice& dev, const StackSize& stack) {
  RenderPlan p;
  p.device = dev.device.str();
  p.memory = agree_memory_plan(world, model, jobs, o, dev, stack);
  std::string error;
  try {
    p.topology = batch_topology(model, jobs, p.memory, world.size(), o, dev);
  } catch (const Error& e) {
    error = e.what();
  }
  world.check_all(error, "topology");
  return p;
}

// The report's line on what was chosen: the strategy and why, the device, the ranks, the topology.
std::string choice_line(const BatchMemoryPlan& memory, const TopologyPlan& plan, const WaveDevice& dev, int ranks,
                        int experts) {
  return str("offload: ", strategy_name(memory.choice.strategy), " (", memory.choice.reason, "); device ",
             dev.device.str(), "; ", ranks, " rank(s)",
             experts > 1 ? str("; ", experts, " experts, each rank holding its share of both") : std::string(),
             "; topology: ", plan.reason, memory.aux_why.empty() ? std::string() : str("; ", memory.aux_why));
}

// Why job `i` cannot run beside the others ("": it can).
std::string refusal(const BatchMemoryPlan& memory, std::size_t i) {
  const auto r = std::find(memory.refused.begin(), memory.refused.end(), static_cast<std::int64_t>(i));
  return r == memory.refused.end() ? std::string()
                                   : memory.refused_why[static_cast<std::size_t>(r - memory.refused.begin())];
}

// This rank's machine in its facts: where it runs, its memory now and at its peak, the plan's figures.
void machine_facts(const MpiWorld& world, const WaveDevice& dev, const BatchMemoryPlan& memory, RankFacts& f) {
  const ProcessMemory end = read_process_memory();
  const DeviceMemory dm = device_memory(dev.device);
  f.rank = world.rank();
  f.host = world.host();
  f.local_rank = world.local_rank();
  f.device = dev.device.str();
  f.working_bytes_estimate = memory.working;
  f.device_blocks = memory.choice.device_blocks;
  f.device_total_bytes = dm.total;
  f.device_used_bytes_at_end = dm.used;
  f.allocator_reserved_peak_bytes = dm.allocator_reserved_peak;
  f.allocator_allocated_peak_bytes = dm.allocator_allocated_peak;
  f.rss_kb = end.rss_kb;
  f.rss_peak_kb = end.hwm_kb;
}

// One batch on this rank: the wave and what it keeps between passes. Members are declared in the
// order they may be destroyed safely in reverse: the workers go first (their tasks dropped, the
// running one joined) while the jobs and the work they use still exist.
class BatchRun {
 public:
  BatchRun(const MpiWorld& world, const ModelInfo& model, const std::vector<BatchJob>& jobs,
           const GenerateOptions& options, const GenerateCallbacks& callbacks, BatchWork& work)
      : world_(world), model_(model), jobs_(jobs), o_(options), cb_(callbacks), work_(work), me_(world.rank()),
        ranks_(world.size()), groups_(world), results_(world, callbacks.on_result) {}

  GenerateReport run() {
    const auto wall_t0 = Clock::now();
    facts_.rss_kb_at_start = read_process_memory().rss_kb;
    setup();
    try {
      wave();
      facts_.wave_s = seconds_since(wall_t0);
      return finish();
    } catch (const std::exception& e) {
      // Once the wave runs, the others may be waiting for this rank in a gather: end them now,
      // with this rank's message, before anything is unwound (with one rank: unwind and throw).
      if (ranks_ > 1) MpiWorld::abort(describe_exception(e), exit_code_of(kind_of(e)));
      throw;
    }
  }

 private:
  static ErrorKind kind_of(const std::exception& e) {
    const auto* d = dynamic_cast<const Error*>(&e);
    return d ? d->kind() : ErrorKind::kInternal;
  }
  void phase(const char* name) const {
    if (cb_.on_phase) cb_.on_phase(name);
  }

  // Before the wave: the device, the work loaded, the memory plan, the topology, the first jobs'
  // prompts, the engines (one per expert: each rank keeps 1/N of both experts' blocks).
  void setup() {
    dev_ = agree_device(world_, o_.device, o_.host_id, "--device");
    std::string error;
    StackSize stack;
    std::uint64_t layout = 0;
    try {
      stack = work_.load(dev_, layout);
    } catch (const Error& e) {
      error = e.what();
    }
    world_.check_all(error);
    (void)agree_wave(world_, 0, layout);
    RenderPlan agreed = agree_plan(world_, model_, jobs_, o_, dev_, stack);
    memory_ = std::move(agreed.memory);
    plan_ = std::move(agreed.topology);
    work_.use_aux_device(memory_.aux_on_device);
    const int experts = work_.experts();
    report_.choice = choice_line(memory_, plan_, dev_, ranks_, experts);
    // A job that does not fit, or whose LoRAs cannot be applied, fails alone, recorded by rank 0,
    // before anything is prepared for it.
    for (std::size_t i = 0; i < jobs_.size(); ++i) {
      const std::string why = refusal(memory_, i);
      if (why.empty()) {
        all_runnable_.push_back(static_cast<std::int64_t>(i));
      } else if (me_ == 0) {
        JobRun refused(jobs_[i], model_, me_);
        refused.fail(why);
        results_.record(refused.result);
      }
    }
    // The first jobs' prompts are encoded before the engine's slots exist.
    start_phase(0, /*before_engine=*/true);
    work_.start(memory_.choice, stack);
    facts_.expert_traversals.assign(static_cast<std::size_t>(experts), 0);
  }

  // Phase `p` of the plan (collective): its groups, its scheduler over its jobs, their first
  // assignments. Every rank is between jobs: nothing held, nothing mirrored (the phase before
  // finished everywhere). `before_engine`: the first phase, whose first prompts are encoded before
  // the engine's slots exist.
  void start_phase(std::size_t p, bool before_engine) {
    DLO_ASSERT(held_.holds_none(), "phase ", p, " starts while rank ", me_, " holds a job");
    if (scheduler_) {
      pass_base_ += scheduler_->pass_count();
      mixed_passes_ += scheduler_->passes_streaming_all_experts();
    }
    phase_ = p;
    const TopologyPhase& ph = plan_.phases[p];
    runnable_.assign(all_runnable_.begin() + ph.first, all_runnable_.begin() + ph.first + ph.count);
    groups_.form(plan_, p, dev_.device);
    std::vector<std::int64_t> steps, high_steps;
    for (const std::int64_t i : runnable_) {
      steps.push_back(jobs_[static_cast<std::size_t>(i)].spec.steps);
      if (model_.two_experts()) high_steps.push_back(high_noise_steps(jobs_[static_cast<std::size_t>(i)].spec, model_));
    }
    // The scheduler's ranks are the groups (one rank each without groups).
    scheduler_ = std::make_unique<JobScheduler>(std::move(steps), groups_.topology().groups(ranks_), o_.align_experts,
                                                std::move(high_steps));
    for (const auto& a : scheduler_->initial_assignments())
      if (groups_.ours(a)) {
        if (before_engine) phase("text");
        assign(a.job);
        if (before_engine) text_worker_.drain();
      }
  }

  const BatchJob& job_at(std::int64_t position) const {
    return jobs_[static_cast<std::size_t>(runnable_[static_cast<std::size_t>(position)])];
  }
  // A run of the job at `position`, stamped with the ranks of this phase that compute it (it may
  // be recorded after its phase has ended).
  Slot new_slot(std::int64_t position) const {
    Slot s;
    s.position = position;
    s.run = std::make_shared<JobRun>(job_at(position), model_, me_);
    groups_.stamp(s.run->result, s.run->job.spec.guided());
    return s;
  }

  // prepare, on the text worker: the job's prompts, latents and scheduler.
  void assign(std::int64_t position) {
    Slot s = new_slot(position);
    auto run = s.run;
    auto ready = s.ready;
    text_worker_.post([this, run, ready] {
      const auto t0 = Clock::now();
      try {
        work_.prepare(*run);
      } catch (const std::exception& e) {
        run->fail(describe_exception(e));
      }
      run->result.text_s = seconds_since(t0);
      ready->store(true, std::memory_order_release);
    });
    if (groups_.leader())
      held_.hold_next(std::move(s));
    else
      held_.hold_mirror(std::move(s));
  }

  // finish, on the decode worker: the VAE decode into the job's sink.
  void finish_later(const Slot& slot) {
    auto run = slot.run;
    facts_.decode_backlog_peak = std::max(facts_.decode_backlog_peak, decodes_in_flight_.fetch_add(1) + 1);
    decode_worker_.post([this, run] {
      try {
        work_.finish(*run, cb_.open_sink, cb_.save_latents);
      } catch (const std::exception& e) {
        run->fail(describe_exception(e));
      }
      finished_.push(std::move(run->result));
      decodes_in_flight_.fetch_sub(1);
    });
  }

  // What this rank says at a pass boundary: its decodes' results and a stop; a leader also what
  // it holds and whether it asks for a job. A rank whose VAE is behind takes no new job: the queue
  // of decodes (what a stop still waits for) stays bounded, at kDecodeBacklog plus the jobs held.
  RankReport boundary_report() {
    for (auto& r : finished_.take()) results_.record(std::move(r));
    if (o_.await_prepared && (!groups_.leader() || held_.next().run)) text_worker_.drain();
    RankReport r;
    const bool vae_keeps_up = decodes_in_flight_.load() < kDecodeBacklog;
    if (!groups_.leader()) {  // a member: the leader reports the rest
      r.wants_job = vae_keeps_up;  // the group asks for a job only while every member's VAE keeps up
      if (!vae_keeps_up) ++facts_.passes_waiting_for_decodes;
    } else {
      if (auto failed = held_.advance()) results_.record(std::move(*failed));
      if (held_.next_text_s() >= 0) text_est_s_ = held_.next_text_s();
      AskInputs ask = held_.ask(work_.experts());
      ask.step_s = step_est_s_;
      ask.text_s = text_est_s_;
      const bool asks = scheduler_->should_ask(ask);
      r.wants_job = asks && vae_keeps_up;
      if (asks && !vae_keeps_up) ++facts_.passes_waiting_for_decodes;
      held_.describe(r);
    }
    r.stop = cb_.stop_requested && cb_.stop_requested();
    r.pending_results = results_.pending();
    return r;
  }

  // Every rank's report, one per group for the scheduler (a member drops the jobs its leader no
  // longer holds).
  std::vector<RankReport> exchange(const RankReport& mine) {
    std::vector<std::int64_t> words(RankReport::kWords);
    mine.encode(words.data());
    const auto s0 = Clock::now();
    const auto all = world_.allgather(words, "pass boundary");
    facts_.boundary_wait_s += seconds_since(s0);
    std::vector<RankReport> reports;
    for (int r = 0; r < ranks_; ++r) reports.push_back(RankReport::decode(&all[static_cast<std::size_t>(r) * RankReport::kWords]));
    if (!groups_.leader()) held_.prune(reports[static_cast<std::size_t>(groups_.leader_rank())]);
    return groups_.group_reports(reports);
  }

  // Seconds left: this phase's scheduler's estimate and the later phases' predicted times (-1 before
  // a step was measured).
  double eta_s() const {
    const double now = scheduler_->eta_s(step_est_s_);
    if (now < 0) return now;
    double later = 0;
    for (std::size_t p = phase_ + 1; p < plan_.phases.size(); ++p) later += plan_.phases[p].topology.predicted;
    return now + later * step_est_s_;
  }

  void progress(const PassDecision& d) {
    if (me_ != 0 || !cb_.on_progress) return;
    const int P = groups_.topology().group_size;
    ProgressEvent ev{pass_base_ + d.pass, static_cast<std::int64_t>(jobs_.size()), results_.done(), results_.failed(), {}, {},
                     eta_s()};
    for (int r = 0; r < ranks_; ++r) {  // each rank shows its group's job
      ev.rank_job.push_back(d.rank_job[static_cast<std::size_t>(r / P)]);
      ev.rank_step.push_back(d.rank_step[static_cast<std::size_t>(r / P)]);
    }
    for (auto& j : ev.rank_job)
      if (j >= 0) j = runnable_[static_cast<std::size_t>(j)];
    cb_.on_progress(ev);
  }

  // denoise: one traversal of the experts of d.experts: a step of this rank's job (the leader's
  // or a lone rank's current one; a member's, its mirror of the job the pass gives its group)
  // through its expert, or a ghost pass. A failure of a ghost pass is the transfers': it
  // propagates and ends every rank.
  void traverse(const PassDecision& d) {
    ++facts_.traversals;
    for (std::size_t e = 0; e < facts_.expert_traversals.size(); ++e)
      if ((d.experts & (1u << e)) != 0) ++facts_.expert_traversals[e];
    Slot* job = held_.pass_job(groups_.leader());
    const int mine = job == nullptr ? -1
                     : groups_.leader() ? job->run->expert()
                                        : d.rank_expert[static_cast<std::size_t>(groups_.slot())];
    DLO_ASSERT(mine < 0 || (d.experts & (1u << mine)) != 0, "the pass does not stream expert ", mine);
    if (mine >= 0) {
      step(*job, mine, d.experts);
      return;
    }
    work_.ghost(d.experts);
    ++facts_.ghost_traversals;
    if (scheduler_->jobs_unassigned() > 0 || held_.next().run) ++facts_.idle_traversals;  // work existed, this rank was not ready
  }

  // One denoising step of this rank's job through `expert` in a pass streaming `experts`.
  void step(Slot& slot, int expert, unsigned experts) {
    const auto t0 = Clock::now();
    JobRun& run = *slot.run;
    try {
      work_.step(run, expert, experts, BlockHook(), groups_.step_groups());
    } catch (const BlockComputeError& e) {
      // The job's own computation failed; the engine is in step (the pass went on as a ghost).
      run.fail(str("denoising step ", run.steps_done + 1, ": ", e.what()));
      if (groups_.leader()) results_.record(run.result);  // the group failed together: its leader records it
      held_.drop(slot, groups_.leader());
      return;
    }
    // Any other exception is the transfers' and propagates: the collective is out of step.
    const double s = seconds_since(t0);
    ++run.steps_done;
    run.result.step_s.push_back(s);
    run.result.denoise_s += s;
    step_est_s_ = step_est_s_ == 0 ? s : 0.8 * step_est_s_ + 0.2 * s;
    if (cb_.on_step && groups_.leader()) cb_.on_step({run.job.spec.id, run.job.index, run.steps_done, run.job.spec.steps, s});
    if (run.steps_left() == 0) {
      if (groups_.decoder_of(slot.position) == me_) finish_later(slot);  // the others' copies are done
      held_.drop(slot, groups_.leader());
    }
  }

  void wave() {
    phase("denoise");
    for (;;) {
      const PassDecision d = scheduler_->schedule(exchange(boundary_report()));
      if (d.collect_results) results_.collect("collecting results");
      if (d.stop) {
        report_.stopped = true;
        return;
      }
      for (const auto& a : d.assignments)
        if (groups_.ours(a)) assign(a.job);
      if (d.finished) {
        // The phase is done on every rank: the next one regroups the ranks for its jobs.
        if (phase_ + 1 == plan_.phases.size()) return;
        start_phase(phase_ + 1, /*before_engine=*/false);
        continue;
      }
      progress(d);
      if (!d.traverse) {
        // Every rank waits for its next job's prompts: no traversal (it would stream weights for
        // nothing); wait a little for this rank's worker, then meet again.
        const auto until = Clock::now() + std::chrono::milliseconds(20);
        Slot& next = held_.next();
        while (next.run && !next.prepared() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::microseconds(200));
        if (!next.run) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        continue;
      }
      if (groups_.leader()) {
        if (held_.take(d.rank_job[static_cast<std::size_t>(groups_.slot())], d.pass)) ++facts_.expert_alignment_switches;
      } else {
        (void)held_.take_mirror(d.rank_job[static_cast<std::size_t>(groups_.slot())], [&] {
          // Its preparation failed here alone (the leader's did not): the step fails on the group.
          Slot s = new_slot(d.rank_job[static_cast<std::size_t>(groups_.slot())]);
          s.ready->store(true);
          return s;
        });
      }
      traverse(d);
    }
  }

  // After the wave: the engines freed before the last decodes need memory; queued decodes finish
  // (their latents are complete); after a stop, a job being denoised or prepared is left for the
  // rerun. Then every rank's facts to rank 0.
  GenerateReport finish() {
    const WorkFacts wf = work_.end();
    facts_.passes_streaming_both_experts = mixed_passes_ + scheduler_->passes_streaming_all_experts();
    phase("decode");
    text_worker_.drain();
    decode_worker_.drain();
    for (auto& r : finished_.take()) results_.record(std::move(r));
    held_.clear();
    results_.collect("collecting the last results");

    RankFacts& f = facts_;
    f.group = groups_.slot();
    f.group_size = groups_.topology().group_size;
    f.token_block_rows = wf.token_block_rows;
    f.exchange_bytes_sent = groups_.bytes_sent();
    f.phases = static_cast<std::int64_t>(plan_.phases.size());
    f.engine_json = wf.engine_json;
    f.expert_json = wf.expert_json;
    machine_facts(world_, dev_, memory_, f);
    report_.ranks_json = gather_rank_facts(world_, f);
    report_.jobs = results_.take_jobs();
    if (me_ == 0)
      std::sort(report_.jobs.begin(), report_.jobs.end(),
                [](const JobResult& a, const JobResult& b) { return a.index < b.index; });
    return std::move(report_);
  }

  const MpiWorld& world_;
  const ModelInfo& model_;
  const std::vector<BatchJob>& jobs_;
  const GenerateOptions& o_;
  const GenerateCallbacks& cb_;
  BatchWork& work_;
  const int me_, ranks_;

  WaveDevice dev_;
  BatchMemoryPlan memory_;
  std::vector<std::int64_t> all_runnable_;  // the jobs that fit: indices into jobs_
  std::vector<std::int64_t> runnable_;      // this phase's scheduler position -> index into jobs_
  TopologyPlan plan_;                       // the batch's phases
  std::size_t phase_ = 0;
  PhaseGroups groups_;                       // this phase's
  std::unique_ptr<JobScheduler> scheduler_;  // this phase's
  std::int64_t pass_base_ = 0, mixed_passes_ = 0;  // the earlier phases' passes, and those that streamed every expert
  GenerateReport report_;
  ResultCollector results_;
  RankFacts facts_;
  double text_est_s_ = 0, step_est_s_ = 0;
  // Used by the workers' tasks: declared before the workers.
  ResultQueue finished_;
  std::atomic<int> decodes_in_flight_{0};  // posted to the decode worker, not yet finished
  HeldJobs held_;
  Worker text_worker_, decode_worker_;  // destroyed first
};

}  // namespace

std::string dtypes_label(const GenerateOptions& o) {
  // A storage asked for changes the frames (fp8 rounds); auto keeps a file's fp8 as written, the
  // frames of upcasting it at load: no label of its own.
  const std::string storage = o.storage == LinearStorage::kAuto ? "" : str("+", linear_storage_name(o.storage));
  return str(compute_dtype_name(o.dtype), storage, "/", compute_dtype_name(o.vae_dtype));
}

std::string report_json(const GenerateReport& report) {
  ojson j = {{"choice", report.choice}, {"stopped", report.stopped}, {"jobs", ojson::array()}};
  for (const auto& r : report.jobs) j["jobs"].push_back(ojson::parse(result_line(r)));
  j["ranks"] = report.ranks_json.empty() ? ojson::array() : ojson::parse(report.ranks_json);
  return j.dump(2);
}

RenderPlan plan_render(const MpiWorld& world, const ModelInfo& model, const std::vector<BatchJob>& jobs,
                       const GenerateOptions& o) {
  const WaveDevice dev = agree_device(world, o.device, o.host_id, "--device");
  std::vector<StackSize> sizes;
  const std::vector<WanTransformerConfig> configs = model.expert_configs();
  const std::vector<std::string> weights = model.expert_weights();
  std::string kept;
  for (std::size_t e = 0; e < configs.size(); ++e) {
    // The checkpoint's header decides what auto keeps (an fp8 file stays fp8); no weight is read.
    const WanDtypes d = resolve_wan_dtypes(o.storage, o.dtype, open_wan_transformer(weights[e]), "--storage-dtype");
    sizes.push_back(config_stack_size(configs[e], d, world.size()));
    kept += (e ? ", " : "") + d.describe();
  }
  RenderPlan p = agree_plan(world, model, jobs, o, dev, join_stacks(sizes));
  p.weights = kept;
  return p;
}

GenerateReport generate(const MpiWorld& world, const ModelInfo& model, const std::vector<BatchJob>& jobs,
                        const GenerateOptions& options, const GenerateCallbacks& callbacks, BatchWork& work) {
  BatchRun run(world, model, jobs, options, callbacks, work);
  return run.run();
}

GenerateReport generate(const MpiWorld& world, const ModelInfo& model, const std::vector<BatchJob>& jobs,
                        const GenerateOptions& options, const GenerateCallbacks& callbacks) {
  const std::unique_ptr<BatchWork> work = make_model_work(world, model, options);
  return generate(world, model, jobs, options, callbacks, *work);
}

}  // namespace dlo
