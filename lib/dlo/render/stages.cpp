#include "dlo/render/stages.h"

#include <chrono>
#include <cstring>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "dlo/common/clock.h"
#include "dlo/common/error.h"
#include "dlo/common/memory.h"
#include "dlo/common/sha256.h"
#include "dlo/io/safetensors_writer.h"
#include "dlo/models/tensor_view.h"
#include "dlo/models/torch_errors.h"
#include "dlo/models/wan_lora_fuse.h"
#include "dlo/models/wan_vae.h"
#include "dlo/offload/engine.h"
#include "dlo/offload/runner.h"
#include "dlo/render/prompt_encoder.h"

namespace dlo {
namespace {

using Clock = SteadyClock;

void save_latents_safetensors(const BatchJob& job, const ModelInfo& model, const at::Tensor& latents) {
  const at::Tensor lat = latents.to(at::kCPU).contiguous();
  std::vector<std::int64_t> shape(lat.sizes().begin(), lat.sizes().end());
  write_safetensors_file(
      job.spec.save_latents, {TensorSpec{"latents", from_scalar_type(lat.scalar_type()), shape}},
      [&](std::size_t, const TensorSpec& spec, std::byte* out) { std::memcpy(out, lat.data_ptr(), spec.nbytes()); },
      {{"format", "pt"}, {"dlo_job", job_parameters_json(job.spec, model, job.fingerprint)}});
}

}  // namespace

JobRun::JobRun(BatchJob j, const ModelInfo& model, int rank) : job(std::move(j)) {
  result.id = job.spec.id;
  result.index = job.index;
  result.rank = rank;
  result.output = job.spec.output;
  result.parameters_json = job_parameters_json(job.spec, model);
  result.fingerprint = job.fingerprint;
}

int JobRun::expert() const {
  if (!boundary_timestep || steps_left() <= 0) return 0;
  const double t = scheduler->timesteps()[scheduler->step_index()].item<double>();
  return static_cast<float>(t) >= *boundary_timestep ? 0 : 1;
}

void JobRun::fail(const std::string& what) {
  if (failed()) return;
  result.status = JobStatus::kFailed;
  result.error = what;
}

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

namespace {

// WanPipeline: boundary_ratio * scheduler.config.num_train_timesteps, in double (Python floats),
// compared in fp32 (see JobRun::boundary_timestep).
float boundary_timestep_of(const JobSpec& job, const ModelInfo& model, const NoiseSchedulerConfig& sc) {
  const double ratio = job.boundary_ratio.value_or(model.boundary_ratio.value_or(0));
  return static_cast<float>(ratio * static_cast<double>(sc.num_train_timesteps));
}

}  // namespace

std::int64_t high_noise_steps(const JobSpec& job, const ModelInfo& model) {
  if (!model.two_experts()) return job.steps;
  const NoiseSchedulerConfig sc = job_scheduler_config(job, model);
  const auto scheduler = make_noise_scheduler(sc);
  scheduler->set_timesteps(job.steps);
  const float boundary = boundary_timestep_of(job, model, sc);
  const at::Tensor ts = scheduler->timesteps().to(at::kDouble).contiguous();
  const std::int64_t n = std::min<std::int64_t>(job.steps, ts.size(0));
  const double* t = ts.data_ptr<double>();
  std::int64_t high = 0;
  while (high < n && static_cast<float>(t[high]) >= boundary) ++high;
  return high;
}

void prepare_schedule(JobRun& run, const ModelInfo& model) {
  const JobSpec& job = run.job.spec;
  const NoiseSchedulerConfig sc = job_scheduler_config(job, model);
  run.scheduler = make_noise_scheduler(sc);
  run.scheduler->set_timesteps(job.steps);
  if (model.two_experts()) {
    run.boundary_timestep = boundary_timestep_of(job, model, sc);
    run.guidance_2 = job.guidance_2.value_or(job.guidance);
  }
  run.per_token_timesteps = model.expand_timesteps;
}

void prepare_job(JobRun& run, const PromptEncoder& text, const ModelInfo& model, at::ScalarType dtype,
                 c10::Device device) {
  const JobSpec& job = run.job.spec;
  with_context(str("job '", job.id, "': encoding the prompt"), [&] {
    run.context = text.encode(job.prompt).to(device, dtype);
    if (job.guided()) run.negative_context = text.encode(job.negative_prompt).to(device, dtype);
  });
  prepare_schedule(run, model);
  if (!job.loras.empty())
    with_context(str("job '", job.id, "': its LoRAs"), [&] {
      const std::vector<LoraSpec> loras = parse_lora_list(job.loras, "loras");
      const std::vector<WanTransformerConfig> configs = model.expert_configs();
      for (std::size_t e = 0; e < configs.size(); ++e)
        run.adapters.push_back(wan_job_adapters(loras, static_cast<int>(e), configs[e], dtype, device));
    });
  run.latents = initial_latents(model.latent_shape(job.frames, job.height, job.width), job.seed).to(device);
}

void denoise_step(WanOffloadRunner& runner, JobRun& run, at::ScalarType dtype, const BlockHook& hook,
                  const std::vector<BlockEngine*>& pass, const StepGroups& groups) {
  const JobSpec& job = run.job.spec;
  // Before the traversal: a failure here joins the pass as a ghost, so only this job fails; in a
  // group the failing rank's branches go in empty, so the group's forward fails on every rank.
  std::vector<WanBranchInputs> branches;
  std::int64_t i = 0;
  double guidance = 0;
  std::string inputs_failed;
  try {
    DLO_CHECK(run.scheduler, "the job was not prepared on this rank");
    i = run.scheduler->step_index();
    guidance = run.guidance_now();
    if (hook) hook(i + 1, -1);
    const at::Tensor x = run.latents.to(dtype);
    at::Tensor t = run.scheduler->timesteps()[i].to(x.device());
    if (run.per_token_timesteps) {
      // WanPipeline: (mask[0][0][:, ::2, ::2] * t).flatten().unsqueeze(0).expand(B, -1), mask = ones
      // in fp32 of the latents' shape: fp32 t per token (a [1, 2, 2] patch, checked with the model).
      const at::Tensor mask = at::ones({x.size(2), (x.size(3) + 1) / 2, (x.size(4) + 1) / 2},
                                       at::TensorOptions().dtype(at::kFloat).device(x.device()));
      t = (mask * t).flatten().unsqueeze(0).expand({x.size(0), -1});
    } else {
      t = t.expand({x.size(0)});
    }
    const std::size_t expert = static_cast<std::size_t>(run.expert());
    const std::shared_ptr<const WanAdapters> adapters = expert < run.adapters.size() ? run.adapters[expert] : nullptr;
    branches.push_back({x, t, run.context, adapters});
    if (job.guided()) branches.push_back({x, t, run.negative_context, adapters});
  } catch (const std::exception& e) {
    inputs_failed = str("the step's inputs: ", describe_exception(e));
    if (groups.group == nullptr) {
      runner.ghost(pass);
      throw BlockComputeError(inputs_failed);
    }
    branches.assign(job.guided() ? 2 : 1, WanBranchInputs{});
  }
  const std::int64_t step = i + 1;
  const auto before_block = hook ? std::function<void(std::int64_t)>([&](std::int64_t b) { hook(step, b); })
                                 : std::function<void(std::int64_t)>();
  // A failure in the group is its agreed BlockComputeError (this rank's own reason where it failed).
  std::vector<at::Tensor> out;
  if (groups.group == nullptr)
    out = runner.forward(branches, before_block, pass);
  else if (job.guided() && groups.partners != nullptr)
    out = runner.forward_cfg(*groups.partners, groups.half, branches, pass, before_block, inputs_failed);
  else
    out = runner.forward_group(*groups.group, branches, pass, before_block, inputs_failed);
  DLO_ASSERT(inputs_failed.empty(), "the group's forward went on without this rank's inputs");
  // After it: the transfers are done, a failure is the job's own.
  try {
    at::Tensor noise = out[0];
    if (job.guided()) noise = out[1] + guidance * (out[0] - out[1]);
    run.latents = run.scheduler->step(noise, run.latents);
  } catch (const std::exception& e) {
    throw BlockComputeError(str("the scheduler step: ", describe_exception(e)));
  }
}

void finish_job(JobRun& run, const WanVae& vae, const ModelInfo& model, const SinkFactory& open_sink,
                const LatentsKeeper& keep_latents) {
  const auto t0 = Clock::now();
  const JobSpec& job = run.job.spec;
  try {
    with_context(str("job '", job.id, "'"), [&] {
      if (keep_latents)
        keep_latents(run.job, run.latents);
      else if (!job.save_latents.empty())
        save_latents_safetensors(run.job, model, run.latents);
      const at::Tensor z = vae.denormalize(run.latents);  // on the VAE's device
      run.latents = at::Tensor();
      const std::int64_t frames = vae.config().output_frames(z.size(2));
      const std::int64_t height = z.size(3) * vae.config().scale_factor_spatial;
      const std::int64_t width = z.size(4) * vae.config().scale_factor_spatial;
      double sink_s = 0;
      auto timed = [&](auto&& fn) {
        const auto s0 = Clock::now();
        fn();
        sink_s += seconds_since(s0);
      };
      std::unique_ptr<FrameSink> sink;
      if (open_sink) timed([&] { sink = open_sink(run.job, width, height, frames); });
      Sha256 sha;
      const auto frame_bytes = static_cast<std::size_t>(height * width * 3);
      vae.decode_frames(z, [&](std::int64_t, const at::Tensor& chunk) {
        const at::Tensor u8 = frames_to_uint8(chunk);
        for (std::int64_t f = 0; f < u8.size(0); ++f) {
          const std::uint8_t* p = u8[f].data_ptr<std::uint8_t>();
          sha.update(p, frame_bytes);
          if (sink) timed([&] { sink->add_frame(p); });
        }
      });
      run.result.frames_sha256 = sha.hex_digest();
      if (sink) timed([&] { sink->finish(run.result.frames_sha256); });
      run.result.frames = frames;
      run.result.height = height;
      run.result.width = width;
      run.result.encode_s = sink_s;
      if (sink) run.result.output_bytes = output_bytes(job.output);
    });
  } catch (const std::exception& e) {
    run.fail(describe_exception(e));
  }
  run.result.decode_s = seconds_since(t0);
  run.result.rss_peak_kb = read_process_memory().hwm_kb;
}

}  // namespace dlo
