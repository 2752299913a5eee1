#include "dlo/pipeline/generate.h"

#include <chrono>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/common/memory.h"
#include "dlo/common/sha256.h"
#include "dlo/dist/collective.h"
#include "dlo/dist/device.h"
#include "dlo/dist/mpi_world.h"
#include "dlo/io/safetensors_writer.h"
#include "dlo/io/tensor_view.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/models/wan_vae.h"
#include "dlo/offload/runner.h"
#include "dlo/pipeline/prompt_encoder.h"

namespace dlo {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One job on its rank: its prompt embeddings, latents and scheduler state between phases.
struct Work {
  JobSpec job;
  JobResult result;
  at::Tensor context, negative_context;  // [1, 512, text_dim], transformer dtype, on the device
  at::Tensor latents;                    // [1, C, F, h, w] on the device
  std::unique_ptr<NoiseScheduler> scheduler;
};

json result_json(const JobResult& r) {
  return {{"id", r.id},
          {"status", r.status},
          {"error", r.error},
          {"rank", r.rank},
          {"output", r.output},
          {"frames_sha256", r.frames_sha256},
          {"frames", r.frames},
          {"height", r.height},
          {"width", r.width},
          {"text_s", r.text_s},
          {"denoise_s", r.denoise_s},
          {"decode_s", r.decode_s},
          {"step_s", r.step_s},
          {"rss_peak_kb", r.rss_peak_kb},
          {"parameters", json::parse(r.parameters_json.empty() ? "{}" : r.parameters_json)}};
}

JobResult result_from_json(const json& j) {
  JobResult r;
  r.id = j.at("id");
  r.status = j.at("status");
  r.error = j.at("error");
  r.rank = j.at("rank");
  r.output = j.at("output");
  r.frames_sha256 = j.at("frames_sha256");
  r.frames = j.at("frames");
  r.height = j.at("height");
  r.width = j.at("width");
  r.text_s = j.at("text_s");
  r.denoise_s = j.at("denoise_s");
  r.decode_s = j.at("decode_s");
  r.step_s = j.at("step_s").get<std::vector<double>>();
  r.rss_peak_kb = j.at("rss_peak_kb");
  r.parameters_json = j.at("parameters").dump();
  return r;
}

std::string describe(const std::vector<FieldError>& errors, const JobSpec& job) {
  std::string s = str("job '", job.id, "':");
  for (const auto& e : errors) s += str("\n  ", e.field, ": ", e.message);
  return s;
}

// Phase 2: the prompt (and, with guidance, the negative prompt) through the text encoder.
void encode_text(Work& w, const ModelInfo& model, const GenerateOptions& o, c10::Device device) {
  const auto t0 = Clock::now();
  const PromptEncoder encoder(model.dir, o.dtype);
  w.context = encoder.encode(w.job.prompt).to(device, o.dtype);
  if (w.job.guided()) w.negative_context = encoder.encode(w.job.negative_prompt).to(device, o.dtype);
  w.result.text_s = since(t0);
}

// One denoising step of WanPipeline's loop, the transformer's blocks coming from the engine.
void denoise_step(Work& w, WanOffloadRunner& runner, at::ScalarType dtype) {
  const std::int64_t i = w.scheduler->step_index();
  const at::Tensor x = w.latents.to(dtype);
  const at::Tensor t = w.scheduler->timesteps()[i].to(x.device()).expand({x.size(0)});
  std::vector<WanBranchInputs> branches{{x, t, w.context}};
  if (w.job.guided()) branches.push_back({x, t, w.negative_context});
  const std::vector<at::Tensor> out = runner.forward(branches);
  at::Tensor noise = out[0];
  if (w.job.guided()) noise = out[1] + w.job.guidance * (out[0] - out[1]);
  w.latents = w.scheduler->step(noise, w.latents);
}

void save_latents(const Work& w, const ModelInfo& model) {
  const at::Tensor lat = w.latents.to(at::kCPU).contiguous();
  std::vector<std::int64_t> shape(lat.sizes().begin(), lat.sizes().end());
  write_safetensors_file(
      w.job.save_latents, {TensorSpec{"latents", from_scalar_type(lat.scalar_type()), shape}},
      [&](std::size_t, const TensorSpec& spec, std::byte* out) { std::memcpy(out, lat.data_ptr(), spec.nbytes()); },
      {{"format", "pt"}, {"dlo_job", job_parameters_json(w.job, model)}});
}

// Phase 4: VAE decode, chunk by chunk, into uint8 frames, the sink and the hash.
void decode(Work& w, const ModelInfo& model, const GenerateOptions& o, const GenerateCallbacks& cb) {
  const auto t0 = Clock::now();
  const WanVae vae = WanVae::load(model.dir + "/vae", o.vae_dtype);
  const at::Tensor z = vae.denormalize(w.latents.to(at::kCPU));
  const std::int64_t frames = vae.config().output_frames(z.size(2));
  const std::int64_t height = z.size(3) * vae.config().scale_factor_spatial;
  const std::int64_t width = z.size(4) * vae.config().scale_factor_spatial;
  std::unique_ptr<FrameSink> sink = cb.open_sink ? cb.open_sink(w.job, width, height, frames) : nullptr;
  Sha256 sha;
  const std::size_t frame_bytes = static_cast<std::size_t>(height * width * 3);
  vae.decode_frames(z, [&](std::int64_t, const at::Tensor& chunk) {
    const at::Tensor u8 = frames_to_uint8(chunk);
    for (std::int64_t f = 0; f < u8.size(0); ++f) {
      const std::uint8_t* p = u8[f].data_ptr<std::uint8_t>();
      sha.update(p, frame_bytes);
      if (sink) sink->add_frame(p);
    }
  });
  if (sink) sink->finish();
  w.result.frames_sha256 = sha.hex_digest();
  w.result.frames = frames;
  w.result.height = height;
  w.result.width = width;
  w.result.decode_s = since(t0);
}

}  // namespace

at::Tensor initial_latents(const std::vector<std::int64_t>& shape, std::uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat));
}

at::Tensor frames_to_uint8(const at::Tensor& chunk) {
  DLO_ASSERT(chunk.dim() == 5 && chunk.size(0) == 1 && chunk.size(1) == 3, "chunk ", chunk.sizes());
  // [1, 3, n, H, W] -> [n, 3, H, W] as postprocess_video permutes; elementwise ops do not care.
  const at::Tensor x = (chunk[0].permute({1, 0, 2, 3}) * 0.5 + 0.5).clamp(0, 1);
  return (x.to(at::kFloat) * 255).to(at::kByte).permute({0, 2, 3, 1}).contiguous().to(at::kCPU);
}

std::string report_json(const GenerateReport& report) {
  json j = {{"choice", report.choice}, {"jobs", json::array()}};
  for (const auto& r : report.jobs) j["jobs"].push_back(result_json(r));
  j["ranks"] = report.ranks_json.empty() ? json::array() : json::parse(report.ranks_json);
  return j.dump(2);
}

GenerateReport generate(const MpiWorld& world, const ModelInfo& model, const std::vector<JobSpec>& my_jobs,
                        const GenerateOptions& o, const GenerateCallbacks& cb) {
  DLO_ASSERT(my_jobs.size() <= 1, "one job per rank per run");
  auto phase = [&](const char* name) {
    if (cb.on_phase) cb.on_phase(name);
  };
  const ProcessMemory at_start = read_process_memory();

  // Phases 1 and 2: checks, then the text encoder, before any block weight is packed.
  std::string error;
  c10::Device device = c10::kCPU;
  std::optional<Work> work;
  std::optional<WanTransformer> transformer;
  std::unique_ptr<WanOffloadRunner> runner;
  try {
    device = pick_device(o.device, world, "device");
    for (const JobSpec& job : my_jobs) {
      const auto errors = validate_job(job, model);
      DLO_CHECK(errors.empty(), describe(errors, job));
      work.emplace();
      work->job = job;
      work->result.id = job.id;
      work->result.rank = world.rank();
      work->result.output = job.output;
      work->result.parameters_json = job_parameters_json(job, model);
      work->scheduler = make_noise_scheduler(job_scheduler_config(job, model));
      work->scheduler->set_timesteps(job.steps);
      work->latents = initial_latents(model.latent_shape(job), job.seed).to(device);
    }
    if (work) {
      phase("text");
      with_context(str("job '", work->job.id, "': encoding the prompt"), [&] { encode_text(*work, model, o, device); });
    }
    transformer.emplace(WanTransformer::load(model.dir + "/transformer", o.dtype, /*load_blocks=*/false));
    transformer->to_device(device);
    runner = std::make_unique<WanOffloadRunner>(*transformer, world.size());
  } catch (const Error& e) {
    error = e.what();
  }
  world.check_all(error);
  const std::int64_t my_steps = work ? work->job.steps : 0;
  const WaveSchedule wave = agree_wave(world, my_steps, runner->plan().fingerprint());

  // Working memory for "auto": activations of a few blocks of the largest job (a rough bound).
  std::uint64_t working = 0;
  if (work) {
    const auto& c = transformer->config();
    const auto tokens = static_cast<std::uint64_t>(work->latents.numel() / c.in_channels / 4 + 512);
    working = tokens * static_cast<std::uint64_t>(c.ffn_dim) * 4 * 4 * (work->job.guided() ? 2 : 1);
  }
  const std::int64_t max_working = world.allreduce_max(static_cast<std::int64_t>(working));
  StrategyChoice choice = choose_strategy(o.offload, runner->plan().total_bytes(),
                                          static_cast<std::uint64_t>(max_working), device, world.size());
  const std::int64_t agreed = world.allgather(static_cast<std::int64_t>(choice.strategy))[0];
  if (agreed != static_cast<std::int64_t>(choice.strategy)) choice = {static_cast<Strategy>(agreed), "as rank 0 chose"};

  GenerateReport report;
  report.choice = str("offload: ", strategy_name(choice.strategy), " (", choice.reason, "); device ", device.str(), "; ",
                      world.size(), " rank(s); ", wave.length, " traversal(s)");

  // Phase 3: the engine and the wave. A failure here would strand the other ranks in a gather.
  try {
    std::unique_ptr<Collective> collective;
    if (choice.strategy == Strategy::kDlo && world.size() > 1)
      collective = device.is_cuda() ? make_nccl_collective(world, device.index()) : make_mpi_collective(world);
    EngineOptions eo;
    eo.strategy = choice.strategy;
    eo.device = device;
    eo.keep_page_cache = o.keep_page_cache;
    runner->start(eo, std::move(collective));
  } catch (const std::exception& e) {
    MpiWorld::abort(str(world.tag(), " setting up the offload engine: ", e.what()));
  }
  if (work) phase("denoise");
  const auto denoise_t0 = Clock::now();
  const auto blocks = static_cast<std::uint64_t>(runner->plan().num_blocks());
  for (std::int64_t p = 0; p < wave.length; ++p) {
    const auto t0 = Clock::now();
    const bool compute = p < my_steps && work->result.status == "ok";
    const std::uint64_t acquired0 = runner->engine().stats().blocks_acquired;
    try {
      if (compute) {
        denoise_step(*work, *runner, o.dtype);
        if (device.is_cuda()) (void)work->latents.flatten()[0].item<float>();  // the step's time is real
      } else {
        runner->ghost();
      }
    } catch (const std::exception& e) {
      // A failure of the job's own computation fails the job; the rank keeps every later pass
      // (as a ghost) so the others' gathers complete. A failure inside a transfer leaves the
      // collective out of step: that ends every rank.
      const std::uint64_t acquired = runner->engine().stats().blocks_acquired - acquired0;
      const bool transfer_ok = compute && (acquired == 0 || acquired == blocks);
      if (!transfer_ok) MpiWorld::abort(str(world.tag(), " denoising step ", p + 1, ": ", e.what()));
      if (acquired == 0) runner->ghost();
      work->result.status = "failed";
      work->result.error = str("job '", work->job.id, "': denoising step ", p + 1, ": ", e.what());
    }
    if (compute && work->result.status == "ok") {
      const double s = since(t0);
      work->result.step_s.push_back(s);
      if (cb.on_step) cb.on_step({work->job.id, p + 1, my_steps, s});
    }
  }
  if (work) work->result.denoise_s = since(denoise_t0);
  const EngineStats es = runner->engine().stats();
  runner.reset();  // frees the slots (and shards) before the VAE needs memory
  transformer.reset();

  // Phase 4: decode and write (rank-local; a failure stays with its job).
  if (work && work->result.status == "ok") {
    phase("decode");
    try {
      with_context(str("job '", work->job.id, "'"), [&] {
        if (!work->job.save_latents.empty()) save_latents(*work, model);
        decode(*work, model, o, cb);
      });
    } catch (const std::exception& e) {
      work->result.status = "failed";
      work->result.error = e.what();
    }
  }
  if (work) work->result.rss_peak_kb = read_process_memory().hwm_kb;

  // Phase 5: results to rank 0.
  const ProcessMemory end = read_process_memory();
  json me = {{"rank", world.rank()},
             {"host", world.host()},
             {"device", device.str()},
             {"strategy", es.strategy},
             {"steps", my_steps},
             {"host_bytes", es.host_bytes},
             {"pinned_bytes", es.pinned_bytes},
             {"slot_bytes", es.slot_bytes},
             {"device_bytes", es.device_bytes},
             {"device_peak_bytes", device_peak_bytes(device)},
             {"bytes_streamed", es.bytes_streamed},
             {"bytes_gathered", es.bytes_gathered},
             {"blocks_acquired", es.blocks_acquired},
             {"exposed_wait_s", es.exposed_wait_s},
             {"pack_s", es.pack_s},
             {"rss_kb_at_start", at_start.rss_kb},
             {"rss_peak_kb", end.hwm_kb},
             {"jobs", json::array()}};
  if (work) me["jobs"].push_back(result_json(work->result));
  const auto all = world.gather_strings(me.dump());
  if (world.rank() == 0) {
    json ranks = json::array();
    for (const auto& s : all) {
      json r = json::parse(s);
      for (const auto& j : r["jobs"]) report.jobs.push_back(result_from_json(j));
      r.erase("jobs");
      ranks.push_back(r);
    }
    report.ranks_json = ranks.dump(2);
  } else if (work) {
    report.jobs.push_back(work->result);
  }
  return report;
}

}  // namespace dlo
