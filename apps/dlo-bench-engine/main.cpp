// dlo-bench-engine: the offload engine's own cost per block transition, with no compute.
//
//   [mpirun -np N] dlo-bench-engine --model DIR [--passes 200] [--repeats 5] [--dtype fp32] [--threads N]
//
// Streams the transformer's blocks through each strategy `passes` times (ghost traversals: every
// acquire/release and transfer, no math), `repeats` times over, and prints (rank 0) the median
// and the range over the repeats of microseconds per block transition (each the slowest rank's).
// With tiny blocks this is the host overhead the Python original pays ~1-2 ms for per block.
// Exit codes: 0 ok, 2 bad flags or model, 1 anything else.
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <vector>

#include <cxxopts.hpp>

#include "dlo/common/error.h"
#include "dlo/common/settings.h"
#include "dlo/dist/collective.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/app/tool.h"
#include "dlo/config/model_info.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/models/weights.h"
#include "dlo/offload/runner.h"
#include "dlo/offload/wave.h"

int main(int argc, char** argv) {
  dlo::MpiWorld world(&argc, &argv);
  // Exit codes, messages and fault handlers shared by every tool (dlo/dist/tool.h).
  return dlo::run_tool("dlo-bench-engine", &world, [&] {
    cxxopts::Options opts("dlo-bench-engine", "Offload engine cost per block transition (no compute)");
    opts.add_options()("model", "model directory (with transformer/)", cxxopts::value<std::string>())(
        "passes", "traversals per measurement", cxxopts::value<int>()->default_value("200"))(
        "repeats", "measurements per strategy (median and range printed)", cxxopts::value<int>()->default_value("5"))(
        "threads", "CPU threads per rank (0: libtorch default)", cxxopts::value<int>()->default_value("0"))(
        "dtype", "fp32, bf16, fp16", cxxopts::value<std::string>()->default_value("fp32"))("h,help", "this help");
    cxxopts::ParseResult args;
    try {
      args = opts.parse(argc, argv);
    } catch (const cxxopts::exceptions::exception& e) {
      throw dlo::Error(e.what());
    }
    if (args.count("help")) {
      if (world.rank() == 0) std::cout << opts.help();
      return 0;
    }
    DLO_CHECK(args.count("model"), "missing --model DIR");
    const int passes = args["passes"].as<int>();
    const int repeats = args["repeats"].as<int>();
    DLO_CHECK(passes >= 1, "--passes must be >= 1, got ", passes);
    DLO_CHECK(repeats >= 1, "--repeats must be >= 1, got ", repeats);
    world.set_timeout_s(dlo::gather_timeout_setting(std::getenv("DLO_GATHER_TIMEOUT_S")));
    std::string note;
    const int threads = dlo::bound_threads(args["threads"].as<int>(), "--threads", &note);
    if (!note.empty() && world.rank() == 0) std::cerr << "dlo-bench-engine: note: " << note << "\n";
    if (threads > 0) at::set_num_threads(threads);
    const auto dtype = dlo::parse_compute_dtype(args["dtype"].as<std::string>(), "--dtype");
    auto model = dlo::WanTransformer::load(dlo::ModelParts{args["model"].as<std::string>(), "", ""}.folder("transformer"), dtype, false);
    const std::int64_t layers = model.config().num_layers;
    for (auto s : {dlo::Strategy::kResident, dlo::Strategy::kDeviceShards, dlo::Strategy::kMixed,
                   dlo::Strategy::kLayerwise, dlo::Strategy::kDlo}) {
      if (s == dlo::Strategy::kMixed && layers < 2) continue;  // needs a block on each side
      dlo::WanOffloadRunner runner(model, world.size());
      dlo::agree_wave(world, static_cast<std::int64_t>(passes) * repeats + 1, runner.plan().fingerprint());
      dlo::EngineOptions eo;
      eo.strategy = s;
      eo.device_blocks = layers / 2;  // mixed: half the blocks on the device
      eo.gather_timeout_s = world.timeout_s();
      runner.start(eo, dlo::is_sharded(s) && world.size() > 1 ? dlo::make_mpi_collective(world) : nullptr);
      runner.ghost();  // cold start excluded
      std::vector<double> us;
      for (int r = 0; r < repeats; ++r) {
        world.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        for (int p = 0; p < passes; ++p) runner.ghost();
        const double s_total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double mine = s_total / passes / static_cast<double>(runner.plan().num_blocks()) * 1e6;
        us.push_back(static_cast<double>(world.allreduce_max(static_cast<std::int64_t>(mine * 1000))) / 1000.0);
      }
      std::sort(us.begin(), us.end());
      const double median = us.size() % 2 ? us[us.size() / 2] : (us[us.size() / 2 - 1] + us[us.size() / 2]) / 2;
      if (world.rank() == 0)
        std::cout << dlo::strategy_name(s) << (s == dlo::Strategy::kMixed ? " (half on the device)" : "") << ": " << median << " us per block transition, median of " << repeats
                  << " (range " << us.front() << "-" << us.back() << "; " << world.size() << " ranks, block "
                  << runner.plan().block(0).bytes << " bytes, " << passes << " passes each, slowest rank)\n";
    }
    return 0;
  });
}
