// The one memory model (offload/memory_model.h): what --dry-run prints is what auto decides with,
// the stack sizes from the config equal the engine's plan of a real checkpoint, a job that fits
// no strategy fails alone, and absurd sizes saturate instead of wrapping to a figure that fits.
#include "common/doctest_torch.h"

#include <filesystem>

#include "common/test_util.h"
#include "dlo/common/checked.h"
#include "dlo/common/error.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/offload/memory_model.h"
#include "dlo/offload/runner.h"
#include "dlo/testing/make_model.h"

using namespace dlo;

namespace {

constexpr std::uint64_t GB = 1000ull * 1000 * 1000;

// A model of config `c` whose text encoder and VAE folders exist (their checkpoint sizes are read).
ModelInfo info_of(const WanTransformerConfig& c) {
  static const dlo::test::TempDir dir;
  std::filesystem::create_directories(dir.file("text_encoder"));
  std::filesystem::create_directories(dir.file("vae"));
  ModelInfo m;
  m.parts.dir = dir.path().string();
  m.transformer = c;
  m.vae = WanVaeConfig::preset("wan2.1-vae");
  return m;
}

JobSpec job(std::int64_t h, std::int64_t w, std::int64_t frames, double guidance = 5.0) {
  JobSpec j;
  j.height = h;
  j.width = w;
  j.frames = frames;
  j.guidance = guidance;
  j.id = "j" + std::to_string(h);
  return j;
}

MemoryBudget gpu(std::uint64_t device, std::uint64_t host) {
  MemoryBudget b;
  b.device_is_host = false;
  b.device = device;
  b.device_why = "test";
  b.host = host;
  b.host_why = "test";
  return b;
}

}  // namespace

TEST_CASE("the stack from the config equals the engine's plan of a checkpoint of that config, at 1-4 ranks") {
  dlo::test::TempDir d;
  WanTransformerConfig c = WanTransformerConfig::preset("wan-test");
  c.num_layers = 3;
  c.attention_head_dim = 18;  // odd tensor sizes: alignment and padding matter
  c.ffn_dim = 40;
  struct Case {
    DType weights;
    at::ScalarType compute;
    LinearStorage storage;
  };
  for (const Case& k : {Case{DType::F32, at::kBFloat16, LinearStorage::kAuto}, Case{DType::BF16, at::kFloat, LinearStorage::kAuto},
                        Case{DType::BF16, at::kBFloat16, LinearStorage::kAuto}, Case{DType::F32, at::kBFloat16, LinearStorage::kFp8},
                        Case{DType::BF16, at::kFloat, LinearStorage::kFp8}, Case{DType::F32, at::kFloat, LinearStorage::kBF16},
                        Case{DType::F8_E4M3, at::kBFloat16, LinearStorage::kAuto}}) {
    CAPTURE(linear_storage_name(k.storage));
    write_random_wan_transformer(d.file("t"), c, k.weights, 1, 0);
    const WanTransformer model = WanTransformer::load(d.file("t"), c, k.compute, /*load_blocks=*/false, k.storage);
    for (int ranks = 1; ranks <= 4; ++ranks) {
      CAPTURE(ranks);
      const WanOffloadRunner runner(model, ranks);
      const StackSize real = stack_size(runner.plan());
      const StackSize from_config = config_stack_size(c, model.dtypes(), ranks);
      CHECK(from_config.block_bytes == real.block_bytes);
      CHECK(from_config.shard_bytes == real.shard_bytes);
      CHECK(from_config.slot_bytes == real.slot_bytes);
      CHECK(from_config.ranks == real.ranks);
    }
  }
}

// Wan2.1 1.3B's block by hand (D 1536, FFN 8960; every tensor a multiple of 64 bytes, so no
// alignment gaps): the Linears (8 attention D x D weights and D biases, FFN D x F + F and F x D +
// D) are 46,422,272 elements; the rest is norm_q/norm_k x 2 (4 D, compute dtype) and norm2 + the
// scale_shift_table (8 D, fp32).
TEST_CASE("fp8 storage halves the block Linears' bytes in the stack the memory model counts") {
  const WanTransformerConfig c = WanTransformerConfig::preset("wan2.1-t2v-1.3b");
  const std::uint64_t linears = 8ULL * 1536 * 1536 + 8 * 1536 + 2ULL * 8960 * 1536 + 8960 + 1536, rest_bf16 = 4 * 1536 * 2,
                      rest_fp32 = 8 * 1536 * 4;
  REQUIRE(linears == 46422272);
  const StackSize bf16 = config_stack_size(c, WanDtypes::same(at::kBFloat16), 2);
  const StackSize fp8 = config_stack_size(c, WanDtypes::narrow(at::kBFloat16, at::kFloat8_e4m3fn), 2);
  CHECK(bf16.block_bytes.at(0) == linears * 2 + rest_bf16 + rest_fp32);
  CHECK(fp8.block_bytes.at(0) == linears + rest_bf16 + rest_fp32);
  CHECK(fp8.shard_bytes.at(0) == 23241984);  // half of 46,483,712 (23,241,856) rounded up to 256
  CHECK(fp8.resident_bytes == bf16.resident_bytes);  // nothing outside the blocks is narrowed
}

TEST_CASE("a job's working memory is the counted forward's, and absurd sizes saturate") {
  const ModelInfo m = info_of(WanTransformerConfig::preset("wan2.1-t2v-1.3b"));
  const JobMemory j = job_memory(m, job(480, 832, 81), at::kBFloat16);
  CHECK(j.working == 3039934976ULL);  // test_strategy counts this figure by hand
  CHECK(j.decode > 0);
  const JobMemory big = job_memory(m, job(std::int64_t{1} << 40, std::int64_t{1} << 40, 5), at::kBFloat16);
  CHECK(big.decode == kSaturated);  // not 0 B, as the unchecked product gave
  CHECK(big.working == kSaturated);
  // Held between steps, by hand: latents [16, 21, 60, 104] in fp32 and 3 more of the scheduler's,
  // two prompt contexts of 512 x 4096 in bf16.
  CHECK(j.held == 4ULL * 16 * 21 * 60 * 104 * 4 + 2ULL * 512 * 4096 * 2);
  CHECK(job_memory(m, job(480, 832, 81, 1.0), at::kBFloat16).held == 4ULL * 16 * 21 * 60 * 104 * 4 + 512ULL * 4096 * 2);
}

TEST_CASE("the other jobs a rank holds (prepared next, parked) count in every job's working memory, the largest's") {
  const WanTransformerConfig c = WanTransformerConfig::preset("wan2.1-t2v-1.3b");
  const ModelInfo m = info_of(c);
  const StackSize stack = config_stack_size(c, WanDtypes::same(at::kBFloat16), 2);
  const std::vector<JobSpec> jobs = {job(256, 256, 17), job(480, 832, 81), job(256, 256, 17), job(256, 256, 17),
                                     job(256, 256, 17)};
  const JobMemory small = job_memory(m, jobs[0], at::kBFloat16), large = job_memory(m, jobs[1], at::kBFloat16);
  const BatchMemoryPlan p = plan_batch_memory(m, jobs, StrategyRequest{}, stack, gpu(80 * GB, 200 * GB), at::kBFloat16, 4);
  CHECK(p.jobs_held == 4);
  CHECK(p.held == 4 * large.held);
  CHECK(p.working == large.working + 4 * large.held);
  CHECK(p.describe().find(" of it the 4 other job(s) a rank holds") != std::string::npos);
  // No more than the batch's other jobs: 2 jobs hold 1 beside each other, 1 job none.
  CHECK(plan_batch_memory(m, {jobs[0], jobs[1]}, StrategyRequest{}, stack, gpu(80 * GB, 200 * GB), at::kBFloat16, 4).jobs_held == 1);
  CHECK(plan_batch_memory(m, {jobs[0]}, StrategyRequest{}, stack, gpu(80 * GB, 200 * GB), at::kBFloat16, 4).held == 0);
  // A device just large enough for the small job alone refuses a batch of them with 4 held beside each.
  const std::uint64_t dev = 2 * stack.slot_bytes + stack.resident_bytes + small.working;
  const std::vector<JobSpec> smalls(5, jobs[0]);
  CHECK(plan_batch_memory(m, smalls, Strategy::kDlo, stack, gpu(with_margin(dev), 200 * GB), at::kBFloat16, 0).refused.empty());
  CHECK_THROWS_WITH(plan_batch_memory(m, smalls, Strategy::kDlo, stack, gpu(with_margin(dev), 200 * GB), at::kBFloat16, 4),
                    doctest::Contains("no job"));
}

TEST_CASE("the batch's strategy is auto's for the largest job that fits, a job that fits no strategy fails alone") {
  const WanTransformerConfig c = WanTransformerConfig::preset("wan2.1-t2v-1.3b");
  const ModelInfo m = info_of(c);
  const StackSize stack = config_stack_size(c, WanDtypes::same(at::kBFloat16), 2);
  const MemoryBudget budget = gpu(80 * GB, 200 * GB);
  const std::vector<JobSpec> jobs = {job(480, 832, 81), job(16384, 16384, 1001), job(256, 256, 17)};
  const BatchMemoryPlan p = plan_batch_memory(m, jobs, StrategyRequest{}, stack, budget, at::kBFloat16, 0);
  REQUIRE(p.refused == std::vector<std::int64_t>{1});
  // With jobs held beside each other the job too large to run at all is not one of them: the
  // others still run (regression: its saturated figure, held beside them, refused the batch).
  const BatchMemoryPlan held = plan_batch_memory(m, jobs, StrategyRequest{}, stack, budget, at::kBFloat16, 4);
  CHECK(held.refused == std::vector<std::int64_t>{1});
  CHECK(held.jobs_held == 1);  // the one other runnable job
  CHECK(held.held == job_memory(m, jobs[0], at::kBFloat16).held);
  CHECK(p.refused_why[0].find("does not fit in memory: one step needs about") == 0);
  CHECK(p.refused_why[0].find("more than the device budget") != std::string::npos);
  // The same choice as auto makes for the largest job left (its working memory beside the
  // weights outside the blocks, which every rank keeps on the device).
  const StrategyChoice direct =
      choose_strategy(StrategyRequest{}, stack, stack.resident_bytes + job_memory(m, jobs[0], at::kBFloat16).working, budget);
  CHECK(p.choice.strategy == direct.strategy);
  CHECK(p.choice.reason == direct.reason);
  CHECK(p.working == job_memory(m, jobs[0], at::kBFloat16).working);
  CHECK(p.choice.strategy == Strategy::kResident);  // 1.3B in bf16 fits 80 GB whole
  CHECK(p.describe().find("job 1 refused: does not fit in memory") != std::string::npos);
  // Nothing fits: the batch is refused before work, naming the job.
  const std::string err = dlo::test::error_of([&] {
    plan_batch_memory(m, {jobs[1]}, StrategyRequest{}, stack, budget, at::kBFloat16, 0);
  });
  CHECK_MESSAGE(err.find("no job of the batch fits in memory; the smallest, job 0 ('j16384'), needs about") == 0, err);
}

TEST_CASE("a job's LoRA adapters count in its working and held memory, and a job whose LoRAs cannot be applied is refused alone") {
  const WanTransformerConfig c = WanTransformerConfig::preset("wan2.1-t2v-1.3b");
  const ModelInfo m = info_of(c);
  const StackSize stack = config_stack_size(c, WanDtypes::same(at::kBFloat16), 2);
  const std::vector<JobSpec> jobs = {job(480, 832, 81), job(256, 256, 17), job(256, 256, 17)};
  const std::uint64_t a = 350ULL * 1000 * 1000;  // about a rank-64 LoRA of the 14B in bf16
  const JobMemory plain = job_memory(m, jobs[0], at::kBFloat16), with = job_memory(m, jobs[0], at::kBFloat16, a);
  CHECK(with.adapters == a);
  CHECK(with.working == plain.working + a);
  CHECK(with.held == plain.held + a);  // a prepared or parked job keeps its adapters too
  const std::vector<JobAdapters> ad = {{a, ""}, {0, "its LoRAs: LoRA 'x.safetensors': module 'blocks.0.attn1.to_q' ..."}, {0, ""}};
  const BatchMemoryPlan p =
      plan_batch_memory(m, jobs, StrategyRequest{}, stack, gpu(80 * GB, 200 * GB), at::kBFloat16, 4, AuxPlacement::kHost, at::kFloat, ad);
  REQUIRE(p.refused == std::vector<std::int64_t>{1});
  CHECK(p.refused_why[0] == ad[1].problem);
  CHECK(p.jobs_held == 1);          // job 2 beside job 0 (the refused job is held by no one)
  CHECK(p.held == with.held);       // the largest held job: job 0, its adapters included
  CHECK(p.working == with.working + with.held);
  CHECK(p.adapters == a);
  const std::string d = p.describe();
  CHECK_MESSAGE(d.find("LoRA adapters        333.8 MiB") != std::string::npos, d);
  CHECK_MESSAGE(d.find("latents, prompts, LoRA adapters)") != std::string::npos, d);
  CHECK_MESSAGE(d.find("job 1 refused: its LoRAs: LoRA 'x.safetensors'") != std::string::npos, d);
  // A device just large enough for job 1's shape alone with dlo: the same job with adapters of
  // 1 MB more than the margin leaves is refused for memory, the one without runs.
  const JobMemory small = job_memory(m, jobs[1], at::kBFloat16);
  const std::uint64_t dev = 2 * stack.slot_bytes + stack.resident_bytes + small.working;
  const std::vector<JobAdapters> big = {{0, ""}, {with_margin(dev) - dev + 1000 * 1000, ""}};
  const BatchMemoryPlan q = plan_batch_memory(m, {jobs[1], jobs[2]}, Strategy::kDlo, stack, gpu(with_margin(dev), 200 * GB),
                                              at::kBFloat16, 0, AuxPlacement::kHost, at::kFloat, big);
  REQUIRE(q.refused == std::vector<std::int64_t>{1});
  CHECK(q.refused_why[0].find("does not fit in memory: ") == 0);
  // Every job refused for its LoRAs: nothing can run, the batch is refused naming job 0's reason.
  CHECK_THROWS_WITH(plan_batch_memory(m, {jobs[1]}, StrategyRequest{}, stack, gpu(80 * GB, 200 * GB), at::kBFloat16, 0,
                                      AuxPlacement::kHost, at::kFloat, {{0, "its LoRAs: gone"}}),
                    doctest::Contains("no job can run; job 0 ('j256'): its LoRAs: gone"));
}

TEST_CASE("the per-job rule is choose_strategy's: a job just inside the device budget fits, just outside not") {
  const WanTransformerConfig c = WanTransformerConfig::preset("wan2.1-t2v-1.3b");
  const StackSize stack = config_stack_size(c, WanDtypes::same(at::kBFloat16), 2);
  JobMemory j;
  j.working = 10 * GB;
  const StrategyChoice dlo{Strategy::kDlo, 0, ""};
  const std::uint64_t slots = 2 * stack.slot_bytes;
  // The weights outside the blocks, bf16 except diffusers' _keep_in_fp32_modules (time_embedder,
  // scale_shift_table): summed over WanTransformer3DModel(**config).named_parameters() on the meta
  // device, diffusers 0.42.1: 57068672 bytes for 1.3B, 520530048 for an A14B expert.
  CHECK(stack.resident_bytes == 57068672);
  CHECK(wan_non_block_bytes(WanTransformerConfig::preset("wan2.2-t2v-a14b"), at::kBFloat16) == 520530048);
  // Device: 2 slots + those weights + working, with the 10% margin.
  const std::uint64_t dev = slots + stack.resident_bytes + j.working;
  CHECK(job_memory_problem(dlo, stack, j, gpu(with_margin(dev), 100 * GB)) == "");
  CHECK(job_memory_problem(dlo, stack, j, gpu(with_margin(dev) - 1, 100 * GB)) != "");
  // Host: the shards and the decode.
  j.decode = 5 * GB;
  CHECK(job_memory_problem(dlo, stack, j, gpu(100 * GB, with_margin(stack.shards_total() + j.decode))) == "");
  CHECK(job_memory_problem(dlo, stack, j, gpu(100 * GB, with_margin(stack.shards_total() + j.decode) - 1))
            .find("its VAE decode needs about") == 0);
  // On the CPU resident blocks are one page-cache copy per node; each rank adds its work.
  MemoryBudget cpu;
  cpu.ranks_per_node = 2;
  cpu.host = 20 * GB;
  cpu.host_why = "test";
  const StrategyChoice resident{Strategy::kResident, 0, ""};
  const std::uint64_t per_rank = j.working + j.decode + stack.resident_bytes;
  cpu.host = (with_margin(stack.total() + 2 * per_rank) + 1) / 2;
  CHECK(job_memory_problem(resident, stack, j, cpu) == "");
  cpu.host = with_margin(stack.total() + 2 * per_rank) / 2 - 1;
  CHECK(job_memory_problem(resident, stack, j, cpu) != "");
}

TEST_CASE("a saturated figure never fits, whatever the budget (no wrap-around)") {
  const WanTransformerConfig c = WanTransformerConfig::preset("wan-test");
  const StackSize stack = config_stack_size(c, WanDtypes::same(at::kFloat), 1);
  JobMemory j;
  j.working = kSaturated;
  CHECK(job_memory_problem({Strategy::kResident, 0, ""}, stack, j, gpu(kSaturated - 1, kSaturated - 1)) != "");
  CHECK_THROWS_AS(choose_strategy(StrategyRequest{}, stack, kSaturated, gpu(1000 * GB, 1000 * GB)), dlo::Error);
}

TEST_CASE("the text encoder and the VAE on the device: bytes by hand, auto only where the transformer's strategy stays") {
  // UMT5-XXL by hand: per layer q, k, v, o 4 x 4096^2, wi_0, wi_1, wo 3 x 10240 x 4096, two norms
  // 2 x 4096 and a relative bias 32 x 64; 24 layers, the shared embedding 256384 x 4096 and the
  // final norm: 5,680,910,336 weights, 11.36 GB in bf16 (Wan's text encoder). fp16 keeps wo in fp32.
  const Umt5Config xxl = Umt5Config::preset("umt5-xxl");
  const std::uint64_t per_layer = 4ull * 4096 * 4096 + 3ull * 10240 * 4096 + 2 * 4096 + 32 * 64;
  const std::uint64_t weights = 24 * per_layer + 256384ull * 4096 + 4096;
  CHECK(weights == 5680910336ull);
  CHECK(text_encoder_device_bytes(xxl, at::kBFloat16) == 2 * weights);
  CHECK(text_encoder_device_bytes(xxl, at::kHalf) == 2 * weights + 2 * 24ull * 10240 * 4096);
  const WanVaeConfig vae = WanVaeConfig::preset("wan2.1-vae");
  CHECK(vae_decoder_device_bytes(vae, at::kFloat) == 2 * vae_decoder_device_bytes(vae, at::kBFloat16));

  const WanTransformerConfig c = WanTransformerConfig::preset("wan2.1-t2v-1.3b");
  ModelInfo m = info_of(c);
  m.text_encoder = xxl;
  const StackSize stack = config_stack_size(c, WanDtypes::same(at::kBFloat16), 1);
  const std::vector<JobSpec> jobs = {job(480, 832, 81)};
  const JobMemory j = job_memory(m, jobs[0], at::kBFloat16);
  const std::uint64_t aux = text_encoder_device_bytes(xxl, at::kBFloat16) + vae_decoder_device_bytes(vae, at::kFloat) + j.decode;
  // 80 GB: resident with them on the device; the plan says so and where they go.
  const BatchMemoryPlan roomy = plan_batch_memory(m, jobs, StrategyRequest{}, stack, gpu(80 * GB, 200 * GB), at::kBFloat16, 0,
                                                  AuxPlacement::kAuto, at::kFloat);
  CHECK(roomy.choice.strategy == Strategy::kResident);
  CHECK(roomy.aux_on_device);
  CHECK(roomy.text_encoder_device == 2 * weights);
  CHECK_MESSAGE(roomy.aux_why.find("on the device: they fit beside the transformer's resident") != std::string::npos,
                roomy.aux_why);
  CHECK(roomy.describe().find("10.6 GiB on the device") != std::string::npos);
  // The host alone: the same choice, nothing on the device.
  const BatchMemoryPlan host = plan_batch_memory(m, jobs, StrategyRequest{}, stack, gpu(80 * GB, 200 * GB), at::kBFloat16, 0);
  CHECK_FALSE(host.aux_on_device);
  CHECK(host.aux_why.empty());
  // A device where resident fits only without them: auto keeps them on the host (the
  // transformer's placement first); cuda takes the device and the transformer streams.
  const std::uint64_t resident_needs = with_margin(stack.total() + stack.resident_bytes + j.working);
  const std::uint64_t tight_device = resident_needs + aux - GB / 2;
  const BatchMemoryPlan tight = plan_batch_memory(m, jobs, StrategyRequest{}, stack, gpu(tight_device, 200 * GB), at::kBFloat16,
                                                  0, AuxPlacement::kAuto, at::kFloat);
  CHECK(tight.choice.strategy == Strategy::kResident);
  CHECK_FALSE(tight.aux_on_device);
  CHECK_MESSAGE(tight.aux_why.find("on the host: on the device they would leave the transformer ") != std::string::npos,
                tight.aux_why);
  const BatchMemoryPlan forced = plan_batch_memory(m, jobs, StrategyRequest{}, stack, gpu(tight_device, 200 * GB), at::kBFloat16,
                                                   0, AuxPlacement::kDevice, at::kFloat);
  CHECK(forced.aux_on_device);
  CHECK(forced.choice.strategy != Strategy::kResident);
  // A device with room for them alone: cuda is refused with the figures.
  CHECK_THROWS_WITH(plan_batch_memory(m, jobs, StrategyRequest{}, stack, gpu(aux, 200 * GB), at::kBFloat16, 0, AuxPlacement::kDevice,
                                      at::kFloat),
                    doctest::Contains("--text-vae-device cuda: the text encoder (10.6 GiB) and the VAE ("));
}
