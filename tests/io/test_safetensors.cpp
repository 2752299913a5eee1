// Reader and writer of dlo/io/safetensors*.h: malformed input, indexes, round trips.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <numeric>

#include "common/test_util.h"
#include "dlo/common/bytes.h"
#include "dlo/common/error.h"
#include "dlo/io/safetensors.h"
#include "dlo/io/safetensors_writer.h"
#include "io/malformed_cases.h"

using namespace dlo;
using dlo::test::TempDir;

namespace {

using dlo::test::error_of;

// Two tensors written with the dlo writer; values are index-derived so readers can check them.
std::vector<TensorSpec> small_specs() {
  return {{"blocks.0.w", DType::F32, {2, 3}}, {"blocks.0.b", DType::BF16, {3}}, {"scale", DType::F64, {}},
          {"ids", DType::I64, {4}},          {"mask", DType::BOOL, {5}},       {"empty", DType::F16, {0, 7}}};
}

void fill_pattern(std::size_t index, const TensorSpec& spec, std::byte* out) {
  for (std::uint64_t b = 0; b < spec.nbytes(); ++b) out[b] = static_cast<std::byte>((index * 31 + b * 7) & 0xff);
}

}  // namespace

TEST_CASE("every malformed file is rejected with a message naming the file and the fault") {
  TempDir dir;
  for (const auto& c : dlo::test::malformed_files()) {
    CAPTURE(c.name);
    const std::string path = dir.file(std::string(c.name) + ".safetensors");
    dlo::test::write_file(path, c.bytes);
    const std::string msg = error_of([&] { Checkpoint::open(path); });
    CHECK_MESSAGE(msg.find(c.expect) != std::string::npos, msg);
    CHECK_MESSAGE(msg.rfind(path, 0) == 0, "message must start with the file path: " << msg);
    // The same bytes through the in-memory parser (what the fuzzer drives).
    CHECK_THROWS_AS(parse_safetensors_header(reinterpret_cast<const std::byte*>(c.bytes.data()), c.bytes.size(), "x"),
                    Error);
  }
}

TEST_CASE("a header computed by hand parses to the offsets and shapes it states") {
  // 16 data bytes: F32[2] at 0..8, I16[2,2] at 8..16; header padded with spaces as Python does.
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("i":{"dtype":"I16","shape":[2,2],"data_offsets":[8,16]}}   )";
  const std::string bytes = dlo::test::safetensors_bytes(header, 16);
  auto h = parse_safetensors_header(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size(), "hand");
  REQUIRE(h.tensors.size() == 2);
  CHECK(h.data_start == 8 + header.size());
  CHECK(h.tensors[0].name == "w");
  CHECK(h.tensors[0].offset == h.data_start);
  CHECK(h.tensors[0].nbytes == 8);
  CHECK(h.tensors[1].name == "i");
  CHECK(h.tensors[1].dtype == DType::I16);
  CHECK(h.tensors[1].shape == std::vector<std::int64_t>{2, 2});
  CHECK(h.tensors[1].offset == h.data_start + 8);
  CHECK(h.metadata.at("format") == "pt");
}

TEST_CASE("files exactly at each bound parse (the malformed cases one byte over them are refused)") {
  auto parse = [](const std::string& bytes) {
    return parse_safetensors_header(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size(), "bound");
  };
  // Header length == file size - 8: no data section at all.
  {
    const auto bytes = dlo::test::safetensors_bytes("{}", 0);
    REQUIRE(bytes.size() == 10);
    const auto h = parse(bytes);
    CHECK(h.data_start == 10);
    CHECK(h.tensors.empty());
  }
  // Header padded with spaces up to the end of the file, a zero-length tensor at offset 0.
  {
    const std::string header = R"({"e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}      )";
    const auto h = parse(dlo::test::safetensors_bytes(header, 0));
    REQUIRE(h.tensors.size() == 1);
    CHECK(h.tensors[0].offset == 8 + header.size());
    CHECK(h.tensors[0].nbytes == 0);
  }
  // End offset == data section size, for the last of two tensors.
  {
    const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                               R"("b":{"dtype":"U8","shape":[5],"data_offsets":[8,13]}})";
    const auto h = parse(dlo::test::safetensors_bytes(header, 13));
    REQUIRE(h.tensors.size() == 2);
    CHECK(h.tensors[1].name == "b");
    CHECK(h.tensors[1].offset == 8 + header.size() + 8);
    CHECK(h.tensors[1].nbytes == 5);
  }
  // Header length one below the file's rest: the last byte is data, and a 1-byte tensor fits.
  {
    const std::string header = R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
    const auto h = parse(dlo::test::safetensors_bytes(header, 1));
    REQUIRE(h.tensors.size() == 1);
    CHECK(h.tensors[0].offset == 8 + header.size());
    // ... and one data byte short of it is refused.
    CHECK_THROWS_WITH_AS(parse(dlo::test::safetensors_bytes(header, 0)),
                         doctest::Contains("end offset 1 beyond the data section (0 bytes"), Error);
  }
}

TEST_CASE("rename_tensors: new names over the same mapped bytes, two tensors given one name refused") {
  TempDir dir;
  const auto specs = small_specs();
  const std::string path = dir.file("one.safetensors");
  write_safetensors_file(path, specs, fill_pattern, {});
  auto ck = Checkpoint::open(path);
  const std::byte* before = ck.data(ck.at(specs[0].name));
  ck.rename_tensors([](const std::string& n) { return "renamed." + n; });
  CHECK(ck.find(specs[0].name) == nullptr);
  const TensorInfo& t = ck.at("renamed." + specs[0].name);
  CHECK(ck.data(t) == before);  // the same bytes of the same mapping: no copy
  CHECK(&ck.file_of(t) == ck.files()[0].get());
  CHECK(ck.tensors().size() == specs.size());
  const std::string msg = dlo::test::error_of([&] { ck.rename_tensors([](const std::string&) { return std::string("x"); }); });
  CHECK(msg.find(path + ": tensors '") == 0);
  CHECK(msg.find("would both be 'x'") != std::string::npos);
  CHECK(ck.find("renamed." + specs[0].name) != nullptr);  // a refused rename changes nothing
}

TEST_CASE("writer output reads back byte for byte, single file and sharded") {
  TempDir dir;
  const auto specs = small_specs();
  SUBCASE("single file") {
    const std::string path = dir.file("one.safetensors");
    write_safetensors_file(path, specs, fill_pattern, {{"format", "pt"}});
    auto ck = Checkpoint::open(path);
    CHECK(ck.metadata().at("format") == "pt");
    REQUIRE(ck.tensors().size() == specs.size());
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const TensorInfo& t = ck.at(specs[i].name);
      CHECK(t.shape == specs[i].shape);
      CHECK(t.dtype == specs[i].dtype);
      CHECK(t.offset % dtype_size(t.dtype) == 0);  // larger elements first keeps alignment
      std::vector<std::byte> want(t.nbytes);
      fill_pattern(i, specs[i], want.data());
      CHECK(std::memcmp(ck.data(t), want.data(), t.nbytes) == 0);
    }
  }
  SUBCASE("sharded, with a diffusers-style index") {
    WriteOptions w;
    w.base_name = "diffusion_pytorch_model";
    w.max_shard_bytes = 40;  // in order: w+b+scale = 38 bytes, then ids+mask+empty = 37
    auto r = write_safetensors_dir(dir.path().string(), specs, fill_pattern, w);
    CHECK(r.files.size() == 2);
    CHECK(r.total_bytes == 24 + 6 + 8 + 32 + 5);
    CHECK(std::filesystem::path(r.files[0]).filename() == "diffusion_pytorch_model-00001-of-00002.safetensors");
    CHECK(std::filesystem::path(r.index_path).filename() == "diffusion_pytorch_model.safetensors.index.json");
    auto ck = Checkpoint::open(dir.path().string());  // directory -> its index
    CHECK(ck.files().size() == 2);
    CHECK(ck.metadata().at("total_size") == std::to_string(r.total_bytes));
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const TensorInfo& t = ck.at(specs[i].name);
      std::vector<std::byte> want(t.nbytes);
      fill_pattern(i, specs[i], want.data());
      CHECK(std::memcmp(ck.data(t), want.data(), t.nbytes) == 0);
    }
    // No temporary files are left behind.
    for (const auto& e : std::filesystem::directory_iterator(dir.path()))
      CHECK(e.path().extension() != ".tmp");
  }
}

TEST_CASE("an index is checked against its shards") {
  TempDir dir;
  WriteOptions w;
  w.max_shard_bytes = 40;  // two shards, as above
  auto r = write_safetensors_dir(dir.path().string(), small_specs(), fill_pattern, w);
  const std::string index = r.index_path;
  auto rewrite_index = [&](const std::string& text) { dlo::test::write_file(index, text); };

  SUBCASE("names a missing file") {
    rewrite_index(R"({"weight_map":{"blocks.0.w":"nope.safetensors"}})");
    CHECK(error_of([&] { Checkpoint::open(index); }).find("names shard 'nope.safetensors' (for tensor 'blocks.0.w'), which does not exist") != std::string::npos);
  }
  SUBCASE("a shard lacks a promised tensor") {
    rewrite_index(R"({"weight_map":{"blocks.0.w":"model-00001-of-00002.safetensors","ghost":"model-00002-of-00002.safetensors"}})");
    auto msg = error_of([&] { Checkpoint::open(index); });
    CHECK_MESSAGE(msg.find("model-00002-of-00002.safetensors: lacks tensor 'ghost'") != std::string::npos, msg);
  }
  SUBCASE("a tensor in two shards") {
    // Shard 3 duplicates shard 1's tensor.
    std::filesystem::copy_file(r.files[0], dir.file("model-extra.safetensors"));
    rewrite_index(R"({"weight_map":{"blocks.0.w":"model-00001-of-00002.safetensors","ids":"model-00002-of-00002.safetensors","x":"model-extra.safetensors"}})");
    auto msg = error_of([&] { Checkpoint::open(index); });
    CHECK_MESSAGE(msg.find("' is in two shards: '" + r.files[0] + "' and '" + dir.file("model-extra.safetensors") + "'") != std::string::npos, msg);
  }
  SUBCASE("a shard name with a directory") {
    rewrite_index(R"({"weight_map":{"a":"../model-00001-of-00002.safetensors"}})");
    CHECK(error_of([&] { Checkpoint::open(index); }).find("which is not a plain file name") != std::string::npos);
  }
  SUBCASE("not JSON, or no weight_map") {
    rewrite_index("{");
    CHECK(error_of([&] { Checkpoint::open(index); }).find(index + ": index is not valid JSON") == 0);
    rewrite_index(R"({"metadata":{}})");
    CHECK(error_of([&] { Checkpoint::open(index); }).find("index has no 'weight_map'") != std::string::npos);
  }
  SUBCASE("a malformed shard is named in the error") {
    dlo::test::write_file(r.files[1], dlo::test::safetensors_bytes("{", 0));
    auto msg = error_of([&] { Checkpoint::open(index); });
    CHECK_MESSAGE(msg.find(r.files[1] + ": header is not valid JSON") != std::string::npos, msg);
  }
}

TEST_CASE("writer memory is bounded by the largest tensor, not the file") {
  TempDir dir;
  // 96 tensors of 2 MiB: 192 MiB of data through a 2 MiB buffer.
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 96; ++i) specs.push_back({"t." + std::to_string(i), DType::F32, {512, 1024}});
  dlo::test::reset_peak_rss();
  const long before = dlo::test::proc_status_kb("VmRSS");
  write_safetensors_file(dir.file("big.safetensors"), specs, fill_pattern, {});
  const long peak = dlo::test::proc_status_kb("VmHWM");
  MESSAGE("writer peak RSS growth: " << (peak - before) << " kB for 192 MiB written");
  CHECK(peak - before < 16 * 1024);
  CHECK(std::filesystem::file_size(dir.file("big.safetensors")) > 192u << 20);
}

TEST_CASE("byte sizes parse like diffusers' max_shard_size") {
  CHECK(parse_bytes("10GB", "x") == 10'000'000'000ull);
  CHECK(parse_bytes("5GiB", "x") == 5ull << 30);
  CHECK(parse_bytes("1.5MB", "x") == 1'500'000);
  CHECK(parse_bytes("4096", "x") == 4096);
  CHECK(error_of([] { parse_bytes("ten", "--shard-size"); }).find("--shard-size: 'ten' is not a byte size") == 0);
  CHECK(error_of([] { parse_bytes("3XB", "--shard-size"); }).find("unknown unit 'XB'") != std::string::npos);
  CHECK(human_bytes(1536) == "1.50 KiB");
}
