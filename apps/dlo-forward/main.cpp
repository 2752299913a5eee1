// dlo-forward: one forward pass of one model component, inputs and outputs as safetensors.
//
//   dlo-forward --model DIR --component transformer --inputs in.safetensors --out out.safetensors
//               [--dtype fp32|bf16|fp16] [--threads N]
//
// Exit codes: 0 ok, 2 bad invocation or input, 1 anything else.
#include <ATen/Parallel.h>

#include <iostream>
#include <string>

#include <cxxopts.hpp>

#include "dlo/common/error.h"
#include "dlo/io/safetensors.h"
#include "dlo/io/tensor_view.h"
#include "dlo/models/component.h"
#include "dlo/models/weights.h"

int main(int argc, char** argv) {
  cxxopts::Options opts("dlo-forward", "One forward pass of one model component");
  opts.add_options()("model", "model directory (diffusers layout)", cxxopts::value<std::string>())(
      "component", "transformer", cxxopts::value<std::string>())(
      "inputs", "input tensors (.safetensors)", cxxopts::value<std::string>())(
      "out", "output file (.safetensors)", cxxopts::value<std::string>())(
      "dtype", "compute dtype: fp32, bf16, fp16", cxxopts::value<std::string>()->default_value("fp32"))(
      "threads", "CPU threads (0: libtorch default)", cxxopts::value<int>()->default_value("0"))(
      "prompt", "text_encoder: tokenize this prompt", cxxopts::value<std::string>())("h,help", "help");
  try {
    auto args = opts.parse(argc, argv);
    if (args.count("help")) {
      std::cout << opts.help();
      return 0;
    }
    for (const char* required : {"model", "component", "out"})
      DLO_CHECK(args.count(required), "missing --", required);
    dlo::ForwardOptions fo;
    fo.dtype = dlo::parse_compute_dtype(args["dtype"].as<std::string>(), "--dtype");
    if (args.count("prompt")) fo.prompt = args["prompt"].as<std::string>();
    const int threads = args["threads"].as<int>();
    DLO_CHECK(threads >= 0, "--threads must be >= 0");
    if (threads > 0) at::set_num_threads(threads);
    dlo::TensorMap inputs;
    if (args.count("inputs")) {
      const std::string path = args["inputs"].as<std::string>();
      auto ck = dlo::Checkpoint::open(path);
      inputs = dlo::load_tensors(ck);
    }
    auto out = dlo::run_component(args["model"].as<std::string>(), args["component"].as<std::string>(), inputs, fo);
    std::vector<std::pair<std::string, at::Tensor>> named(out.begin(), out.end());
    dlo::save_tensors(args["out"].as<std::string>(), named);
    return 0;
  } catch (const dlo::Error& e) {
    std::cerr << "dlo-forward: error: " << e.what() << "\n";
    return 2;
  } catch (const cxxopts::exceptions::exception& e) {
    std::cerr << "dlo-forward: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dlo-forward: unexpected error: " << e.what() << "\n";
    return 1;
  }
}
