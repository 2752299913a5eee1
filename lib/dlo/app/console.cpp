#include "dlo/app/console.h"

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <iostream>

#include "dlo/common/error.h"
#include "dlo/mpi/mpi_world.h"

namespace dlo {
namespace {

std::string now_stamp() {
  char b[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(b, sizeof b, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return b;
}

}  // namespace

Console::Console(const MpiWorld& world, const BatchPlan& plan, bool batch, bool quiet)
    : world_(world), plan_(plan), batch_(batch), talk_(world.rank() == 0 && !quiet), quiet_(quiet),
      tty_(::isatty(STDERR_FILENO) != 0) {}

std::string Console::seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, s < 100 ? "%.2f s" : "%.0f s", s);
  return b;
}

void Console::phase(const std::string& name) {
  if (talk_ && !batch_) std::cerr << world_.tag() << " " << name << "\n";
}

void Console::step(const StepEvent& e) {
  if (!talk_ || batch_) return;
  total_step_s_ += e.seconds;
  char line[160];
  std::snprintf(line, sizeof line, "%s step %lld/%lld  %.2f s  (%.2f s/it)", world_.tag().c_str(),
                static_cast<long long>(e.step), static_cast<long long>(e.steps), e.seconds,
                total_step_s_ / static_cast<double>(e.step));
  std::cerr << line << "\n";
}

void Console::progress(const ProgressEvent& e) {
  if (!talk_ || !batch_) return;
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  if (!tty_ && t - last_line_ < 10) return;  // a line every 10 s in logs
  last_line_ = t;
  std::string ranks;
  for (std::size_t r = 0; r < e.rank_job.size(); ++r)
    ranks += e.rank_job[r] < 0 ? " -"
                               : str(" ", plan_.jobs[static_cast<std::size_t>(e.rank_job[r])].spec.id, ":", e.rank_step[r]);
  const std::string text = str("jobs ", e.jobs_done, " done, ", e.jobs_failed, " failed, ", e.jobs_total, " total; ranks",
                               ranks, e.eta_s >= 0 ? str("; ETA ", seconds(e.eta_s)) : "");
  if (tty_)
    std::cerr << "\r\033[K" << text << std::flush;
  else
    std::cerr << now_stamp() << " " << text << "\n";
}

void Console::result(const JobResult& r) {
  if (world_.rank() != 0 || !batch_) return;
  const bool ok = r.ok();
  if (!talk_ && ok) return;  // --quiet: failures only
  if (tty_ && talk_) std::cerr << "\r\033[K";
  std::cerr << (tty_ ? "" : now_stamp() + " ") << "job " << r.index << " '" << r.id << "' " << job_status_name(r.status) << " (rank "
            << r.rank << ", " << seconds(r.denoise_s + r.decode_s) << ")" << (ok ? " -> " + r.output : ": " + r.error)
            << "\n";
}

}  // namespace dlo
