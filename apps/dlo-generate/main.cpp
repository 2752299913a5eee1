// dlo-generate: text to video with a Wan2.1 text-to-video model in the diffusers layout.
//
//   [mpirun -np N] dlo-generate --model DIR --prompt TEXT [--negative-prompt TEXT] [--seed S]
//       [--steps N] [--guidance G] [--height H] [--width W] [--frames F] [--fps R]
//       [--scheduler unipc|euler] [--flow-shift X] [--dtype bf16|fp32|fp16]
//       [--offload auto|resident|layerwise|dlo] [--device auto|cpu|cuda[:N]] [--threads T]
//       [--out FILE] [--format mp4|png|ffv1] [--crf N] [--preset P] [--save-latents FILE]
//
// With one prompt and N ranks, rank 0 renders and every rank keeps 1/N of the transformer's
// blocks and joins the gathers. Rank 0 prints one line per step and the phases' times.
// Exit codes: 0 ok, 2 bad invocation or input (found before any weight is read), 1 anything else.
#include <ATen/Parallel.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <thread>

#include <cxxopts.hpp>

#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/common/settings.h"
#include "dlo/dist/tool.h"
#include "dlo/dist/mpi_world.h"
#include "dlo/media/video_writer.h"
#include "dlo/models/weights.h"
#include "dlo/pipeline/generate.h"

namespace {

// Job field -> the flag it came from, for messages.
std::string flag_of(const std::string& field) {
  if (field == "output") return "--out";
  std::string f = "--" + field;
  for (auto& c : f)
    if (c == '_') c = '-';
  return f;
}

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
  v.tags = {{"comment", dlo::job_parameters_text(job, model)}, {"description", dlo::job_parameters_json(job, model)}};
  return v;
}

std::string seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f s", s);
  return b;
}

int run(dlo::MpiWorld& world, int argc, char** argv) {
  cxxopts::Options opts("dlo-generate", "Text to video with a Wan2.1 text-to-video model (diffusers layout)");
  opts.add_options()("model", "model folder (diffusers layout: transformer/, vae/, text_encoder/, tokenizer/, scheduler/)",
                     cxxopts::value<std::string>())(
      "prompt", "what to render", cxxopts::value<std::string>())(
      "negative-prompt", "what to steer away from (with guidance > 1; default \"\" as in WanPipeline)",
      cxxopts::value<std::string>()->default_value(""))(
      "seed", "seed of the initial noise (default: random, printed and recorded)", cxxopts::value<std::uint64_t>())(
      "steps", "denoising steps", cxxopts::value<std::int64_t>()->default_value("50"))(
      "guidance", "classifier-free guidance scale (<= 1: off, no negative prompt)",
      cxxopts::value<double>()->default_value("5.0"))(
      "height", "pixels, a multiple of 16", cxxopts::value<std::int64_t>()->default_value("480"))(
      "width", "pixels, a multiple of 16", cxxopts::value<std::int64_t>()->default_value("832"))(
      "frames", "frames, 4k+1", cxxopts::value<std::int64_t>()->default_value("81"))(
      "fps", "frames per second of the video", cxxopts::value<std::int64_t>()->default_value("16"))(
      "scheduler", "unipc or euler (default: the model folder's)", cxxopts::value<std::string>())(
      "flow-shift", "flow shift (default: the model folder's; Wan suggests 3 for 480p, 5 for 720p)",
      cxxopts::value<double>())(
      "dtype", "transformer and text encoder: bf16, fp32 or fp16", cxxopts::value<std::string>()->default_value("bf16"))(
      "vae-dtype", "VAE: fp32, bf16 or fp16", cxxopts::value<std::string>()->default_value("fp32"))(
      "offload", "auto, resident, layerwise or dlo", cxxopts::value<std::string>()->default_value("auto"))(
      "device", "auto, cpu, cuda or cuda:N (default: local rank modulo visible GPUs)",
      cxxopts::value<std::string>()->default_value("auto"))(
      "threads", "CPU threads per rank (0: the cores divided among this node's ranks)",
      cxxopts::value<int>()->default_value("0"))(
      "out", "output: a file (mp4, ffv1) or a folder (png); default video.mp4 / video.mkv / video",
      cxxopts::value<std::string>())(
      "format", "mp4 (H.264), png (a numbered PNG per frame in a folder) or ffv1 (lossless MKV)",
      cxxopts::value<std::string>()->default_value("mp4"))(
      "crf", "H.264 quality, 0 (lossless) .. 51", cxxopts::value<std::int64_t>()->default_value("25"))(
      "preset", "libx264 preset (ultrafast .. veryslow)", cxxopts::value<std::string>()->default_value("medium"))(
      "save-latents", "also write the final latents before decoding (.safetensors)", cxxopts::value<std::string>())(
      "report", "write the job's result and every rank's engine and memory facts as JSON (rank 0)",
      cxxopts::value<std::string>())(
      "keep-page-cache", "keep the checkpoint's pages cached after building the shards")(
      "quiet", "print only errors")("h,help", "help");
  auto args = opts.parse(argc, argv);
  if (args.count("help")) {
    if (world.rank() == 0) std::cout << opts.help();
    return 0;
  }
  DLO_CHECK(args.unmatched().empty(), "unexpected argument '", args.unmatched().front(), "'");
  const bool quiet = args.count("quiet") > 0;
  const bool talk = world.rank() == 0 && !quiet;

  // Everything checkable is checked on every rank before any weight is read.
  std::string error;
  dlo::ModelInfo model;
  dlo::JobSpec job;
  dlo::GenerateOptions go;
  std::string thread_note;
  try {
    DLO_CHECK(args.count("model"), "missing --model DIR");
    DLO_CHECK(args.count("prompt"), "missing --prompt TEXT (an empty prompt is allowed: --prompt \"\")");
    world.set_timeout_s(dlo::parse_seconds_setting(std::getenv("DLO_GATHER_TIMEOUT_S"), "DLO_GATHER_TIMEOUT_S", 600));
    const int threads = dlo::bound_threads(args["threads"].as<int>(), "--threads", &thread_note);
    at::set_num_threads(threads > 0 ? threads : std::max(1, dlo::available_cores() / std::max(1, world.local_size())));
    const std::string model_dir = args["model"].as<std::string>();
    go.dtype = dlo::parse_compute_dtype(args["dtype"].as<std::string>(), "--dtype");
    go.vae_dtype = dlo::parse_compute_dtype(args["vae-dtype"].as<std::string>(), "--vae-dtype");
    go.offload = args["offload"].as<std::string>();
    DLO_CHECK(go.offload == "auto" || go.offload == "resident" || go.offload == "layerwise" || go.offload == "dlo",
              "--offload: '", go.offload, "' is not auto, resident, layerwise or dlo");
    go.device = args["device"].as<std::string>();
    go.keep_page_cache = args.count("keep-page-cache") > 0;

    job.prompt = args["prompt"].as<std::string>();
    job.negative_prompt = args["negative-prompt"].as<std::string>();
    job.steps = args["steps"].as<std::int64_t>();
    job.guidance = args["guidance"].as<double>();
    job.height = args["height"].as<std::int64_t>();
    job.width = args["width"].as<std::int64_t>();
    job.frames = args["frames"].as<std::int64_t>();
    job.fps = args["fps"].as<std::int64_t>();
    if (args.count("scheduler"))
      job.scheduler = dlo::with_context("--scheduler",
                                        [&] { return dlo::parse_noise_scheduler_kind(args["scheduler"].as<std::string>()); });
    if (args.count("flow-shift")) job.flow_shift = args["flow-shift"].as<double>();
    job.format = args["format"].as<std::string>();
    job.crf = args["crf"].as<std::int64_t>();
    job.preset = args["preset"].as<std::string>();
    if (args.count("save-latents")) job.save_latents = args["save-latents"].as<std::string>();
    if (args.count("out")) {
      job.output = args["out"].as<std::string>();
    } else {
      const auto format = dlo::with_context("--format", [&] { return dlo::parse_video_format(job.format); });
      job.output = std::string("video") + dlo::video_format_extension(format);
    }
    model = dlo::read_model_info(model_dir);
    const auto problems = dlo::validate_job(job, model);
    if (!problems.empty()) {
      std::string msg;
      for (const auto& p : problems) msg += (msg.empty() ? "" : "\n  ") + flag_of(p.field) + ": " + p.message;
      DLO_CHECK(false, msg);
    }
    dlo::with_context("--out", [&] { dlo::check_video_output(job.output, video_options(job, model)); });
    if (!job.save_latents.empty()) dlo::with_context("--save-latents", [&] { dlo::check_output_path(job.save_latents); });
    if (args.count("report")) dlo::with_context("--report", [&] { dlo::check_output_path(args["report"].as<std::string>()); });
  } catch (const dlo::Error& e) {
    error = e.what();
  }
  world.check_all(error);

  // The seed: given, or drawn on rank 0 (the renderer) and recorded in the video's metadata.
  job.seed = args.count("seed") ? args["seed"].as<std::uint64_t>()
                                : static_cast<std::uint64_t>(std::random_device{}()) & 0xffffffffu;
  if (talk && !thread_note.empty()) std::cerr << "dlo-generate: note: " << thread_note << "\n";
  if (talk) {
    std::cerr << world.tag() << " model " << model.dir << "; " << dlo::job_parameters_text(job, model) << "\n";
    std::cerr << world.tag() << " " << at::get_num_threads() << " thread(s) per rank; rank 0 renders, "
              << world.size() << " rank(s) share the transformer's weights\n";
  }

  dlo::GenerateCallbacks cb;
  cb.on_phase = [&](const std::string& phase) {
    if (talk) std::cerr << world.tag() << " " << phase << "\n";
  };
  double total_step_s = 0;
  cb.on_step = [&](const dlo::StepEvent& e) {
    if (!talk) return;
    total_step_s += e.seconds;
    char line[160];
    std::snprintf(line, sizeof line, "%s step %lld/%lld  %.2f s  (%.2f s/it)", world.tag().c_str(),
                  static_cast<long long>(e.step), static_cast<long long>(e.steps), e.seconds,
                  total_step_s / static_cast<double>(e.step));
    std::cerr << line << "\n";
  };
  cb.open_sink = [&](const dlo::JobSpec& j, std::int64_t w, std::int64_t h, std::int64_t) {
    return std::make_unique<VideoSink>(j.output, w, h, video_options(j, model));
  };

  const dlo::GenerateReport report = dlo::generate(world, model, {job}, go, cb);
  if (world.rank() != 0) return 0;
  if (talk) std::cerr << world.tag() << " " << report.choice << "\n";
  const dlo::JobResult& r = report.jobs.at(0);
  if (args.count("report")) dlo::write_file_atomic(args["report"].as<std::string>(), dlo::report_json(report) + "\n");
  if (r.status != "ok") {
    std::cerr << "dlo-generate: error: " << r.error << "\n";
    return dlo::kExitFailed;
  }
  if (talk) {
    std::cerr << world.tag() << " phases: text " << seconds(r.text_s) << ", denoise " << seconds(r.denoise_s)
              << ", decode + write " << seconds(r.decode_s) << " (writing " << seconds(r.encode_s) << "); peak RSS " << r.rss_peak_kb / 1024 << " MiB\n";
    std::cerr << world.tag() << " frames sha256 " << r.frames_sha256 << "\n";
  }
  std::cout << r.output << "\n";
  return 0;
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
