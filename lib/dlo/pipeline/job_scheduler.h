// Which rank renders which job of a batch, decided at every pass boundary.
//
// As in vLLM's scheduler, the decision is a value: every rank reports a RankReport at the
// boundary (the reports are exchanged by one small allgather, see render/generate), and every
// rank feeds the same reports, in rank order, to its own JobScheduler, whose schedule() returns
// the same PassDecision everywhere. There is no coordinator and nothing else to agree on. The
// scheduler keeps the batch's state (each job queued, assigned, held or finished) as typed data;
// no MPI, no torch, no clock: it is tested alone (tests/pipeline/test_job_scheduler.cpp).
//
// A pass is one traversal of the transformer's blocks by every rank: a denoising step of each
// rank's current job, or a ghost pass for a rank without one. With two experts a pass traverses
// the experts that some rank's step needs (PassDecision::experts), each rank computing in its own. Jobs are handed out in order, to the
// ranks that ask, in rank order; a rank asks for its next job early enough that the job's prompts
// are encoded when its current job ends (should_ask), so jobs of different steps, sizes and
// guidance mix freely and no rank waits behind another rank's longer job.
//
// Two experts: jobs of different lengths, shifts or boundaries drift ranks apart, one starting a
// job's high-noise steps while another is in its low-noise ones, and such a pass streams both
// experts (twice the gathers). The scheduler keeps the ranks' phases aligned where it can: a rank
// holds up to 1 + kMaxParked jobs being denoised (its current one, and some parked), plus the next one being
// prepared, and each pass the scheduler picks one expert that every rank can compute in (with its
// current job, its parked one, or by starting its prepared next job early and parking the
// current); only when no expert fits every rank does a pass stream both. That can only work if
// every rank holds about as many high-noise steps as the others (in a pass where all compute, all
// compute in the same expert), so jobs are not handed out strictly in order: the asking rank gets,
// of the first 2 x ranks queued jobs, the one after which the high- and low-noise steps given to
// each rank so far are most even (the front job never waits more than that many hand-outs). Each job's steps stay
// in order and each is computed once, so the frames are those of the job alone.
//
// Groups: the scheduler's "ranks" are the batch's groups of ranks (pipeline/topology.h; one rank
// each in data parallelism); an assignment names the group that renders a job. A batch in phases
// (a tail regrouped) has one scheduler per phase, over that phase's jobs.
//
// Thread-safety: none (one thread drives a scheduler).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace dlo {

// Expert alignment: the jobs a rank may hold paused besides its current one.
inline constexpr int kMaxParked = 3;

// What one rank says at a pass boundary.
struct RankReport {
  bool wants_job = false;           // asks for the next job
  bool stop = false;                // a stop was requested here (a signal)
  std::int64_t pending_results = 0; // finished jobs' results not yet at rank 0
  std::int64_t current = -1;        // the job its next pass computes (-1: none: a ghost pass)
  std::int64_t steps_done = 0;      // of `current`
  std::int64_t next = -1;           // a job assigned to it whose prompts are being prepared (-1: none)
  int expert = 0;                   // the expert (0 .. kMaxExperts - 1) `current`'s next step runs
  // Expert alignment (two experts): jobs paused so that the rank could compute in a pass's expert
  // (-1: none; the first `parked_count()` are set, oldest first), each with its steps done and its
  // next step's expert; and whether `next` is prepared (it may then start early) and its first
  // step's expert.
  std::array<std::int64_t, kMaxParked> parked{-1, -1, -1};
  std::array<std::int64_t, kMaxParked> parked_steps_done{};
  std::array<int, kMaxParked> parked_expert{};
  bool next_ready = false;
  int next_expert = 0;
  int parked_count() const;

  // The report as a fixed number of integers (the exchange carries kWords per rank), and back.
  static constexpr std::size_t kWords = 9 + 3 * kMaxParked;
  void encode(std::int64_t* out) const;
  static RankReport decode(const std::int64_t* in);
};

// A job and the ranks that render it (one rank today).
struct JobAssignment {
  std::int64_t job = -1;
  std::vector<int> ranks;
};

// A model has one transformer (Wan2.1) or two experts (Wan2.2 A14B: high noise, low noise).
inline constexpr int kMaxExperts = 2;

struct PassDecision {
  std::int64_t pass = 0;
  bool collect_results = false;  // some rank holds results: every rank joins their gather to rank 0
  bool stop = false;             // a rank asked to stop: every rank leaves the wave now
  bool finished = false;         // nothing is left to denoise anywhere: leave the wave
  bool traverse = false;         // some rank computes: every rank makes one traversal
  // Which experts the traversal streams (bit e: expert e), in expert order: those some rank's
  // step runs. Every rank traverses each of them, computing in its own expert's and joining the
  // other's gathers as a ghost (their blocks traversed together), so ranks on different experts
  // both compute in the same pass.
  unsigned experts = 0;
  std::vector<JobAssignment> assignments;  // jobs handed out at this boundary
  // Per rank: the job it computes in this pass (-1: none): its current one, its parked one (the
  // current is parked), or its prepared next one (started early; the current is parked); that
  // job's steps done, and the expert the step runs.
  std::vector<std::int64_t> rank_job;
  std::vector<std::int64_t> rank_step;
  std::vector<int> rank_expert;
};

enum class JobState {
  kQueued,    // not yet handed out
  kAssigned,  // handed out at this boundary; its rank reports it from the next one on
  kHeld,      // its rank reports it (its prompts being prepared, or being denoised)
  kFinished,  // its rank does not hold it (any more): denoised (decoding or done) or failed
};

// What a rank knows of its own jobs when it decides whether to ask (should_ask).
struct AskInputs {
  bool has_current = false, has_next = false;
  std::int64_t current_steps_left = 0;  // of the current job and the parked one together
  double step_s = 0;  // the measured seconds of a denoising step (0: none measured yet)
  double text_s = 0;  // the measured seconds of preparing a job (its prompts)
  // Two experts: every job it holds is past its high-noise steps, so without a new job it could
  // not join a pass of expert 0 (expert alignment).
  bool only_low_noise = false;
};

class JobScheduler {
 public:
  // `steps[i]`: the denoising steps of job i; `high_steps[i]` (two experts): how many of them run
  // expert 0 (a prefix: timesteps fall); empty: one expert, jobs handed out in order. Throws
  // nothing; ranks >= 1. `align_experts` false: jobs in order, every rank always computes its
  // current job (no parking, no early start).
  JobScheduler(std::vector<std::int64_t> steps, int ranks, bool align_experts = true,
               std::vector<std::int64_t> high_steps = {});

  // Before the wave: jobs 0 .. min(ranks, jobs) - 1 go to ranks 0, 1, ... (their prompts are
  // encoded before the engine exists). Call once, first.
  std::vector<JobAssignment> initial_assignments();

  // One boundary: `reports` are every rank's, in rank order. Hands the next jobs to the ranks that
  // asked (in rank order), updates the states, and says what every rank does next.
  PassDecision schedule(const std::vector<RankReport>& reports);

  // The policy a rank's wants_job follows: never while it holds a prepared next job; at once while
  // more jobs wait than there are ranks, or (expert alignment) while it holds only low-noise
  // steps and fewer than kMaxParked jobs are parked; near the end of the batch only when its
  // current job is about to end (within the time of preparing a job and one step), so that the
  // last jobs go to whichever ranks free up first.
  bool should_ask(const AskInputs& in) const;

  // Steps not yet computed over the batch (queued and assigned jobs in full, held ones less their
  // reported steps): with the measured step time, the ETA.
  std::int64_t steps_left() const;
  // Seconds left, from `step_s` per step spread over the ranks (-1 without a measurement).
  double eta_s(double step_s) const;

  JobState state(std::int64_t job) const { return state_.at(static_cast<std::size_t>(job)); }
  std::int64_t jobs() const { return static_cast<std::int64_t>(steps_.size()); }
  std::int64_t jobs_unassigned() const { return static_cast<std::int64_t>(queue_.size()); }
  // Passes so far whose traversal streamed more than one expert (ranks on different experts).
  std::int64_t passes_streaming_all_experts() const { return mixed_passes_; }
  int ranks() const { return ranks_; }
  // Boundaries scheduled so far (the next PassDecision::pass).
  std::int64_t pass_count() const { return pass_; }

 private:
  void assign(std::int64_t job, int rank, std::vector<JobAssignment>& out);
  // Hands rank `rank` a queued job (see the top) and counts its steps in given_high_/given_low_.
  void assign_next(int rank, std::vector<JobAssignment>& out);
  std::int64_t high_of(std::int64_t job) const;
  // The expert of the pass (or -1: each rank its current job's) and each rank's job in it.
  void choose_work(const std::vector<RankReport>& reports, PassDecision& d) const;

  std::vector<std::int64_t> steps_, done_steps_, high_steps_;
  std::vector<std::int64_t> queue_;  // queued jobs, in manifest order
  std::int64_t front_skipped_ = 0;   // hand-outs that passed over queue_.front()
  // Per rank: the high- and low-noise steps of the jobs it has been given so far.
  std::vector<std::int64_t> given_high_, given_low_;
  std::vector<JobState> state_;
  std::vector<int> owner_;  // per job: the rank it was given to (-1: none)
  int ranks_;
  std::int64_t pass_ = 0;
  std::int64_t mixed_passes_ = 0;
  bool started_ = false;
  bool align_experts_ = true;
};

}  // namespace dlo
