// dlo-checkpoint: look at and rewrite safetensors checkpoints.
//
//   dlo-checkpoint inspect PATH [--json]
//   dlo-checkpoint copy SRC DST_DIR [--shard-size 10GB] [--base-name NAME] [--wan-names original]
//   dlo-checkpoint convert SRC DST_DIR --storage-dtype fp8 [--dtype bf16] [--shard-size 10GB]
//   dlo-checkpoint lora FILE [--model DIR | --preset NAME] [--out OUT.safetensors] [--list]
//   dlo-checkpoint make OUT_DIR [--preset wan-test] [--layers N ...] [--dtype bf16] [--seed S]
//                      [--components transformer,scheduler,vae] [--vae-preset wan2.1-vae-small]
//                      [--components ...,text_encoder,tokenizer] [--te-layers N --te-d-ff F ...]
//
// A checkpoint write replaces the checkpoint its folder held (the new files first, then the old
// *.safetensors / *.safetensors.index.json are removed); `copy` into the source's own folder is
// refused. Every file is written atomically (temporary name, every byte checked, fsync, rename);
// outputs that are not folders/regular files are refused before any work.
// Exit codes: 0 ok, 2 bad invocation, malformed checkpoint or an I/O error, 1 anything else.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include <cxxopts.hpp>

#include "dlo/common/bytes.h"
#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/app/tool.h"
#include "dlo/config/wan_tensor_names.h"
#include "dlo/config/model_info.h"
#include "dlo/config/wan_vae_names.h"
#include "dlo/io/inspect.h"
#include "dlo/io/safetensors.h"
#include "dlo/io/safetensors_writer.h"
#include "dlo/testing/make_model.h"
#include "dlo/models/tensor_view.h"
#include "dlo/models/wan_convert.h"
#include "dlo/models/wan_lora.h"
#include "dlo/models/weights.h"

namespace {

constexpr const char* kUsage =
    "usage: dlo-checkpoint COMMAND ...\n"
    "commands:\n"
    "  inspect PATH [--json]        summarise a checkpoint (file, index or directory)\n"
    "  copy SRC DST_DIR [--shard-size SIZE] [--base-name NAME]\n"
    "                               rewrite a checkpoint, resharded (SIZE 0: one file)\n"
    "       [--wan-names diffusers|original|comfyui]  a Wan transformer's names rewritten\n"
    "  convert SRC DST_DIR --storage-dtype fp8 [--dtype bf16] [--shard-size SIZE]\n"
    "                               a Wan transformer as a diffusers folder at a storage dtype\n"
    "  lora FILE [--model DIR | --preset NAME] [--out OUT.safetensors] [--list]\n"
    "                               a Wan LoRA as diffusers reads it: layout, ranks, scalings, keys\n"
    "                               diffusers ignores; checked against a model; rewritten (diffusers/PEFT)\n"
    "  make OUT_DIR [--preset NAME] [--layers N] [--dim D] ... [--dtype bf16] [--seed S]\n"
    "       [--components transformer,scheduler,vae] [--vae-preset NAME] [--vae-base-dim N]\n"
    "                               write a random-weight model in the diffusers layout\n";

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
      "wan-names", "a Wan transformer's tensors renamed: diffusers, original (the Wan repositories') or comfyui "
      "(original under 'model.diffusion_model.'); read from any of them. A Wan VAE's likewise (the original Wan2.1 "
      "or Wan2.2 VAE names; ComfyUI's VAE files use the original names)", cxxopts::value<std::string>())(
      "src", "source", cxxopts::value<std::string>())("dst", "destination directory", cxxopts::value<std::string>())(
      "h,help", "help");
  opts.parse_positional({"src", "dst"});
  auto args = opts.parse(argc, argv);
  if (args.count("help")) {
    std::cout << opts.help();
    return 0;
  }
  DLO_CHECK(args.count("src") && args.count("dst"), "copy: need SRC and DST_DIR");
  dlo::check_output_folder(args["dst"].as<std::string>());
  const std::string names = args.count("wan-names") ? args["wan-names"].as<std::string>() : "";
  DLO_CHECK(names.empty() || names == "diffusers" || names == "original" || names == "comfyui", "--wan-names: '", names,
            "' is not diffusers, original or comfyui");
  const std::string src = args["src"].as<std::string>();
  auto ck = dlo::Checkpoint::open(src);
  // A VAE (its decoder's first conv under either naming) takes the VAE's table, anything else the transformer's.
  const bool vae = ck.find("decoder.conv_in.weight") != nullptr || ck.find("decoder.conv1.weight") != nullptr;
  if (!names.empty()) ck = vae ? dlo::open_wan_vae(src) : dlo::open_wan_transformer(src);
  if (names != "" && names != "diffusers" && vae) {
    std::vector<std::string> now;
    for (const dlo::TensorInfo* t : ck.tensors()) now.push_back(t->name);
    dlo::WanVaeKeyLayout to = dlo::detect_wan_vae_layout(now, ck.source());
    to.original = true;
    ck.rename_tensors([&](const std::string& n) { return *dlo::wan_vae_diffusers_to_original(n, to); });
  } else if (names != "" && names != "diffusers") {
    ck.rename_tensors([&](const std::string& n) {
      const std::string bare = n == dlo::kScaledFp8Marker ? n : *dlo::wan_diffusers_to_original(n);
      return (names == "comfyui" ? "model.diffusion_model." : "") + bare;
    });
  }
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

int convert(int argc, char** argv) {
  cxxopts::Options opts("dlo-checkpoint convert",
                        "A Wan transformer (folder, file or index; diffusers', original Wan or ComfyUI names) rewritten as a "
                        "diffusers transformer folder at a storage dtype");
  opts.add_options()("storage-dtype", "the blocks' Linears: fp8 (e4m3fn; a file already fp8 stays as it is), bf16, fp16 or fp32",
                     cxxopts::value<std::string>())(
      "dtype", "the compute dtype the rest is kept in, and the Linears rounded through (as dlo-generate --dtype)",
      cxxopts::value<std::string>()->default_value("bf16"))(
      "shard-size", "max bytes per shard (0: one file)", cxxopts::value<std::string>()->default_value("10GB"))(
      "src", "source", cxxopts::value<std::string>())("dst", "destination directory", cxxopts::value<std::string>())(
      "h,help", "help");
  opts.parse_positional({"src", "dst"});
  auto args = opts.parse(argc, argv);
  if (args.count("help")) {
    std::cout << opts.help();
    return 0;
  }
  DLO_CHECK(args.count("src") && args.count("dst"), "convert: need SRC and DST_DIR");
  DLO_CHECK(args.count("storage-dtype"), "convert: give --storage-dtype (fp8, bf16, fp16 or fp32)");
  const auto compute = dlo::parse_compute_dtype(args["dtype"].as<std::string>(), "--dtype");
  const std::string storage_name = args["storage-dtype"].as<std::string>();
  DLO_CHECK(storage_name != "auto", "--storage-dtype: give the dtype to write (fp8, bf16, fp16 or fp32), not auto");
  const auto storage = dlo::parse_linear_storage(storage_name, compute, "--storage-dtype");
  const std::string dst = args["dst"].as<std::string>();
  dlo::check_output_folder(dst);
  dlo::WriteOptions w;
  w.max_shard_bytes = dlo::parse_bytes(args["shard-size"].as<std::string>(), "--shard-size");
  w.base_name = "diffusion_pytorch_model";
  const auto r = dlo::convert_wan_transformer(args["src"].as<std::string>(), dst, storage, compute, w);
  std::cout << "wrote " << r.written.files.size() << " file(s), " << dlo::human_bytes(r.written.total_bytes)
            << " of tensors (" << r.dtypes.describe() << "), config.json"
            << (r.written.index_path.empty() ? "" : ", index " + r.written.index_path) << "\n";
  return 0;
}

int lora(int argc, char** argv) {
  cxxopts::Options opts("dlo-checkpoint lora",
                        "A LoRA for a Wan transformer (diffusers/PEFT, ComfyUI/Kijai or musubi layout) read as diffusers "
                        "reads it");
  std::string presets;
  for (const auto& p : dlo::WanTransformerConfig::preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  opts.add_options()("model", "check it against this model folder's transformer (each expert of a two-expert model)",
                     cxxopts::value<std::string>())(
      "preset", "check it against a transformer shape: " + presets, cxxopts::value<std::string>())(
      "out", "write it in the diffusers/PEFT layout (transformer.<module>.lora_A.weight, .lora_B.weight, "
      ".lora_B.bias), the tensors as read", cxxopts::value<std::string>())(
      "list", "one line per module: name, rank, in, out, scaling, bias")("file", "LoRA .safetensors",
                                                                         cxxopts::value<std::string>())("h,help", "help");
  opts.parse_positional({"file"});
  auto args = opts.parse(argc, argv);
  if (args.count("help")) {
    std::cout << opts.help();
    return 0;
  }
  DLO_CHECK(args.count("file"), "lora: missing FILE");
  DLO_CHECK(!(args.count("model") && args.count("preset")), "lora: give --model or --preset, not both");
  const std::string file = args["file"].as<std::string>();
  if (args.count("out")) {
    const std::string out = args["out"].as<std::string>();
    dlo::check_output_path(out);
    std::error_code ec;
    DLO_CHECK(!std::filesystem::equivalent(file, out, ec), "--out '", out, "' is the LoRA read");
  }
  const dlo::LoraFile f = dlo::read_wan_lora(file);
  std::vector<dlo::WanTransformerConfig> configs;
  if (args.count("model")) {  // its transformer/ (and transformer_2/): the other parts need not be there
    const dlo::ModelParts parts{args["model"].as<std::string>(), "", ""};
    configs.push_back(dlo::read_expert_config(parts, false));
    if (std::filesystem::exists(parts.folder("transformer_2"))) configs.push_back(dlo::read_expert_config(parts, true));
  }
  if (args.count("preset")) configs.push_back(dlo::WanTransformerConfig::preset(args["preset"].as<std::string>()));
  for (const auto& c : configs) dlo::check_wan_lora(f, c);

  std::map<std::int64_t, int> ranks;
  std::map<double, int> scalings;
  int biases = 0;
  for (const auto& [m, mod] : f.modules) {
    ++ranks[mod.down.size(0)];
    ++scalings[mod.scaling];
    biases += mod.bias.defined();
  }
  auto counts = [](const auto& by) {
    std::ostringstream os;
    const char* sep = "";
    for (const auto& [v, n] : by) {
      os << sep << v << " (" << n << ")";
      sep = ", ";
    }
    return os.str();
  };
  std::cout << file << ": " << f.layout << ", " << f.modules.size() << " modules, " << biases << " with a bias\n"
            << "  ranks: " << counts(ranks) << "\n  scalings: " << counts(scalings) << "\n";
  if (!configs.empty()) std::cout << "  fits the model's Linears\n";
  if (args.count("list"))
    for (const auto& [m, mod] : f.modules)
      std::cout << "  " << m << " rank " << mod.down.size(0) << " in " << mod.down.size(1) << " out " << mod.up.size(0)
                << " scaling " << std::setprecision(17) << mod.scaling << (mod.bias.defined() ? " bias" : "") << "\n";
  if (!f.ignored.empty()) {
    std::cout << "  ignored as diffusers ignores them (not applied): " << f.ignored.size() << " key(s)\n";
    for (const auto& k : f.ignored) std::cout << "    " << k << "\n";
  }
  if (args.count("out")) {
    dlo::save_tensors(args["out"].as<std::string>(), dlo::wan_lora_peft_tensors(f));
    std::cout << "wrote " << args["out"].as<std::string>() << "\n";
  }
  return 0;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t comma = s.find(',', start);
    std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!part.empty()) out.push_back(part);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int make(int argc, char** argv) {
  cxxopts::Options opts("dlo-checkpoint make", "Write a random-weight model directory (diffusers layout)");
  std::string presets;
  for (const auto& p : dlo::WanTransformerConfig::preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  std::string vae_presets;
  for (const auto& p : dlo::WanVaeConfig::preset_names()) vae_presets += (vae_presets.empty() ? "" : ", ") + p;
  opts.add_options()("preset", "transformer shape: " + presets, cxxopts::value<std::string>()->default_value("wan-test"))(
      "layers", "number of blocks", cxxopts::value<std::int64_t>())(
      "dim", "model width (heads x head dim)", cxxopts::value<std::int64_t>())(
      "heads", "attention heads", cxxopts::value<std::int64_t>())(
      "head-dim", "attention head dim", cxxopts::value<std::int64_t>())(
      "ffn-dim", "feed-forward width", cxxopts::value<std::int64_t>())(
      "text-dim", "text embedding width", cxxopts::value<std::int64_t>())(
      "in-channels", "latent channels in", cxxopts::value<std::int64_t>())(
      "out-channels", "latent channels out", cxxopts::value<std::int64_t>())(
      "freq-dim", "timestep embedding width", cxxopts::value<std::int64_t>())(
      "rope-max-seq-len", "RoPE table length", cxxopts::value<std::int64_t>())(
      "dtype", "bf16, fp16 or fp32", cxxopts::value<std::string>()->default_value("bf16"))(
      "seed", "random seed", cxxopts::value<std::uint64_t>()->default_value("0"))(
      "boundary-ratio", "with transformer_2: model_index.json's boundary_ratio (default 0.875)", cxxopts::value<double>())(
      "shard-size", "max bytes per shard (0: one file)", cxxopts::value<std::string>()->default_value("10GB"))(
      "components", "comma-separated components (transformer, transformer_2, scheduler, vae, text_encoder, tokenizer; a "
      "wan2.2 A14B preset adds transformer_2)",
      cxxopts::value<std::string>()->default_value("transformer,scheduler,vae,text_encoder,tokenizer"))(
      "vae-preset", "VAE shape: " + vae_presets + " (default: the preset's: wan2.2-vae for wan2.2-ti2v-5b, "
      "wan2.2-vae-test for wan2.2-ti2v-test, else wan2.1-vae-small)", cxxopts::value<std::string>())(
      "vae-base-dim", "VAE base_dim (channels of the last decoder stage)", cxxopts::value<std::int64_t>())(
      "vae-dtype", "VAE weights: fp32, bf16 or fp16", cxxopts::value<std::string>()->default_value("fp32"))(
      "te-preset", "text encoder shape: umt5-test, umt5-xxl", cxxopts::value<std::string>()->default_value("umt5-test"))(
      "te-d-model", "text encoder width (default: the transformer's text_dim)", cxxopts::value<std::int64_t>())(
      "te-layers", "text encoder blocks", cxxopts::value<std::int64_t>())(
      "te-heads", "text encoder attention heads", cxxopts::value<std::int64_t>())(
      "te-d-kv", "text encoder head dim", cxxopts::value<std::int64_t>())(
      "te-d-ff", "text encoder feed-forward width", cxxopts::value<std::int64_t>())(
      "te-vocab", "text encoder vocab_size", cxxopts::value<std::int64_t>())(
      "te-buckets", "relative_attention_num_buckets", cxxopts::value<std::int64_t>())(
      "te-max-distance", "relative_attention_max_distance", cxxopts::value<std::int64_t>())(
      "te-ff-proj", "feed_forward_proj (gated-gelu, relu, ...)", cxxopts::value<std::string>())(
      "out", "output directory", cxxopts::value<std::string>())("h,help", "help");
  opts.parse_positional({"out"});
  auto args = opts.parse(argc, argv);
  if (args.count("help")) {
    std::cout << opts.help();
    return 0;
  }
  DLO_CHECK(args.count("out"), "make: missing OUT_DIR");
  dlo::MakeModelOptions o;
  o.transformer = dlo::WanTransformerConfig::preset(args["preset"].as<std::string>());
  auto& c = o.transformer;
  auto flag = [&](const char* name, std::int64_t& field) {
    if (args.count(name)) field = args[name].as<std::int64_t>();
  };
  flag("layers", c.num_layers);
  flag("heads", c.num_attention_heads);
  flag("head-dim", c.attention_head_dim);
  flag("ffn-dim", c.ffn_dim);
  flag("text-dim", c.text_dim);
  flag("in-channels", c.in_channels);
  flag("out-channels", c.out_channels);
  flag("freq-dim", c.freq_dim);
  flag("rope-max-seq-len", c.rope_max_seq_len);
  if (args.count("dim")) {
    const auto d = args["dim"].as<std::int64_t>();
    DLO_CHECK(d > 0 && d % c.num_attention_heads == 0, "--dim ", d, " must be a positive multiple of --heads (",
              c.num_attention_heads, ")");
    DLO_CHECK(!args.count("head-dim") || args["head-dim"].as<std::int64_t>() * c.num_attention_heads == d,
              "--dim disagrees with --heads x --head-dim");
    c.attention_head_dim = d / c.num_attention_heads;
  }
  c.validate("make");
  auto to_dtype = [](at::ScalarType st) {
    return st == at::kFloat ? dlo::DType::F32 : st == at::kHalf ? dlo::DType::F16 : dlo::DType::BF16;
  };
  o.dtype = to_dtype(dlo::parse_compute_dtype(args["dtype"].as<std::string>(), "--dtype"));
  const std::string preset = args["preset"].as<std::string>();
  // The VAE follows the preset's model (the Wan2.2 VAE for TI2V) unless given.
  o.vae = dlo::WanVaeConfig::preset(args.count("vae-preset") ? args["vae-preset"].as<std::string>()
                                                              : dlo::WanTransformerConfig::preset_vae(preset));
  if (args.count("vae-base-dim")) o.vae.base_dim = args["vae-base-dim"].as<std::int64_t>();
  o.vae.validate("make (VAE)");
  o.vae_dtype = to_dtype(dlo::parse_compute_dtype(args["vae-dtype"].as<std::string>(), "--vae-dtype"));
  auto& te = o.text_encoder;
  te = dlo::Umt5Config::preset(args["te-preset"].as<std::string>());
  if (!args.count("te-preset") || args["te-preset"].as<std::string>() == "umt5-test") te.d_model = c.text_dim;
  flag("te-d-model", te.d_model);
  flag("te-layers", te.num_layers);
  flag("te-heads", te.num_heads);
  flag("te-d-kv", te.d_kv);
  flag("te-d-ff", te.d_ff);
  flag("te-vocab", te.vocab_size);
  flag("te-buckets", te.relative_attention_num_buckets);
  flag("te-max-distance", te.relative_attention_max_distance);
  if (args.count("te-ff-proj")) te.feed_forward_proj = args["te-ff-proj"].as<std::string>();
  te.validate("make (text encoder)");
  o.seed = args["seed"].as<std::uint64_t>();
  o.shard_bytes = dlo::parse_bytes(args["shard-size"].as<std::string>(), "--shard-size");
  o.components = split_commas(args["components"].as<std::string>());
  // A two-expert preset (Wan2.2 A14B) writes the low-noise expert beside the transformer.
  const bool two_experts = dlo::WanTransformerConfig::preset_has_two_experts(args["preset"].as<std::string>());
  if (two_experts && std::find(o.components.begin(), o.components.end(), "transformer") != o.components.end() &&
      std::find(o.components.begin(), o.components.end(), "transformer_2") == o.components.end())
    o.components.push_back("transformer_2");
  if (args.count("boundary-ratio")) {
    DLO_CHECK(std::find(o.components.begin(), o.components.end(), "transformer_2") != o.components.end(),
              "--boundary-ratio: only with a second expert (transformer_2 in --components, or a wan2.2 A14B preset)");
    o.boundary_ratio = args["boundary-ratio"].as<double>();
  }
  // TI2V (converted repo): a timestep per token, flow shift 5.0.
  if (dlo::WanTransformerConfig::preset_expands_timesteps(preset)) {
    o.expand_timesteps = true;
    o.flow_shift = 5.0;
  }
  // The parts must fit together: WanPipeline runs the transformer on the VAE's latents, so its
  // in/out channels follow the VAE's z_dim unless given, and given ones must agree.
  auto has = [&](const char* comp) {
    return std::find(o.components.begin(), o.components.end(), comp) != o.components.end();
  };
  if (has("transformer") && has("vae")) {
    if (!args.count("in-channels")) c.in_channels = o.vae.z_dim;
    if (!args.count("out-channels")) c.out_channels = o.vae.z_dim;
    o.channels_follow_vae = false;  // decided here: given flags must agree
    DLO_CHECK(c.in_channels == o.vae.z_dim && c.out_channels == o.vae.z_dim, "--in-channels/--out-channels (",
              c.in_channels, "/", c.out_channels, ") must equal the VAE's z_dim (", o.vae.z_dim,
              ") when both are written: WanPipeline runs the transformer on the VAE's latents (leave them out "
              "to follow z_dim, or leave vae out of --components)");
  }
  dlo::check_make_model(args["out"].as<std::string>(), o);
  dlo::MakeModelResult r;
  try {
    r = dlo::make_model(args["out"].as<std::string>(), o);
  } catch (const std::exception& e) {
    // Out of memory while drawing weights: the model is too large for this machine (exit 2).
    if (dlo::is_allocation_failure(e)) throw dlo::Error(dlo::describe_exception(e));
    throw;
  }
  std::cout << "wrote " << args["out"].as<std::string>() << ": ";
  for (std::size_t i = 0; i < r.written.size(); ++i) std::cout << (i ? ", " : "") << r.written[i];
  std::cout << " (" << dlo::human_bytes(r.bytes) << " of weights)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string cmd = argv[1];
  // Exit codes, messages and fault handlers shared by every tool (dlo/dist/tool.h).
  return dlo::run_tool("dlo-checkpoint " + cmd, nullptr, [&] {
    try {
      if (cmd == "inspect") return inspect(argc - 1, argv + 1);
      if (cmd == "copy") return copy(argc - 1, argv + 1);
      if (cmd == "convert") return convert(argc - 1, argv + 1);
      if (cmd == "make") return make(argc - 1, argv + 1);
      if (cmd == "lora") return lora(argc - 1, argv + 1);
    } catch (const cxxopts::exceptions::exception& e) {
      throw dlo::Error(e.what());
    }
    if (cmd == "-h" || cmd == "--help") {
      std::cout << kUsage;
      return 0;
    }
    std::cerr << "dlo-checkpoint: unknown command '" << cmd << "'\n" << kUsage;
    return 2;
  });
}
