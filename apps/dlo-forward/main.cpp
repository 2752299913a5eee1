// dlo-forward: one forward pass of one model component, inputs and outputs as safetensors.
//
//   [mpirun -np N] dlo-forward --model DIR --component transformer --inputs in.safetensors
//               --out out.safetensors [--dtype fp32|bf16|fp16] [--threads N]
//               [--offload auto|resident|device-shards|mixed|dlo|layerwise] [--device-budget BYTES]
//               [--device auto|cpu|cuda[:N]]
//               [--passes P] [--guidance] [--report FILE]
//
// The transformer runs through the offload engine on every rank (the lowest rank that computes
// writes the output); the other components run on each rank on their own (rank 0 writes).
// Outputs (--out, --report) and inputs are checked on every rank before any work; collectives wait
// at most DLO_GATHER_TIMEOUT_S seconds (default 600) for a rank.
// Exit codes: 0 ok, 2 bad invocation or input (found before the work), 1 anything else.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <signal.h>

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "dlo/common/bytes.h"
#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/common/settings.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/app/tool.h"
#include "dlo/io/safetensors.h"
#include "dlo/models/tensor_view.h"
#include "component.h"
#include "dlo/models/weights.h"
#include "transformer_job.h"

namespace {

std::vector<std::int64_t> parse_counts(const std::string& s, const char* flag) {
  std::vector<std::int64_t> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
    }
    DLO_CHECK(used == part.size() && v >= 0, flag, ": '", part, "' is not a count >= 0");
    out.push_back(v);
  }
  return out;
}

int run(dlo::MpiWorld& world, int argc, char** argv) {
  cxxopts::Options opts("dlo-forward", "One forward pass of one model component");
  opts.add_options()("model", "model directory (diffusers layout)", cxxopts::value<std::string>())(
      "transformer", "the transformer's weights instead of the folder's transformer/ (as dlo-generate --transformer)",
      cxxopts::value<std::string>())(
      "transformer-2", "the low-noise expert's weights instead of transformer_2/", cxxopts::value<std::string>())(
      "vae", "the VAE's weights instead of the folder's vae/ (as dlo-generate --vae)", cxxopts::value<std::string>())(
      "fuse-lora", "transformer: a LoRA merged into the weights, [high=|low=]PATH[:STRENGTH] (repeatable; as "
      "dlo-generate --fuse-lora; high=/low= apply to transformer / transformer_2)",
      cxxopts::value<std::vector<std::string>>())(
      "lora", "transformer: LoRAs applied unfused beside the weights, every rank's forward, \"[high=|low=]PATH[:S], ...\" "
      "(as the job field loras)", cxxopts::value<std::string>())(
      "component", "transformer, transformer_2 (Wan2.2 A14B's low-noise expert, as transformer), vae (input latents [B, 16, F, H, W] as the transformer outputs them; de-normalised "
      "with the config's latents_mean/std as WanPipeline does, then decoded: output [B, 3, 1 + 4 (F - 1), 8 H, 8 W] "
      "in [-1, 1]), vae_encoder (input video [B, 3, F = 1 + 4k, H, W] in [-1, 1]; outputs latents, vae.encode(video)'s "
      "posterior mean, and latents_normalized, (latents - latents_mean) / latents_std as WanImageToVideoPipeline "
      "computes it), text_encoder (inputs input_ids [+ attention_mask], or --prompt / "
      "text + text_lengths [+ max_sequence_length, clean, compact]; output [B, L, d_model] as the "
      "pipeline's prompt_embeds) or tokenizer",
      cxxopts::value<std::string>())(
      "inputs", "input tensors (.safetensors)", cxxopts::value<std::string>())(
      "out", "output file (.safetensors), written by the lowest rank that computes", cxxopts::value<std::string>())(
      "dtype", "compute dtype: fp32, bf16, fp16", cxxopts::value<std::string>()->default_value("fp32"))(
      "storage-dtype", "transformer: what the blocks' Linears are kept in, as dlo-generate --storage-dtype",
      cxxopts::value<std::string>()->default_value("auto"))(
      "threads", "CPU threads per rank (0: libtorch default)", cxxopts::value<int>()->default_value("0"))(
      "prompt", "text_encoder, tokenizer: clean and tokenize this prompt (to 512 tokens)", cxxopts::value<std::string>())(
      "offload", "transformer: auto, resident, device-shards, mixed, dlo or layerwise",
      cxxopts::value<std::string>()->default_value("auto"))(
      "device-budget", "transformer: device memory each rank may use, e.g. 40GiB (auto decides from it; mixed keeps "
      "as many blocks' shards on the device as fit). Default: the device's free memory",
      cxxopts::value<std::string>())(
      "device", "transformer: auto, cpu, cuda or cuda:N (default: local rank modulo visible devices)",
      cxxopts::value<std::string>()->default_value("auto"))(
      "passes", "forward passes on every rank (timing; the last output is written)",
      cxxopts::value<std::int64_t>()->default_value("1"))(
      "repeat", "same as --passes", cxxopts::value<std::int64_t>())(
      "rank-passes", "transformer: passes per rank, e.g. 2,0,1 (ranks with fewer join the gathers idle)",
      cxxopts::value<std::string>())(
      "guidance", "transformer: also run input negative_encoder_hidden_states through each block (output_negative)")(
      "sp", "transformer: ranks per group; a group computes one forward with Ulysses sequence parallelism, each rank its "
      "share of the tokens (groups of consecutive ranks, the last one smaller)", cxxopts::value<int>()->default_value("1"))(
      "cfg-parallel", "transformer, with --guidance: the two branches on two halves of each 2 x --sp ranks, predictions "
      "exchanged")(
      "keep-page-cache", "transformer: keep the checkpoint's pages cached after building the shards")(
      "random-inputs", "transformer: random latents and text instead of --inputs: F,H,W,L (seeded by --seed + rank)",
      cxxopts::value<std::string>())(
      "seed", "seed for --random-inputs", cxxopts::value<std::uint64_t>()->default_value("0"))(
      "report", "write per-rank timing and memory as JSON (rank 0)", cxxopts::value<std::string>())(
      "fail-at-block", "test hook: throw while transferring this block", cxxopts::value<std::int64_t>())(
      "fail-rank", "test hook: ... on this rank only", cxxopts::value<int>()->default_value("-1"))(
      "test-jitter-us", "test hook: random pauses of up to this many microseconds before each transfer and each block "
      "(the soak of gathers interleaved with exchanges)", cxxopts::value<std::int64_t>()->default_value("0"))(
      "test-stop-rank", "test hook: this rank stops itself (SIGSTOP) at --test-stop-at", cxxopts::value<int>())(
      "test-stop-at", "test hook: loaded (before the start-up check) or report (before the closing gather)",
      cxxopts::value<std::string>()->default_value("loaded"))("h,help", "help");
  auto args = opts.parse(argc, argv);
  if (args.count("help")) {
    if (world.rank() == 0) std::cout << opts.help();
    return 0;
  }
  for (const char* required : {"model", "component", "out"}) DLO_CHECK(args.count(required), "missing --", required);
  for (const char* given : {"transformer", "transformer-2", "fuse-lora", "lora"})
    DLO_CHECK(!args.count(given) || args["component"].as<std::string>().rfind("transformer", 0) == 0, "--", given,
              " is for --component transformer or transformer_2");
  DLO_CHECK(!args.count("vae") || args["component"].as<std::string>().rfind("vae", 0) == 0,
            "--vae is for --component vae or vae_encoder");
  world.set_timeout_s(dlo::gather_timeout_setting(std::getenv("DLO_GATHER_TIMEOUT_S")));
  const auto dtype = dlo::parse_compute_dtype(args["dtype"].as<std::string>(), "--dtype");
  std::string note;
  const int threads = dlo::bound_threads(args["threads"].as<int>(), "--threads", &note);
  if (!note.empty() && world.rank() == 0) std::cerr << "dlo-forward: note: " << note << "\n";
  if (threads > 0) at::set_num_threads(threads);
  if (dtype == at::kFloat) {
    // fp32 means fp32 on CUDA too (parity runs compare with the CPU): no TF32 convolutions
    // (cuDNN's default in torch 2.11) or matmuls.
    at::globalContext().setAllowTF32CuDNN(false);
    at::globalContext().setAllowTF32CuBLAS(false);
  }
  std::int64_t passes = args.count("repeat") ? args["repeat"].as<std::int64_t>() : args["passes"].as<std::int64_t>();
  DLO_CHECK(passes >= 1, "--passes must be >= 1");
  const std::string component = args["component"].as<std::string>();
  const std::string out_path = args["out"].as<std::string>();
  const std::string report_path = args.count("report") ? args["report"].as<std::string>() : "";

  // Before any work, on every rank: the outputs can be written (not a device, FIFO or folder; the
  // folder exists and is writable), and the inputs are read, once, into memory (a FIFO is refused
  // without blocking; a later change of the file cannot reach the run).
  dlo::TensorMap inputs;
  {
    std::string error;
    try {
      dlo::with_context("--out", [&] { dlo::check_output_path(out_path); });
      if (!report_path.empty()) dlo::with_context("--report", [&] { dlo::check_output_path(report_path); });
      if (args.count("inputs"))
        inputs = dlo::with_context("--inputs", [&] { return dlo::read_tensors(args["inputs"].as<std::string>()); });
    } catch (const dlo::Error& e) {
      error = e.what();
    }
    world.check_all(error, "start-up check (flags, inputs and outputs)");
  }
  auto write_out = [&](const dlo::TensorMap& t) {
    std::vector<std::pair<std::string, at::Tensor>> named(t.begin(), t.end());
    dlo::save_tensors(out_path, named);
  };
  std::string report;
  dlo::TensorMap out;
  int code = dlo::kExitOk;

  if (component == "transformer" || component == "transformer_2") {
    dlo::TransformerJobOptions jo;
    jo.model.dir = args["model"].as<std::string>();
    if (args.count("transformer")) jo.model.transformer = args["transformer"].as<std::string>();
    if (args.count("transformer-2")) jo.model.transformer_2 = args["transformer-2"].as<std::string>();
    if (args.count("fuse-lora"))
      for (const auto& text : args["fuse-lora"].as<std::vector<std::string>>())
        jo.model.fused_loras.push_back(dlo::parse_lora_spec(text, "--fuse-lora"));
    if (args.count("lora")) jo.loras = dlo::parse_lora_list(args["lora"].as<std::string>(), "--lora");
    jo.expert = component;
    jo.dtype = dtype;
    jo.storage = dlo::parse_linear_storage(args["storage-dtype"].as<std::string>(), dtype, "--storage-dtype");
    jo.offload = dlo::parse_strategy_request(args["offload"].as<std::string>(), "--offload");
    jo.device = dlo::parse_device_request(args["device"].as<std::string>(), "--device");
    if (args.count("device-budget"))
      jo.device_budget = dlo::parse_bytes(args["device-budget"].as<std::string>(), "--device-budget");
    if (const char* id = std::getenv("NCCL_HOSTID")) jo.host_id = id;
    jo.passes = passes;
    if (args.count("rank-passes")) jo.rank_passes = parse_counts(args["rank-passes"].as<std::string>(), "--rank-passes");
    jo.guidance = args.count("guidance") > 0;
    jo.sp = args["sp"].as<int>();
    jo.cfg_parallel = args.count("cfg-parallel") > 0;
    jo.keep_page_cache = args.count("keep-page-cache") > 0;
    if (args.count("random-inputs")) {
      jo.random_latent = parse_counts(args["random-inputs"].as<std::string>(), "--random-inputs");
      jo.random_seed = args["seed"].as<std::uint64_t>();
    }
    if (args.count("fail-at-block")) jo.fail_at_block = args["fail-at-block"].as<std::int64_t>();
    jo.fail_rank = args["fail-rank"].as<int>();
    jo.jitter_us = args["test-jitter-us"].as<std::int64_t>();
    DLO_CHECK(jo.jitter_us >= 0, "--test-jitter-us must be >= 0");
    jo.write_output = write_out;
    if (args.count("test-stop-rank")) {
      const int stop_rank = args["test-stop-rank"].as<int>();
      const std::string stop_at = args["test-stop-at"].as<std::string>();
      DLO_CHECK(stop_at == "loaded" || stop_at == "report", "--test-stop-at: 'loaded' or 'report'");
      jo.test_hook = [&world, stop_rank, stop_at](const char* phase) {
        if (world.rank() == stop_rank && stop_at == phase) ::raise(SIGSTOP);
      };
    }
    auto r = dlo::run_transformer_job(world, inputs, jo);
    if (world.rank() == 0) std::cerr << world.tag() << " " << r.choice << "\n";
    if (!r.output_error.empty()) {
      std::cerr << world.tag() << " dlo-forward: error: writing --out: " << r.output_error << "\n";
      code = dlo::kExitFailed;
    }
    report = std::move(r.report_json);
  } else {
    dlo::ForwardOptions fo;
    fo.dtype = dtype;
    if (args.count("prompt")) fo.prompt = args["prompt"].as<std::string>(), fo.has_prompt = true;
    if (args.count("vae")) fo.vae = args["vae"].as<std::string>();
    fo.repeat = static_cast<int>(passes);
    dlo::ForwardStats stats;
    fo.stats = &stats;
    out = dlo::run_component(args["model"].as<std::string>(), component, inputs, fo);
    nlohmann::ordered_json j = {{"component", component},
                                {"dtype", args["dtype"].as<std::string>()},
                                {"threads", at::get_num_threads()},
                                {"rss_before_load_kb", stats.rss_before_load_kb},
                                {"rss_after_load_kb", stats.rss_after_load_kb},
                                {"peak_rss_kb", stats.peak_rss_kb},
                                {"forward_seconds", stats.forward_seconds}};
    report = j.dump(2) + "\n";
    if (world.rank() == 0)
      for (const auto& w : stats.warnings) std::cerr << "dlo-forward: warning: " << w << "\n";
    if (world.rank() == 0) {
      try {
        write_out(out);
      } catch (const std::exception& e) {  // after the work: an I/O failure, not bad input
        std::cerr << "dlo-forward: error: writing --out: " << e.what() << "\n";
        code = dlo::kExitFailed;
      }
    }
  }
  if (world.rank() == 0 && !report_path.empty()) {
    try {
      dlo::write_file_atomic(report_path, report);
    } catch (const std::exception& e) {
      std::cerr << "dlo-forward: error: writing --report: " << e.what() << "\n";
      code = dlo::kExitFailed;
    }
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  dlo::MpiWorld world(&argc, &argv);
  // Exit codes, messages and fault handlers shared by every tool (dlo/dist/tool.h).
  return dlo::run_tool("dlo-forward", &world, [&] {
    try {
      return run(world, argc, argv);
    } catch (const cxxopts::exceptions::exception& e) {
      throw dlo::Error(e.what());  // a bad flag: before any work, the same on every rank
    }
  });
}
