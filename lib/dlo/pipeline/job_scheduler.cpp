#include "dlo/pipeline/job_scheduler.h"

#include <algorithm>

#include "dlo/common/error.h"

namespace dlo {

void RankReport::encode(std::int64_t* out) const {
  out[0] = wants_job;
  out[1] = stop;
  out[2] = pending_results;
  out[3] = current;
  out[4] = steps_done;
  out[5] = next;
  out[6] = expert;
  out[7] = next_ready;
  out[8] = next_expert;
  for (int i = 0; i < kMaxParked; ++i) {
    out[9 + 3 * i] = parked[static_cast<std::size_t>(i)];
    out[10 + 3 * i] = parked_steps_done[static_cast<std::size_t>(i)];
    out[11 + 3 * i] = parked_expert[static_cast<std::size_t>(i)];
  }
}

int RankReport::parked_count() const {
  int n = 0;
  while (n < kMaxParked && parked[static_cast<std::size_t>(n)] >= 0) ++n;
  return n;
}

RankReport RankReport::decode(const std::int64_t* in) {
  RankReport r;
  r.wants_job = in[0] != 0;
  r.stop = in[1] != 0;
  r.pending_results = in[2];
  r.current = in[3];
  r.steps_done = in[4];
  r.next = in[5];
  r.expert = static_cast<int>(in[6]);
  r.next_ready = in[7] != 0;
  r.next_expert = static_cast<int>(in[8]);
  for (int i = 0; i < kMaxParked; ++i) {
    r.parked[static_cast<std::size_t>(i)] = in[9 + 3 * i];
    r.parked_steps_done[static_cast<std::size_t>(i)] = in[10 + 3 * i];
    r.parked_expert[static_cast<std::size_t>(i)] = static_cast<int>(in[11 + 3 * i]);
  }
  return r;
}

JobScheduler::JobScheduler(std::vector<std::int64_t> steps, int ranks, bool align_experts,
                           std::vector<std::int64_t> high_steps)
    : steps_(std::move(steps)),
      done_steps_(steps_.size(), 0),
      high_steps_(std::move(high_steps)),
      state_(steps_.size(), JobState::kQueued),
      owner_(steps_.size(), -1),
      ranks_(std::max(1, ranks)),
      align_experts_(align_experts) {
  given_high_.assign(static_cast<std::size_t>(ranks_), 0);
  given_low_.assign(static_cast<std::size_t>(ranks_), 0);
  DLO_ASSERT(high_steps_.empty() || high_steps_.size() == steps_.size(), high_steps_.size(), " high-noise step counts for ",
             steps_.size(), " jobs");
  for (std::int64_t j = 0; j < jobs(); ++j) queue_.push_back(j);
}

std::int64_t JobScheduler::high_of(std::int64_t job) const {
  const auto j = static_cast<std::size_t>(job);
  return high_steps_.empty() ? steps_[j] : std::clamp<std::int64_t>(high_steps_[j], 0, steps_[j]);
}

void JobScheduler::assign_next(int rank, std::vector<JobAssignment>& out) {
  auto& high = given_high_;
  auto& low = given_low_;
  std::size_t pick = 0;
  const std::size_t window = std::min(queue_.size(), static_cast<std::size_t>(2 * ranks_));
  if (align_experts_ && !high_steps_.empty() && front_skipped_ < static_cast<std::int64_t>(window)) {
    // The job after which the high- and low-noise steps given to each rank so far are most even.
    std::int64_t best = -1;
    for (std::size_t q = 0; q < window; ++q) {
      const std::int64_t j = queue_[q], h = high_of(j), l = steps_[static_cast<std::size_t>(j)] - h;
      std::int64_t hmin = high[static_cast<std::size_t>(rank)] + h, hmax = hmin;
      std::int64_t lmin = low[static_cast<std::size_t>(rank)] + l, lmax = lmin;
      for (int r = 0; r < ranks_; ++r) {
        if (r == rank) continue;
        hmin = std::min(hmin, high[static_cast<std::size_t>(r)]), hmax = std::max(hmax, high[static_cast<std::size_t>(r)]);
        lmin = std::min(lmin, low[static_cast<std::size_t>(r)]), lmax = std::max(lmax, low[static_cast<std::size_t>(r)]);
      }
      const std::int64_t cost = (hmax - hmin) + (lmax - lmin);
      if (best < 0 || cost < best) best = cost, pick = q;
    }
  }
  front_skipped_ = pick == 0 ? 0 : front_skipped_ + 1;
  const std::int64_t job = queue_[pick];
  queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(pick));
  high[static_cast<std::size_t>(rank)] += high_of(job);
  low[static_cast<std::size_t>(rank)] += steps_[static_cast<std::size_t>(job)] - high_of(job);
  assign(job, rank, out);
}

namespace {

// What a rank could compute in a pass: a job and its next step's expert.
struct Option {
  std::int64_t job = -1, steps_done = 0;
  int expert = 0;
};

// In order of preference: the current job, the parked ones (oldest first), the prepared next one
// (only while fewer than kMaxParked are parked).
std::vector<Option> options_of(const RankReport& r) {
  std::vector<Option> o;
  if (r.current >= 0) o.push_back({r.current, r.steps_done, r.expert});
  const int parked = r.parked_count();
  for (int i = 0; i < parked; ++i) {
    const auto k = static_cast<std::size_t>(i);
    o.push_back({r.parked[k], r.parked_steps_done[k], r.parked_expert[k]});
  }
  if (r.next >= 0 && r.next_ready && parked < kMaxParked && r.current >= 0) o.push_back({r.next, 0, r.next_expert});
  return o;
}

}  // namespace

void JobScheduler::choose_work(const std::vector<RankReport>& reports, PassDecision& d) const {
  std::vector<std::vector<Option>> opts;
  for (const auto& r : reports) opts.push_back(options_of(r));
  // The expert every rank with work can compute in; of two, the one more ranks' current jobs are
  // on (they continue without parking); a tie goes to the low-noise expert, which finishes the
  // older jobs first.
  int pick = -1, pick_current = -1;
  if (align_experts_)
    for (int e = kMaxExperts - 1; e >= 0; --e) {
      bool all = true;
      int on_current = 0;
      for (std::size_t r = 0; r < opts.size(); ++r) {
        if (opts[r].empty()) continue;
        const bool can = std::any_of(opts[r].begin(), opts[r].end(), [&](const Option& o) { return o.expert == e; });
        all = all && can;
        on_current += opts[r][0].expert == e;
      }
      if (all && on_current > pick_current) pick = e, pick_current = on_current;
    }
  for (std::size_t r = 0; r < opts.size(); ++r) {
    if (opts[r].empty()) continue;
    Option chosen = opts[r][0];  // without an expert for all: each rank its current job
    if (pick >= 0)
      chosen = *std::find_if(opts[r].begin(), opts[r].end(), [&](const Option& o) { return o.expert == pick; });
    d.rank_job[r] = chosen.job;
    d.rank_step[r] = chosen.steps_done;
    d.rank_expert[r] = chosen.expert;
    d.experts |= 1u << chosen.expert;
  }
}

void JobScheduler::assign(std::int64_t job, int rank, std::vector<JobAssignment>& out) {
  const auto j = static_cast<std::size_t>(job);
  state_[j] = JobState::kAssigned;
  owner_[j] = rank;
  out.push_back({job, {rank}});
}

std::vector<JobAssignment> JobScheduler::initial_assignments() {
  DLO_ASSERT(!started_, "initial_assignments called twice");
  started_ = true;
  std::vector<JobAssignment> out;
  for (int r = 0; r < ranks_ && !queue_.empty(); ++r) assign_next(r, out);
  return out;
}

PassDecision JobScheduler::schedule(const std::vector<RankReport>& reports) {
  DLO_ASSERT(static_cast<int>(reports.size()) == ranks_, reports.size(), " reports for ", ranks_, " ranks");
  started_ = true;
  PassDecision d;
  d.pass = pass_++;
  d.rank_job.assign(static_cast<std::size_t>(ranks_), -1);
  d.rank_step.assign(static_cast<std::size_t>(ranks_), 0);
  d.rank_expert.assign(static_cast<std::size_t>(ranks_), 0);
  bool busy = false;
  std::vector<char> held(steps_.size(), 0);
  for (int r = 0; r < ranks_; ++r) {
    const RankReport& rep = reports[static_cast<std::size_t>(r)];
    d.collect_results |= rep.pending_results > 0;
    d.stop |= rep.stop;
    busy |= rep.current >= 0 || rep.next >= 0;
    d.traverse |= rep.current >= 0;
    const int parked = rep.parked_count();
    DLO_ASSERT(parked == 0 || rep.current >= 0, "rank ", r, " reports a parked job without a current one");
    std::vector<std::int64_t> held_jobs{rep.current, rep.next};
    for (int i = 0; i < parked; ++i) {
      const auto k = static_cast<std::size_t>(i);
      DLO_ASSERT(rep.parked_expert[k] >= 0 && rep.parked_expert[k] < kMaxExperts, "rank ", r, " reports expert ",
                 rep.parked_expert[k]);
      held_jobs.push_back(rep.parked[k]);
    }
    for (const int e : {rep.expert, rep.next_expert})
      DLO_ASSERT(e >= 0 && e < kMaxExperts, "rank ", r, " reports expert ", e);
    for (const std::int64_t j : held_jobs) {
      if (j < 0) continue;
      DLO_ASSERT(j < jobs() && owner_[static_cast<std::size_t>(j)] == r, "rank ", r, " reports job ", j,
                 " it was not given");
      held[static_cast<std::size_t>(j)] = 1;
      state_[static_cast<std::size_t>(j)] = JobState::kHeld;
    }
    if (rep.current >= 0) done_steps_[static_cast<std::size_t>(rep.current)] = rep.steps_done;
    for (int i = 0; i < parked; ++i)
      done_steps_[static_cast<std::size_t>(rep.parked[static_cast<std::size_t>(i)])] =
          rep.parked_steps_done[static_cast<std::size_t>(i)];
  }
  if (d.traverse) choose_work(reports, d);
  // A job handed out at an earlier boundary that its rank does not report (any more) is finished:
  // denoised, or failed (a failed preparation may end before its rank ever reported it).
  for (std::size_t j = 0; j < steps_.size(); ++j)
    if ((state_[j] == JobState::kHeld || state_[j] == JobState::kAssigned) && !held[j]) state_[j] = JobState::kFinished;
  if (d.stop) return d;
  if ((d.experts & (d.experts - 1)) != 0) ++mixed_passes_;
  for (int r = 0; r < ranks_ && !queue_.empty(); ++r)
    if (reports[static_cast<std::size_t>(r)].wants_job) assign_next(r, d.assignments);
  d.finished = !busy && d.assignments.empty() && queue_.empty();
  return d;
}

bool JobScheduler::should_ask(const AskInputs& in) const {
  if (in.has_next) return false;
  if (!in.has_current) return true;
  if (jobs_unassigned() > ranks_) return true;
  if (align_experts_ && in.only_low_noise && jobs_unassigned() > 0) return true;
  if (in.step_s > 0) return static_cast<double>(in.current_steps_left) * in.step_s <= in.text_s + in.step_s;
  return in.current_steps_left <= 1;
}

std::int64_t JobScheduler::steps_left() const {
  std::int64_t n = 0;
  for (std::size_t j = 0; j < steps_.size(); ++j) {
    switch (state_[j]) {
      case JobState::kQueued:
      case JobState::kAssigned: n += steps_[j]; break;
      case JobState::kHeld: n += std::max<std::int64_t>(0, steps_[j] - done_steps_[j]); break;
      case JobState::kFinished: break;
    }
  }
  return n;
}

double JobScheduler::eta_s(double step_s) const {
  if (step_s <= 0) return -1;
  return static_cast<double>(steps_left()) * step_s / ranks_;
}

}  // namespace dlo
