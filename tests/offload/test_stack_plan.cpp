// dlo/offload/stack_plan.h: shard sizes and packing. The N shards of a block, packed one per rank
// and laid side by side (what the AllGather builds), must hold every byte of the block as the
// checkpoint stores it, then zeros. Block sizes sit at every residue around the rounding unit
// (kShardAlign * N - 1, exactly, + 1) for 1-4 ranks, where a rounding bug loses a block's last
// bytes.
#include "common/doctest_torch.h"

#include <cstring>

#include "common/test_util.h"
#include "dlo/io/safetensors_writer.h"
#include "dlo/models/tensor_view.h"
#include "dlo/testing/random_weights.h"
#include "dlo/offload/stack_plan.h"

using namespace dlo;
using dlo::test::TempDir;

namespace {

// The smallest multiple of 256 (kShardAlign, written out: the test does not trust the header)
// that N shards of it hold `bytes`.
std::uint64_t shard_by_hand(std::uint64_t bytes, std::uint64_t ranks) {
  std::uint64_t m = 256;
  while (m * ranks < bytes) m += 256;
  return m;
}

}  // namespace

TEST_CASE("shards hold every byte of a block at each size around k * 256 * N, for 1, 2, 3 and 4 ranks") {
  for (int ranks = 1; ranks <= 4; ++ranks) {
    CAPTURE(ranks);
    TempDir dir;
    // Block kinds: "u" one U8 tensor of `size` bytes; "m" an F32[3] (12 bytes at offset 0) and a
    // U8 tensor at offset 64 (the 64-byte tensor alignment) ending at `size`.
    std::vector<TensorSpec> specs;
    std::vector<std::vector<std::string>> blocks;
    std::vector<std::uint64_t> sizes;
    for (std::uint64_t k = 1; k <= 3; ++k) {
      for (int d = -1; d <= 1; ++d) {
        const std::uint64_t size = static_cast<std::uint64_t>(static_cast<std::int64_t>(k * 256 * ranks) + d);
        const std::string b = "blocks." + std::to_string(blocks.size()) + ".";
        specs.push_back({b + "u", DType::U8, {static_cast<std::int64_t>(size)}});
        blocks.push_back({b + "u"});
        sizes.push_back(size);
        const std::string m = "blocks." + std::to_string(blocks.size()) + ".";
        specs.push_back({m + "f", DType::F32, {3}});
        specs.push_back({m + "v", DType::U8, {static_cast<std::int64_t>(size - 64)}});
        blocks.push_back({m + "f", m + "v"});
        sizes.push_back(size);
      }
    }
    WriteOptions w;
    w.max_shard_bytes = 3000;  // several files: tensors come from different mappings
    write_random_checkpoint(dir.file("ck"), specs, [](const TensorSpec&) { return RandomInit{0.5, 3.0}; }, 9, w);
    const auto shared = std::make_shared<const Checkpoint>(Checkpoint::open(dir.file("ck")));
    const Checkpoint& ck = *shared;
    const StackPlan plan(shared, blocks, [&](const std::string& n) { return ck.at(n).dtype; }, ranks);
    REQUIRE(plan.num_blocks() == static_cast<std::int64_t>(blocks.size()));

    std::uint64_t largest = 0, total = 0;
    for (std::int64_t i = 0; i < plan.num_blocks(); ++i) {
      const std::uint64_t size = sizes[static_cast<std::size_t>(i)];
      CAPTURE(size);
      CAPTURE(i);
      REQUIRE(plan.block(i).bytes == size);
      const std::uint64_t shard = plan.shard_bytes(i);
      CHECK(shard == shard_by_hand(size, static_cast<std::uint64_t>(ranks)));
      CHECK(plan.padded_bytes(i) == shard * static_cast<std::uint64_t>(ranks));
      largest = std::max(largest, plan.padded_bytes(i));
      total += size;

      // The block as the checkpoint stores it, laid out by hand: tensors at 0 (and 64), zeros between.
      std::vector<std::byte> want(std::max(plan.padded_bytes(i), size), std::byte{0});
      const auto& names = blocks[static_cast<std::size_t>(i)];
      for (std::size_t t = 0; t < names.size(); ++t) {
        const TensorInfo& info = ck.at(names[t]);
        std::memcpy(want.data() + (t == 0 ? 0 : 64), ck.data(info), info.nbytes);
      }
      // Each rank packs its own shard into its place (pre-filled with junk, as a slot may be).
      std::vector<std::byte> gathered(want.size(), std::byte{0xAB});
      for (int r = 0; r < ranks; ++r) {
        const std::uint64_t begin = shard * static_cast<std::uint64_t>(r);
        if (begin + shard > gathered.size()) break;  // a short plan: the comparison below fails
        plan.pack(i, begin, begin + shard, gathered.data() + begin, /*release_pages=*/false);
      }
      CHECK(std::memcmp(gathered.data(), want.data(), want.size()) == 0);
      // The views into the gathered buffer are the checkpoint's tensors.
      const auto views = plan.views(i, gathered.data(), at::kCPU);
      REQUIRE(views.size() == names.size());
      for (std::size_t t = 0; t < names.size(); ++t) CHECK(at::equal(views[t], tensor_view(ck, names[t])));
    }
    CHECK(plan.slot_bytes() == largest);
    CHECK(plan.total_bytes() == total);
  }
}

TEST_CASE("a shard range that cuts a tensor packs exactly that range, converting dtypes per element") {
  TempDir dir;
  // F32[100] packed as BF16 (200 bytes at 0) and F32[70] packed as F32 (280 bytes at 256).
  std::vector<TensorSpec> specs = {{"blocks.0.a", DType::F32, {100}}, {"blocks.0.b", DType::F32, {70}}};
  write_random_checkpoint(dir.file("ck"), specs, [](const TensorSpec&) { return RandomInit{0.0, 1.0}; }, 3, {});
  const auto shared = std::make_shared<const Checkpoint>(Checkpoint::open(dir.file("ck")));
  const Checkpoint& ck = *shared;
  const StackPlan plan(shared, {{"blocks.0.a", "blocks.0.b"}},
                       [](const std::string& n) { return n == "blocks.0.a" ? DType::BF16 : DType::F32; }, 3);
  REQUIRE(plan.block(0).bytes == 256 + 280);
  CHECK(plan.shard_bytes(0) == 256);  // ceil(536 / 3) = 179 -> 256
  std::vector<std::byte> whole(plan.padded_bytes(0));
  plan.pack(0, 0, whole.size(), whole.data(), false);
  // Any cut at 64-byte steps gives the same bytes as the whole.
  for (std::uint64_t lo = 0; lo < whole.size(); lo += 64) {
    for (std::uint64_t hi = lo; hi <= whole.size(); hi += 64) {
      std::vector<std::byte> part(hi - lo, std::byte{0x5A});
      plan.pack(0, lo, hi, part.data(), false);
      CHECK_MESSAGE(std::memcmp(part.data(), whole.data() + lo, hi - lo) == 0, lo << ".." << hi);
    }
  }
  const auto v = plan.views(0, whole.data(), at::kCPU);
  CHECK(at::equal(v[0], tensor_view(ck, "blocks.0.a").to(at::kBFloat16)));
  CHECK(at::equal(v[1], tensor_view(ck, "blocks.0.b")));
  // Bytes between a's end (200) and b's start (256) and past b's end are zero.
  for (std::size_t k = 200; k < 256; ++k) CHECK(whole[k] == std::byte{0});
  for (std::size_t k = 536; k < whole.size(); ++k) CHECK(whole[k] == std::byte{0});
}
