#include "transformer_job.h"

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <thread>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "dlo/common/bytes.h"
#include "dlo/common/error.h"
#include "dlo/common/memory.h"
#include "dlo/common/partition.h"
#include "dlo/dist/collective.h"
#include "dlo/dist/device.h"
#include "dlo/dist/exchange_group.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/app/tool.h"
#include "dlo/models/tensor_view.h"
#include "dlo/models/wan_lora_fuse.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/offload/runner.h"
#include "dlo/offload/wave.h"
#include "dlo/offload/strategy.h"


namespace dlo {
namespace {

const at::Tensor& input(const std::map<std::string, at::Tensor>& in, const std::string& key) {
  auto it = in.find(key);
  DLO_CHECK(it != in.end(), "transformer: inputs lack '", key, "'");
  return it->second;
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
  double load_s = 0;                // reading the model (views) and any fused LoRAs' files
  std::uint64_t adapter_bytes = 0;  // the unfused LoRAs' adapters on the device
  // The ranks that compute one forward together (one group of SP, times 2 with CFG parallelism).
  const int job_ranks = std::max(1, o.sp) * (o.cfg_parallel ? 2 : 1);
  std::uint64_t working = 0;
  // The device, and two ranks on one GPU refused, before anything is loaded.
  const WaveDevice dev = agree_device(world, o.device, o.host_id, "--device");
  device = dev.device;
  try {
    const bool second = o.expert == "transformer_2";
    DLO_CHECK(!second || !o.model.transformer_2.empty() || std::filesystem::is_directory(o.model.folder("transformer_2")),
              "--component transformer_2: ", o.model.dir, " has no transformer_2/ (a model with one transformer)");
    const int expert = second ? 1 : 0;
    const WanTransformerConfig config = read_expert_config(o.model, second);
    const auto t_load = std::chrono::steady_clock::now();
    model.emplace(WanTransformer::load(second ? o.model.transformer_2_weights() : o.model.transformer_weights(), config,
                                       o.dtype, /*load_blocks=*/false, o.storage,
                                       fused_loras_for(o.model.fused_loras, expert, config)));
    load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    const auto& c = model->config();
    adapter_bytes = wan_job_adapter_bytes(o.loras, expert, c, o.dtype);
    const std::size_t nbranch = o.guidance ? 2 : 1;
    // The shapes of the run, checked before anything is allocated for it.
    if (!o.random_latent.empty()) {
      const auto& r = o.random_latent;
      DLO_CHECK(r.size() == 4, "random inputs need F, H, W and the text length L");
      for (auto v : r) DLO_CHECK(v > 0, "random inputs: F, H, W and L must be > 0");
      model->check_inputs(at::empty({1, c.in_channels, r[0], r[1], r[2]}, at::TensorOptions().device(at::kMeta)),
                          at::empty({1}, at::TensorOptions().dtype(at::kLong).device(at::kMeta)),
                          at::empty({1, r[3], c.text_dim}, at::TensorOptions().device(at::kMeta)));
      working = wan_forward_working_bytes(c, r[0], r[1], r[2], r[3], static_cast<std::int64_t>(nbranch), from_scalar_type(o.dtype));
    } else {
      const at::Tensor& x = input(inputs, "hidden_states");
      const at::Tensor& t = input(inputs, "timestep");
      const at::Tensor& ctx = input(inputs, "encoder_hidden_states");
      model->check_inputs(x, t, ctx);
      if (o.guidance) {
        const at::Tensor& neg = input(inputs, "negative_encoder_hidden_states");
        with_context("negative_encoder_hidden_states", [&] { model->check_inputs(x, t, neg); });
      }
      working = static_cast<std::uint64_t>(x.size(0)) *
                wan_forward_working_bytes(c, x.size(2), x.size(3), x.size(4), ctx.size(1),
                                          static_cast<std::int64_t>(nbranch), from_scalar_type(o.dtype));
    }
    working += adapter_bytes;  // on the device beside the activations
    // Refuse, with the figure, a run that cannot fit: on the CPU every rank of the node shares
    // the host memory (the strategy's own needs are checked by choose_strategy below).
    std::uint64_t avail = 0;
    const std::uint64_t need = device.is_cpu() ? working * static_cast<std::uint64_t>(world.local_size()) : working;
    if (device.is_cpu()) {
      avail = available_memory_bytes();
    } else {
      const DeviceMemory m = device_memory(device, /*release_cache=*/true);
      avail = m.free > 0 ? static_cast<std::uint64_t>(m.free) : 0;
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
      at::manual_seed(o.random_seed + static_cast<std::uint64_t>(world.rank() / job_ranks));
      const auto& r = o.random_latent;
      branches.push_back({at::randn({1, c.in_channels, r[0], r[1], r[2]}), at::tensor({500}, at::kLong),
                          at::randn({1, r[3], c.text_dim})});
      if (o.guidance) branches.push_back({branches[0].hidden_states, branches[0].timestep, at::randn({1, r[3], c.text_dim})});
    } else {
      branches.push_back({input(inputs, "hidden_states"), input(inputs, "timestep"), input(inputs, "encoder_hidden_states")});
      if (o.guidance)
        branches.push_back({branches[0].hidden_states, branches[0].timestep, input(inputs, "negative_encoder_hidden_states")});
    }
    if (!o.loras.empty()) {
      const std::shared_ptr<const WanAdapters> adapters = wan_job_adapters(o.loras, expert, c, o.dtype, device);
      for (auto& b : branches) b.adapters = adapters;
    }
    if (!o.rank_passes.empty()) {
      DLO_CHECK(static_cast<int>(o.rank_passes.size()) == world.size(), "--rank-passes lists ", o.rank_passes.size(),
                " counts for ", world.size(), " ranks");
      my_passes = o.rank_passes[static_cast<std::size_t>(world.rank())];
    }
    DLO_CHECK(my_passes >= 0, "pass counts must be >= 0");
    if (o.cfg_parallel) {
      DLO_CHECK(o.guidance, "--cfg-parallel needs --guidance (the two branches it puts on partner ranks)");
      DLO_CHECK(world.size() % job_ranks == 0, "--cfg-parallel: ", world.size(), " rank(s) are not a multiple of 2 x --sp (",
                job_ranks, ")");
      DLO_CHECK(o.rank_passes.empty(), "--cfg-parallel with --rank-passes: partner ranks compute the same passes");
    }
    if (o.sp != 1) {
      DLO_CHECK(o.sp >= 1 && o.sp <= world.size(), "--sp ", o.sp, ": a group of 1 to ", world.size(), " rank(s)");
      DLO_CHECK(o.rank_passes.empty(), "--sp with --rank-passes: the ranks of a group compute the same passes");
      const at::Tensor& x = branches[0].hidden_states;
      const std::int64_t tokens = wan_tokens(c, x.size(2), x.size(3), x.size(4));
      const auto largest = static_cast<std::int64_t>(std::min(o.sp, world.size()));
      with_context("--sp", [&] {
        (void)Partition::even(c.num_attention_heads, largest, "the attention heads");
        (void)Partition::even(tokens, largest, "the tokens");
      });
    }
  } catch (const Error& e) {
    error = e.what();
  } catch (const std::exception& e) {
    // libtorch errors and failed allocations while loading: a message, not a stranded rank.
    error = describe_exception(e);
  }
  if (o.test_hook) o.test_hook("loaded");
  world.check_all(error, "start-up check (model and inputs loaded on every rank)");
  const WaveSchedule wave = agree_wave(world, my_passes, runner->plan().fingerprint());
  // Groups (collective): MPI communicators on the CPU, peers on one NCCL communicator on CUDA.
  const std::unique_ptr<ExchangeNetwork> net = o.sp > 1 || o.cfg_parallel ? make_exchange_network(world, device) : nullptr;
  const std::unique_ptr<ExchangeGroup> group = o.sp > 1 ? net->split(world.rank() / o.sp, "sequence-parallel groups") : nullptr;
  // CFG partners: the ranks at the same place in the two halves of a job's ranks.
  const int sp = std::max(1, o.sp);
  const std::unique_ptr<ExchangeGroup> partners =
      o.cfg_parallel ? net->split(world.rank() / job_ranks * sp + world.rank() % sp, "CFG partners") : nullptr;
  // The rank that computed writes: the lowest one with passes (rank 0 may have none).
  TransformerJobResult result;
  result.writer_rank = -1;
  for (int r = 0; r < world.size() && result.writer_rank < 0; ++r)
    if (wave.passes[static_cast<std::size_t>(r)] > 0) result.writer_rank = r;
  DLO_CHECK(result.writer_rank >= 0, "no rank has a pass to compute (every pass count is 0): nothing would be written");

  // The choice, from budgets every rank agreed on (the least over the ranks), so it is the same
  // everywhere; a strategy that cannot fit is refused on every rank alike, before the engine.
  const StrategyChoice choice =
      agree_strategy(world, o.offload, runner->plan(), working, device, dev.sharing, o.device_budget);
  // From here on a failure on one rank would strand the others in a collective: start_engine
  // aborts them all.
  EngineOptions eo;
  eo.keep_page_cache = o.keep_page_cache;
  if (o.fail_rank < 0 || o.fail_rank == world.rank()) eo.fail_at_block = o.fail_at_block;
  eo.jitter_us = o.jitter_us;
  eo.jitter_seed = 1000 + static_cast<std::uint64_t>(world.rank());
  std::mt19937_64 jitter(2000 + static_cast<std::uint64_t>(world.rank()));
  const std::function<void(std::int64_t)> before_block =
      o.jitter_us > 0 ? std::function<void(std::int64_t)>([&](std::int64_t) {
        std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<std::int64_t>(0, o.jitter_us)(jitter)));
      })
                      : std::function<void(std::int64_t)>();
  result.choice = str("offload: ", strategy_name(choice.strategy), " (", choice.reason, "); device ", device.str(), "; ",
                      world.size(), " rank(s); wave of ", wave.length, " pass(es)");
  const ProcessMemory before = read_process_memory();
  const auto t_engine = std::chrono::steady_clock::now();
  start_engine(world, *runner, choice, device, eo);
  const double engine_start_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_engine).count();
  const ProcessMemory after_pack = read_process_memory();
  const DeviceMemory at_engine = device_memory(device);

  using Clock = std::chrono::steady_clock;
  nlohmann::ordered_json passes = nlohmann::ordered_json::array();
  for (std::int64_t p = 0; p < wave.length; ++p) {
    const double wait0 = runner->engine().stats().exposed_wait_s;
    const auto t0 = Clock::now();
    const bool compute = p < my_passes;
    try {
      if (compute) {
        auto outs = partners ? runner->forward_cfg(*partners, group.get(), branches, {}, before_block)
                    : group  ? runner->forward_group(*group, branches, {}, before_block)
                             : runner->forward(branches, before_block);
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
  const DeviceMemory dm = device_memory(device);
  nlohmann::ordered_json me = {
      {"rank", world.rank()},
      {"host", world.host()},
      {"local_rank", world.local_rank()},
      {"device", device.str()},
      {"passes", my_passes},
      {"sp_group", group ? world.rank() / o.sp : world.rank()},
      {"sp_group_size", group ? group->size() : 1},
      {"cfg_partners", partners ? partners->size() : 1},
      {"branches_computed_per_pass", partners ? 1 : static_cast<int>(branches.size())},
      {"guidance_branches", branches.size()},
      {"blocks", runner->plan().num_blocks()},
      {"block_bytes_total", runner->plan().total_bytes()},
      {"shard_bytes_total", is_sharded(choice.strategy) ? stack_size(runner->plan()).shards_total() : 0},
      {"device_blocks", choice.device_blocks},
      {"working_bytes_estimate", working},
      {"adapter_bytes", adapter_bytes},
      {"load_s", load_s},
      {"engine_start_s", engine_start_s},
      {"device_total_bytes", dm.total},
      {"device_used_bytes_after_engine_start", at_engine.used},
      {"device_used_bytes_at_end", dm.used},
      {"allocator_reserved_peak_bytes", dm.allocator_reserved_peak},
      {"allocator_allocated_peak_bytes", dm.allocator_allocated_peak},
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
