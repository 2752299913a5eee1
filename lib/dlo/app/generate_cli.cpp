#include "dlo/app/generate_cli.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <random>

#include "dlo/app/job_flags.h"
#include "dlo/common/bytes.h"
#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/common/settings.h"
#include "dlo/dist/device.h"
#include "dlo/models/weights.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/render/batch_work.h"

namespace dlo {
namespace {

// The output folder's lock file: a second batch on the folder is refused while this one runs.
constexpr const char* kLockFileName = ".dlo-generate.lock";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace
cxxopts::Options generate_flag_table(const AppOutputs& outputs) {
  cxxopts::Options opts(outputs.build, "Text to video with a Wan2.1 text-to-video model (diffusers layout)");
  opts.add_options()("model", "model folder (diffusers layout: transformer/, vae/, text_encoder/, tokenizer/, scheduler/)",
                     cxxopts::value<std::string>())(
      "transformer", "the transformer's weights instead of the folder's transformer/: a .safetensors file or a folder "
      "of shards with an index, in diffusers', the original Wan or ComfyUI's tensor names (config from the shapes, "
      "checked against the folder's)", cxxopts::value<std::string>())(
      "transformer-2", "two experts: the low-noise expert's weights instead of transformer_2/ (as --transformer)",
      cxxopts::value<std::string>())(
      "vae", "the VAE's weights instead of the folder's vae/: a .safetensors file in diffusers' or the original "
      "Wan2.1 / Wan2.2 VAE names (config from the shapes, checked against the folder's)", cxxopts::value<std::string>())(
      "fuse-lora", "a LoRA merged into the transformer's weights for the whole run, [high=|low=]PATH[:STRENGTH] "
      "(repeatable, merged in order; high=/low= pick Wan2.2's expert): diffusers/PEFT, ComfyUI/Kijai/lightx2v or "
      "musubi files. Default: the manifest's fuse_loras", cxxopts::value<std::vector<std::string>>())(
      "jobs", "a batch: a YAML manifest or a .txt file of prompts (docs/manifest.md)", cxxopts::value<std::string>())(
      "output-dir", "batch: where videos and results.jsonl go (default: the manifest's output_dir)",
      cxxopts::value<std::string>())("force", "batch: render every job again, also those done or changed since")(
      "dry-run", "batch: print the plan and the memory estimate, render nothing")(
      "dtype", "transformer and text encoder: bf16, fp32 or fp16", cxxopts::value<std::string>()->default_value("bf16"))(
      "vae-dtype", "VAE: fp32, bf16 or fp16", cxxopts::value<std::string>()->default_value("fp32"))(
      "storage-dtype", "what the transformer blocks' Linears are kept in (host shards, gathers, device slots), cast to "
      "--dtype just before each matmul: fp8 (e4m3fn: half of bf16's bytes; the frames of diffusers' layerwise "
      "casting), bf16, fp16, fp32, or auto (as computed; a file already in fp8 stays fp8). Default: the manifest's "
      "storage_dtype, else auto", cxxopts::value<std::string>())(
      "offload", "auto, resident, device-shards, mixed, dlo or layerwise",
      cxxopts::value<std::string>()->default_value("auto"))(
      "device-budget", "device memory each rank may use, e.g. 40GiB (auto decides from it; mixed keeps as many "
      "blocks' shards on the device as fit). Default: the device's free memory", cxxopts::value<std::string>())(
      "device", "auto, cpu, cuda or cuda:N (default: local rank modulo visible GPUs)",
      cxxopts::value<std::string>()->default_value("auto"))(
      "text-vae-device", "with the transformer on CUDA, where the text encoder and the VAE run: auto (the GPU when "
      "that leaves the transformer's strategy as it is), cuda or cpu", cxxopts::value<std::string>()->default_value("auto"))(
      "threads", "CPU threads per rank (0: the cores divided among this node's ranks)",
      cxxopts::value<std::string>()->default_value("0"))(
      "report", "write the results and every rank's engine and memory facts as JSON (rank 0)",
      cxxopts::value<std::string>())("keep-page-cache", "keep the checkpoint's pages cached after building the shards")(
      "sp", "ranks that split one job along the sequence (Ulysses), or auto (default: a single prompt or a short "
      "batch takes every rank, a full batch one rank per job; see --dry-run)", cxxopts::value<std::string>()->default_value("auto"))(
      "cfg-parallel", "on, off or auto: a guided job's two guidance branches on two halves of its ranks",
      cxxopts::value<std::string>()->default_value("auto"))(
      "no-expert-alignment", "two experts: let each rank step its current job even when that makes a pass "
      "stream both experts (default: park a job or start the next early to keep the ranks on one)")(
      "quiet", "print only errors and failed jobs")("help-fields", "print the job-field table (Markdown) and exit")(
      "h,help", "help");
  add_job_field_flags(opts);
  return opts;
}

std::int64_t integer_flag(const cxxopts::ParseResult& a, const std::string& flag) {
  const std::string text = a[flag].as<std::string>();
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DLO_CHECK(used == text.size() && !text.empty(), "--", flag, ": '", text, "' is not an integer");
  return v;
}

GenerateOptions generate_options_from_flags(const cxxopts::ParseResult& a, const std::string& storage_key) {
  GenerateOptions go;
  go.dtype = parse_compute_dtype(a["dtype"].as<std::string>(), "--dtype");
  go.vae_dtype = parse_compute_dtype(a["vae-dtype"].as<std::string>(), "--vae-dtype");
  if (a.count("storage-dtype"))
    go.storage = parse_linear_storage(a["storage-dtype"].as<std::string>(), go.dtype, "--storage-dtype");
  else if (!storage_key.empty())
    go.storage = parse_linear_storage(storage_key, go.dtype, "storage_dtype");
  go.offload = parse_strategy_request(a["offload"].as<std::string>(), "--offload");
  if (a.count("device-budget")) go.device_budget = parse_bytes(a["device-budget"].as<std::string>(), "--device-budget");
  if (const char* id = std::getenv("NCCL_HOSTID")) go.host_id = id;
  go.device = parse_device_request(a["device"].as<std::string>(), "--device");
  go.text_vae = parse_aux_placement(a["text-vae-device"].as<std::string>(), "--text-vae-device");
  go.keep_page_cache = a.count("keep-page-cache") > 0;
  go.align_experts = a.count("no-expert-alignment") == 0;
  go.topology.sp = parse_sp(a["sp"].as<std::string>(), "--sp");
  go.topology.cfg = parse_cfg_parallel(a["cfg-parallel"].as<std::string>(), "--cfg-parallel");
  return go;
}

TopologyFlags topology_flags(const cxxopts::ParseResult& a) {
  TopologyFlags f;
  if (a.count("sp")) f.sp = parse_sp(a["sp"].as<std::string>(), "--sp");
  if (a.count("cfg-parallel")) f.cfg = parse_cfg_parallel(a["cfg-parallel"].as<std::string>(), "--cfg-parallel");
  return f;
}

std::vector<LoraSpec> fused_loras_from_flags(const cxxopts::ParseResult& a) {
  std::vector<LoraSpec> out;
  if (a.count("fuse-lora"))
    for (const auto& text : a["fuse-lora"].as<std::vector<std::string>>()) {
      LoraSpec l = parse_lora_spec(text, "--fuse-lora");
      l.path = canonical_path(l.path);
      out.push_back(std::move(l));
    }
  return out;
}

ModelParts model_parts_from_flags(const cxxopts::ParseResult& a) {
  ModelParts m{canonical_path(a["model"].as<std::string>()), "", ""};
  m.fused_loras = fused_loras_from_flags(a);
  for (const auto& [flag, given] : {std::pair<const char*, std::string*>{"transformer", &m.transformer},
                                    {"transformer-2", &m.transformer_2}, {"vae", &m.vae_file}})
    if (a.count(flag)) {
      *given = a[flag].as<std::string>();
      DLO_CHECK(!given->empty(), "--", flag, " is empty");
      *given = canonical_path(*given);
    }
  return m;
}

BatchPlan prompt_plan_from_flags(const cxxopts::ParseResult& a, const JobFlags& flags, const AppOutputs& outputs,
                           const std::string& dtypes, int ranks) {
  DLO_CHECK(a.count("model"), "missing --model DIR");
  DLO_CHECK(!a.count("output-dir") && !a.count("dry-run") && !a.count("force"),
            "--output-dir, --dry-run and --force are for batches (--jobs)");
  BatchPlan p;
  p.model = model_parts_from_flags(a);
  // The seed: given, or drawn here (on rank 0, which renders) and recorded in the metadata.
  const ModelInfo model = read_model_info(p.model);
  JobSpec job = prompt_job(flags, outputs.names(), std::random_device{}() & 0xffffffffu,
                                     read_model_job_defaults(p.model.dir));
  check_prompt_job(job, model, outputs.names(), flags);
  check_topology(batch_topology_request(topology_flags(a), "", ""), model, {&job}, ranks);
  if (a.count("out")) {
    const std::string why = output_name_problem(job.output);
    DLO_CHECK(why.empty(), "--out: ", why);
  }
  for (const std::string* out : {&job.output, &job.save_latents})
    DLO_CHECK(out->empty() || (canonical_path(*out) + "/").rfind(p.model.dir + "/", 0) != 0, "--",
              out == &job.output ? "out" : "save-latents", ": '", *out, "' is inside the model folder '", p.model.dir, "'");
  with_context("--out", [&] { outputs.format(job.format).check(job, model); });
  if (a.count("out")) {
    // As in a manifest: a video's name says its format (a PNG folder's has no extension). After
    // the format's own check, which says what a device or a folder at that path is.
    const std::string& ext = outputs.format(job.format).extension;
    const std::string name = path_name(job.output);
    DLO_CHECK(ext.empty() || job.output.back() == '/' || name.find('.', 1) != std::string::npos,
              "--out: '", job.output, "' has no extension (a ", job.format, " video: e.g. '", name, ext, "')");
  }
  DLO_CHECK(job.save_latents.empty() || !ends_with(job.save_latents, ".h5"),
            "--save-latents: .h5 files collect a batch's latents (--jobs); for one prompt write .safetensors");
  if (!job.save_latents.empty()) with_context("--save-latents", [&] { check_output_path(job.save_latents); });
  job.output = canonical_path(job.output);
  if (!job.save_latents.empty()) job.save_latents = canonical_path(job.save_latents);
  p.model_identity = model_identity(p.model);
  p.jobs.push_back({job, 0, job_fingerprint(job, model, p.model_identity, dtypes)});
  return p;
}

BatchPlan batch_plan_from_flags(const cxxopts::ParseResult& a, JobFlags flags, const AppOutputs& outputs,
                          const std::string& dtypes, int ranks, std::optional<FolderLock>& lock,
                          std::optional<FolderLock>& latents_lock) {
  flags.erase("save_latents");  // for a batch, --save-latents names its latents file
  for (const char* single : {"prompt", "out"})
    DLO_CHECK(!a.count(single), "--", single,
              " is for one prompt; with --jobs each job has its own (manifest keys prompt, output)");
  if (a.count("save-latents")) {
    const std::string file = a["save-latents"].as<std::string>();
    DLO_CHECK(outputs.open_latents, "--save-latents ", file, ": ", outputs.no_latents_store);
    DLO_CHECK(ends_with(file, outputs.latents_suffix), "--save-latents: a batch keeps its latents in one file (FILE",
              outputs.latents_suffix, ")");
    with_context("--save-latents", [&] { check_output_path(file); });
  }
  BatchPlanOptions o;
  o.manifest = a["jobs"].as<std::string>();
  o.flags = std::move(flags);
  if (a.count("model")) o.model = a["model"].as<std::string>();
  if (a.count("output-dir")) o.output_dir = a["output-dir"].as<std::string>();
  for (const auto& [flag, given] : {std::pair<const char*, std::string*>{"transformer", &o.transformer},
                                    {"transformer-2", &o.transformer_2}, {"vae", &o.vae}})
    if (a.count(flag)) {
      *given = a[flag].as<std::string>();
      DLO_CHECK(!given->empty(), "--", flag, " is empty");
    }
  o.fused_loras = fused_loras_from_flags(a);
  o.formats = outputs.names();
  o.force = a.count("force") > 0;
  o.dry_run = a.count("dry-run") > 0;
  o.dtypes = dtypes;
  o.dtypes_with = [&a](const std::string& key) { return dtypes_label(generate_options_from_flags(a, key)); };
  o.ranks = ranks;
  o.topology = topology_flags(a);
  o.check_output = [&](const JobSpec& j, const ModelInfo& m) { outputs.format(j.format).check(j, m); };
  o.check_model = [](const ModelInfo& m) { check_model_parts(m); };
  o.recorded_fingerprint = [&](const JobSpec& j) {
    const OutputFormat& f = outputs.format(j.format);
    const std::optional<RecordedJob> r = f.recorded ? f.recorded(j.output, false) : std::nullopt;
    return r ? r->fingerprint : std::string();
  };
  if (a.count("save-latents")) {
    o.latents = canonical_path(a["save-latents"].as<std::string>());
    o.read_latents = outputs.read_latents;
  }
  o.hold_output_dir = [&](const std::string& dir) { lock.emplace(dir, kLockFileName); };
  // The latents file, shared by any batch that names it: a lock beside it ("FILE.h5.lock"), which
  // covers the file only under that name.
  o.hold_latents = [&](const std::string& file) {
    struct stat st;
    DLO_CHECK(::stat(file.c_str(), &st) != 0 || st.st_nlink == 1, "--save-latents: '", file, "' has ", st.st_nlink,
              " hard links: its lock ('", path_name(file), ".lock') cannot keep batches that name it otherwise away; ",
              "give a file of its own (a copy)");
    latents_lock.emplace(path_folder(file), path_name(file) + ".lock", str("the latents file '", file, "'"));
  };
  return plan_batch(o);
}

void print_dry_run(const MpiWorld& world, const ModelInfo& model, const BatchPlan& plan,
                   const GenerateOptions& go) {
  const RenderPlan rp = plan_render(world, model, plan.jobs, go);
  if (world.rank() != 0) return;
  // Each runnable job's phase and, for the first jobs of a phase, the ranks it starts on.
  std::int64_t position = 0;
  for (std::size_t i = 0; i < plan.jobs.size(); ++i) {
    const auto& j = plan.jobs[i].spec;
    std::cout << "job " << plan.jobs[i].index << " '" << j.id << "': " << j.width << "x" << j.height << ", " << j.frames
              << " frames, " << j.steps << " steps, guidance " << j.guidance << " -> " << j.output;
    const auto& refused = rp.memory.refused;
    if (const auto r = std::find(refused.begin(), refused.end(), static_cast<std::int64_t>(i)); r != refused.end()) {
      std::cout << " (refused: " << rp.memory.refused_why[static_cast<std::size_t>(r - refused.begin())] << ")\n";
      continue;
    }
    for (std::size_t p = 0; p < rp.topology.phases.size(); ++p) {
      const TopologyPhase& ph = rp.topology.phases[p];
      if (position < ph.first || position >= ph.first + ph.count) continue;
      const int P = ph.topology.group_size, first = static_cast<int>(position - ph.first) * P;
      const std::string when = p == 0 ? "starts on" : "then, once the jobs before it are denoised, on";
      if (first < world.size())
        std::cout << (P == 1 ? str(" (", when, " rank ", first, ")")
                             : str(" (", when, " ranks ", first, "-", first + P - 1, ", ",
                                        ph.topology.label(j.guided()), ")"));
      else if (p > 0)
        std::cout << " (in the tail, on the next free group of " << P << " rank(s))";
    }
    ++position;
    std::cout << "\n";
  }
  std::cout << "topology: " << rp.topology.reason << "\n";
  std::cout << "memory per rank with " << strategy_name(rp.memory.choice.strategy) << " on " << world.size()
            << " rank(s) (estimate; device " << rp.device << "; transformer " << rp.weights << "):\n"
            << rp.memory.describe() << "\n";
}

}  // namespace dlo
