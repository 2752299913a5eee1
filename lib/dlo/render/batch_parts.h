// The parts of a batch on one rank that have a name of their own (generate.cpp drives them): the
// worker threads of the stages, the results on their way to rank 0, and the rank's facts for the
// run's report.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dlo/pipeline/results.h"

namespace dlo {

class MpiWorld;

// A background thread running tasks in the order posted. Destroying it drops the tasks not yet
// started and waits for the one running, so nothing a task uses is destroyed under it (declare a
// Worker after what its tasks use). Tasks catch their own errors.
class Worker {
 public:
  Worker();
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void post(std::function<void()> task);
  // Blocks until every posted task has run.
  void drain();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> tasks_;
  bool running_ = false, quit_ = false;
  std::thread thread_;
};

// Results a worker hands back to the wave's thread. Thread-safe.
class ResultQueue {
 public:
  void push(JobResult r);
  std::vector<JobResult> take();

 private:
  std::mutex mu_;
  std::deque<JobResult> results_;
};

// Every rank's finished and failed jobs, on their way to rank 0, which hands each to `on_result`
// as it arrives and keeps them for the report. A failed job's error is prefixed with its index
// and id once, where it is recorded.
class ResultCollector {
 public:
  // `on_result` (rank 0; may be empty) may throw: that ends every rank (generate.h).
  ResultCollector(const MpiWorld& world, std::function<void(const JobResult&)> on_result);

  // A finished or failed job's result on this rank. Not collective.
  void record(JobResult r);
  // This rank's results not yet at rank 0.
  std::int64_t pending() const { return static_cast<std::int64_t>(pending_.size()); }
  // Collective (every rank calls it when any has results pending: PassDecision::collect_results):
  // every rank's pending results to rank 0.
  void collect(const char* phase);

  std::int64_t done() const { return done_; }      // rank 0: collected, finished
  std::int64_t failed() const { return failed_; }  // rank 0: collected, failed
  // Rank 0: every collected result; the others: their own recorded ones. Moves them out.
  std::vector<JobResult> take_jobs() { return std::move(jobs_); }

 private:
  const MpiWorld& world_;
  std::function<void(const JobResult&)> on_result_;
  std::vector<std::string> pending_;  // results.jsonl lines
  std::vector<JobResult> jobs_;
  std::int64_t done_ = 0, failed_ = 0;
};

// What one rank did in a batch, for the run's report (GenerateReport::ranks_json).
struct RankFacts {
  int rank = 0, group = 0, group_size = 1;
  std::int64_t token_block_rows = 0;        // the work this rank computed (runner.h)
  std::uint64_t exchange_bytes_sent = 0;    // on its groups' communicators
  std::int64_t phases = 0;
  std::string host, device;
  int local_rank = 0;
  std::int64_t traversals = 0, ghost_traversals = 0, idle_traversals = 0;
  int decode_backlog_peak = 0;
  std::int64_t passes_waiting_for_decodes = 0;
  double boundary_wait_s = 0, wave_s = 0;
  std::uint64_t working_bytes_estimate = 0;
  std::int64_t device_blocks = 0;
  std::int64_t device_total_bytes = -1, device_used_bytes_at_end = -1;
  std::int64_t allocator_reserved_peak_bytes = -1, allocator_allocated_peak_bytes = -1;
  std::int64_t rss_kb_at_start = 0, rss_kb = 0, rss_peak_kb = 0;
  std::string engine_json;  // the engines' statistics (a JSON object), merged into the facts
  // Two experts (expert_traversals has one entry per expert): each engine's statistics with its
  // traversals, the passes that streamed both experts and this rank's parks and early starts.
  std::vector<std::string> expert_json;
  std::vector<std::int64_t> expert_traversals;
  std::int64_t passes_streaming_both_experts = 0, expert_alignment_switches = 0;

  // One JSON object (the keys in the order above; the engine's merged in).
  std::string to_json() const;
};

// Collective: every rank's facts to rank 0, as a JSON array in rank order (rank 0; "" elsewhere).
std::string gather_rank_facts(const MpiWorld& world, const RankFacts& mine);

}  // namespace dlo
