// dlo-generate: text to video with a Wan2.1 text-to-video model in the diffusers layout.
//
//   [mpirun -np N] dlo-generate --model DIR --prompt TEXT [job flags] [--out FILE]
//   [mpirun -np N] dlo-generate --jobs prompts.yaml|prompts.txt [--model DIR] [--output-dir DIR]
//       [job flags] [--force] [--dry-run] [--save-latents FILE.h5] [--quiet]
//   job flags: --negative-prompt --seed --steps --guidance --height --width --frames --fps
//       --scheduler unipc|euler --flow-shift --format mp4|png|ffv1 --crf --preset
//   run flags: --dtype --vae-dtype --offload auto|resident|device-shards|mixed|dlo|layerwise
//              --device-budget --device --threads
//
// One prompt: rank 0 renders, every rank keeps 1/N of the transformer's blocks. A batch: every rank
// renders a different job at once, taking the next at a pass boundary; results.jsonl in the output
// folder records each job; a rerun skips what is done. SIGINT/SIGTERM stop every rank at the next
// pass boundary (finished decodes are kept); a rerun continues.
// Exit codes: 0 ok, 2 bad invocation or input (found before any weight is read; nothing written),
// 3 a batch finished with some jobs failed, 130/143 stopped by SIGINT/SIGTERM, 1 anything else.
//
// dlo-generate-bare is this file built with DLO_GENERATE_BARE: no libav and no HDF5 (it travels to
// bare GPU machines in tools/gpu-bundle.sh). It writes each job's frames to FILE.safetensors
// (tensor "frames", uint8 [frames, height, width, 3], the job's parameters as metadata, as
// --save-latents does) and refuses video outputs and .h5 latents before any work (exit 2).
#include <ATen/Parallel.h>
#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "dlo/common/bytes.h"
#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/common/memory.h"
#include "dlo/common/settings.h"
#include "dlo/dist/mpi_world.h"
#include "dlo/dist/tool.h"
#ifdef DLO_GENERATE_BARE
#include "dlo/io/safetensors_writer.h"
#else
#include "dlo/media/latents_h5.h"
#include "dlo/media/video_writer.h"
#endif
#include "dlo/models/weights.h"
#include "dlo/pipeline/generate.h"
#include "dlo/pipeline/memory_estimate.h"
#include "dlo/pipeline/manifest.h"
#include "dlo/pipeline/results.h"

namespace {

std::atomic<int> g_signal{0};
extern "C" void on_stop_signal(int sig) { g_signal.store(sig); }

// Job field -> the flag it came from, for messages.
std::string flag_of(const std::string& field) {
  if (field == "output") return "--out";
  std::string f = "--" + field;
  for (auto& c : f)
    if (c == '_') c = '-';
  return f;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

#ifdef DLO_GENERATE_BARE
constexpr const char* kNoEncoder =
    "this build (dlo-generate-bare) has no video encoder and no HDF5: it writes frames as FILE.safetensors";

// The frames of one job, kept in memory and written as one uint8 tensor [frames, height, width, 3]
// by finish() (write_safetensors_file: a temporary renamed into place).
class FramesSink : public dlo::FrameSink {
 public:
  FramesSink(std::string path, std::int64_t w, std::int64_t h, std::int64_t frames, std::string parameters_json)
      : path_(std::move(path)), w_(w), h_(h), frames_(frames), parameters_(std::move(parameters_json)) {
    bytes_.reserve(static_cast<std::size_t>(frames * h * w * 3));
  }
  void add_frame(const std::uint8_t* rgb) override { bytes_.insert(bytes_.end(), rgb, rgb + w_ * h_ * 3); }
  void finish() override {
    const auto frame = static_cast<std::size_t>(w_ * h_ * 3);
    DLO_CHECK(bytes_.size() == frame * static_cast<std::size_t>(frames_), "'", path_, "': ", bytes_.size() / frame,
              " frames decoded, ", frames_, " expected");
    dlo::write_safetensors_file(
        path_, {dlo::TensorSpec{"frames", dlo::DType::U8, {frames_, h_, w_, 3}}},
        [&](std::size_t, const dlo::TensorSpec& spec, std::byte* out) { std::memcpy(out, bytes_.data(), spec.nbytes()); },
        {{"format", "pt"}, {"dlo_job", parameters_}});
  }

 private:
  std::string path_;
  std::int64_t w_, h_, frames_;
  std::string parameters_;
  std::vector<std::uint8_t> bytes_;
};

// A job's output can be written by this build: FILE.safetensors, in a writable folder.
void check_output(const dlo::JobSpec& job, const dlo::ModelInfo&) {
  DLO_CHECK(ends_with(job.output, ".safetensors"), "'", job.output, "' is not a .safetensors file: ", kNoEncoder,
            " (uint8 [frames, height, width, 3])");
  dlo::check_output_path(job.output);
}

std::unique_ptr<dlo::FrameSink> open_output(const dlo::JobSpec& job, const dlo::ModelInfo& model, std::int64_t w,
                                            std::int64_t h, std::int64_t frames) {
  return std::make_unique<FramesSink>(job.output, w, h, frames, dlo::job_parameters_json(job, model));
}
#else
class VideoSink : public dlo::FrameSink {
 public:
  VideoSink(const std::string& path, std::int64_t w, std::int64_t h, const dlo::VideoOptions& o)
      : writer_(path, static_cast<int>(w), static_cast<int>(h), o) {}
  void add_frame(const std::uint8_t* rgb) override { writer_.add_frame(rgb); }
  void finish() override { writer_.finish(); }

 private:
  dlo::VideoWriter writer_;
};

dlo::VideoOptions video_options(const dlo::JobSpec& job, const dlo::ModelInfo& model) {
  dlo::VideoOptions v;
  v.format = dlo::parse_video_format(job.format);
  v.fps = static_cast<int>(job.fps);
  v.crf = static_cast<int>(job.crf);
  v.preset = job.preset;
  v.threads = 1;
  v.tags = {{"comment", dlo::job_parameters_text(job, model)}, {"description", dlo::job_parameters_json(job, model)}};
  return v;
}

void check_output(const dlo::JobSpec& job, const dlo::ModelInfo& model) {
  dlo::check_video_output(job.output, video_options(job, model));
}

std::unique_ptr<dlo::FrameSink> open_output(const dlo::JobSpec& job, const dlo::ModelInfo& model, std::int64_t w,
                                            std::int64_t h, std::int64_t) {
  return std::make_unique<VideoSink>(job.output, w, h, video_options(job, model));
}
#endif

std::string seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, s < 100 ? "%.2f s" : "%.0f s", s);
  return b;
}

std::string now_stamp() {
  char b[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(b, sizeof b, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return b;
}

// The job-field flags the user gave (defaults do not count: a manifest's own defaults apply).
dlo::JobFieldOverrides field_flags(const cxxopts::ParseResult& a) {
  dlo::JobFieldOverrides f;
  if (a.count("negative-prompt")) f.negative_prompt = a["negative-prompt"].as<std::string>();
  if (a.count("format")) f.format = a["format"].as<std::string>();
  if (a.count("preset")) f.preset = a["preset"].as<std::string>();
  if (a.count("seed")) f.seed = a["seed"].as<std::uint64_t>();
  if (a.count("steps")) f.steps = a["steps"].as<std::int64_t>();
  if (a.count("height")) f.height = a["height"].as<std::int64_t>();
  if (a.count("width")) f.width = a["width"].as<std::int64_t>();
  if (a.count("frames")) f.frames = a["frames"].as<std::int64_t>();
  if (a.count("fps")) f.fps = a["fps"].as<std::int64_t>();
  if (a.count("crf")) f.crf = a["crf"].as<std::int64_t>();
  if (a.count("guidance")) f.guidance = a["guidance"].as<double>();
  if (a.count("flow-shift")) f.flow_shift = a["flow-shift"].as<double>();
  if (a.count("scheduler"))
    f.scheduler = dlo::with_context("--scheduler",
                                    [&] { return dlo::parse_noise_scheduler_kind(a["scheduler"].as<std::string>()); });
  return f;
}

// One job from the flags (the --prompt form).
dlo::JobSpec single_job(const cxxopts::ParseResult& a) {
  const dlo::JobFieldOverrides f = field_flags(a);
  dlo::JobSpec j;
  j.prompt = a["prompt"].as<std::string>();
  j.negative_prompt = f.negative_prompt.value_or("");
  j.steps = f.steps.value_or(j.steps);
  j.guidance = f.guidance.value_or(j.guidance);
  j.height = f.height.value_or(j.height);
  j.width = f.width.value_or(j.width);
  j.frames = f.frames.value_or(j.frames);
  j.fps = f.fps.value_or(j.fps);
  j.crf = f.crf.value_or(j.crf);
  j.preset = f.preset.value_or(j.preset);
  j.format = f.format.value_or(j.format);
  j.scheduler = f.scheduler;
  j.flow_shift = f.flow_shift;
  // The seed: given, or drawn here (on rank 0, which renders) and recorded in the metadata.
  j.seed = f.seed.value_or(static_cast<std::uint64_t>(std::random_device{}()) & 0xffffffffu);
  if (a.count("save-latents")) j.save_latents = a["save-latents"].as<std::string>();
#ifdef DLO_GENERATE_BARE
  DLO_CHECK(!a.count("format"), "--format ", j.format, ": ", kNoEncoder);
  j.output = a.count("out") ? a["out"].as<std::string>() : "video.safetensors";
#else
  if (a.count("out")) {
    j.output = a["out"].as<std::string>();
  } else {
    const auto format = dlo::with_context("--format", [&] { return dlo::parse_video_format(j.format); });
    j.output = std::string("video") + dlo::video_format_extension(format);
  }
#endif
  return j;
}

// What rank 0 decided before any weight is read: the model, the jobs to run, what was skipped.
struct Plan {
  std::string model_dir, output_dir, results;
  std::vector<dlo::JobSpec> jobs;
  std::int64_t skipped = 0;
};

// Rank 0: the batch's manifest, checks and resume. Throws dlo::Error (ManifestError) for bad input.
Plan batch_plan(const cxxopts::ParseResult& a, bool force, const std::string& dtypes, bool dry_run) {
  std::optional<std::string> model_flag, out_flag;
  if (a.count("model")) model_flag = a["model"].as<std::string>();
  if (a.count("output-dir")) out_flag = a["output-dir"].as<std::string>();
  for (const char* single : {"prompt", "out"})
    DLO_CHECK(!a.count(single), "--", single,
              " is for one prompt; with --jobs each job has its own (manifest keys prompt, output)");
  const dlo::Manifest m = dlo::load_manifest(a["jobs"].as<std::string>(), field_flags(a), model_flag, out_flag);
  const dlo::ModelInfo model = dlo::read_model_info(m.model);
  auto problems = dlo::check_manifest(m, model, [&](const dlo::JobSpec& j) { check_output(j, model); });
  Plan p;
  p.model_dir = m.model;
  p.output_dir = m.output_dir;
  p.results = m.output_dir + "/" + dlo::kResultsFileName;
  // Resume: a job recorded ok with the same fingerprint whose output is there is skipped; one
  // whose parameters changed since is refused (its video would be replaced) unless --force.
  const auto past = dlo::read_results(p.results);
  for (std::size_t i = 0; i < m.jobs.size(); ++i) {
    const dlo::JobSpec& j = m.jobs[i];
    const auto it = past.find(j.id);
    const bool done = it != past.end() && it->second.status == "ok" && ::access(j.output.c_str(), F_OK) == 0;
    if (done && !force) {
      const std::string fp = dlo::job_fingerprint(j, model, dtypes);
      if (fp == it->second.fingerprint) {
        ++p.skipped;
        continue;
      }
      problems.push_back({m.path, static_cast<std::int64_t>(i), j.id, "",
                          dlo::str("changed since its video '", j.output, "' was rendered (parameters fingerprint ",
                                   it->second.fingerprint, ", now ", fp, "); --force renders it again"),
                          m.job_lines[i], -1});
      continue;
    }
    p.jobs.push_back(j);
  }
  if (!problems.empty()) throw dlo::ManifestError(std::move(problems));
  if (dry_run) return p;  // writes nothing
  dlo::create_output_folders(m);
  for (const auto& j : m.jobs) dlo::remove_stale_temporaries(j.output);  // left by a killed run
  return p;
}

std::string plan_to_json(const Plan& p) {
  return nlohmann::json({{"model", p.model_dir}, {"output_dir", p.output_dir}, {"results", p.results},
                         {"skipped", p.skipped}, {"jobs", nlohmann::json::parse(dlo::jobs_to_json(p.jobs))}})
      .dump();
}

Plan plan_from_json(const std::string& text) {
  const auto j = nlohmann::json::parse(text);
  Plan p;
  p.model_dir = j.at("model");
  p.output_dir = j.at("output_dir");
  p.results = j.at("results");
  p.skipped = j.at("skipped");
  p.jobs = dlo::jobs_from_json(j.at("jobs").dump());
  return p;
}

int run(dlo::MpiWorld& world, int argc, char** argv) {
  cxxopts::Options opts("dlo-generate", "Text to video with a Wan2.1 text-to-video model (diffusers layout)");
  opts.add_options()("model", "model folder (diffusers layout: transformer/, vae/, text_encoder/, tokenizer/, scheduler/)",
                     cxxopts::value<std::string>())(
      "prompt", "one prompt to render", cxxopts::value<std::string>())(
      "jobs", "a batch: a YAML manifest or a .txt file of prompts (docs/manifest.md)", cxxopts::value<std::string>())(
      "output-dir", "batch: where videos and results.jsonl go (default: the manifest's output_dir)",
      cxxopts::value<std::string>())(
      "force", "batch: render every job again, also those done or changed since")(
      "dry-run", "batch: print the plan and the memory estimate, render nothing")(
      "negative-prompt", "what to steer away from (with guidance > 1; default \"\" as in WanPipeline)",
      cxxopts::value<std::string>())(
      "seed", "seed of the initial noise (one prompt: default random, printed and recorded)",
      cxxopts::value<std::uint64_t>())(
      "steps", "denoising steps (default 50)", cxxopts::value<std::int64_t>())(
      "guidance", "classifier-free guidance scale (<= 1: off, no negative prompt; default 5)", cxxopts::value<double>())(
      "height", "pixels, a multiple of 16 (default 480)", cxxopts::value<std::int64_t>())(
      "width", "pixels, a multiple of 16 (default 832)", cxxopts::value<std::int64_t>())(
      "frames", "frames, 4k+1 (default 81)", cxxopts::value<std::int64_t>())(
      "fps", "frames per second of the video (default 16)", cxxopts::value<std::int64_t>())(
      "scheduler", "unipc or euler (default: the model folder's)", cxxopts::value<std::string>())(
      "flow-shift", "flow shift (default: the model folder's; Wan suggests 3 for 480p, 5 for 720p)",
      cxxopts::value<double>())(
      "dtype", "transformer and text encoder: bf16, fp32 or fp16", cxxopts::value<std::string>()->default_value("bf16"))(
      "vae-dtype", "VAE: fp32, bf16 or fp16", cxxopts::value<std::string>()->default_value("fp32"))(
      "offload", "auto, resident, device-shards, mixed, dlo or layerwise",
      cxxopts::value<std::string>()->default_value("auto"))(
      "device-budget", "device memory each rank may use, e.g. 40GiB (auto decides from it; mixed keeps as many "
      "blocks' shards on the device as fit). Default: the device's free memory", cxxopts::value<std::string>())(
      "device", "auto, cpu, cuda or cuda:N (default: local rank modulo visible GPUs)",
      cxxopts::value<std::string>()->default_value("auto"))(
      "threads", "CPU threads per rank (0: the cores divided among this node's ranks)",
      cxxopts::value<int>()->default_value("0"))(
      "out", "one prompt: a file (mp4, ffv1) or a folder (png); default video.mp4 / video.mkv / video",
      cxxopts::value<std::string>())(
      "format", "mp4 (H.264), png (a numbered PNG per frame in a folder) or ffv1 (lossless MKV)",
      cxxopts::value<std::string>())(
      "crf", "H.264 quality, 0 (lossless) .. 51 (default 25)", cxxopts::value<std::int64_t>())(
      "preset", "libx264 preset (ultrafast .. veryslow; default medium)", cxxopts::value<std::string>())(
      "save-latents", "keep the final latents before decoding: FILE.safetensors (one prompt) or FILE.h5 (all jobs)",
      cxxopts::value<std::string>())(
      "report", "write the results and every rank's engine and memory facts as JSON (rank 0)",
      cxxopts::value<std::string>())(
      "keep-page-cache", "keep the checkpoint's pages cached after building the shards")(
      "quiet", "print only errors")(
      "fail-job", "test hook: this job (index) fails in step --fail-step", cxxopts::value<std::int64_t>())(
      "fail-step", "test hook", cxxopts::value<std::int64_t>()->default_value("1"))("h,help", "help");
  auto args = opts.parse(argc, argv);
  if (args.count("help")) {
    if (world.rank() == 0) std::cout << opts.help();
    return 0;
  }
  DLO_CHECK(args.unmatched().empty(), "unexpected argument '", args.unmatched().front(), "'");
  const bool quiet = args.count("quiet") > 0;
  const bool talk = world.rank() == 0 && !quiet;
  const bool batch = args.count("jobs") > 0;
  const bool force = args.count("force") > 0;

  // Everything checkable is checked before any weight is read: the options on every rank, the
  // jobs on rank 0, which shares the plan.
  std::string error, thread_note, plan_text;
  dlo::GenerateOptions go;
  Plan plan;
  try {
    world.set_timeout_s(dlo::parse_seconds_setting(std::getenv("DLO_GATHER_TIMEOUT_S"), "DLO_GATHER_TIMEOUT_S", 600));
    const int threads = dlo::bound_threads(args["threads"].as<int>(), "--threads", &thread_note);
    at::set_num_threads(threads > 0 ? threads : std::max(1, dlo::available_cores() / std::max(1, world.local_size())));
    go.dtype = dlo::parse_compute_dtype(args["dtype"].as<std::string>(), "--dtype");
    go.vae_dtype = dlo::parse_compute_dtype(args["vae-dtype"].as<std::string>(), "--vae-dtype");
    go.offload = args["offload"].as<std::string>();
    DLO_CHECK(go.offload == "auto" || dlo::parse_strategy(go.offload), "--offload: '", go.offload,
              "' is not auto, resident, device-shards, mixed, dlo or layerwise");
    if (args.count("device-budget"))
      go.device_budget = dlo::parse_bytes(args["device-budget"].as<std::string>(), "--device-budget");
    if (const char* id = std::getenv("NCCL_HOSTID")) go.host_id = id;
    go.device = args["device"].as<std::string>();
    go.keep_page_cache = args.count("keep-page-cache") > 0;
    if (args.count("fail-job")) {
      go.fail_job = args["fail-job"].as<std::int64_t>();
      go.fail_step = args["fail-step"].as<std::int64_t>();
    }
    DLO_CHECK(batch || args.count("prompt"),
              "give --prompt TEXT (one video; an empty prompt is allowed: --prompt \"\") or --jobs FILE (a batch)");
    DLO_CHECK(!(batch && args.count("prompt")), "give --prompt or --jobs, not both");
    if (world.rank() == 0) {
      if (batch) {
        plan = batch_plan(args, force, dlo::dtypes_label(go), args.count("dry-run") > 0);
      } else {
        DLO_CHECK(args.count("model"), "missing --model DIR");
        DLO_CHECK(!args.count("output-dir") && !args.count("dry-run") && !force,
                  "--output-dir, --dry-run and --force are for batches (--jobs)");
        plan.model_dir = args["model"].as<std::string>();
        plan.jobs = {single_job(args)};
        const dlo::ModelInfo model = dlo::read_model_info(plan.model_dir);
        const dlo::JobSpec& job = plan.jobs[0];
        const auto problems = dlo::validate_job(job, model);
        if (!problems.empty()) {
          std::string msg;
          for (const auto& p : problems) msg += (msg.empty() ? "" : "\n  ") + flag_of(p.field) + ": " + p.message;
          DLO_CHECK(false, msg);
        }
        dlo::with_context("--out", [&] { check_output(job, model); });
        DLO_CHECK(job.save_latents.empty() || !ends_with(job.save_latents, ".h5"),
                  "--save-latents: .h5 files collect a batch's latents (--jobs); for one prompt write .safetensors");
        if (!job.save_latents.empty())
          dlo::with_context("--save-latents", [&] { dlo::check_output_path(job.save_latents); });
      }
      if (batch && args.count("save-latents")) {
        const std::string h5 = args["save-latents"].as<std::string>();
#ifdef DLO_GENERATE_BARE
        DLO_CHECK(false, "--save-latents ", h5, ": a batch keeps its latents in one HDF5 file; ", kNoEncoder);
#endif
        DLO_CHECK(ends_with(h5, ".h5"), "--save-latents: a batch keeps its latents in one HDF5 file (FILE.h5)");
        dlo::with_context("--save-latents", [&] { dlo::check_output_path(h5); });
      }
      if (args.count("report")) dlo::with_context("--report", [&] { dlo::check_output_path(args["report"].as<std::string>()); });
      plan_text = plan_to_json(plan);
    }
  } catch (const dlo::Error& e) {
    error = e.what();
  }
  world.check_all(error);
  plan = plan_from_json(world.broadcast_string(plan_text, 0, "sharing the plan"));
  const dlo::ModelInfo model = dlo::read_model_info(plan.model_dir);
  if (talk && !thread_note.empty()) std::cerr << "dlo-generate: note: " << thread_note << "\n";

  if (batch && talk) {
    std::cerr << world.tag() << " " << plan.jobs.size() << " job(s) to render"
              << (plan.skipped ? dlo::str(", ", plan.skipped, " already done (results.jsonl)") : "") << "; model "
              << plan.model_dir << "; output " << plan.output_dir << "; " << world.size() << " rank(s), "
              << at::get_num_threads() << " thread(s) each\n";
  } else if (talk) {
    std::cerr << world.tag() << " model " << model.dir << "; " << dlo::job_parameters_text(plan.jobs[0], model) << "\n";
    std::cerr << world.tag() << " " << at::get_num_threads() << " thread(s) per rank; rank 0 renders, "
              << world.size() << " rank(s) share the transformer's weights\n";
  }
  if (args.count("dry-run")) {
    if (world.rank() == 0) {
      for (std::size_t i = 0; i < plan.jobs.size(); ++i) {
        const auto& j = plan.jobs[i];
        std::cout << "job " << i << " '" << j.id << "': " << j.width << "x" << j.height << ", " << j.frames
                  << " frames, " << j.steps << " steps, guidance " << j.guidance << " -> " << j.output
                  << (static_cast<int>(i) < world.size() ? dlo::str(" (starts on rank ", i, ")") : "") << "\n";
      }
      // The host side only; auto's real choice depends on the device's free memory, known once loaded.
      const auto strategy = go.offload != "auto" ? *dlo::parse_strategy(go.offload)
                            : world.size() > 1   ? dlo::Strategy::kDlo
                                                 : dlo::Strategy::kResident;
      const auto est = dlo::estimate_memory(model, plan.jobs, world.size(), strategy, go.dtype);
      const std::uint64_t avail = dlo::available_memory_bytes();
      std::cout << "memory per rank with " << dlo::strategy_name(strategy) << " on " << world.size()
                << " rank(s) (estimate):\n"
                << est.describe() << "\n  available here       " << dlo::human_bytes(avail) << "\n";
      const std::uint64_t need = est.host_per_rank * static_cast<std::uint64_t>(world.local_size()) + est.shared_per_node;
      DLO_CHECK(avail == 0 || need <= avail, "the plan needs about ", dlo::human_bytes(need), " on this node (",
                world.local_size(), " rank(s)) but ", dlo::human_bytes(avail), " is available");
    }
    return dlo::kExitOk;
  }

  // Signals: stop at the next pass boundary on every rank.
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);

  std::unique_ptr<dlo::ResultsLog> log;
  if (batch && world.rank() == 0) log = std::make_unique<dlo::ResultsLog>(plan.results);
#ifndef DLO_GENERATE_BARE
  std::unique_ptr<dlo::LatentsFile> h5;
  if (batch && args.count("save-latents")) {
    std::vector<dlo::LatentsEntry> entries;
    for (const auto& j : plan.jobs) {
      const auto shape = model.latent_shape(j);
      entries.push_back({j.id, shape, {{"parameters_json", dlo::job_parameters_json(j, model)}},
                         dlo::job_fingerprint(j, model, dlo::dtypes_label(go))});
    }
    h5 = std::make_unique<dlo::LatentsFile>(MPI_COMM_WORLD, args["save-latents"].as<std::string>(), entries);
  }
#endif

  dlo::GenerateCallbacks cb;
  cb.stop_requested = [] { return g_signal.load() != 0; };
  cb.on_phase = [&](const std::string& phase) {
    if (talk && !batch) std::cerr << world.tag() << " " << phase << "\n";
  };
  double total_step_s = 0;
  cb.on_step = [&](const dlo::StepEvent& e) {
    if (!talk || batch) return;
    total_step_s += e.seconds;
    char line[160];
    std::snprintf(line, sizeof line, "%s step %lld/%lld  %.2f s  (%.2f s/it)", world.tag().c_str(),
                  static_cast<long long>(e.step), static_cast<long long>(e.steps), e.seconds,
                  total_step_s / static_cast<double>(e.step));
    std::cerr << line << "\n";
  };
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  double last_line = -1e9;
  const auto t0 = std::chrono::steady_clock::now();
  cb.on_progress = [&](const dlo::ProgressEvent& e) {
    if (!talk || !batch) return;
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!tty && t - last_line < 10) return;  // a line every 10 s in logs
    last_line = t;
    std::string ranks;
    for (std::size_t r = 0; r < e.rank_job.size(); ++r)
      ranks += e.rank_job[r] < 0 ? " -" : dlo::str(" ", plan.jobs[static_cast<std::size_t>(e.rank_job[r])].id, ":",
                                                    e.rank_step[r]);
    const std::string text =
        dlo::str("jobs ", e.jobs_done, " done, ", e.jobs_failed, " failed, ", e.jobs_total, " total; ranks", ranks,
                 e.eta_s >= 0 ? dlo::str("; ETA ", seconds(e.eta_s)) : "");
    if (tty)
      std::cerr << "\r\033[K" << text << std::flush;
    else
      std::cerr << now_stamp() << " " << text << "\n";
  };
  cb.on_result = [&](const dlo::JobResult& r) {
    if (log) log->append(dlo::result_line(r));
    if (talk && batch) {
      if (tty) std::cerr << "\r\033[K";
      std::cerr << (tty ? "" : now_stamp() + " ") << "job " << r.index << " '" << r.id << "' " << r.status << " (rank "
                << r.rank << ", " << seconds(r.denoise_s + r.decode_s) << ")"
                << (r.status == "ok" ? " -> " + r.output : ": " + r.error) << "\n";
    }
  };
  cb.open_sink = [&](const dlo::JobSpec& j, std::int64_t w, std::int64_t h, std::int64_t frames) {
    return open_output(j, model, w, h, frames);
  };
#ifndef DLO_GENERATE_BARE
  if (h5) {
    cb.save_latents = [&](const dlo::JobSpec&, std::int64_t index, const at::Tensor& latents) {
      const at::Tensor f = latents.to(at::kCPU, at::kFloat).contiguous();
      h5->write(static_cast<std::size_t>(index), f.data_ptr<float>());
    };
  }

#endif
  const dlo::GenerateReport report = dlo::generate(world, model, plan.jobs, go, cb);
#ifndef DLO_GENERATE_BARE
  h5.reset();  // collective close
#endif
  const int sig = g_signal.load();
  if (world.rank() != 0) return report.stopped ? 128 + (sig ? sig : SIGTERM) : dlo::kExitOk;
  if (talk) std::cerr << world.tag() << " " << report.choice << "\n";
  if (args.count("report")) dlo::write_file_atomic(args["report"].as<std::string>(), dlo::report_json(report) + "\n");
  std::int64_t failed = 0;
  for (const auto& r : report.jobs) failed += r.status != "ok";
  if (report.stopped) {
    std::cerr << "dlo-generate: stopped by signal " << sig << " with " << report.jobs.size() << " job(s) recorded; "
              << "run the same command again to continue\n";
    return 128 + (sig ? sig : SIGTERM);
  }
  if (!batch) {
    const dlo::JobResult& r = report.jobs.at(0);
    if (r.status != "ok") {
      std::cerr << "dlo-generate: error: " << r.error << "\n";
      return dlo::kExitFailed;
    }
    if (talk) {
      std::cerr << world.tag() << " phases: text " << seconds(r.text_s) << ", denoise " << seconds(r.denoise_s)
                << ", decode + write " << seconds(r.decode_s) << " (writing " << seconds(r.encode_s)
                << "); peak RSS " << r.rss_peak_kb / 1024 << " MiB; frames sha256 " << r.frames_sha256 << "\n";
    }
    std::cout << r.output << "\n";
    return dlo::kExitOk;
  }
  if (talk)
    std::cerr << world.tag() << " " << report.jobs.size() - static_cast<std::size_t>(failed) << " job(s) done, " << failed
              << " failed, " << plan.skipped << " skipped; results in " << plan.results << "\n";
  return failed ? dlo::kExitSomeJobsFailed : dlo::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  dlo::MpiWorld world(&argc, &argv);
  // Exit codes, messages and fault handlers shared by every tool (dlo/dist/tool.h).
  return dlo::run_tool("dlo-generate", &world, [&] {
    try {
      return run(world, argc, argv);
    } catch (const cxxopts::exceptions::exception& e) {
      throw dlo::Error(e.what());  // a bad flag: the same on every rank
    }
  });
}
