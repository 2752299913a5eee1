// dlo-bench-collectives: the cost of MpiWorld's small collectives, the ones every pass and every
// batch make: the pass-boundary exchange (an allgather of each rank's report, RankReport's 18
// words), the results gather to rank 0 (a short line per rank) and a broadcast from rank 0.
//
//   mpirun -np N dlo-bench-collectives [--iterations 200] [--words 18] [--bytes 300]
//
// Each measurement: the ranks meet, then call the collective --iterations times back to back; a
// rank's time per call is its loop's time / iterations; the figure printed is the slowest rank's.
// Rank 0 prints one JSON object. No libtorch: 64 ranks start in seconds on a small machine.
// Exit codes: 0 ok, 2 bad flags, 1 anything else.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <cxxopts.hpp>

#include "dlo/common/error.h"
#include "dlo/common/settings.h"
#include "dlo/mpi/mpi_world.h"

namespace {

using Clock = std::chrono::steady_clock;

// The slowest rank's microseconds per call of `fn`, called `n` times after a meeting.
template <typename Fn>
double per_call_us(const dlo::MpiWorld& world, int n, Fn&& fn) {
  world.barrier("bench: start");
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) fn();
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n;
  return static_cast<double>(world.allreduce_max(static_cast<std::int64_t>(us * 1000), "bench: result")) / 1000;
}

}  // namespace

int main(int argc, char** argv) {
  dlo::MpiWorld world(&argc, &argv);
  try {
    cxxopts::Options opts("dlo-bench-collectives", "MpiWorld's small collectives, timed");
    opts.add_options()("iterations", "calls per measurement", cxxopts::value<int>()->default_value("200"))(
        "words", "64-bit words per rank in the allgather (a pass boundary's report: 18)",
        cxxopts::value<int>()->default_value("18"))(
        "bytes", "bytes per rank in the gather and the broadcast (a results line: ~300)",
        cxxopts::value<int>()->default_value("300"))("h,help", "this help");
    cxxopts::ParseResult args;
    try {
      args = opts.parse(argc, argv);
    } catch (const std::exception& e) {
      throw dlo::Error(std::string("bad flags: ") + e.what());
    }
    if (args.count("help")) {
      if (world.rank() == 0) std::printf("%s", opts.help().c_str());
      return 0;
    }
    const int n = args["iterations"].as<int>(), words = args["words"].as<int>(), bytes = args["bytes"].as<int>();
    DLO_CHECK(n >= 1 && words >= 1 && bytes >= 0, "--iterations and --words must be >= 1, --bytes >= 0");
    world.set_timeout_s(dlo::gather_timeout_setting(std::getenv("DLO_GATHER_TIMEOUT_S")));
    const std::vector<std::int64_t> report(static_cast<std::size_t>(words), world.rank());
    const std::string line(static_cast<std::size_t>(bytes), 'x');
    const double boundary = per_call_us(world, n, [&] { (void)world.allgather(report, "bench: pass boundary"); });
    const double gather = per_call_us(world, n, [&] { (void)world.gather_strings(line, 0, "bench: results"); });
    const double bcast = per_call_us(world, n, [&] { (void)world.broadcast_string(line, 0, "bench: broadcast"); });
    const double check = per_call_us(world, n, [&] { world.check_all("", "bench: check_all"); });
    if (world.rank() == 0)
      std::printf(
          "{\"ranks\": %d, \"iterations\": %d, \"boundary_allgather_us\": %.1f, \"gather_strings_us\": %.1f, "
          "\"broadcast_string_us\": %.1f, \"check_all_us\": %.1f}\n",
          world.size(), n, boundary, gather, bcast, check);
    return 0;
  } catch (const dlo::Error& e) {
    std::fprintf(stderr, "dlo-bench-collectives: error: %s\n", e.what());
    return e.kind() == dlo::ErrorKind::kInput ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dlo-bench-collectives: error: %s\n", e.what());
    return 1;
  }
}
