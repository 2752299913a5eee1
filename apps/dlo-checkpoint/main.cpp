// dlo-checkpoint: look at and rewrite safetensors checkpoints.
//
//   dlo-checkpoint inspect PATH [--json]
//   dlo-checkpoint copy SRC DST_DIR [--shard-size 10GB] [--base-name NAME]
//
// Exit codes: 0 ok, 2 bad invocation or malformed checkpoint, 1 anything else.
#include <cstdio>
#include <iostream>
#include <string>

#include <cxxopts.hpp>

#include "dlo/common/bytes.h"
#include "dlo/common/error.h"
#include "dlo/io/inspect.h"
#include "dlo/io/safetensors.h"
#include "dlo/io/safetensors_writer.h"

namespace {

constexpr const char* kUsage =
    "usage: dlo-checkpoint COMMAND ...\n"
    "commands:\n"
    "  inspect PATH [--json]        summarise a checkpoint (file, index or directory)\n"
    "  copy SRC DST_DIR [--shard-size SIZE] [--base-name NAME]\n"
    "                               rewrite a checkpoint, resharded (SIZE 0: one file)\n";

int inspect(int argc, char** argv) {
  cxxopts::Options opts("dlo-checkpoint inspect", "Summarise a safetensors checkpoint");
  opts.add_options()("json", "print JSON instead of text")("path", "checkpoint", cxxopts::value<std::string>())(
      "h,help", "help");
  opts.parse_positional({"path"});
  auto args = opts.parse(argc, argv);
  if (args.count("help")) {
    std::cout << opts.help();
    return 0;
  }
  DLO_CHECK(args.count("path"), "inspect: missing PATH");
  auto ck = dlo::Checkpoint::open(args["path"].as<std::string>());
  auto summary = dlo::summarize(ck);
  std::cout << (args.count("json") ? dlo::format_json(summary) : dlo::format_text(summary));
  return 0;
}

int copy(int argc, char** argv) {
  cxxopts::Options opts("dlo-checkpoint copy", "Rewrite a checkpoint, resharded");
  opts.add_options()("shard-size", "max bytes per shard (0: one file)", cxxopts::value<std::string>()->default_value("10GB"))(
      "base-name", "file base name (default: the source's)", cxxopts::value<std::string>())(
      "src", "source", cxxopts::value<std::string>())("dst", "destination directory", cxxopts::value<std::string>())(
      "h,help", "help");
  opts.parse_positional({"src", "dst"});
  auto args = opts.parse(argc, argv);
  if (args.count("help")) {
    std::cout << opts.help();
    return 0;
  }
  DLO_CHECK(args.count("src") && args.count("dst"), "copy: need SRC and DST_DIR");
  auto ck = dlo::Checkpoint::open(args["src"].as<std::string>());
  dlo::WriteOptions w;
  w.max_shard_bytes = dlo::parse_bytes(args["shard-size"].as<std::string>(), "--shard-size");
  if (args.count("base-name")) {
    w.base_name = args["base-name"].as<std::string>();
  } else {
    // "x/diffusion_pytorch_model.safetensors.index.json" or "x/model-00001-of-00002.safetensors" -> base
    std::string n = ck.files().size() == 1 && ck.source().find(".json") == std::string::npos
                        ? ck.files()[0]->path() : ck.source();
    n = n.substr(n.find_last_of('/') + 1);
    n = n.substr(0, n.find(".safetensors"));
    if (auto p = n.find("-0000"); p != std::string::npos) n = n.substr(0, p);
    w.base_name = n;
  }
  auto r = dlo::copy_checkpoint(ck, args["dst"].as<std::string>(), w);
  std::cout << "wrote " << r.files.size() << " file(s), " << dlo::human_bytes(r.total_bytes) << " of tensors"
            << (r.index_path.empty() ? "" : ", index " + r.index_path) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "inspect") return inspect(argc - 1, argv + 1);
    if (cmd == "copy") return copy(argc - 1, argv + 1);
    if (cmd == "-h" || cmd == "--help") {
      std::cout << kUsage;
      return 0;
    }
    std::cerr << "dlo-checkpoint: unknown command '" << cmd << "'\n" << kUsage;
    return 2;
  } catch (const dlo::Error& e) {
    std::cerr << "dlo-checkpoint " << cmd << ": error: " << e.what() << "\n";
    return 2;
  } catch (const cxxopts::exceptions::exception& e) {
    std::cerr << "dlo-checkpoint " << cmd << ": " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dlo-checkpoint " << cmd << ": unexpected error: " << e.what() << "\n";
    return 1;
  }
}
