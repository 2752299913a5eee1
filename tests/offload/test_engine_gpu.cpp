// The offload engine on a CUDA device (label gpu). Exits 77 (CTest: skipped) without a GPU.
// On the device, every strategy must equal resident-on-the-device bit for bit (same kernels, same
// order), and the device result must match the CPU within float tolerance.
#define DOCTEST_CONFIG_IMPLEMENT
#include "common/doctest_torch.h"

#include "common/test_util.h"
#include "dlo/dist/collective.h"
#include "dlo/dist/mpi_world.h"
#include "dlo/models/make_model.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/offload/engine.h"
#include "dlo/offload/runner.h"

#ifdef DLO_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace dlo;

namespace {
int device_count() {
  int n = 0;
#ifdef DLO_HAVE_CUDA
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
#endif
  return n;
}
}  // namespace

TEST_CASE("on the GPU, layerwise and dlo equal resident bit for bit, and the CPU within tolerance") {
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
  for (Strategy s : {Strategy::kResident, Strategy::kLayerwise, Strategy::kDlo}) {
    CAPTURE(strategy_name(s));
    auto model = WanTransformer::load(dir.file("t"), at::kFloat, /*load_blocks=*/false);
    model.to_device(gpu);
    WanOffloadRunner runner(model, 1);
    EngineOptions eo;
    eo.strategy = s;
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
    if (s != Strategy::kResident) CHECK(st.slot_bytes > 0);
  }
}

int main(int argc, char** argv) {
  if (device_count() == 0) {
    std::fprintf(stderr, "no CUDA device: skipped\n");
    return 77;
  }
  dlo::MpiWorld world(&argc, &argv);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
