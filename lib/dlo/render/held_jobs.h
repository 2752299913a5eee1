// The jobs one rank holds between passes of a batch (generate.cpp): a group's leader (or a lone
// rank) holds the job it denoises, the next one being prepared and, with two experts, jobs parked
// so that it could compute in a pass's expert; a member of a group mirrors every job its leader
// holds. Not thread-safe: the wave's thread alone (a slot's `ready` is set by the text worker).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dlo/pipeline/job_scheduler.h"
#include "dlo/render/stages.h"

namespace dlo {

// A job on this rank and whether its preparation has finished (set by the text worker).
struct Slot {
  std::int64_t position = -1;  // in the phase's scheduler (an index into its runnable jobs)
  std::shared_ptr<JobRun> run;
  std::shared_ptr<std::atomic<bool>> ready = std::make_shared<std::atomic<bool>>(false);
  bool prepared() const { return run && ready->load(std::memory_order_acquire); }
};

class HeldJobs {
 public:
  // Leader: the job just assigned, being prepared. Member: a mirror of a job its leader holds.
  void hold_next(Slot s) { next_ = std::move(s); }
  void hold_mirror(Slot s) { mirror_.push_back(std::move(s)); }

  // Leader, at a pass boundary: whether the next job is prepared is read once (next_ready); a next
  // job whose preparation failed leaves (its result is returned, to be recorded); then, with no
  // current job, the oldest parked one resumes, or else the prepared next one starts.
  std::optional<JobResult> advance();
  bool next_ready() const { return next_ready_; }
  double next_text_s() const { return next_text_s_; }  // the ready next job's preparation time (-1: none)
  // Leader: the scheduler's inputs and this rank's report of what it holds (current, next, parked
  // and their experts; `experts`: the model's).
  AskInputs ask(int experts) const;
  void describe(RankReport& r) const;

  // Leader: the job the pass decided this rank computes becomes current: a parked one (resumed;
  // the current one is parked last) or the prepared next one started early (the current one is
  // parked). Returns whether the current job changed.
  bool take(std::int64_t want, std::int64_t pass);
  // Member: the mirror of `want` (waits for its preparation here); nullptr for none. Where it is
  // missing (its preparation failed here alone, not on the leader) `missing()` makes one, which
  // then fails the step on the whole group.
  Slot* take_mirror(std::int64_t want, const std::function<Slot()>& missing);
  // Member: drops the mirrors of jobs the leader no longer holds (finished, or failed there).
  void prune(const RankReport& leader);

  // The job this rank computes in the pass (nullptr: a ghost pass).
  Slot* pass_job(bool leader);
  // The job of `slot` leaves this rank's denoising (finished or failed).
  void drop(Slot& slot, bool leader);
  Slot& next() { return next_; }
  bool holds_none() const { return !current_.run && !next_.run && parked_.empty() && mirror_.empty(); }
  void clear();

 private:
  // current_: the job being denoised; parked_: jobs paused so that this rank could compute in a
  // pass's expert (two experts; JobScheduler; oldest first); next_: the one being prepared.
  Slot current_, next_;
  std::vector<Slot> parked_;
  // A member of a group: every job its group holds (the leader's current, parked and next), and
  // the one this pass computes (an index into mirror_, -1: none).
  std::vector<Slot> mirror_;
  std::int64_t member_job_ = -1;
  bool next_ready_ = false;  // advance()'s reading
  double next_text_s_ = -1;
};

}  // namespace dlo
