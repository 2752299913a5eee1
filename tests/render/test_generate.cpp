// The pipeline's pieces that are checked without running a model: seeded latents equal torch's,
// the uint8 conversion equals diffusers' postprocess + export_to_video on hand-computed values,
// model-folder checks give their messages. (A job's field checks: tests/config/test_job.cpp.)
#include "common/doctest_torch.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "dlo/common/error.h"
#include "dlo/testing/make_model.h"
#include "dlo/config/job.h"
#include "dlo/render/stages.h"

namespace {

using dlo::test::error_of;

// A complete, consistent random model folder (tiny).
void make_tiny_model(const std::string& dir) {
  dlo::MakeModelOptions o;
  o.dtype = dlo::DType::F32;
  o.transformer.num_layers = 1;
  o.transformer.in_channels = o.transformer.out_channels = o.vae.z_dim;
  dlo::make_model(dir, o);
}

}  // namespace

TEST_CASE("initial latents equal torch.randn with torch.Generator('cpu').manual_seed(seed)") {
  // Values printed by Python torch 2.11.0:
  //   g = torch.Generator("cpu").manual_seed(42); x = torch.randn((1,16,2,4,6), generator=g)
  const at::Tensor x = dlo::initial_latents({1, 16, 2, 4, 6}, 42);
  CHECK((x.scalar_type() == at::kFloat));
  const at::Tensor f = x.flatten();
  CHECK(f[0].item<float>() == 1.9269152879714966f);
  CHECK(f[1].item<float>() == 1.4872840642929077f);
  CHECK(f[2].item<float>() == 0.9007171988487244f);
  CHECK(f[3].item<float>() == -2.1055209636688232f);
  CHECK(f[-2].item<float>() == -0.42982181906700134f);
  CHECK(f[-1].item<float>() == 0.5761587619781494f);
  CHECK(x.to(at::kDouble).sum().item<double>() == doctest::Approx(27.414545370207634).epsilon(1e-12));
  // Seeds above 32 bits are not truncated: manual_seed(2**32 + 7), randn(3).
  const at::Tensor y = dlo::initial_latents({3}, (std::uint64_t{1} << 32) + 7);
  CHECK(y[0].item<float>() == -0.1467950940132141f);
  CHECK(y[2].item<float>() == 0.9468216300010681f);
}

TEST_CASE("uint8 frames: (x * 0.5 + 0.5).clamp(0, 1) * 255, truncated, as diffusers + export_to_video") {
  // One frame of 2x3 pixels; hand-computed results (fp32):
  //   -1 -> 0; 1 -> 255; 0 -> 127.5 -> 127; 0.9999 -> 0.99995 * 255 = 254.98725 -> 254;
  //   -0.99 -> 0.005 * 255 = 1.275 -> 1; 0.0039 -> 0.50195 * 255 = 127.997 -> 127.
  const float px[6] = {-1.f, 1.f, 0.f, 0.9999f, -0.99f, 0.0039f};
  at::Tensor chunk = at::empty({1, 3, 1, 2, 3});
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 6; ++i) chunk[0][c][0][i / 3][i % 3] = px[(i + 2 * c) % 6];
  const at::Tensor u8 = dlo::frames_to_uint8(chunk);
  REQUIRE((u8.sizes() == at::IntArrayRef({1, 2, 3, 3})));
  CHECK((u8.scalar_type() == at::kByte));
  const std::uint8_t expect[6] = {0, 255, 127, 254, 1, 127};
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 6; ++i) CHECK(u8[0][i / 3][i % 3][c].item<int>() == expect[(i + 2 * c) % 6]);
}

TEST_CASE("latent shape follows WanPipeline.prepare_latents") {
  dlo::ModelInfo info;
  info.transformer = dlo::WanTransformerConfig::preset("wan2.1-t2v-1.3b");
  const dlo::JobSpec job;  // 480x832, 81 frames
  CHECK((info.latent_shape(job.frames, job.height, job.width) == std::vector<std::int64_t>{1, 16, 21, 60, 104}));
  CHECK((info.latent_shape(1, 16, 32) == std::vector<std::int64_t>{1, 16, 1, 2, 4}));
}

TEST_CASE("a model folder is checked part by part before any weight is read") {
  dlo::test::TempDir tmp;
  const std::string dir = tmp.file("m");
  CHECK(error_of([&] { dlo::read_model_info(dir); }) == "model folder '" + dir + "': not a folder");
  make_tiny_model(dir);
  const dlo::ModelInfo info = dlo::read_model_info(dir);
  CHECK(info.transformer.in_channels == info.vae.z_dim);
  CHECK((info.scheduler.kind == dlo::NoiseSchedulerKind::kUniPC));

  std::filesystem::remove_all(dir + "/vae");
  std::filesystem::remove_all(dir + "/tokenizer");
  CHECK(error_of([&] { dlo::read_model_info(dir); }) ==
        "model folder '" + dir +
            "': lacks vae/, tokenizer/ (a diffusers Wan2.1 text-to-video folder has transformer/, vae/, "
            "text_encoder/, tokenizer/ and scheduler/)");
}

TEST_CASE("a transformer whose channels differ from the VAE's z_dim is refused") {
  dlo::test::TempDir tmp;
  const std::string dir = tmp.file("m");
  make_tiny_model(dir);
  const std::string cfg = dir + "/transformer/config.json";
  auto j = nlohmann::json::parse(std::ifstream(cfg));
  j["in_channels"] = 4;
  dlo::test::write_file(cfg, j.dump());
  CHECK(error_of([&] { dlo::read_model_info(dir); }) ==
        "model folder '" + dir + "': the transformer's latent channels (in 4, out 16) differ from the VAE's z_dim (16)");
}
