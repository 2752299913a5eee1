#include "dlo/offload/transformer_job.h"

#include <chrono>
#include <optional>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/common/memory.h"
#include "dlo/dist/collective.h"
#include "dlo/dist/mpi_world.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/offload/runner.h"

#ifdef DLO_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

namespace dlo {
namespace {

at::Device pick_device(const std::string& requested, const MpiWorld& world) {
  int count = 0;
#ifdef DLO_HAVE_CUDA
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
#endif
  if (requested == "cpu") return at::kCPU;
  if (requested == "auto") {
    if (count == 0) return at::kCPU;
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank() % count));
  }
  DLO_CHECK(requested.rfind("cuda", 0) == 0, "--device: '", requested, "' is not auto, cpu, cuda or cuda:N");
  DLO_CHECK(count > 0, "--device ", requested, ": no CUDA device is visible");
  int index = world.local_rank() % count;
  if (requested.size() > 5) index = std::stoi(requested.substr(5));
  DLO_CHECK(index >= 0 && index < count, "--device ", requested, ": only ", count, " devices are visible");
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

const at::Tensor& input(const std::map<std::string, at::Tensor>& in, const std::string& key) {
  auto it = in.find(key);
  DLO_CHECK(it != in.end(), "transformer: inputs lack '", key, "'");
  return it->second;
}

std::int64_t device_peak_bytes(at::Device d) {
#ifdef DLO_HAVE_CUDA
  if (d.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
    return stats.reserved_bytes[0].peak;
  }
#endif
  return -1;
}

}  // namespace

TransformerJobResult run_transformer_job(const MpiWorld& world, const std::map<std::string, at::Tensor>& inputs,
                                         const TransformerJobOptions& o) {
  // Everything that can fail on bad input happens first, then all ranks agree nobody failed.
  const ProcessMemory at_start = read_process_memory();
  ProcessMemory after_load;
  std::string error;
  at::Device device = at::kCPU;
  std::optional<WanTransformer> model;
  std::unique_ptr<WanOffloadRunner> runner;
  std::vector<WanBranchInputs> branches;
  std::int64_t my_passes = o.passes;
  try {
    device = pick_device(o.device, world);
    model.emplace(WanTransformer::load(o.model_dir + "/transformer", o.dtype, /*load_blocks=*/false));
    model->to_device(device);
    runner = std::make_unique<WanOffloadRunner>(*model, world.size());
    after_load = read_process_memory();  // the model built (views), nothing computed yet
    if (!o.random_latent.empty()) {
      DLO_CHECK(o.random_latent.size() == 4, "random inputs need F, H, W and the text length L");
      const auto& c = model->config();
      at::manual_seed(o.random_seed + static_cast<std::uint64_t>(world.rank()));
      const auto& r = o.random_latent;
      branches.push_back({at::randn({1, c.in_channels, r[0], r[1], r[2]}), at::tensor({500}, at::kLong),
                          at::randn({1, r[3], c.text_dim})});
      if (o.guidance) branches.push_back({branches[0].hidden_states, branches[0].timestep, at::randn({1, r[3], c.text_dim})});
    } else {
      branches.push_back({input(inputs, "hidden_states"), input(inputs, "timestep"), input(inputs, "encoder_hidden_states")});
      if (o.guidance)
        branches.push_back({branches[0].hidden_states, branches[0].timestep, input(inputs, "negative_encoder_hidden_states")});
    }
    // Validate the inputs now (shapes against the config), not mid-wave.
    for (const auto& b : branches) model->begin(b.hidden_states.slice(0, 0, 1), b.timestep.slice(0, 0, 1),
                                                b.encoder_hidden_states.slice(0, 0, 1));
    if (!o.rank_passes.empty()) {
      DLO_CHECK(static_cast<int>(o.rank_passes.size()) == world.size(), "--rank-passes lists ", o.rank_passes.size(),
                " counts for ", world.size(), " ranks");
      my_passes = o.rank_passes[static_cast<std::size_t>(world.rank())];
    }
    DLO_CHECK(my_passes >= 0, "pass counts must be >= 0");
  } catch (const Error& e) {
    error = e.what();
  }
  world.check_all(error);
  const WaveSchedule wave = agree_wave(world, my_passes, runner->plan().fingerprint());

  // Working memory: activations of a few blocks, a rough bound for "auto".
  const std::uint64_t tokens = static_cast<std::uint64_t>(branches[0].hidden_states.numel() / 4 + 512);
  const std::uint64_t working = tokens * static_cast<std::uint64_t>(model->config().ffn_dim) * 4 * 4 * branches.size();
  // All ranks must make the same choice: decide on rank 0 and broadcast.
  StrategyChoice choice = choose_strategy(o.offload, runner->plan().total_bytes(), working, device, world.size());
  const std::int64_t agreed = world.allgather(static_cast<std::int64_t>(choice.strategy))[0];
  if (agreed != static_cast<std::int64_t>(choice.strategy)) {
    choice.strategy = static_cast<Strategy>(agreed);
    choice.reason = "as rank 0 chose";
  }

  // From here on a failure on one rank would strand the others in a collective: abort them all.
  TransformerJobResult result;
  ProcessMemory before, after_pack;
  try {
    std::unique_ptr<Collective> collective;
    if (choice.strategy == Strategy::kDlo && world.size() > 1)
      collective = device.is_cuda() ? make_nccl_collective(world, device.index()) : make_mpi_collective(world);
    EngineOptions eo;
    eo.strategy = choice.strategy;
    eo.device = device;
    eo.keep_page_cache = o.keep_page_cache;
    if (o.fail_rank < 0 || o.fail_rank == world.rank()) eo.fail_at_block = o.fail_at_block;
    result.choice = str("offload: ", strategy_name(choice.strategy), " (", choice.reason, "); device ", device.str(),
                        "; ", world.size(), " rank(s); wave of ", wave.length, " pass(es)");
    before = read_process_memory();
    runner->start(eo, std::move(collective));
    after_pack = read_process_memory();
  } catch (const std::exception& e) {
    MpiWorld::abort(str(world.tag(), " setting up the offload engine: ", e.what()));
  }

  using Clock = std::chrono::steady_clock;
  nlohmann::ordered_json passes = nlohmann::ordered_json::array();
  for (std::int64_t p = 0; p < wave.length; ++p) {
    const double wait0 = runner->engine().stats().exposed_wait_s;
    const auto t0 = Clock::now();
    const bool compute = p < my_passes;
    try {
      if (compute) {
        auto outs = runner->forward(branches);
        if (device.is_cuda())
          for (auto& t : outs) t = t.to(at::kCPU);  // synchronises: the pass's time is real
        result.outputs["output"] = outs[0];
        if (o.guidance) result.outputs["output_negative"] = outs[1];
      } else {
        runner->ghost();
      }
    } catch (const std::exception& e) {
      // Mid-wave the other ranks are inside, or about to enter, a gather this rank would skip.
      MpiWorld::abort(str(world.tag(), " pass ", p, ": ", e.what()));
    }
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    const double exposed = runner->engine().stats().exposed_wait_s - wait0;
    passes.push_back({{"pass", p}, {"computed", compute}, {"wall_s", wall}, {"exposed_transfer_s", exposed},
                      {"compute_s", wall - exposed}});
  }

  const EngineStats es = runner->engine().stats();
  const ProcessMemory end = read_process_memory();
  nlohmann::ordered_json me = {
      {"rank", world.rank()},
      {"host", world.host()},
      {"local_rank", world.local_rank()},
      {"device", device.str()},
      {"strategy", es.strategy},
      {"passes", my_passes},
      {"guidance_branches", branches.size()},
      {"blocks", runner->plan().num_blocks()},
      {"block_bytes_total", runner->plan().total_bytes()},
      {"shard_bytes_total", choice.strategy == Strategy::kDlo ? es.host_bytes : 0},
      {"host_bytes", es.host_bytes},
      {"pinned_bytes", es.pinned_bytes},
      {"slot_bytes", es.slot_bytes},
      {"device_bytes", es.device_bytes},
      {"device_peak_bytes", device_peak_bytes(device)},
      {"bytes_streamed", es.bytes_streamed},
      {"bytes_gathered", es.bytes_gathered},
      {"blocks_acquired", es.blocks_acquired},
      {"pack_s", es.pack_s},
      {"rss_kb_at_start", at_start.rss_kb},
      {"rss_kb_after_model_load", after_load.rss_kb},
      {"rss_kb_before_engine", before.rss_kb},
      {"rss_kb_after_engine", after_pack.rss_kb},
      {"rss_kb", end.rss_kb},
      {"rss_peak_kb", end.hwm_kb},
      {"pss_kb", end.pss_kb},
      {"pss_anon_kb", end.pss_anon_kb},
      {"pss_file_kb", end.pss_file_kb},
      {"per_pass", passes},
  };
  auto all = world.gather_strings(me.dump());
  if (world.rank() == 0) {
    nlohmann::ordered_json report = {{"choice", result.choice}, {"ranks", nlohmann::ordered_json::array()}};
    for (const auto& s : all) report["ranks"].push_back(nlohmann::ordered_json::parse(s));
    result.report_json = report.dump(2) + "\n";
  }
  return result;
}

}  // namespace dlo
