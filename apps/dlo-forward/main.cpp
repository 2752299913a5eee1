// dlo-forward: one forward pass of one model component, inputs and outputs as safetensors.
//
//   [mpirun -np N] dlo-forward --model DIR --component transformer --inputs in.safetensors
//               --out out.safetensors [--dtype fp32|bf16|fp16] [--threads N]
//               [--offload auto|resident|layerwise|dlo] [--device auto|cpu|cuda[:N]]
//               [--passes P] [--guidance] [--report FILE]
//
// The transformer runs through the offload engine on every rank (rank 0 writes the output); the
// other components run on each rank on their own.
// Exit codes: 0 ok, 2 bad invocation or input, 1 anything else.
#include <ATen/Parallel.h>

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/dist/mpi_world.h"
#include "dlo/io/safetensors.h"
#include "dlo/io/tensor_view.h"
#include "dlo/models/component.h"
#include "dlo/models/weights.h"
#include "dlo/offload/transformer_job.h"

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

int run(const dlo::MpiWorld& world, int argc, char** argv) {
  cxxopts::Options opts("dlo-forward", "One forward pass of one model component");
  opts.add_options()("model", "model directory (diffusers layout)", cxxopts::value<std::string>())(
      "component", "transformer, vae (input latents [B, 16, F, H, W] as the transformer outputs them; de-normalised "
      "with the config's latents_mean/std as WanPipeline does, then decoded: output [B, 3, 1 + 4 (F - 1), 8 H, 8 W] "
      "in [-1, 1]), text_encoder (inputs input_ids [+ attention_mask], or --prompt / "
      "text + text_lengths [+ max_sequence_length, clean, compact]; output [B, L, d_model] as the "
      "pipeline's prompt_embeds) or tokenizer",
      cxxopts::value<std::string>())(
      "inputs", "input tensors (.safetensors)", cxxopts::value<std::string>())(
      "out", "output file (.safetensors), written by rank 0", cxxopts::value<std::string>())(
      "dtype", "compute dtype: fp32, bf16, fp16", cxxopts::value<std::string>()->default_value("fp32"))(
      "threads", "CPU threads per rank (0: libtorch default)", cxxopts::value<int>()->default_value("0"))(
      "prompt", "text_encoder, tokenizer: clean and tokenize this prompt (to 512 tokens)", cxxopts::value<std::string>())(
      "offload", "transformer: auto, resident, layerwise or dlo", cxxopts::value<std::string>()->default_value("auto"))(
      "device", "transformer: auto, cpu, cuda or cuda:N (default: local rank modulo visible devices)",
      cxxopts::value<std::string>()->default_value("auto"))(
      "passes", "forward passes on every rank (timing; the last output is written)",
      cxxopts::value<std::int64_t>()->default_value("1"))(
      "repeat", "same as --passes", cxxopts::value<std::int64_t>())(
      "rank-passes", "transformer: passes per rank, e.g. 2,0,1 (ranks with fewer join the gathers idle)",
      cxxopts::value<std::string>())(
      "guidance", "transformer: also run input negative_encoder_hidden_states through each block (output_negative)")(
      "keep-page-cache", "transformer: keep the checkpoint's pages cached after building the shards")(
      "random-inputs", "transformer: random latents and text instead of --inputs: F,H,W,L (seeded by --seed + rank)",
      cxxopts::value<std::string>())(
      "seed", "seed for --random-inputs", cxxopts::value<std::uint64_t>()->default_value("0"))(
      "report", "write per-rank timing and memory as JSON (rank 0)", cxxopts::value<std::string>())(
      "fail-at-block", "test hook: throw while transferring this block", cxxopts::value<std::int64_t>())(
      "fail-rank", "test hook: ... on this rank only", cxxopts::value<int>()->default_value("-1"))("h,help", "help");
  auto args = opts.parse(argc, argv);
  if (args.count("help")) {
    if (world.rank() == 0) std::cout << opts.help();
    return 0;
  }
  for (const char* required : {"model", "component", "out"}) DLO_CHECK(args.count(required), "missing --", required);
  const auto dtype = dlo::parse_compute_dtype(args["dtype"].as<std::string>(), "--dtype");
  const int threads = args["threads"].as<int>();
  DLO_CHECK(threads >= 0, "--threads must be >= 0");
  if (threads > 0) at::set_num_threads(threads);
  std::int64_t passes = args.count("repeat") ? args["repeat"].as<std::int64_t>() : args["passes"].as<std::int64_t>();
  DLO_CHECK(passes >= 1, "--passes must be >= 1");

  dlo::TensorMap inputs;
  if (args.count("inputs")) inputs = dlo::load_tensors(dlo::Checkpoint::open(args["inputs"].as<std::string>()));
  const std::string component = args["component"].as<std::string>();
  const std::string out_path = args["out"].as<std::string>();
  std::string report;
  dlo::TensorMap out;

  if (component == "transformer") {
    dlo::TransformerJobOptions jo;
    jo.model_dir = args["model"].as<std::string>();
    jo.dtype = dtype;
    jo.offload = args["offload"].as<std::string>();
    jo.device = args["device"].as<std::string>();
    jo.passes = passes;
    if (args.count("rank-passes")) jo.rank_passes = parse_counts(args["rank-passes"].as<std::string>(), "--rank-passes");
    jo.guidance = args.count("guidance") > 0;
    jo.keep_page_cache = args.count("keep-page-cache") > 0;
    if (args.count("random-inputs")) {
      jo.random_latent = parse_counts(args["random-inputs"].as<std::string>(), "--random-inputs");
      jo.random_seed = args["seed"].as<std::uint64_t>();
    }
    if (args.count("fail-at-block")) jo.fail_at_block = args["fail-at-block"].as<std::int64_t>();
    jo.fail_rank = args["fail-rank"].as<int>();
    auto r = dlo::run_transformer_job(world, inputs, jo);
    if (world.rank() == 0) std::cerr << world.tag() << " " << r.choice << "\n";
    out = std::move(r.outputs);
    report = std::move(r.report_json);
  } else {
    dlo::ForwardOptions fo;
    fo.dtype = dtype;
    if (args.count("prompt")) fo.prompt = args["prompt"].as<std::string>(), fo.has_prompt = true;
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
  }
  if (world.rank() == 0) {
    if (!out.empty()) {
      std::vector<std::pair<std::string, at::Tensor>> named(out.begin(), out.end());
      dlo::save_tensors(out_path, named);
    }
    if (args.count("report")) std::ofstream(args["report"].as<std::string>()) << report;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dlo::MpiWorld world(&argc, &argv);
  try {
    return run(world, argc, argv);
  } catch (const dlo::Error& e) {
    // Errors reaching here were found before any collective could be left waiting (bad flags,
    // inputs, checkpoint), and every rank holds the same message: rank 0 says it.
    if (world.rank() == 0) std::cerr << "dlo-forward: error: " << e.what() << "\n";
    return 2;
  } catch (const cxxopts::exceptions::exception& e) {
    if (world.rank() == 0) std::cerr << "dlo-forward: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    dlo::MpiWorld::abort(std::string("dlo-forward: unexpected error: ") + e.what(), 1);
  }
}
