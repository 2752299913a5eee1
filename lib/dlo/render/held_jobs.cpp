#include "dlo/render/held_jobs.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "dlo/common/error.h"

namespace dlo {

std::optional<JobResult> HeldJobs::advance() {
  next_ready_ = next_.prepared();  // once: the text worker may finish it meanwhile
  next_text_s_ = next_ready_ ? next_.run->result.text_s : -1;
  std::optional<JobResult> failed;
  if (next_ready_ && next_.run->failed()) {  // its prompts could not be encoded
    failed = next_.run->result;
    next_ = Slot{};
  }
  if (!current_.run && !parked_.empty()) {  // the oldest parked job resumes
    current_ = std::move(parked_.front());
    parked_.erase(parked_.begin());
  }
  if (!current_.run && next_ready_ && next_.run) {
    current_ = std::move(next_);
    next_ = Slot{};
  }
  return failed;
}

AskInputs HeldJobs::ask(int experts) const {
  AskInputs a;
  a.has_current = current_.run != nullptr;
  a.has_next = next_.run != nullptr;
  a.current_steps_left = current_.run ? current_.run->steps_left() : 0;
  for (const auto& p : parked_) a.current_steps_left += p.run->steps_left();
  if (experts > 1 && current_.run && parked_.size() < static_cast<std::size_t>(kMaxParked)) {
    a.only_low_noise = current_.run->expert() == 1;
    for (const auto& p : parked_) a.only_low_noise = a.only_low_noise && p.run->expert() == 1;
  }
  return a;
}

void HeldJobs::describe(RankReport& r) const {
  r.current = current_.run ? current_.position : -1;
  r.steps_done = current_.run ? current_.run->steps_done : 0;
  r.next = next_.run ? next_.position : -1;
  r.expert = current_.run ? current_.run->expert() : 0;
  for (std::size_t i = 0; i < parked_.size(); ++i) {
    r.parked[i] = parked_[i].position;
    r.parked_steps_done[i] = parked_[i].run->steps_done;
    r.parked_expert[i] = parked_[i].run->expert();
  }
  r.next_ready = next_.run && next_ready_;
  r.next_expert = r.next_ready ? next_.run->expert() : 0;
}

bool HeldJobs::take(std::int64_t want, std::int64_t pass) {
  if (want < 0 || (current_.run && current_.position == want)) return false;
  const auto p = std::find_if(parked_.begin(), parked_.end(), [&](const Slot& s) { return s.position == want; });
  if (p != parked_.end()) {
    Slot resumed = std::move(*p);
    parked_.erase(p);
    parked_.push_back(std::move(current_));
    current_ = std::move(resumed);
    return true;
  }
  DLO_ASSERT(next_.run && next_.position == want && parked_.size() < static_cast<std::size_t>(kMaxParked), "pass ",
             pass, ": this rank was given job ", want, " which it does not hold");
  parked_.push_back(std::move(current_));
  current_ = std::move(next_);
  next_ = Slot{};
  return true;
}

Slot* HeldJobs::take_mirror(std::int64_t want, const std::function<Slot()>& missing) {
  member_job_ = -1;
  if (want < 0) return nullptr;
  const auto m = std::find_if(mirror_.begin(), mirror_.end(), [&](const Slot& s) { return s.position == want; });
  if (m == mirror_.end()) {
    mirror_.push_back(missing());
    member_job_ = static_cast<std::int64_t>(mirror_.size()) - 1;
  } else {
    while (!m->ready->load(std::memory_order_acquire)) std::this_thread::sleep_for(std::chrono::microseconds(200));
    member_job_ = m - mirror_.begin();
  }
  return &mirror_[static_cast<std::size_t>(member_job_)];
}

void HeldJobs::prune(const RankReport& l) {
  std::vector<std::int64_t> held = {l.current, l.next};
  held.insert(held.end(), l.parked.begin(), l.parked.end());
  mirror_.erase(std::remove_if(mirror_.begin(), mirror_.end(),
                               [&](const Slot& s) { return std::find(held.begin(), held.end(), s.position) == held.end(); }),
                mirror_.end());
}

Slot* HeldJobs::pass_job(bool leader) {
  if (leader) return current_.run ? &current_ : nullptr;
  return member_job_ >= 0 ? &mirror_[static_cast<std::size_t>(member_job_)] : nullptr;
}

void HeldJobs::drop(Slot& slot, bool leader) {
  if (leader) {
    DLO_ASSERT(&slot == &current_);
    current_ = Slot{};
    return;
  }
  mirror_.erase(mirror_.begin() + (&slot - mirror_.data()));
  member_job_ = -1;
}

void HeldJobs::clear() {
  current_ = Slot{};
  parked_.clear();
  next_ = Slot{};
  mirror_.clear();
  member_job_ = -1;
}

}  // namespace dlo
