// dlo/io/tensor_view.h: checkpoint tensors as zero-copy at::Tensor views.
#include "common/doctest_torch.h"

#include "common/test_util.h"
#include "dlo/common/error.h"
#include "dlo/io/safetensors.h"
#include "dlo/io/safetensors_writer.h"
#include "dlo/models/tensor_view.h"

using namespace dlo;
using dlo::test::TempDir;

TEST_CASE("views of every dtype hold the values that were saved") {
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> saved;
  auto base = at::arange(-6, 6, at::kDouble).reshape({3, 4}) * 0.75;
  for (auto st : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kShort, at::kChar,
                  at::kByte, at::kBool, at::kUInt16, at::kUInt32, at::kUInt64, at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
    at::Tensor t = (st == at::kByte || st == at::kUInt16 || st == at::kUInt32 || st == at::kUInt64)
                       ? at::arange(12, at::kLong).reshape({3, 4}).to(st)
                       : base.to(st);
    saved.emplace_back(std::string("t_") + c10::toString(st), t);
  }
  saved.emplace_back("scalar", at::scalar_tensor(3.5, at::kFloat));
  saved.emplace_back("empty", at::empty({0, 5}, at::kBFloat16));
  saved.emplace_back("strided", at::arange(20, at::kFloat).reshape({4, 5}).t());  // non-contiguous input
  save_tensors(path, saved);

  auto ck = Checkpoint::open(path);
  for (const auto& [name, want] : saved) {
    CAPTURE(name);
    at::Tensor got = tensor_view(ck, name);
    CHECK(std::string(c10::toString(got.scalar_type())) == c10::toString(want.scalar_type()));
    CHECK(got.sizes().vec() == want.sizes().vec());
    // Compare the raw bytes: exact for every dtype, including float8 and bool.
    CHECK(at::equal(got.contiguous().reshape(-1).view(at::kByte), want.contiguous().reshape(-1).view(at::kByte)));
  }
}

TEST_CASE("views alias the mapping and keep it alive after the checkpoint is gone") {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  save_tensors(path, {{"w", at::arange(1000, at::kFloat)}});
  at::Tensor w;
  {
    auto ck = Checkpoint::open(path);
    w = tensor_view(ck, "w");
    const auto* base = ck.files()[0]->mapping()->data();
    const auto* p = static_cast<const std::byte*>(w.data_ptr());
    CHECK(p >= base);
    CHECK(p + w.nbytes() <= base + ck.files()[0]->mapping()->size());
  }
  CHECK(w[999].item<float>() == 999.0f);  // mapping still alive through the view
}

TEST_CASE("mapping a 256 MiB checkpoint and viewing every tensor does not grow resident memory") {
  TempDir dir;
  // 130 tensors of 2 MiB (bf16 and f32 mixed) = 260 MiB, sharded into three files.
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 130; ++i)
    specs.push_back({"blocks." + std::to_string(i) + ".weight", i % 2 ? DType::BF16 : DType::F32,
                     {i % 2 ? 1024 : 512, 1024}});
  WriteOptions w;
  w.max_shard_bytes = 100u << 20;
  auto result = write_safetensors_dir(
      dir.path().string(), specs,
      [](std::size_t i, const TensorSpec& s, std::byte* out) { std::memset(out, static_cast<int>(i), s.nbytes()); },
      w);
  REQUIRE(result.total_bytes >= (256ull << 20));
  REQUIRE(result.files.size() == 3);

  const long before = dlo::test::proc_status_kb("VmRSS");
  auto ck = Checkpoint::open(dir.path().string());
  auto views = load_tensors(ck);
  const long after = dlo::test::proc_status_kb("VmRSS");
  MESSAGE("RSS growth after mapping + viewing " << (result.total_bytes >> 20) << " MiB: " << (after - before) << " kB");
  CHECK(views.size() == 130);
  CHECK(after - before < 8 * 1024);  // a copy would be 260 MiB
  // The views read the right bytes (this touches two tensors' pages only).
  CHECK(views.at("blocks.7.weight").view(at::kByte)[0][0].item<int>() == 7);
  CHECK(views.at("blocks.128.weight").view(at::kByte)[511][4095].item<int>() == 128);
}

TEST_CASE("unsupported tensor types are refused by name") {
  CHECK_THROWS_WITH_AS(from_scalar_type(at::kComplexFloat), doctest::Contains("cannot be stored in safetensors"), Error);
}
