#include "dlo/render/batch_parts.h"

#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/mpi/mpi_world.h"

namespace dlo {

Worker::Worker() : thread_([this] { loop(); }) {}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
    tasks_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

void Worker::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void Worker::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return tasks_.empty() && !running_; });
}

void Worker::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return quit_ || !tasks_.empty(); });
    if (quit_) return;
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    running_ = true;
    lock.unlock();
    task();
    lock.lock();
    running_ = false;
    if (tasks_.empty()) idle_cv_.notify_all();
  }
}

void ResultQueue::push(JobResult r) {
  std::lock_guard<std::mutex> lock(mu_);
  results_.push_back(std::move(r));
}

std::vector<JobResult> ResultQueue::take() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<JobResult> out(std::make_move_iterator(results_.begin()), std::make_move_iterator(results_.end()));
  results_.clear();
  return out;
}

ResultCollector::ResultCollector(const MpiWorld& world, std::function<void(const JobResult&)> on_result)
    : world_(world), on_result_(std::move(on_result)) {}

void ResultCollector::record(JobResult r) {
  if (!r.ok()) r.error = str("job ", r.index, " ('", r.id, "'): ", r.error);
  pending_.push_back(result_line(r));
  if (world_.rank() != 0) jobs_.push_back(std::move(r));
}

void ResultCollector::collect(const char* phase) {
  std::string mine;
  for (const auto& l : pending_) mine += l + "\n";
  pending_.clear();
  const auto all = world_.gather_strings(mine, 0, phase);
  if (world_.rank() != 0) return;
  for (const auto& text : all)
    for (std::size_t pos = 0; pos < text.size();) {
      const std::size_t nl = text.find('\n', pos);
      JobResult r = result_from_line(text.substr(pos, nl - pos));
      pos = nl + 1;
      (r.ok() ? done_ : failed_) += 1;
      if (on_result_) on_result_(r);
      jobs_.push_back(std::move(r));
    }
}

std::string RankFacts::to_json() const {
  using ojson = nlohmann::ordered_json;
  ojson j = {{"rank", rank},
             {"group", group},
             {"group_size", group_size},
             {"token_block_rows", token_block_rows},
             {"exchange_bytes_sent", exchange_bytes_sent},
             {"phases", phases},
             {"host", host},
             {"local_rank", local_rank},
             {"device", device},
             {"traversals", traversals},
             {"ghost_traversals", ghost_traversals},
             {"idle_traversals", idle_traversals},
             {"decode_backlog_peak", decode_backlog_peak},
             {"passes_waiting_for_decodes", passes_waiting_for_decodes},
             {"boundary_wait_s", boundary_wait_s},
             {"wave_s", wave_s},
             {"working_bytes_estimate", working_bytes_estimate},
             {"device_blocks", device_blocks},
             {"device_total_bytes", device_total_bytes},
             {"device_used_bytes_at_end", device_used_bytes_at_end},
             {"allocator_reserved_peak_bytes", allocator_reserved_peak_bytes},
             {"allocator_allocated_peak_bytes", allocator_allocated_peak_bytes},
             {"rss_kb_at_start", rss_kb_at_start},
             {"rss_kb", rss_kb},
             {"rss_peak_kb", rss_peak_kb}};
  if (!engine_json.empty()) j.update(ojson::parse(engine_json));
  if (expert_traversals.size() > 1) {
    ojson per = ojson::array();
    for (std::size_t e = 0; e < expert_traversals.size(); ++e) {
      ojson x = e < expert_json.size() ? ojson::parse(expert_json[e]) : ojson::object();
      x["traversals"] = expert_traversals[e];
      per.push_back(std::move(x));
    }
    j["experts"] = std::move(per);
    j["passes_streaming_both_experts"] = passes_streaming_both_experts;
    j["expert_alignment_switches"] = expert_alignment_switches;
  }
  return j.dump();
}

std::string gather_rank_facts(const MpiWorld& world, const RankFacts& mine) {
  const auto all = world.gather_strings(mine.to_json(), 0, "collecting rank facts");
  if (world.rank() != 0) return {};
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const auto& s : all) arr.push_back(nlohmann::ordered_json::parse(s));
  return arr.dump(2);
}

}  // namespace dlo
