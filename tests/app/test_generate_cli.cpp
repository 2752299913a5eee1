// dlo/app/generate_cli.h: what dlo-generate's flags turn into (the run options, the job-field
// flags) and the errors a bad flag gets, each naming the flag. Values checked by hand against the
// flags given; the end-to-end behaviour of the tool is tests/app/*.sh's.
#include "common/doctest_torch.h"  // first: removes c10's glog-style CHECK

#include <functional>
#include <string>
#include <vector>

#include <c10/util/Flags.h>

#include "common/test_util.h"
#include "dlo/app/generate_cli.h"
#include "dlo/app/generate_hooks.h"
#include "dlo/app/job_flags.h"
#include "dlo/app/tool.h"
#include "dlo/common/error.h"

C10_DECLARE_bool(caffe2_use_fatal_for_enforce);
C10_DECLARE_int(minloglevel);

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

cxxopts::ParseResult parse(cxxopts::Options& table, std::vector<std::string> words) {
  words.insert(words.begin(), "dlo-generate");
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  return table.parse(static_cast<int>(argv.size()), argv.data());
}

// The flag table needs only the tool's name; no output format is opened here.
const dlo::AppOutputs& outputs() {
  static const dlo::AppOutputs o = [] {
    dlo::AppOutputs a;
    a.build = "dlo-generate";
    return a;
  }();
  return o;
}

using dlo::test::error_of;

}  // namespace

TEST_CASE("dlo-generate's run flags become the run options they name") {
  cxxopts::Options table = dlo::generate_flag_table(outputs());
  const auto args = parse(table, {"--jobs", "j.yaml", "--dtype", "fp32", "--offload", "dlo", "--device-budget", "3GiB",
                                  "--sp", "2", "--cfg-parallel", "off", "--no-expert-alignment", "--steps", "7",
                                  "--guidance", "1"});
  const dlo::GenerateOptions go = dlo::generate_options_from_flags(args);
  CHECK((go.dtype == at::kFloat));
  CHECK((go.vae_dtype == at::kFloat));  // the default
  CHECK((go.offload.strategy == dlo::Strategy::kDlo));
  REQUIRE(go.device_budget.has_value());
  CHECK(*go.device_budget == 3ull << 30);
  CHECK(go.topology.sp == 2);
  CHECK((go.topology.cfg == dlo::TopologyRequest::Cfg::kOff));
  CHECK_FALSE(go.align_experts);
  CHECK_FALSE(go.await_prepared);
  // The job-field flags are in the same table, as text for the job table's own parser.
  const dlo::JobFlags flags = dlo::job_field_flags(args);
  CHECK(flags.at("steps") == "7");
  CHECK(flags.at("guidance") == "1");
  CHECK(flags.count("seed") == 0);
}

TEST_CASE("dlo-generate's defaults: auto everywhere, bf16 transformer, fp32 VAE, no faults") {
  cxxopts::Options table = dlo::generate_flag_table(outputs());
  const dlo::GenerateOptions go = dlo::generate_options_from_flags(parse(table, {"--prompt", "a red circle"}));
  CHECK((go.dtype == at::kBFloat16));
  CHECK((go.vae_dtype == at::kFloat));
  CHECK(go.offload.is_auto());
  CHECK((go.device.kind == dlo::DeviceRequest::Kind::kAuto));
  CHECK_FALSE(go.device_budget.has_value());
  CHECK(go.topology.sp == 0);
  CHECK((go.topology.cfg == dlo::TopologyRequest::Cfg::kAuto));
  CHECK(go.align_experts);
  CHECK_FALSE(go.await_prepared);
}

TEST_CASE("the shipped flag table has no test hook, the tests' build adds them as a group of their own") {
  cxxopts::Options shipped = dlo::generate_flag_table(outputs());
  const std::string help = shipped.help();
  for (const char* hook : {"fail-", "test-", "slow-decode", "await-prepared", "test hooks"})
    CHECK_MESSAGE(!has(help, hook), hook);
  CHECK_THROWS(parse(shipped, {"--fail-job", "1"}));  // an unknown flag there
  cxxopts::Options table = dlo::generate_flag_table(outputs());
  dlo::generate_hooks().add_flags(table);  // this binary links the tests' hooks
  CHECK(has(table.help({"test hooks"}), "--fail-job"));
  // The run options alone do not see them (the hooks apply them: through dlo-generate-testhooks).
  const auto args = parse(table, {"--prompt", "p", "--await-prepared", "--fail-job", "1"});
  CHECK_FALSE(dlo::generate_options_from_flags(args).await_prepared);
}

TEST_CASE("a bad run flag is an error naming the flag and the value") {
  cxxopts::Options table = dlo::generate_flag_table(outputs());
  const auto with = [&](std::vector<std::string> words) {
    return error_of([&] { (void)dlo::generate_options_from_flags(parse(table, std::move(words))); });
  };
  CHECK_MESSAGE(has(with({"--offload", "fast"}), "--offload: 'fast' is not auto, resident"), with({"--offload", "fast"}));
  CHECK(has(with({"--dtype", "int8"}), "--dtype"));
  CHECK(has(with({"--device-budget", "lots"}), "--device-budget"));
  CHECK(has(with({"--sp", "two"}), "--sp"));
  CHECK(has(with({"--cfg-parallel", "maybe"}), "--cfg-parallel"));
  const auto threads = parse(table, {"--threads", "12x"});
  CHECK(error_of([&] { (void)dlo::integer_flag(threads, "threads"); }) == "--threads: '12x' is not an integer");
  const auto empty = parse(table, {"--threads", ""});
  CHECK(has(error_of([&] { (void)dlo::integer_flag(empty, "threads"); }), "is not an integer"));
}

// This binary links what dlo-generate links (the renderer, the text encoder, the tokenizer). When
// the tokenizer linked libsentencepiece.so.0, its 32-byte FLAGS_minloglevel was bound to libc10's
// 4-byte one and its constructor overwrote libc10's globals beside it: the allocation below then
// aborted the process (c10 LOG(FATAL)) instead of throwing (text/tokenizer.cpp, check_spm).
TEST_CASE("with everything dlo-generate links, libc10's globals are intact and an allocation failure throws") {
  CHECK_FALSE(FLAGS_caffe2_use_fatal_for_enforce);
  CHECK(FLAGS_minloglevel == 0);  // c10's default
  std::string what;
  bool oom = false;
  try {
    (void)at::empty({std::int64_t{1} << 40}, at::kFloat);  // 4 TiB
  } catch (const std::exception& e) {
    oom = dlo::is_allocation_failure(e);
    what = dlo::describe_exception(e);
  }
  CHECK(oom);
  CHECK_MESSAGE(has(what, "out of memory"), what);
}
