#include "dlo/render/generate.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "dlo/common/clock.h"
#include "dlo/common/error.h"
#include "dlo/common/memory.h"
#include "dlo/common/settings.h"
#include "dlo/dist/device.h"
#include "dlo/dist/exchange_group.h"
#include "dlo/models/tensor_view.h"
#include "dlo/models/torch_errors.h"
#include "dlo/models/umt5.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/models/wan_vae.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/offload/runner.h"
#include "dlo/offload/wave.h"
#include "dlo/pipeline/job_scheduler.h"
#include "dlo/render/prompt_encoder.h"
#include "dlo/text/tokenizer.h"

namespace dlo {
namespace {

using Clock = SteadyClock;
using ojson = nlohmann::ordered_json;

// Finished jobs a rank may have waiting for (or in) its VAE before it takes no new job. Two keep
// the decoder busy while denoising goes on; after a stop a rank still decodes at most this many
// plus the two jobs it holds (docs/slurm.md's margin).
constexpr int kDecodeBacklog = 2;


// A background thread running tasks in the order posted. Destroying it drops the tasks not yet
// started and waits for the one running, so nothing a task uses is destroyed under it (declare a
// Worker after what its tasks use).
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
      tasks_.clear();
    }
    cv_.notify_all();
    thread_.join();
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
  }
  // Blocks until every posted task has run.
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [this] { return tasks_.empty() && !running_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return quit_ || !tasks_.empty(); });
      if (quit_) return;
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      running_ = true;
      lock.unlock();
      task();  // tasks catch their own errors
      lock.lock();
      running_ = false;
      if (tasks_.empty()) idle_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> tasks_;
  bool running_ = false, quit_ = false;
  std::thread thread_;
};

// Results the workers hand back to the wave.
class ResultQueue {
 public:
  void push(JobResult r) {
    std::lock_guard<std::mutex> lock(mu_);
    results_.push_back(std::move(r));
  }
  std::vector<JobResult> take() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<JobResult> out(std::make_move_iterator(results_.begin()), std::make_move_iterator(results_.end()));
    results_.clear();
    return out;
  }

 private:
  std::mutex mu_;
  std::deque<JobResult> results_;
};

// A job on this rank and whether its preparation has finished (set by the text worker).
struct Slot {
  std::int64_t position = -1;  // in the scheduler (an index into the runnable jobs)
  std::shared_ptr<JobRun> run;
  std::shared_ptr<std::atomic<bool>> ready = std::make_shared<std::atomic<bool>>(false);
};

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
    plan = plan_batch_memory(model, specs, o.offload, stack, budget, o.dtype, held,
                             dev.device.is_cuda() ? o.text_vae : AuxPlacement::kHost, o.vae_dtype);
  } catch (const Error& e) {
    error = e.what();
  }
  world.check_all(error, "memory plan");
  return plan;
}

// The batch's topology plan over the jobs that fit: its phases (every rank computes the same from
// the same input).
TopologyPlan batch_topology(const ModelInfo& model, const std::vector<BatchJob>& jobs, const BatchMemoryPlan& memory,
                        int ranks, const GenerateOptions& o) {
  TopologyLimits l;
  l.ranks = ranks;
  l.heads = 1 << 30;
  const std::vector<WanTransformerConfig> configs = model.expert_configs();
  for (const auto& c : configs) l.heads = std::min(l.heads, static_cast<int>(c.num_attention_heads));
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (std::find(memory.refused.begin(), memory.refused.end(), static_cast<std::int64_t>(i)) != memory.refused.end())
      continue;
    const JobSpec& j = jobs[i].spec;
    const std::vector<std::int64_t> shape = model.latent_shape(j.frames, j.height, j.width);
    l.steps.push_back(j.steps);
    l.guided.push_back(j.guided());
    l.tokens.push_back(wan_tokens(configs.front(), shape[2], shape[3], shape[4]));
  }
  return plan_topology(o.topology, l);
}

// One batch on this rank: the wave and what it keeps between passes. Members are declared in the
// order they may be destroyed safely in reverse: the workers go first (their tasks dropped, the
// running one joined) while the jobs, models and engine they use still exist.
class BatchRun {
 public:
  BatchRun(const MpiWorld& world, const ModelInfo& model, const std::vector<BatchJob>& jobs,
           const GenerateOptions& options, const GenerateCallbacks& callbacks)
      : world_(world), model_(model), jobs_(jobs), o_(options), cb_(callbacks), me_(world.rank()),
        ranks_(world.size()) {}

  GenerateReport run() {
    const auto wall_t0 = Clock::now();
    at_start_ = read_process_memory();
    setup();
    try {
      wave();
      wave_s_ = seconds_since(wall_t0);
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

  // Before the wave: the device, the experts' plans, the memory plan, the first jobs' prompts, the
  // engines (one per expert: each rank keeps 1/N of both experts' blocks).
  void setup() {
    dev_ = agree_device(world_, o_.device, o_.host_id, "--device");
    std::string error;
    try {
      for (const auto& dir : model_.expert_dirs()) {
        experts_.push_back(std::make_unique<WanTransformer>(
            WanTransformer::load(model_.dir + "/" + dir, o_.dtype, /*load_blocks=*/false)));
        experts_.back()->to_device(dev_.device);
        runners_.push_back(std::make_unique<WanOffloadRunner>(*experts_.back(), ranks_));
      }
      // The other parts' checkpoints are checked now (headers only), not after a job's denoise.
      Umt5Encoder::check_checkpoint(model_.dir + "/text_encoder");
      WanVae::check_checkpoint(model_.dir + "/vae");
      T5Tokenizer::load(model_.dir + "/tokenizer").check_fits_encoder(model_.text_encoder.vocab_size);
    } catch (const Error& e) {
      error = e.what();
    }
    world_.check_all(error);
    // The same block layout everywhere (every expert's).
    std::uint64_t layout = 0;
    std::vector<StackSize> sizes;
    const std::vector<WanTransformerConfig> configs = model_.expert_configs();
    for (std::size_t e = 0; e < runners_.size(); ++e) {
      layout = layout * 1000003u ^ runners_[e]->plan().fingerprint();
      sizes.push_back(stack_size(runners_[e]->plan()));
      sizes.back().resident_bytes = wan_non_block_bytes(configs[e], o_.dtype);
    }
    (void)agree_wave(world_, 0, layout);
    const StackSize stack = join_stacks(sizes);
    memory_ = agree_memory_plan(world_, model_, jobs_, o_, dev_, stack);
    agree_topology();
    report_.choice = str("offload: ", strategy_name(memory_.choice.strategy), " (", memory_.choice.reason, "); device ",
                         dev_.device.str(), "; ", ranks_, " rank(s)",
                         runners_.size() > 1 ? str("; ", runners_.size(), " experts, each rank holding its share of both")
                                             : std::string(),
                         "; topology: ", plan_.reason,
                         memory_.aux_why.empty() ? std::string() : str("; ", memory_.aux_why));
    // A job that does not fit fails alone, recorded by rank 0, before anything is prepared for it.
    for (std::size_t i = 0; i < jobs_.size(); ++i) {
      const auto r = std::find(memory_.refused.begin(), memory_.refused.end(), static_cast<std::int64_t>(i));
      if (r == memory_.refused.end()) {
        all_runnable_.push_back(static_cast<std::int64_t>(i));
        continue;
      }
      if (me_ != 0) continue;
      JobRun refused(jobs_[i], model_, me_);
      refused.fail(str("does not fit in memory: ", memory_.refused_why[static_cast<std::size_t>(r - memory_.refused.begin())]));
      record(refused.result);
    }
    // The first jobs' prompts are encoded before the engine's slots exist.
    start_phase(0, /*before_engine=*/true);
    EngineOptions eo;
    eo.keep_page_cache = o_.keep_page_cache;
    if (o_.faults.transfer_rank < 0 || o_.faults.transfer_rank == me_) eo.fail_at_block = o_.faults.transfer_block;
    const std::vector<StrategyChoice> choices = split_choice(memory_.choice, stack);
    for (std::size_t e = 0; e < runners_.size(); ++e) start_engine(world_, *runners_[e], choices[e], dev_.device, eo);
    expert_traversals_.assign(runners_.size(), 0);
  }

  // The topology plan (its phases), the same on every rank: a request that cannot hold is the
  // same error on every rank, before the engine.
  void agree_topology() {
    std::string error;
    try {
      plan_ = batch_topology(model_, jobs_, memory_, ranks_, o_);
    } catch (const Error& e) {
      error = e.what();
    }
    world_.check_all(error, "topology");
  }

  // Phase `p` of the plan (collective): its groups, its scheduler over its jobs, their first
  // assignments. Every rank is between jobs: nothing held, nothing mirrored (the phase before
  // finished everywhere). `before_engine`: the first phase, whose first prompts are encoded before
  // the engine's slots exist.
  void start_phase(std::size_t p, bool before_engine) {
    DLO_ASSERT(!current_.run && !next_.run && parked_.empty() && mirror_.empty(), "phase ", p, " starts while rank ", me_,
               " holds a job");
    if (scheduler_) {
      pass_base_ += scheduler_->pass_count();
      mixed_passes_ += scheduler_->passes_streaming_all_experts();
    }
    phase_ = p;
    const TopologyPhase& ph = plan_.phases[p];
    topo_ = ph.topology;
    runnable_.assign(all_runnable_.begin() + ph.first, all_runnable_.begin() + ph.first + ph.count);
    form_groups();
    std::vector<std::int64_t> steps, high_steps;
    for (const std::int64_t i : runnable_) {
      steps.push_back(jobs_[static_cast<std::size_t>(i)].spec.steps);
      if (model_.two_experts()) high_steps.push_back(high_noise_steps(jobs_[static_cast<std::size_t>(i)].spec, model_));
    }
    // The scheduler's ranks are the groups (one rank each without groups).
    scheduler_ = std::make_unique<JobScheduler>(std::move(steps), topo_.groups(ranks_), o_.align_experts,
                                                std::move(high_steps));
    for (const auto& a : scheduler_->initial_assignments())
      if (ours(a)) {
        if (before_engine) phase("text");
        assign(a.job);
        if (before_engine) text_worker_.drain();
      }
  }

  // This phase's groups (collective: every rank splits alike), after the ranks compared the phase
  // (its index, jobs and topology) before any of its collectives. The last phase's groups go first.
  void form_groups() {
    for (const auto* g : {group_.get(), half_.get(), partners_.get()})
      if (g != nullptr) exchange_bytes_ += g->bytes_sent();
    partners_.reset();
    half_.reset();
    group_.reset();
    group_ranks_.clear();
    const TopologyPhase& ph = plan_.phases[phase_];
    std::vector<std::int64_t> mine = {static_cast<std::int64_t>(phase_), ph.first, ph.count, topo_.group_size,
                                      topo_.cfg ? 1 : 0};
    if (me_ == o_.faults.topology_skew_rank) ++mine[3];  // a test hook: a rank that disagrees
    const std::size_t n = mine.size();
    const std::vector<std::int64_t> all = world_.allgather(mine, "agreeing on the topology");
    for (int r = 0; r < ranks_; ++r)
      DLO_CHECK_KIND(ErrorKind::kInternal,
                     std::equal(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(r * n)), "rank ", r,
                     " starts phase ", all[r * n], " (jobs ", all[r * n + 1], " + ", all[r * n + 2], ") with groups of ",
                     all[r * n + 3], " rank(s) (CFG ", all[r * n + 4], "), rank ", me_, " phase ", mine[0], " (jobs ",
                     mine[1], " + ", mine[2], ") with groups of ", mine[3], " (CFG ", mine[4], ")");
    const int P = topo_.group_size;
    slot_ = me_ / P;
    leader_ = slot_ * P;
    if (P == 1) return;
    // Collective: every rank makes the network once (on CUDA, one NCCL communicator for activations).
    if (!net_) net_ = make_exchange_network(world_, dev_.device);
    group_ = net_->split(slot_, "job groups");
    if (topo_.cfg) {
      const int half = P / 2, at = me_ - leader_;
      half_ = net_->split(slot_ * 2 + at / half, "job groups' CFG halves");
      partners_ = net_->split(slot_ * half + at % half, "CFG partners");
    }
    for (int r = leader_; r < leader_ + P; ++r) group_ranks_.push_back(r);
  }
  bool leader() const { return me_ == leader_; }
  // The rank of the group that decodes and records the job at `position` (every rank of the group
  // holds its final latents): the group's ranks in turn, so that the decodes, which run beside the
  // group's next job, do not all queue on one rank.
  int decoder_of(std::int64_t position) const {
    return group_ranks_.empty() ? me_ : group_ranks_[static_cast<std::size_t>(position % topo_.group_size)];
  }
  // Whether an assignment is this rank's group's.
  bool ours(const JobAssignment& a) const {
    return std::find(a.ranks.begin(), a.ranks.end(), slot_) != a.ranks.end();
  }
  StepGroups step_groups() const {
    StepGroups g;
    g.group = group_.get();
    g.half = half_ && half_->size() > 1 ? half_.get() : nullptr;
    g.partners = partners_.get();
    return g;
  }

  const BatchJob& job_at_index(std::int64_t index) const {
    for (const auto& j : jobs_)
      if (j.index == index) return j;
    DLO_ASSERT(false, "no job of index ", index);
    return jobs_.front();
  }
  const BatchJob& job_at(std::int64_t position) const {
    return jobs_[static_cast<std::size_t>(runnable_[static_cast<std::size_t>(position)])];
  }

  // prepare, on the text worker: the job's prompts, latents and scheduler.
  void assign(std::int64_t position) {
    Slot s;
    s.position = position;
    s.run = std::make_shared<JobRun>(job_at(position), model_, me_);
    stamp_group(s.run->result);
    auto run = s.run;
    auto ready = s.ready;
    text_worker_.post([this, run, ready] {
      const auto t0 = Clock::now();
      try {
        // On the job's device when the plan says so (its kernels on this thread's stream, the
        // device's default one, in order with the denoising kernels; the host work overlaps).
        if (!text_) text_.emplace(model_.dir, o_.dtype, memory_.aux_on_device ? dev_.device : at::Device(at::kCPU));
        prepare_job(*run, *text_, model_, o_.dtype, dev_.device);
      } catch (const std::exception& e) {
        run->fail(describe_exception(e));
      }
      run->result.text_s = seconds_since(t0);
      ready->store(true, std::memory_order_release);
    });
    if (leader())
      next_ = std::move(s);
    else
      mirror_.push_back(std::move(s));
  }

  // finish, on the decode worker: the VAE decode into the job's sink.
  void finish_later(Slot slot) {
    auto run = slot.run;
    decode_peak_ = std::max(decode_peak_, decodes_in_flight_.fetch_add(1) + 1);
    decode_worker_.post([this, run] {
      if (o_.faults.decode_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o_.faults.decode_delay_ms));
      try {
        if (!vae_) {
          vae_.emplace(WanVae::load(model_.dir + "/vae", o_.vae_dtype));
          if (memory_.aux_on_device) vae_->to_device(dev_.device);
        }
        finish_job(*run, *vae_, model_, cb_.open_sink, cb_.save_latents);
      } catch (const std::exception& e) {
        run->fail(str("loading the VAE: ", describe_exception(e)));
      }
      finished_.push(std::move(run->result));
      decodes_in_flight_.fetch_sub(1);
    });
  }

  // The ranks that compute a job of this phase and how, into its result (stamped when the job is
  // given out: it may be recorded after its phase has ended).
  void stamp_group(JobResult& r) const {
    if (group_ranks_.empty()) return;
    r.ranks = group_ranks_;
    r.parallel = topo_.label(job_at_index(r.index).spec.guided());
  }

  // A finished or failed job's result, on its way to rank 0.
  void record(JobResult r) {
    if (r.status != "ok") r.error = str("job ", r.index, " ('", r.id, "'): ", r.error);
    pending_.push_back(result_line(r));
    if (me_ != 0) report_.jobs.push_back(std::move(r));
  }

  // Results of all ranks to rank 0 (collective; every rank calls it when any has some).
  void collect(const char* phase_name) {
    std::string mine;
    for (const auto& l : pending_) mine += l + "\n";
    pending_.clear();
    const auto all = world_.gather_strings(mine, 0, phase_name);
    if (me_ != 0) return;
    for (const auto& text : all)
      for (std::size_t pos = 0; pos < text.size();) {
        const std::size_t nl = text.find('\n', pos);
        JobResult r = result_from_line(text.substr(pos, nl - pos));
        pos = nl + 1;
        (r.status == "ok" ? done_ : failed_) += 1;
        if (cb_.on_result) cb_.on_result(r);
        report_.jobs.push_back(std::move(r));
      }
  }

  RankReport boundary_report() {
    if (!leader()) {  // a member: its decodes' results and a stop; the leader reports the rest
      for (auto& r : finished_.take()) record(std::move(r));
      if (o_.faults.await_prepared) text_worker_.drain();
      RankReport r;
      r.stop = cb_.stop_requested && cb_.stop_requested();
      r.pending_results = static_cast<std::int64_t>(pending_.size());
      // Whether its VAE keeps up: the group asks for a job only while every member's does.
      r.wants_job = decodes_in_flight_.load() < kDecodeBacklog;
      if (!r.wants_job) ++decode_waits_;
      return r;
    }
    for (auto& r : finished_.take()) record(std::move(r));
    if (o_.faults.await_prepared && next_.run) text_worker_.drain();
    const bool next_ready = next_.run && next_.ready->load(std::memory_order_acquire);
    if (next_ready) text_est_s_ = next_.run->result.text_s;
    if (next_ready && next_.run->failed()) {  // its prompts could not be encoded
      record(next_.run->result);
      next_ = Slot{};
    }
    if (!current_.run && !parked_.empty()) {  // the oldest parked job resumes
      current_ = std::move(parked_.front());
      parked_.erase(parked_.begin());
    }
    if (!current_.run && next_ready && next_.run) {
      current_ = std::move(next_);
      next_ = Slot{};
    }
    RankReport r;
    AskInputs ask;
    ask.has_current = current_.run != nullptr;
    ask.has_next = next_.run != nullptr;
    ask.current_steps_left = current_.run ? current_.run->steps_left() : 0;
    for (const auto& p : parked_) ask.current_steps_left += p.run->steps_left();
    if (runners_.size() > 1 && current_.run && parked_.size() < static_cast<std::size_t>(kMaxParked)) {
      ask.only_low_noise = current_.run->expert() == 1;
      for (const auto& p : parked_) ask.only_low_noise = ask.only_low_noise && p.run->expert() == 1;
    }
    ask.step_s = step_est_s_;
    ask.text_s = text_est_s_;
    // A rank whose VAE is behind takes no new job: the queue of decodes (what a stop still waits
    // for) stays bounded, at kDecodeBacklog plus the jobs it already holds.
    const int backlog = decodes_in_flight_.load();
    r.wants_job = scheduler_->should_ask(ask) && backlog < kDecodeBacklog;
    if (backlog >= kDecodeBacklog && scheduler_->should_ask(ask)) ++decode_waits_;
    r.stop = cb_.stop_requested && cb_.stop_requested();
    r.pending_results = static_cast<std::int64_t>(pending_.size());
    r.current = current_.run ? current_.position : -1;
    r.steps_done = current_.run ? current_.run->steps_done : 0;
    r.next = next_.run ? next_.position : -1;
    r.expert = current_.run ? current_.run->expert() : 0;
    for (std::size_t i = 0; i < parked_.size(); ++i) {
      r.parked[i] = parked_[i].position;
      r.parked_steps_done[i] = parked_[i].run->steps_done;
      r.parked_expert[i] = parked_[i].run->expert();
    }
    r.next_ready = next_.run && next_ready;
    r.next_expert = r.next_ready ? next_.run->expert() : 0;
    return r;
  }

  // The job the pass decided this rank computes becomes current_: a parked one (resumed; the
  // current one is parked last), or the prepared next one started early (the current is parked).
  void take_decided_job(const PassDecision& d) {
    const std::int64_t want = d.rank_job[static_cast<std::size_t>(slot_)];
    if (!leader()) {
      member_job_ = -1;
      if (want < 0) return;
      const auto m = std::find_if(mirror_.begin(), mirror_.end(), [&](const Slot& s) { return s.position == want; });
      if (m == mirror_.end()) {
        // Its preparation failed here alone (the leader's did not): the step fails on the group.
        Slot s;
        s.position = want;
        s.run = std::make_shared<JobRun>(job_at(want), model_, me_);
        stamp_group(s.run->result);
        s.ready->store(true);
        mirror_.push_back(std::move(s));
        member_job_ = static_cast<std::int64_t>(mirror_.size()) - 1;
        return;
      }
      while (!m->ready->load(std::memory_order_acquire)) std::this_thread::sleep_for(std::chrono::microseconds(200));
      member_job_ = m - mirror_.begin();
      return;
    }
    if (want < 0 || (current_.run && current_.position == want)) return;
    const auto p = std::find_if(parked_.begin(), parked_.end(), [&](const Slot& s) { return s.position == want; });
    if (p != parked_.end()) {
      Slot resumed = std::move(*p);
      parked_.erase(p);
      parked_.push_back(std::move(current_));
      current_ = std::move(resumed);
    } else {
      DLO_ASSERT(next_.run && next_.position == want && parked_.size() < static_cast<std::size_t>(kMaxParked), "pass ",
                 d.pass, ": rank ", me_, " was given job ", want, " which it does not hold");
      parked_.push_back(std::move(current_));
      current_ = std::move(next_);
      next_ = Slot{};
    }
    ++expert_switches_;
  }

  std::vector<RankReport> exchange(const RankReport& mine) {
    std::vector<std::int64_t> words(RankReport::kWords);
    mine.encode(words.data());
    const auto s0 = Clock::now();
    const auto all = world_.allgather(words, "pass boundary");
    sync_s_ += seconds_since(s0);
    std::vector<RankReport> reports;
    for (int r = 0; r < ranks_; ++r) reports.push_back(RankReport::decode(&all[static_cast<std::size_t>(r) * RankReport::kWords]));
    if (topo_.group_size == 1) return reports;
    // The scheduler's ranks are the groups: each leader's report, with a stop and results from any
    // member, and a request for a job only while no member's VAE is behind.
    const int P = topo_.group_size;
    std::vector<RankReport> groups;
    for (int g = 0; g < topo_.groups(ranks_); ++g) {
      RankReport r = reports[static_cast<std::size_t>(g * P)];
      for (int m = 1; m < P; ++m) {
        r.stop = r.stop || reports[static_cast<std::size_t>(g * P + m)].stop;
        r.pending_results += reports[static_cast<std::size_t>(g * P + m)].pending_results;
        r.wants_job = r.wants_job && reports[static_cast<std::size_t>(g * P + m)].wants_job;
      }
      groups.push_back(r);
    }
    // A member drops the jobs its leader no longer holds (finished, or failed there alone).
    if (!leader()) {
      const RankReport& l = reports[static_cast<std::size_t>(leader_)];
      std::vector<std::int64_t> held = {l.current, l.next};
      held.insert(held.end(), l.parked.begin(), l.parked.end());
      mirror_.erase(std::remove_if(mirror_.begin(), mirror_.end(),
                                   [&](const Slot& s) { return std::find(held.begin(), held.end(), s.position) == held.end(); }),
                    mirror_.end());
    }
    return groups;
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
    ProgressEvent ev{pass_base_ + d.pass, static_cast<std::int64_t>(jobs_.size()), done_, failed_, {}, {}, eta_s()};
    for (int r = 0; r < ranks_; ++r) {  // each rank shows its group's job
      ev.rank_job.push_back(d.rank_job[static_cast<std::size_t>(r / topo_.group_size)]);
      ev.rank_step.push_back(d.rank_step[static_cast<std::size_t>(r / topo_.group_size)]);
    }
    for (auto& j : ev.rank_job)
      if (j >= 0) j = runnable_[static_cast<std::size_t>(j)];
    cb_.on_progress(ev);
  }

  // denoise: one traversal of the experts in `experts` (PassDecision::experts): a step of this
  // rank's job through its expert's blocks, or a ghost pass. When the pass streams both experts
  // (ranks on different experts) their blocks are traversed together, block i of each in expert
  // order, so this rank joins the other expert's gathers behind its own compute
  // (BlockEngine::traverse_together). A failure of a ghost pass is the transfers': it propagates
  // and ends every rank.
  void traverse(const PassDecision& d) {
    const unsigned experts = d.experts;
    ++traversals_;
    // This rank's job in the pass: the leader's (or a lone rank's) current one; a member's, its
    // mirror of the job the pass gives its group.
    Slot* job = leader() ? (current_.run ? &current_ : nullptr)
                         : (member_job_ >= 0 ? &mirror_[static_cast<std::size_t>(member_job_)] : nullptr);
    const int mine = job == nullptr ? -1 : leader() ? current_.run->expert() : d.rank_expert[static_cast<std::size_t>(slot_)];
    DLO_ASSERT(mine < 0 || (experts & (1u << mine)) != 0, "the pass does not stream expert ", mine);
    std::vector<BlockEngine*> pass;
    int first = -1;
    for (std::size_t e = 0; e < runners_.size(); ++e) {
      if ((experts & (1u << e)) == 0) continue;
      ++expert_traversals_[e];
      pass.push_back(&runners_[e]->engine());
      if (first < 0) first = static_cast<int>(e);
    }
    if (pass.size() == 1) pass.clear();  // one engine: its own traversal
    // An expert that sits this pass out brings its block 0 in behind it (once: after its own
    // passes block 0 is already there), so the switch to it does not wait for a transfer.
    for (std::size_t e = 0; e < runners_.size(); ++e)
      if ((experts & (1u << e)) == 0) runners_[e]->engine().prefetch_entry();
    if (mine >= 0)
      step(*runners_[static_cast<std::size_t>(mine)], pass, *job);
    else
      runners_[static_cast<std::size_t>(first)]->ghost(pass);
    if (mine < 0) {
      ++ghosts_;
      if (scheduler_->jobs_unassigned() > 0 || next_.run) ++idle_;  // work existed, this rank was not ready for it
    }
  }

  // One denoising step of this rank's job through its expert's runner (and `pass`, see traverse).
  void step(WanOffloadRunner& runner, const std::vector<BlockEngine*>& pass, Slot& slot) {
    const auto t0 = Clock::now();
    JobRun& run = *slot.run;
    const FaultHooks& f = o_.faults;
    const bool fails_here = run.job.index == f.compute_job && (f.compute_rank < 0 || f.compute_rank == me_);
    const BlockHook hook = fails_here ? BlockHook([&](std::int64_t step, std::int64_t block) {
      DLO_CHECK(!(step == f.compute_step && block == f.compute_block), "injected failure (test hook)");
    })
                                                          : BlockHook();
    try {
      denoise_step(runner, run, o_.dtype, hook, pass, step_groups());
      if (dev_.device.is_cuda()) (void)run.latents.flatten()[0].item<float>();  // the step's time is real
      run.result.allocator_reserved_peak_bytes = device_memory(dev_.device).allocator_reserved_peak;
    } catch (const BlockComputeError& e) {
      // The job's own computation failed; the engine is in step (the pass went on as a ghost).
      run.fail(str("denoising step ", run.steps_done + 1, ": ", e.what()));
      if (leader()) record(run.result);  // the group failed together: its leader records it
      drop(slot);
      return;
    }
    // Any other exception is the transfers' and propagates: the collective is out of step.
    const double s = seconds_since(t0);
    ++run.steps_done;
    run.result.step_s.push_back(s);
    run.result.denoise_s += s;
    step_est_s_ = step_est_s_ == 0 ? s : 0.8 * step_est_s_ + 0.2 * s;
    if (cb_.on_step && leader()) cb_.on_step({run.job.spec.id, run.job.index, run.steps_done, run.job.spec.steps, s});
    if (run.steps_left() == 0) {
      if (decoder_of(slot.position) == me_) finish_later(slot);  // the others' copies are done
      drop(slot);
    }
  }

  // The job of `slot` leaves this rank's denoising (finished or failed).
  void drop(Slot& slot) {
    if (leader()) {
      DLO_ASSERT(&slot == &current_);
      current_ = Slot{};
      return;
    }
    mirror_.erase(mirror_.begin() + (&slot - mirror_.data()));
    member_job_ = -1;
  }

  void wave() {
    phase("denoise");
    for (;;) {
      const RankReport mine = boundary_report();
      if (me_ == o_.faults.io_rank && scheduler_pass_ == o_.faults.io_pass)
        throw Error(str("pass ", scheduler_pass_, ": injected I/O failure (test hook)"), ErrorKind::kIo);
      const PassDecision d = scheduler_->schedule(exchange(mine));
      scheduler_pass_ = pass_base_ + d.pass + 1;
      if (d.collect_results) collect("collecting results");
      if (d.stop) {
        report_.stopped = true;
        return;
      }
      for (const auto& a : d.assignments)
        if (ours(a)) assign(a.job);
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
        while (next_.run && !next_.ready->load(std::memory_order_acquire) && Clock::now() < until)
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        if (!next_.run) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        continue;
      }
      take_decided_job(d);
      traverse(d);
    }
  }

  // After the wave: the engine freed before the last decodes need memory; queued decodes finish
  // (their latents are complete); after a stop, a job being denoised or prepared is left for the
  // rerun. Then every rank's facts to rank 0.
  GenerateReport finish() {
    std::vector<EngineStats> es;
    std::int64_t token_rows = 0;
    for (const auto& r : runners_) {
      es.push_back(r->engine().stats());
      token_rows += r->token_rows();
    }
    runners_.clear();
    experts_.clear();
    const std::int64_t mixed_passes = mixed_passes_ + scheduler_->passes_streaming_all_experts();
    phase("decode");
    text_worker_.drain();
    decode_worker_.drain();
    for (auto& r : finished_.take()) record(std::move(r));
    current_ = Slot{};
    parked_.clear();
    next_ = Slot{};
    mirror_.clear();
    collect("collecting the last results");

    const ProcessMemory end = read_process_memory();
    const DeviceMemory dm = device_memory(dev_.device);
    ojson mine = {{"rank", me_},
                 {"group", slot_},
                 {"group_size", topo_.group_size},
                 {"token_block_rows", token_rows},  // the work this rank computed (runner.h)
                 {"exchange_bytes_sent", exchange_bytes_ + (group_ ? group_->bytes_sent() : 0) +
                                             (half_ ? half_->bytes_sent() : 0) + (partners_ ? partners_->bytes_sent() : 0)},
                 {"phases", plan_.phases.size()},
                 {"host", world_.host()},
                 {"local_rank", world_.local_rank()},
                 {"device", dev_.device.str()},
                 {"traversals", traversals_},
                 {"ghost_traversals", ghosts_},
                 {"idle_traversals", idle_},
                 {"decode_backlog_peak", decode_peak_},
                 {"passes_waiting_for_decodes", decode_waits_},
                 {"boundary_wait_s", sync_s_},
                 {"wave_s", wave_s_},
                 {"working_bytes_estimate", memory_.working},
                 {"device_blocks", memory_.choice.device_blocks},
                 {"device_total_bytes", dm.total},
                 {"device_used_bytes_at_end", dm.used},
                 {"allocator_reserved_peak_bytes", dm.allocator_reserved_peak},
                 {"allocator_allocated_peak_bytes", dm.allocator_allocated_peak},
                 {"rss_kb_at_start", at_start_.rss_kb},
                 {"rss_kb", end.rss_kb},
                 {"rss_peak_kb", end.hwm_kb}};
    mine.update(ojson::parse(engine_stats_json(sum_engine_stats(es))));
    if (es.size() > 1) {
      // Per expert: what each engine kept and streamed, and the passes that streamed both.
      ojson per = ojson::array();
      for (std::size_t e = 0; e < es.size(); ++e) {
        ojson x = ojson::parse(engine_stats_json(es[e]));
        x["traversals"] = expert_traversals_[e];
        per.push_back(std::move(x));
      }
      mine["experts"] = std::move(per);
      mine["passes_streaming_both_experts"] = mixed_passes;
      mine["expert_alignment_switches"] = expert_switches_;  // this rank's parks and early starts
    }
    const auto all = world_.gather_strings(mine.dump(), 0, "collecting rank facts");
    if (me_ == 0) {
      ojson arr = ojson::array();
      for (const auto& s : all) arr.push_back(ojson::parse(s));
      report_.ranks_json = arr.dump(2);
      std::sort(report_.jobs.begin(), report_.jobs.end(),
                [](const JobResult& a, const JobResult& b) { return a.index < b.index; });
    }
    return std::move(report_);
  }

  const MpiWorld& world_;
  const ModelInfo& model_;
  const std::vector<BatchJob>& jobs_;
  const GenerateOptions& o_;
  const GenerateCallbacks& cb_;
  const int me_, ranks_;

  WaveDevice dev_;
  std::vector<std::unique_ptr<WanTransformer>> experts_;    // transformer/ (, transformer_2/)
  std::vector<std::unique_ptr<WanOffloadRunner>> runners_;  // one engine per expert
  std::vector<std::int64_t> expert_traversals_;
  BatchMemoryPlan memory_;
  std::vector<std::int64_t> all_runnable_;  // the jobs that fit: indices into jobs_
  std::vector<std::int64_t> runnable_;      // this phase's scheduler position -> index into jobs_
  TopologyPlan plan_;                       // the batch's phases
  std::size_t phase_ = 0;
  Topology topo_;                           // this phase's
  int slot_ = 0, leader_ = 0;        // this rank's group (the scheduler's rank) and its first rank
  std::vector<int> group_ranks_;     // the group's ranks (empty: no groups)
  std::unique_ptr<ExchangeNetwork> net_;                     // what the groups are made from (declared first: outlives them)
  std::unique_ptr<ExchangeGroup> group_, half_, partners_;  // the group, its CFG half, the CFG partners
  std::unique_ptr<JobScheduler> scheduler_;  // this phase's
  std::int64_t scheduler_pass_ = 0;          // over the phases
  std::int64_t pass_base_ = 0, mixed_passes_ = 0;  // the earlier phases' passes, and those that streamed every expert
  std::uint64_t exchange_bytes_ = 0;               // sent in the earlier phases' groups
  GenerateReport report_;
  std::vector<std::string> pending_;  // this rank's result lines not yet at rank 0
  std::int64_t done_ = 0, failed_ = 0, traversals_ = 0, ghosts_ = 0, idle_ = 0, decode_waits_ = 0;
  std::int64_t expert_switches_ = 0;
  int decode_peak_ = 0;
  double sync_s_ = 0, text_est_s_ = 0, step_est_s_ = 0, wave_s_ = 0;
  ProcessMemory at_start_;
  // Used by the workers' tasks: declared before the workers.
  std::optional<PromptEncoder> text_;  // text worker only
  std::optional<WanVae> vae_;          // decode worker only
  ResultQueue finished_;
  std::atomic<int> decodes_in_flight_{0};  // posted to the decode worker, not yet finished
  // current_: the job being denoised; parked_: jobs paused so that this rank could compute in a
  // pass's expert (two experts; JobScheduler; oldest first); next_: the one being prepared.
  Slot current_, next_;
  std::vector<Slot> parked_;
  // A member of a group: every job its group holds (the leader's current, parked and next), and
  // the one this pass computes (an index into mirror_, -1: none).
  std::vector<Slot> mirror_;
  std::int64_t member_job_ = -1;
  Worker text_worker_, decode_worker_;  // destroyed first
};

}  // namespace

std::string dtypes_label(const GenerateOptions& o) {
  return str(compute_dtype_name(o.dtype), "/", compute_dtype_name(o.vae_dtype));
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
  RenderPlan p;
  p.device = dev.device.str();
  std::vector<StackSize> sizes;
  for (const auto& c : model.expert_configs()) sizes.push_back(config_stack_size(c, o.dtype, world.size()));
  p.memory = agree_memory_plan(world, model, jobs, o, dev, join_stacks(sizes));
  std::string error;
  try {
    p.topology = batch_topology(model, jobs, p.memory, world.size(), o);
  } catch (const Error& e) {
    error = e.what();
  }
  world.check_all(error, "topology");
  return p;
}

GenerateReport generate(const MpiWorld& world, const ModelInfo& model, const std::vector<BatchJob>& jobs,
                        const GenerateOptions& options, const GenerateCallbacks& callbacks) {
  BatchRun run(world, model, jobs, options, callbacks);
  return run.run();
}

}  // namespace dlo
