// The offload engine on a CUDA device (label gpu). Exits 77 (CTest: skipped) only where no GPU is
// present: no NVIDIA device node and CUDA finds no device (or no driver). Anything else on a
// machine with a GPU (this build without CUDA, a driver or runtime error, devices hidden) is a
// failure, and DLO_REQUIRE_GPU=1 (set by tools/gpu-check.sh) turns every skip into one.
// On the device, every strategy (device-shards and mixed included) must equal resident-on-the-device
// bit for bit (same kernels, same order), and the device result must match the CPU within float
// tolerance, with TF32 off.
#define DOCTEST_CONFIG_IMPLEMENT
#include "common/doctest_torch.h"

#include <ATen/Context.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/gpu_probe.h"
#include "common/test_util.h"
#include "dlo/dist/collective.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/testing/make_model.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/offload/engine.h"
#include "dlo/offload/runner.h"

#ifdef DLO_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace dlo;

using dlo::test::why_no_device;

TEST_CASE("on the GPU, every strategy equals resident bit for bit, and the CPU within tolerance") {
  dlo::test::TempDir dir;
  auto c = WanTransformerConfig::preset("wan-test");
  c.num_layers = 5;
  write_random_wan_transformer(dir.file("t"), c, DType::BF16, 4, 0);
  at::manual_seed(1);
  WanBranchInputs in{at::randn({1, 4, 2, 8, 8}), at::tensor({321}, at::kLong), at::randn({1, 7, 16})};
  WanBranchInputs neg{in.hidden_states, in.timestep, at::randn({1, 7, 16})};
  const at::Device gpu(at::kCUDA, 0);

  auto cpu_model = WanTransformer::load(dir.file("t"), at::kFloat);
  const at::Tensor cpu_out = cpu_model.forward(in.hidden_states, in.timestep, in.encoder_hidden_states);

  at::Tensor resident_out;
  struct Mode {
    Strategy s;
    std::int64_t device_blocks;
  };
  for (const Mode m : {Mode{Strategy::kResident, 0}, Mode{Strategy::kDeviceShards, 0}, Mode{Strategy::kMixed, 1},
                       Mode{Strategy::kMixed, c.num_layers - 1}, Mode{Strategy::kLayerwise, 0},
                       Mode{Strategy::kDlo, 0}}) {
    const Strategy s = m.s;
    CAPTURE(strategy_name(s));
    CAPTURE(m.device_blocks);
    auto model = WanTransformer::load(dir.file("t"), at::kFloat, /*load_blocks=*/false);
    model.to_device(gpu);
    WanOffloadRunner runner(model, 1);
    EngineOptions eo;
    eo.strategy = s;
    eo.device_blocks = m.device_blocks;
    eo.device = gpu;
    runner.start(eo);
    for (int pass = 0; pass < 3; ++pass) {
      auto out = runner.forward({in, neg});
      at::Tensor got = out[0].cpu();
      if (!resident_out.defined()) resident_out = got;
      CHECK(at::equal(got, resident_out));
      CHECK(at::allclose(got, cpu_out, 1e-4, 1e-4));
    }
    auto st = runner.engine().stats();
    // One rank: device-held blocks are used in place, so device-shards needs no slot.
    if (s == Strategy::kLayerwise || s == Strategy::kDlo || s == Strategy::kMixed) CHECK(st.slot_bytes > 0);
    if (s == Strategy::kDeviceShards) CHECK(st.slot_bytes == 0);
    if (s == Strategy::kDeviceShards || s == Strategy::kResident) CHECK(st.h2d_bytes == 0);
    if (s == Strategy::kLayerwise || s == Strategy::kDlo || s == Strategy::kMixed) CHECK(st.pinned_bytes == st.host_bytes);
    if (s == Strategy::kMixed) CHECK(st.device_shard_bytes > 0);
  }
}

int main(int argc, char** argv) {
  bool absent = false;
  const std::string why = why_no_device(absent);
  if (!why.empty()) {
    const char* req = std::getenv("DLO_REQUIRE_GPU");
    const bool required = req != nullptr && std::string(req) == "1";
    if (absent && !required) {
      std::fprintf(stderr, "test_engine_gpu: no GPU on this machine (%s): skipped\n", why.c_str());
      return 77;
    }
    std::fprintf(stderr, "test_engine_gpu: FAILED: no usable CUDA device: %s%s\n", why.c_str(),
                 required ? " (DLO_REQUIRE_GPU=1: a GPU is required)" : "");
    return 1;
  }
  // The CPU reference is full fp32: no TF32 in cuDNN convolutions (on by default in torch) or
  // matmuls, or the 1e-4 bound compares TF32 rounding, not the engine.
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  dlo::MpiWorld world(&argc, &argv);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
