// The render stages against WanPipeline, step by step (tests/data/goldens/wan_pipeline_steps.safetensors,
// made by tools/reference/make_pipeline_goldens.py): the prompt and negative-prompt contexts the
// transformer gets, the initial latents, every step's timestep and latents, and the final frames,
// for a tiny fp32 model. fp32 on the CPU is bitwise equal to diffusers, so on the CPU type that
// made the goldens every comparison is exact (elsewhere fp32 GEMMs round differently: within a
// tolerance, tests/models/golden.h; the parity label recomputes WanPipeline there): a wrong guidance base, another step's timestep, the positive prompt's context used for
// the negative branch, a scheduler step off by one, each fails here at the step where it happens.
// tests/data/goldens/wan_pipeline_two_experts.safetensors (the same script) does the same for a
// two-expert (Wan2.2 A14B-shaped) folder and a job with no guidance_2.
#include "common/doctest_torch.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "models/golden.h"
#include "dlo/common/error.h"
#include "dlo/io/safetensors.h"
#include "dlo/models/tensor_view.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/models/wan_vae.h"
#include "dlo/offload/runner.h"
#include "dlo/render/prompt_encoder.h"
#include "dlo/render/stages.h"
#include "dlo/testing/make_model.h"

namespace {

using dlo::test::TempDir;

constexpr const char* kSteps = "wan_pipeline_steps";
constexpr const char* kTwoExperts = "wan_pipeline_two_experts";

// tests/data/goldens/<file>.safetensors, opened once.
const dlo::Checkpoint& goldens(const std::string& file = kSteps) {
  static std::map<std::string, dlo::Checkpoint> open;
  auto it = open.find(file);
  if (it == open.end())
    it = open.emplace(file, dlo::Checkpoint::open(dlo::test::golden_dir() + "/" + file + ".safetensors")).first;
  return it->second;
}

at::Tensor golden(const std::string& name, const std::string& file = kSteps) {
  return dlo::tensor_view(goldens(file), name).clone();
}

bool goldens_made_here(const std::string& file = kSteps) {
  const auto& m = goldens(file).metadata();
  auto it = m.find("cpu");
  return it != m.end() && it->second == dlo::test::cpu_fingerprint();
}

// Bitwise on the CPU that made the goldens; on another, fp32 within rel 1e-4 (a few steps of
// GEMMs that round differently: measured up to 1.5e-6 on 2026-12-02) and integers within 1.
bool same(const at::Tensor& a, const at::Tensor& b, const std::string& file = kSteps) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  if (goldens_made_here(file) || at::equal(a, b)) return at::equal(a, b);
  if (at::isFloatingType(a.scalar_type())) {
    const double err = dlo::test::golden_rel_err(a, b);
    MESSAGE("goldens made on another CPU: rel err ", err, " (bar 1e-4)");
    return err <= 1e-4;
  }
  const double diff = (a.to(at::kLong) - b.to(at::kLong)).abs().max().item<double>();
  MESSAGE("goldens made on another CPU: max |diff| ", diff, " (bar 1)");
  return diff <= 1;
}

// The model folder the goldens were made from: dlo-checkpoint make DIR --preset wan-test --layers 2
// --dtype fp32 --seed 3 (the metadata's "make_args"), checked by the sum of its transformer weights.
std::string make_golden_model(const TempDir& d) {
  const auto& meta = goldens().metadata();
  REQUIRE(nlohmann::json::parse(meta.at("make_args")) ==
          nlohmann::json::parse(R"(["--preset", "wan-test", "--layers", "2", "--dtype", "fp32", "--seed", "3"])"));
  dlo::MakeModelOptions o;
  o.dtype = dlo::DType::F32;
  o.seed = 3;
  o.transformer.num_layers = 2;
  const std::string dir = d.file("model");
  dlo::make_model(dir, o);
  const dlo::Checkpoint ck = dlo::Checkpoint::open(dir + "/transformer");
  double sum = 0;
  for (const dlo::TensorInfo* t : ck.tensors()) sum += dlo::tensor_view(ck, *t).to(at::kDouble).sum().item<double>();
  const double want = std::stod(meta.at("weights_sum"));
  REQUIRE_MESSAGE(std::abs(sum - want) <= 1e-9 * std::abs(want),
                  "the random writers changed (transformer weights sum " << sum << ", the goldens' " << want
                                                                          << "): regenerate with make_pipeline_goldens.py");
  return dir;
}

// The sum of all weights of a component, in float64 (make_pipeline_goldens.py's weights_sum).
double weights_sum(const std::string& component_dir) {
  const dlo::Checkpoint ck = dlo::Checkpoint::open(component_dir);
  double sum = 0;
  for (const dlo::TensorInfo* t : ck.tensors()) sum += dlo::tensor_view(ck, *t).to(at::kDouble).sum().item<double>();
  return sum;
}

// Finishes `run` (the VAE decode into uint8 frames) and checks the frames against the golden
// `<c>.frames` of `file`: bitwise (and their sha256) on the CPU that made it, within 1 per byte
// elsewhere.
void check_frames(dlo::JobRun& run, const dlo::WanVae& vae, const dlo::ModelInfo& info, const std::string& c,
                  const std::string& file) {
  struct Keep : dlo::FrameSink {
    std::vector<std::uint8_t>* bytes;
    std::size_t frame_bytes;
    Keep(std::vector<std::uint8_t>* b, std::size_t n) : bytes(b), frame_bytes(n) {}
    void add_frame(const std::uint8_t* rgb) override { bytes->insert(bytes->end(), rgb, rgb + frame_bytes); }
    void finish(const std::string&) override {}
  };
  std::vector<std::uint8_t> kept;
  std::int64_t kept_h = 0, kept_w = 0;
  dlo::finish_job(run, vae, info,
                  [&](const dlo::BatchJob&, std::int64_t width, std::int64_t height, std::int64_t) {
                    kept_h = height;
                    kept_w = width;
                    return std::make_unique<Keep>(&kept, static_cast<std::size_t>(width * height * 3));
                  },
                  {});
  REQUIRE_MESSAGE(!run.failed(), run.result.error);
  const auto m = nlohmann::json::parse(goldens(file).metadata().at(c));
  if (goldens_made_here(file)) CHECK(run.result.frames_sha256 == m["frames_sha256"].get<std::string>());
  const at::Tensor frames = golden(c + ".frames", file);
  REQUIRE(static_cast<std::int64_t>(kept.size()) == frames.numel());
  const at::Tensor ours = at::from_blob(kept.data(), {frames.size(0), kept_h, kept_w, 3}, at::kByte).clone();
  CHECK(same(ours.to(frames.scalar_type()), frames, file));
  CHECK(run.result.frames == frames.size(0));
  CHECK(run.result.height == frames.size(1));
  CHECK(run.result.width == frames.size(2));
}

// A job of the golden case `c` (metadata JSON `m`).
dlo::BatchJob golden_job(const std::string& c, const nlohmann::json& m) {
  dlo::BatchJob job;
  job.spec.id = c;
  job.spec.prompt = m["prompt"];
  job.spec.negative_prompt = m["negative_prompt"];
  job.spec.guidance = m["guidance"];
  job.spec.steps = m["steps"];
  job.spec.height = m["height"];
  job.spec.width = m["width"];
  job.spec.frames = m["frames"];
  job.spec.seed = m["seed"];
  job.spec.scheduler = dlo::parse_noise_scheduler_kind(m["scheduler"]);
  job.spec.flow_shift = m["flow_shift"].get<double>();
  return job;
}

}  // namespace

TEST_CASE("every stage of WanPipeline, step by step: contexts, latents, timesteps, guidance, frames (fp32, bitwise)") {
  at::set_num_threads(1);
  TempDir d;
  const std::string dir = make_golden_model(d);
  const dlo::ModelInfo info = dlo::read_model_info(dir);
  const dlo::PromptEncoder text(dlo::ModelParts{dir, "", ""}, at::kFloat);
  const dlo::WanTransformer transformer = dlo::WanTransformer::load(dir + "/transformer", at::kFloat, false);
  dlo::WanOffloadRunner runner(transformer, 1);
  runner.start(dlo::EngineOptions{});  // resident at one rank
  const dlo::WanVae vae = dlo::WanVae::load(dir + "/vae", at::kFloat);

  for (const auto& name : nlohmann::json::parse(goldens().metadata().at("cases"))) {
    const std::string c = name.get<std::string>();
    CAPTURE(c);
    const auto m = nlohmann::json::parse(goldens().metadata().at(c));
    const dlo::BatchJob job = golden_job(c, m);
    dlo::JobRun run(job, info, 0);

    dlo::prepare_job(run, text, info, at::kFloat, at::kCPU);
    CHECK(same(run.context, golden(c + ".prompt_embeds")));
    if (job.spec.guided()) CHECK(same(run.negative_context, golden(c + ".negative_prompt_embeds")));
    CHECK(same(run.latents, golden(c + ".latents_init")));

    for (std::int64_t i = 0; i < job.spec.steps; ++i) {
      CAPTURE(i);
      const at::Tensor t = run.scheduler->timesteps()[i].to(at::kFloat).reshape({1});
      CHECK(same(t, golden(c + ".timestep_" + std::to_string(i))));
      dlo::denoise_step(runner, run, at::kFloat);
      ++run.steps_done;
      REQUIRE_MESSAGE(same(run.latents, golden(c + ".latents_" + std::to_string(i))),
                      "latents after step " << i << " differ from WanPipeline's: max |diff| "
                                            << (run.latents - golden(c + ".latents_" + std::to_string(i))).abs().max().item<float>());
    }

    // The decoded frames, kept by a sink: compared with WanPipeline's (bitwise on the CPU that
    // made the goldens, within 1 per byte elsewhere), and their sha256 where bitwise.
    check_frames(run, vae, info, c, kSteps);
  }
}

// WanPipeline with guidance_scale_2 unset guides the low-noise expert with guidance_scale (README:
// guidance_2's default is --guidance); before this golden no cpu-label test rendered such a job
// against it. The folder: dlo-checkpoint make DIR --preset wan2.2-a14b-test --dtype fp32 --seed 5
// (transformer/ and transformer_2/ of wan-test's shape, boundary_ratio 0.875, the VAE's 16 latent
// channels). Every step on the expert WanPipeline called, every step's latents, the frames.
TEST_CASE("two experts, guidance_2 unset: the low-noise expert guided with guidance, step by step as WanPipeline (golden)") {
  at::set_num_threads(1);
  const auto& meta = goldens(kTwoExperts).metadata();
  REQUIRE(nlohmann::json::parse(meta.at("make_args")) ==
          nlohmann::json::parse(R"(["--preset", "wan2.2-a14b-test", "--dtype", "fp32", "--seed", "5"])"));
  TempDir d;
  const std::string dir = d.file("model");
  dlo::MakeModelOptions o;
  o.transformer = dlo::WanTransformerConfig::preset("wan2.2-a14b-test");
  o.components.push_back("transformer_2");
  o.dtype = dlo::DType::F32;
  o.seed = 5;
  dlo::make_model(dir, o);
  const auto sums = nlohmann::json::parse(meta.at("weights_sums"));
  for (const char* part : {"transformer", "transformer_2"}) {
    CAPTURE(part);
    const double want = std::stod(sums.at(part).get<std::string>()), sum = weights_sum(dir + "/" + part);
    REQUIRE_MESSAGE(std::abs(sum - want) <= 1e-9 * std::abs(want),
                    "the random writers changed (weights sum " << sum << ", the goldens' " << want
                                                               << "): regenerate with make_pipeline_goldens.py");
  }
  const dlo::ModelInfo info = dlo::read_model_info(dir);
  REQUIRE(info.transformer_2.has_value());
  const dlo::PromptEncoder text(dlo::ModelParts{dir, "", ""}, at::kFloat);
  const dlo::WanTransformer high = dlo::WanTransformer::load(dir + "/transformer", at::kFloat, false);
  const dlo::WanTransformer low = dlo::WanTransformer::load(dir + "/transformer_2", at::kFloat, false);
  dlo::WanOffloadRunner high_runner(high, 1), low_runner(low, 1);
  high_runner.start(dlo::EngineOptions{});
  low_runner.start(dlo::EngineOptions{});
  const dlo::WanVae vae = dlo::WanVae::load(dir + "/vae", at::kFloat);

  for (const auto& name : nlohmann::json::parse(meta.at("cases"))) {
    const std::string c = name.get<std::string>();
    CAPTURE(c);
    const auto m = nlohmann::json::parse(meta.at(c));
    REQUIRE(m["guidance_2"].is_null());
    const dlo::BatchJob job = golden_job(c, m);
    REQUIRE(!job.spec.guidance_2.has_value());
    dlo::JobRun run(job, info, 0);
    dlo::prepare_job(run, text, info, at::kFloat, at::kCPU);
    CHECK(same(run.latents, golden(c + ".latents_init", kTwoExperts), kTwoExperts));
    const auto experts = m["experts"].get<std::vector<int>>();
    REQUIRE(static_cast<std::int64_t>(experts.size()) == job.spec.steps);
    for (std::int64_t i = 0; i < job.spec.steps; ++i) {
      CAPTURE(i);
      const at::Tensor t = run.scheduler->timesteps()[i].to(at::kFloat).reshape({1});
      CHECK(same(t, golden(c + ".timestep_" + std::to_string(i), kTwoExperts), kTwoExperts));
      REQUIRE(run.expert() == experts[static_cast<std::size_t>(i)]);
      dlo::denoise_step(run.expert() == 0 ? high_runner : low_runner, run, at::kFloat);
      ++run.steps_done;
      const at::Tensor want = golden(c + ".latents_" + std::to_string(i), kTwoExperts);
      REQUIRE_MESSAGE(same(run.latents, want, kTwoExperts),
                      "latents after step " << i << " (expert " << experts[static_cast<std::size_t>(i)]
                                            << ") differ from WanPipeline's: max |diff| "
                                            << (run.latents - want).abs().max().item<float>());
    }
    check_frames(run, vae, info, c, kTwoExperts);
  }
}

TEST_CASE("a step whose computation fails throws BlockComputeError after a complete traversal, the next job runs") {
  at::set_num_threads(1);
  TempDir d;
  const std::string dir = make_golden_model(d);
  const dlo::ModelInfo info = dlo::read_model_info(dir);
  const dlo::PromptEncoder text(dlo::ModelParts{dir, "", ""}, at::kFloat);
  const dlo::WanTransformer transformer = dlo::WanTransformer::load(dir + "/transformer", at::kFloat, false);
  dlo::WanOffloadRunner runner(transformer, 1);
  dlo::EngineOptions eo;
  eo.strategy = dlo::Strategy::kLayerwise;  // streamed through slots, as on a GPU
  runner.start(eo);
  dlo::BatchJob job;
  job.spec.prompt = "x";
  job.spec.steps = 2;
  job.spec.height = job.spec.width = 32;
  job.spec.frames = 5;
  dlo::JobRun run(job, info, 0);
  dlo::prepare_job(run, text, info, at::kFloat, at::kCPU);
  const auto blocks_before = runner.engine().stats().blocks_acquired;
  CHECK_THROWS_AS(dlo::denoise_step(runner, run, at::kFloat,
                                    [](std::int64_t, std::int64_t block) {
                                      DLO_CHECK(block != 1, "injected failure (test hook)");
                                    }),
                  dlo::BlockComputeError);
  CHECK(runner.engine().stats().blocks_acquired - blocks_before == 2);  // the pass went on: both blocks
  // Inputs that cannot be embedded: a ghost pass, and the job's own error.
  dlo::JobRun broken(job, info, 0);
  dlo::prepare_job(broken, text, info, at::kFloat, at::kCPU);
  broken.context = at::zeros({1, 512, 3});  // text_dim is 16
  try {
    dlo::denoise_step(runner, broken, at::kFloat);
    FAIL("no throw");
  } catch (const dlo::BlockComputeError& e) {
    CHECK(std::string(e.what()).find("the transformer's input embeddings") == 0);
  }
  CHECK(runner.engine().stats().blocks_acquired - blocks_before == 4);
  // The engine is in step: another job's step runs.
  dlo::JobRun next(job, info, 0);
  dlo::prepare_job(next, text, info, at::kFloat, at::kCPU);
  dlo::denoise_step(runner, next, at::kFloat);
  CHECK(next.latents.isfinite().all().item<bool>());
}

TEST_CASE("two experts: the expert of a step at the boundary's edges, compared in fp32 as WanPipeline's t >= boundary") {
  dlo::ModelInfo info;
  info.parts.dir = "m";
  info.transformer = dlo::WanTransformerConfig::preset("wan-test");
  info.transformer_2 = info.transformer;
  for (const char* kind : {"unipc", "euler"}) {
    CAPTURE(kind);
    dlo::BatchJob bj;
    bj.spec.steps = 6;
    bj.spec.guidance = 4.0;
    bj.spec.guidance_2 = 2.5;
    bj.spec.scheduler = dlo::parse_noise_scheduler_kind(kind);
    dlo::JobRun run(bj, info, 0);
    run.scheduler = dlo::make_noise_scheduler(dlo::job_scheduler_config(bj.spec, info));
    run.scheduler->set_timesteps(6);
    const at::Tensor ts = run.scheduler->timesteps();
    const auto t = [&](int i) { return static_cast<float>(ts[i].item<double>()); };
    // Walks the run's scheduler through its steps and collects each step's expert.
    const auto experts_with = [&](float boundary) {
      run.scheduler->set_timesteps(6);
      run.steps_done = 0;
      run.boundary_timestep = boundary;
      std::vector<int> e;
      at::Tensor x = at::zeros({1, 4, 1, 2, 2});
      for (int i = 0; i < 6; ++i) {
        e.push_back(run.expert());
        x = run.scheduler->step(at::zeros_like(x), x);
        ++run.steps_done;
      }
      return e;
    };
    // A boundary equal to step 2's timestep: step 2 is still the high-noise expert's (>=).
    CHECK(experts_with(t(2)) == std::vector<int>{0, 0, 0, 1, 1, 1});
    // The next float above it: step 2 goes to the low-noise expert.
    CHECK(experts_with(std::nextafter(t(2), 2000.0f)) == std::vector<int>{0, 0, 1, 1, 1, 1});
    CHECK(experts_with(0.0f) == std::vector<int>(6, 0));      // ratio 0: transformer/ only
    CHECK(experts_with(1001.0f) == std::vector<int>(6, 1));   // above every timestep: transformer_2/ only
    // The guidance follows the expert.
    run.scheduler->set_timesteps(6);
    run.steps_done = 0;
    run.boundary_timestep = t(0);
    run.guidance_2 = 2.5;
    CHECK(run.guidance_now() == 4.0);
    run.boundary_timestep = 1001.0f;
    CHECK(run.guidance_now() == 2.5);
  }
}
