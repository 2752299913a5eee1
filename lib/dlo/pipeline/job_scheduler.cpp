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
  return r;
}

JobScheduler::JobScheduler(std::vector<std::int64_t> steps, int ranks)
    : steps_(std::move(steps)),
      done_steps_(steps_.size(), 0),
      state_(steps_.size(), JobState::kQueued),
      owner_(steps_.size(), -1),
      ranks_(std::max(1, ranks)) {}

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
  for (int r = 0; r < ranks_ && next_job_ < jobs(); ++r) assign(next_job_++, r, out);
  return out;
}

PassDecision JobScheduler::schedule(const std::vector<RankReport>& reports) {
  DLO_ASSERT(static_cast<int>(reports.size()) == ranks_, reports.size(), " reports for ", ranks_, " ranks");
  started_ = true;
  PassDecision d;
  d.pass = pass_++;
  d.rank_job.assign(static_cast<std::size_t>(ranks_), -1);
  d.rank_step.assign(static_cast<std::size_t>(ranks_), 0);
  bool busy = false;
  std::vector<char> held(steps_.size(), 0);
  for (int r = 0; r < ranks_; ++r) {
    const RankReport& rep = reports[static_cast<std::size_t>(r)];
    d.collect_results |= rep.pending_results > 0;
    d.stop |= rep.stop;
    busy |= rep.current >= 0 || rep.next >= 0;
    d.traverse |= rep.current >= 0;
    if (rep.current >= 0) {
      DLO_ASSERT(rep.expert >= 0 && rep.expert < kMaxExperts, "rank ", r, " reports expert ", rep.expert);
      d.experts |= 1u << rep.expert;
    }
    d.rank_job[static_cast<std::size_t>(r)] = rep.current;
    d.rank_step[static_cast<std::size_t>(r)] = rep.current >= 0 ? rep.steps_done : 0;
    for (const std::int64_t j : {rep.current, rep.next}) {
      if (j < 0) continue;
      DLO_ASSERT(j < jobs() && owner_[static_cast<std::size_t>(j)] == r, "rank ", r, " reports job ", j,
                 " it was not given");
      held[static_cast<std::size_t>(j)] = 1;
      state_[static_cast<std::size_t>(j)] = JobState::kHeld;
    }
    if (rep.current >= 0) done_steps_[static_cast<std::size_t>(rep.current)] = rep.steps_done;
  }
  // A job handed out at an earlier boundary that its rank does not report (any more) is finished:
  // denoised, or failed (a failed preparation may end before its rank ever reported it).
  for (std::size_t j = 0; j < steps_.size(); ++j)
    if ((state_[j] == JobState::kHeld || state_[j] == JobState::kAssigned) && !held[j]) state_[j] = JobState::kFinished;
  if (d.stop) return d;
  if ((d.experts & (d.experts - 1)) != 0) ++mixed_passes_;
  for (int r = 0; r < ranks_ && next_job_ < jobs(); ++r)
    if (reports[static_cast<std::size_t>(r)].wants_job) assign(next_job_++, r, d.assignments);
  d.finished = !busy && d.assignments.empty() && next_job_ >= jobs();
  return d;
}

bool JobScheduler::should_ask(const AskInputs& in) const {
  if (in.has_next) return false;
  if (!in.has_current) return true;
  if (jobs_unassigned() > ranks_) return true;
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
