#include "dlo/offload/transformer_job.h"

#include <chrono>
#include <optional>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "dlo/common/bytes.h"
#include "dlo/common/error.h"
#include "dlo/common/memory.h"
#include "dlo/dist/collective.h"
#include "dlo/dist/mpi_world.h"
#include "dlo/dist/tool.h"
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

// Host or device bytes one forward needs beyond the weights, at its peak (one block at a time, all
// branches): per branch about 12 hidden-state-sized fp32 tensors, 3 of the feed-forward's width,
// the projected text, and the branch's inputs and output. Generous on purpose: it refuses only
// runs that cannot fit.
std::uint64_t forward_working_bytes(const WanTransformerConfig& c, std::int64_t batch, std::int64_t frames,
                                    std::int64_t height, std::int64_t width, std::int64_t text_len,
                                    std::size_t branches) {
  const auto& p = c.patch_size;
  const double tokens = static_cast<double>(batch) * static_cast<double>(frames / p[0]) *
                        static_cast<double>(height / p[1]) * static_cast<double>(width / p[2]);
  const double latent = static_cast<double>(batch) * static_cast<double>(c.in_channels + c.out_channels) *
                        static_cast<double>(frames) * static_cast<double>(height) * static_cast<double>(width);
  const double text = static_cast<double>(batch) * static_cast<double>(text_len) *
                      static_cast<double>(c.dim() + c.text_dim) * 2;
  const double per_branch = 4.0 * (tokens * static_cast<double>(12 * c.dim() + 3 * c.ffn_dim) + latent + text);
  const double total = per_branch * static_cast<double>(branches);
  return total >= 1.8e19 ? UINT64_MAX : static_cast<std::uint64_t>(total);
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
  std::uint64_t working = 0;
  try {
    device = pick_device(o.device, world);
    model.emplace(WanTransformer::load(o.model_dir + "/transformer", o.dtype, /*load_blocks=*/false));
    const auto& c = model->config();
    const std::size_t nbranch = o.guidance ? 2 : 1;
    // The shapes of the run, checked before anything is allocated for it.
    if (!o.random_latent.empty()) {
      const auto& r = o.random_latent;
      DLO_CHECK(r.size() == 4, "random inputs need F, H, W and the text length L");
      for (auto v : r) DLO_CHECK(v > 0, "random inputs: F, H, W and L must be > 0");
      model->check_inputs(at::empty({1, c.in_channels, r[0], r[1], r[2]}, at::TensorOptions().device(at::kMeta)),
                          at::empty({1}, at::TensorOptions().dtype(at::kLong).device(at::kMeta)),
                          at::empty({1, r[3], c.text_dim}, at::TensorOptions().device(at::kMeta)));
      working = forward_working_bytes(c, 1, r[0], r[1], r[2], r[3], nbranch);
    } else {
      const at::Tensor& x = input(inputs, "hidden_states");
      const at::Tensor& t = input(inputs, "timestep");
      const at::Tensor& ctx = input(inputs, "encoder_hidden_states");
      model->check_inputs(x, t, ctx);
      if (o.guidance) {
        const at::Tensor& neg = input(inputs, "negative_encoder_hidden_states");
        with_context("negative_encoder_hidden_states", [&] { model->check_inputs(x, t, neg); });
      }
      working = forward_working_bytes(c, x.size(0), x.size(2), x.size(3), x.size(4), ctx.size(1), nbranch);
    }
    // Refuse, with the figure, a run that cannot fit: on the CPU every rank of the node shares
    // the host memory.
    std::uint64_t avail = 0;
    const std::uint64_t need = device.is_cpu() ? working * static_cast<std::uint64_t>(world.local_size()) : working;
    if (device.is_cpu()) {
      avail = available_memory_bytes();
    } else {
#ifdef DLO_HAVE_CUDA
      std::size_t free = 0, total = 0;
      if (cudaSetDevice(device.index()) == cudaSuccess && cudaMemGetInfo(&free, &total) == cudaSuccess) avail = free;
#endif
    }
    DLO_CHECK(avail == 0 || need <= avail, "out of memory: this run needs about ", human_bytes(need),
              " of working memory for its activations", device.is_cpu() && world.local_size() > 1
                  ? str(" (", world.local_size(), " ranks on this node)") : std::string(),
              " but ", human_bytes(avail), " is available on ", device.is_cpu() ? "the host" : device.str(),
              "; use smaller latents or fewer ranks per node");
    model->to_device(device);
    runner = std::make_unique<WanOffloadRunner>(*model, world.size());
    after_load = read_process_memory();  // the model built (views), nothing computed yet
    if (!o.random_latent.empty()) {
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
    if (!o.rank_passes.empty()) {
      DLO_CHECK(static_cast<int>(o.rank_passes.size()) == world.size(), "--rank-passes lists ", o.rank_passes.size(),
                " counts for ", world.size(), " ranks");
      my_passes = o.rank_passes[static_cast<std::size_t>(world.rank())];
    }
    DLO_CHECK(my_passes >= 0, "pass counts must be >= 0");
  } catch (const Error& e) {
    error = e.what();
  } catch (const std::exception& e) {
    // libtorch errors and failed allocations while loading: a message, not a stranded rank.
    error = describe_exception(e);
  }
  if (o.test_hook) o.test_hook("loaded");
  world.check_all(error, "start-up check (model and inputs loaded on every rank)");
  const WaveSchedule wave = agree_wave(world, my_passes, runner->plan().fingerprint());
  // The rank that computed writes: the lowest one with passes (rank 0 may have none).
  TransformerJobResult result;
  result.writer_rank = -1;
  for (int r = 0; r < world.size() && result.writer_rank < 0; ++r)
    if (wave.passes[static_cast<std::size_t>(r)] > 0) result.writer_rank = r;
  DLO_CHECK(result.writer_rank >= 0, "no rank has a pass to compute (every pass count is 0): nothing would be written");

  // All ranks must make the same choice: decide on rank 0 and broadcast.
  StrategyChoice choice = choose_strategy(o.offload, runner->plan().total_bytes(), working, device, world.size());
  const std::int64_t agreed = world.allgather(static_cast<std::int64_t>(choice.strategy), "strategy agreement")[0];
  if (agreed != static_cast<std::int64_t>(choice.strategy)) {
    choice.strategy = static_cast<Strategy>(agreed);
    choice.reason = "as rank 0 chose";
  }

  // From here on a failure on one rank would strand the others in a collective: abort them all.
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
    MpiWorld::abort(str(world.tag(), " setting up the offload engine: ", describe_exception(e)));
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
      MpiWorld::abort(str(world.tag(), " pass ", p, ": ", describe_exception(e)));
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
      {"passes", my_passes},
      {"guidance_branches", branches.size()},
      {"blocks", runner->plan().num_blocks()},
      {"block_bytes_total", runner->plan().total_bytes()},
      {"shard_bytes_total", choice.strategy == Strategy::kDlo ? es.host_bytes : 0},
      {"device_peak_bytes", device_peak_bytes(device)},
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
  me.update(nlohmann::ordered_json::parse(engine_stats_json(es)));
  // The output first: a rank stuck in the gather below must not keep it from being written.
  if (world.rank() == result.writer_rank && o.write_output) {
    try {
      o.write_output(result.outputs);
    } catch (const std::exception& e) {
      result.output_error = describe_exception(e);
    }
  }
  if (o.test_hook) o.test_hook("report");
  auto all = world.gather_strings(me.dump(), 0, "closing report gather");
  if (world.rank() == 0) {
    nlohmann::ordered_json report = {{"choice", result.choice}, {"ranks", nlohmann::ordered_json::array()}};
    for (const auto& s : all) report["ranks"].push_back(nlohmann::ordered_json::parse(s));
    result.report_json = report.dump(2) + "\n";
  }
  return result;
}

}  // namespace dlo
