// What dlo-generate prints while it renders (the library prints nothing; it reports through
// GenerateCallbacks). Rank 0 only, stderr: for a batch, a progress line (redrawn on a terminal,
// timestamped every 10 s in logs) and one line per finished job; for one prompt, the phases and
// each step. `quiet` keeps only failed jobs' lines.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "dlo/pipeline/batch_plan.h"
#include "dlo/render/generate.h"

namespace dlo {

class MpiWorld;

class Console {
 public:
  Console(const MpiWorld& world, const BatchPlan& plan, bool batch, bool quiet);

  void phase(const std::string& name);
  void step(const StepEvent& e);
  void progress(const ProgressEvent& e);
  void result(const JobResult& r);

  // "12.34 s" (two decimals below 100 s).
  static std::string seconds(double s);

 private:
  const MpiWorld& world_;
  const BatchPlan& plan_;
  bool batch_, talk_, quiet_, tty_;
  double total_step_s_ = 0, last_line_ = -1e9;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

}  // namespace dlo
