// The dlo-checkpoint app: exit codes and output, run as a user would run it.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "common/source_tree.h"
#include "dlo/io/safetensors.h"
#include "dlo/io/safetensors_writer.h"
#include "io/malformed_cases.h"

namespace {

struct Run {
  int exit_code = -1;  // -1 when killed by a signal
  std::string output;  // stdout and stderr
};

Run run(const std::string& args) {
  const std::string cmd = (dlo::test::bin_dir() / "dlo-checkpoint").string() + " " + args + " 2>&1";
  Run r;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace

TEST_CASE("inspect exits 2 with the reader's message on every malformed file (never a signal)") {
  dlo::test::TempDir dir;
  for (const auto& c : dlo::test::malformed_files()) {
    CAPTURE(c.name);
    const std::string path = dir.file(std::string(c.name) + ".safetensors");
    dlo::test::write_file(path, c.bytes);
    Run r = run("inspect " + path);
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(r.output.find(c.expect) != std::string::npos, r.output);
    CHECK_MESSAGE(r.output.find(path) != std::string::npos, r.output);
  }
  Run missing = run("inspect " + dir.file("absent"));
  CHECK(missing.exit_code == 2);
  CHECK(missing.output.find("does not exist") != std::string::npos);
  CHECK(run("frobnicate").exit_code == 2);
  CHECK(run("copy " + dir.file("absent") + " " + dir.file("out") + " --shard-size 12XB").exit_code == 2);
}

TEST_CASE("inspect summarises tensors per block prefix with byte counts computed by hand") {
  dlo::test::TempDir dir;
  // blocks.N.w: F32 [4,N+1] -> 16*(N+1) bytes; blocks.N.b: BF16 [4] -> 8 bytes; head: F16 [10] -> 20.
  std::vector<dlo::TensorSpec> specs;
  for (int n = 0; n < 12; ++n) {
    specs.push_back({"blocks." + std::to_string(n) + ".w", dlo::DType::F32, {4, n + 1}});
    specs.push_back({"blocks." + std::to_string(n) + ".b", dlo::DType::BF16, {4}});
  }
  specs.push_back({"head.weight", dlo::DType::F16, {10}});
  dlo::WriteOptions w;
  w.max_shard_bytes = 300;
  w.base_name = "diffusion_pytorch_model";
  auto written = dlo::write_safetensors_dir(
      dir.path().string(), specs, [](std::size_t, const dlo::TensorSpec& s, std::byte* out) { std::memset(out, 0, s.nbytes()); }, w);
  REQUIRE(written.files.size() > 1);

  Run r = run("inspect --json " + dir.path().string());
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.output);
  CHECK(j["tensors"] == 25);
  CHECK(j["files"] == written.files.size());
  std::uint64_t total = 20;
  for (int n = 0; n < 12; ++n) total += 16 * (n + 1) + 8;
  CHECK(j["bytes"] == total);
  CHECK(j["dtypes"]["BF16"]["tensors"] == 12);
  CHECK(j["dtypes"]["F16"]["bytes"] == 20);
  REQUIRE(j["groups"].size() == 13);
  CHECK(j["groups"][2]["prefix"] == "blocks.2");  // natural order: blocks.2 before blocks.10
  CHECK(j["groups"][2]["bytes"] == 16 * 3 + 8);
  CHECK(j["groups"][11]["prefix"] == "blocks.11");
  CHECK(j["groups"][12]["prefix"] == "head");

  Run text = run("inspect " + written.index_path);
  CHECK(text.exit_code == 0);
  CHECK(text.output.find("tensors:    25") != std::string::npos);
  CHECK(text.output.find("blocks.10") != std::string::npos);
}

TEST_CASE("copy reshards a checkpoint and inspect sees the same tensors") {
  dlo::test::TempDir dir;
  std::vector<dlo::TensorSpec> specs;
  for (int n = 0; n < 6; ++n) specs.push_back({"layers." + std::to_string(n) + ".w", dlo::DType::F32, {64}});
  dlo::write_safetensors_file(dir.file("one.safetensors"), specs,
                              [](std::size_t i, const dlo::TensorSpec& s, std::byte* out) { std::memset(out, int(i), s.nbytes()); },
                              {{"format", "pt"}});
  Run c = run("copy " + dir.file("one.safetensors") + " " + dir.file("sharded") + " --shard-size 600");
  REQUIRE(c.exit_code == 0);
  Run r = run("inspect --json " + dir.file("sharded"));
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.output);
  CHECK(j["files"] == 3);  // 256 bytes per tensor, two per 600-byte shard
  CHECK(j["tensors"] == 6);
  CHECK(j["metadata"]["total_size"] == "1536");  // the index records 6 x 256 bytes
}

TEST_CASE("lora prints a LoRA's layout and ignored keys, rewrites it in the diffusers layout, exits 2 on a misfit") {
  dlo::test::TempDir dir;
  // A ComfyUI-layout LoRA for wan-test (width 24): one module of rank 2, a full-weight delta diffusers ignores.
  const auto write = [&](const std::string& name, std::int64_t width) {
    const std::string path = dir.file(name);
    const std::vector<dlo::TensorSpec> specs = {
        {"diffusion_model.blocks.1.self_attn.q.lora_down.weight", dlo::DType::BF16, {2, width}},
        {"diffusion_model.blocks.1.self_attn.q.lora_up.weight", dlo::DType::BF16, {width, 2}},
        {"diffusion_model.blocks.1.self_attn.q.diff", dlo::DType::BF16, {width, width}}};
    dlo::write_safetensors_file(path, specs, [](std::size_t, const dlo::TensorSpec& s, std::byte* out) {
      std::fill(out, out + s.nbytes(), std::byte{0});
    }, {});
    return path;
  };
  const std::string fits = write("fits.safetensors", 24), wide = write("wide.safetensors", 1536);
  const std::string out = dir.file("peft.safetensors");
  Run ok = run("lora " + fits + " --preset wan-test --out " + out);
  CHECK_MESSAGE(ok.exit_code == 0, ok.output);
  CHECK(ok.output.find("ComfyUI/Kijai (diffusion_model.), 1 modules") != std::string::npos);
  CHECK(ok.output.find("diffusion_model.blocks.1.self_attn.q.diff") != std::string::npos);
  const dlo::Checkpoint written = dlo::Checkpoint::open(out);
  REQUIRE(written.tensors().size() == 2);
  CHECK(written.tensors()[0]->name == "transformer.blocks.1.attn1.to_q.lora_A.weight");
  CHECK(written.tensors()[1]->name == "transformer.blocks.1.attn1.to_q.lora_B.weight");

  Run misfit = run("lora " + wide + " --preset wan-test");
  CHECK(misfit.exit_code == 2);
  CHECK(misfit.output.find(wide) != std::string::npos);
  CHECK(misfit.output.find("blocks.1.attn1.to_q") != std::string::npos);
  CHECK(run("lora " + dir.file("absent.safetensors")).exit_code == 2);
}
