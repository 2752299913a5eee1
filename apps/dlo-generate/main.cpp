// dlo-generate: text to video with a Wan2.1 text-to-video model in the diffusers layout.
//
//   [mpirun -np N] dlo-generate --model DIR --prompt TEXT [job flags] [--out FILE]
//   [mpirun -np N] dlo-generate --jobs prompts.yaml|prompts.txt [--model DIR] [--output-dir DIR]
//       [job flags] [--force] [--dry-run] [--save-latents FILE.h5] [--quiet]
//   job flags: one per job field (docs/manifest.md; --help lists them)
//   run flags: --dtype --vae-dtype --offload --device-budget --device --text-vae-device --sp --cfg-parallel --threads --report
//
// One prompt: every rank keeps 1/N of the transformer's blocks; by default all of them compute
// it together (CFG pairs, then sequence parallelism: --sp, --cfg-parallel), rank 0 writes it. A batch: every rank
// renders a different job at once, taking the next at a pass boundary; results.jsonl in the output
// folder records each job; a rerun skips what is done. SIGINT/SIGTERM stop every rank at the next
// pass boundary (finished decodes are kept); a second signal stops at once; a rerun continues.
// The output folder is locked while a batch runs (a second batch on it is refused).
// Exit codes: 0 ok, 2 bad invocation or input (found before any weight is read; nothing written),
// 3 a batch finished with some jobs failed, 130/143 stopped by SIGINT/SIGTERM, 1 anything else.
//
// The outputs this build writes come from its format table (dlo/app/output_formats.h), linked by
// CMake: libav's for dlo-generate, frames as .safetensors for dlo-generate-bare.
#include <ATen/Parallel.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include <cxxopts.hpp>

#include "dlo/app/console.h"
#include "dlo/app/job_flags.h"
#include "dlo/app/output_formats.h"
#include "dlo/app/tool.h"
#include "dlo/common/bytes.h"
#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/common/folder_lock.h"
#include "dlo/common/settings.h"
#include "dlo/dist/device.h"
#include "dlo/models/weights.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/pipeline/batch_plan.h"
#include "dlo/render/generate.h"

namespace {


bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

cxxopts::Options make_options(const dlo::AppOutputs& outputs) {
  cxxopts::Options opts(outputs.build, "Text to video with a Wan2.1 text-to-video model (diffusers layout)");
  opts.add_options()("model", "model folder (diffusers layout: transformer/, vae/, text_encoder/, tokenizer/, scheduler/)",
                     cxxopts::value<std::string>())(
      "jobs", "a batch: a YAML manifest or a .txt file of prompts (docs/manifest.md)", cxxopts::value<std::string>())(
      "output-dir", "batch: where videos and results.jsonl go (default: the manifest's output_dir)",
      cxxopts::value<std::string>())("force", "batch: render every job again, also those done or changed since")(
      "dry-run", "batch: print the plan and the memory estimate, render nothing")(
      "dtype", "transformer and text encoder: bf16, fp32 or fp16", cxxopts::value<std::string>()->default_value("bf16"))(
      "vae-dtype", "VAE: fp32, bf16 or fp16", cxxopts::value<std::string>()->default_value("fp32"))(
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
  dlo::add_job_field_flags(opts);
  opts.add_options("test hooks")("fail-job", "this job (manifest index) fails in step --fail-step",
                                 cxxopts::value<std::string>())(
      "fail-step", "see --fail-job", cxxopts::value<std::string>()->default_value("1"))(
      "fail-block", "with --fail-job: the block it fails at (-1: the step's inputs, before the traversal)",
      cxxopts::value<std::string>()->default_value("0"))(
      "fail-at-block", "this rank's transfer of that block fails (every pass)", cxxopts::value<std::string>())(
      "fail-io-at-pass", "this rank fails with an I/O error at that pass boundary", cxxopts::value<std::string>())(
      "fail-rank", "the rank of --fail-job / --fail-at-block / --fail-io-at-pass (default: every rank)",
      cxxopts::value<std::string>()->default_value("-1"))(
      "slow-decode-ms", "every VAE decode waits this long first (a slow decoder)", cxxopts::value<std::string>())(
      "await-prepared", "at each pass boundary wait for this rank's next job's prompts (deterministic scheduling)")(
      "test-topology-skew-rank", "this rank claims groups one rank larger than the others (the topology agreement)",
      cxxopts::value<std::string>());
  return opts;
}

std::int64_t int_flag(const cxxopts::ParseResult& a, const std::string& flag) {
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

// Run options, the same on every rank.
dlo::GenerateOptions generate_options(const cxxopts::ParseResult& a) {
  dlo::GenerateOptions go;
  go.dtype = dlo::parse_compute_dtype(a["dtype"].as<std::string>(), "--dtype");
  go.vae_dtype = dlo::parse_compute_dtype(a["vae-dtype"].as<std::string>(), "--vae-dtype");
  go.offload = a["offload"].as<std::string>();
  DLO_CHECK(go.offload == "auto" || dlo::parse_strategy(go.offload), "--offload: '", go.offload,
            "' is not auto, resident, device-shards, mixed, dlo or layerwise");
  if (a.count("device-budget")) go.device_budget = dlo::parse_bytes(a["device-budget"].as<std::string>(), "--device-budget");
  if (const char* id = std::getenv("NCCL_HOSTID")) go.host_id = id;
  go.device = a["device"].as<std::string>();
  go.text_vae = dlo::parse_aux_placement(a["text-vae-device"].as<std::string>(), "--text-vae-device");
  go.keep_page_cache = a.count("keep-page-cache") > 0;
  go.align_experts = a.count("no-expert-alignment") == 0;
  go.topology.sp = dlo::parse_sp(a["sp"].as<std::string>(), "--sp");
  go.topology.cfg = dlo::parse_cfg_parallel(a["cfg-parallel"].as<std::string>(), "--cfg-parallel");
  const int rank = static_cast<int>(int_flag(a, "fail-rank"));
  if (a.count("fail-job")) {
    go.faults.compute_job = int_flag(a, "fail-job");
    go.faults.compute_step = int_flag(a, "fail-step");
    go.faults.compute_block = int_flag(a, "fail-block");
    go.faults.compute_rank = rank;
  }
  if (a.count("fail-at-block")) go.faults.transfer_block = int_flag(a, "fail-at-block"), go.faults.transfer_rank = rank;
  if (a.count("fail-io-at-pass")) go.faults.io_pass = int_flag(a, "fail-io-at-pass"), go.faults.io_rank = rank < 0 ? 0 : rank;
  if (a.count("slow-decode-ms")) go.faults.decode_delay_ms = int_flag(a, "slow-decode-ms");
  go.faults.await_prepared = a.count("await-prepared") > 0;
  if (a.count("test-topology-skew-rank")) go.faults.topology_skew_rank = static_cast<int>(int_flag(a, "test-topology-skew-rank"));
  return go;
}

// Rank 0: the plan of one --prompt job, every check made before any weight is read.
dlo::BatchPlan prompt_plan(const cxxopts::ParseResult& a, const dlo::JobFlags& flags, const dlo::AppOutputs& outputs,
                           const std::string& dtypes) {
  DLO_CHECK(a.count("model"), "missing --model DIR");
  DLO_CHECK(!a.count("output-dir") && !a.count("dry-run") && !a.count("force"),
            "--output-dir, --dry-run and --force are for batches (--jobs)");
  dlo::BatchPlan p;
  p.model_dir = dlo::canonical_path(a["model"].as<std::string>());
  // The seed: given, or drawn here (on rank 0, which renders) and recorded in the metadata.
  const dlo::ModelInfo model = dlo::read_model_info(p.model_dir);
  dlo::JobSpec job = dlo::prompt_job(flags, outputs.names(), std::random_device{}() & 0xffffffffu,
                                     dlo::read_model_job_defaults(p.model_dir));
  dlo::check_prompt_job(job, model, outputs.names(), flags);
  for (const std::string* out : {&job.output, &job.save_latents})
    DLO_CHECK(out->empty() || (dlo::canonical_path(*out) + "/").rfind(p.model_dir + "/", 0) != 0, "--",
              out == &job.output ? "out" : "save-latents", ": '", *out, "' is inside the model folder '", p.model_dir, "'");
  dlo::with_context("--out", [&] { outputs.format(job.format).check(job, model); });
  DLO_CHECK(job.save_latents.empty() || !ends_with(job.save_latents, ".h5"),
            "--save-latents: .h5 files collect a batch's latents (--jobs); for one prompt write .safetensors");
  if (!job.save_latents.empty()) dlo::with_context("--save-latents", [&] { dlo::check_output_path(job.save_latents); });
  job.output = dlo::canonical_path(job.output);
  if (!job.save_latents.empty()) job.save_latents = dlo::canonical_path(job.save_latents);
  p.model_identity = dlo::model_identity(p.model_dir);
  p.jobs.push_back({job, 0, dlo::job_fingerprint(job, model, p.model_identity, dtypes)});
  return p;
}

// Rank 0: the plan of a batch (manifest, checks, resume) and its latents file.
// The output folder's lock file: a second batch on the folder is refused while this one runs.
constexpr const char* kLockFileName = ".dlo-generate.lock";

dlo::BatchPlan batch_plan(const cxxopts::ParseResult& a, dlo::JobFlags flags, const dlo::AppOutputs& outputs,
                          const std::string& dtypes, std::optional<dlo::FolderLock>& lock) {
  flags.erase("save_latents");  // for a batch, --save-latents names its latents file
  for (const char* single : {"prompt", "out"})
    DLO_CHECK(!a.count(single), "--", single,
              " is for one prompt; with --jobs each job has its own (manifest keys prompt, output)");
  if (a.count("save-latents")) {
    const std::string file = a["save-latents"].as<std::string>();
    DLO_CHECK(outputs.open_latents, "--save-latents ", file, ": ", outputs.no_latents_store);
    DLO_CHECK(ends_with(file, outputs.latents_suffix), "--save-latents: a batch keeps its latents in one file (FILE",
              outputs.latents_suffix, ")");
    dlo::with_context("--save-latents", [&] { dlo::check_output_path(file); });
  }
  dlo::BatchPlanOptions o;
  o.manifest = a["jobs"].as<std::string>();
  o.flags = std::move(flags);
  if (a.count("model")) o.model = a["model"].as<std::string>();
  if (a.count("output-dir")) o.output_dir = a["output-dir"].as<std::string>();
  o.formats = outputs.names();
  o.force = a.count("force") > 0;
  o.dry_run = a.count("dry-run") > 0;
  o.dtypes = dtypes;
  o.check_output = [&](const dlo::JobSpec& j, const dlo::ModelInfo& m) { outputs.format(j.format).check(j, m); };
  o.recorded_fingerprint = [&](const dlo::JobSpec& j) {
    const dlo::OutputFormat& f = outputs.format(j.format);
    return f.recorded_fingerprint ? f.recorded_fingerprint(j.output) : std::string();
  };
  o.hold_output_dir = [&](const std::string& dir) { lock.emplace(dir, kLockFileName); };
  return dlo::plan_batch(o);
}

void print_dry_run(const dlo::MpiWorld& world, const dlo::ModelInfo& model, const dlo::BatchPlan& plan,
                   const dlo::GenerateOptions& go) {
  const dlo::RenderPlan rp = dlo::plan_render(world, model, plan.jobs, go);
  if (world.rank() != 0) return;
  // Each runnable job's phase and, for the first jobs of a phase, the ranks it starts on.
  std::int64_t position = 0;
  for (std::size_t i = 0; i < plan.jobs.size(); ++i) {
    const auto& j = plan.jobs[i].spec;
    std::cout << "job " << plan.jobs[i].index << " '" << j.id << "': " << j.width << "x" << j.height << ", " << j.frames
              << " frames, " << j.steps << " steps, guidance " << j.guidance << " -> " << j.output;
    const auto& refused = rp.memory.refused;
    if (std::find(refused.begin(), refused.end(), static_cast<std::int64_t>(i)) != refused.end()) {
      std::cout << " (does not fit in memory)\n";
      continue;
    }
    for (std::size_t p = 0; p < rp.topology.phases.size(); ++p) {
      const dlo::TopologyPhase& ph = rp.topology.phases[p];
      if (position < ph.first || position >= ph.first + ph.count) continue;
      const int P = ph.topology.group_size, first = static_cast<int>(position - ph.first) * P;
      const std::string when = p == 0 ? "starts on" : "then, once the jobs before it are denoised, on";
      if (first < world.size())
        std::cout << (P == 1 ? dlo::str(" (", when, " rank ", first, ")")
                             : dlo::str(" (", when, " ranks ", first, "-", first + P - 1, ", ",
                                        ph.topology.label(j.guided()), ")"));
      else if (p > 0)
        std::cout << " (in the tail, on the next free group of " << P << " rank(s))";
    }
    ++position;
    std::cout << "\n";
  }
  std::cout << "topology: " << rp.topology.reason << "\n";
  std::cout << "memory per rank with " << dlo::strategy_name(rp.memory.choice.strategy) << " on " << world.size()
            << " rank(s) (estimate; device " << rp.device << "):\n"
            << rp.memory.describe() << "\n";
}

int run(dlo::MpiWorld& world, int argc, char** argv) {
  const dlo::AppOutputs& outputs = dlo::app_outputs();
  const std::string tool = outputs.build;
  cxxopts::Options opts = make_options(outputs);
  // Everything checkable is checked before any weight is read: the flags and options on every
  // rank, the jobs on rank 0, which shares the plan. A problem is the same error on every rank.
  std::string error, thread_note, plan_text;
  std::optional<dlo::FolderLock> lock;  // rank 0, a batch: held until every result is written
  dlo::GenerateOptions go;
  cxxopts::ParseResult args;
  bool batch = false;
  try {
    args = opts.parse(argc, argv);
    if (args.count("help") || args.count("help-fields")) {
      if (world.rank() == 0) std::cout << (args.count("help") ? opts.help() : dlo::job_fields_markdown());
      return dlo::kExitOk;
    }
    DLO_CHECK(args.unmatched().empty(), "unexpected argument '", args.unmatched().front(), "'");
    batch = args.count("jobs") > 0;
    world.set_timeout_s(dlo::gather_timeout_setting(std::getenv("DLO_GATHER_TIMEOUT_S")));
    const int threads = dlo::bound_threads(static_cast<int>(int_flag(args, "threads")), "--threads", &thread_note);
    if (threads > 0) at::set_num_threads(threads);
    go = generate_options(args);
    (void)dlo::pick_device(go.device, world, "--device");  // a bad --device before anything is written
    DLO_CHECK(batch || args.count("prompt"),
              "give --prompt TEXT (one video; an empty prompt is allowed: --prompt \"\") or --jobs FILE (a batch)");
    DLO_CHECK(!(batch && args.count("prompt")), "give --prompt or --jobs, not both");
    if (world.rank() == 0) {
      if (args.count("report")) dlo::with_context("--report", [&] { dlo::check_output_path(args["report"].as<std::string>()); });
      const dlo::JobFlags flags = dlo::job_field_flags(args);
      const std::string dtypes = dlo::dtypes_label(go);
      const dlo::BatchPlan plan = batch ? batch_plan(args, flags, outputs, dtypes, lock) : prompt_plan(args, flags, outputs, dtypes);
      plan_text = dlo::plan_to_json(plan);
    }
  } catch (const cxxopts::exceptions::exception& e) {
    error = e.what();  // a bad flag: the same on every rank
  } catch (const dlo::Error& e) {
    error = e.what();
  }
  world.check_all(error);
  std::string threads_why = "--threads";
  if (int_flag(args, "threads") == 0) {
    try {
      at::set_num_threads(dlo::default_threads(world, &threads_why));  // collective
    } catch (const dlo::Error& e) {
      error = e.what();  // OMP_NUM_THREADS is the same text everywhere a launcher copies it
    }
    world.check_all(error);
  }
  const dlo::BatchPlan plan = dlo::plan_from_json(world.broadcast_string(plan_text, 0, "sharing the plan"));
  // The manifest's topology keys (checked on rank 0) where the flags do not say.
  if (!args.count("sp") && !plan.sp.empty()) go.topology.sp = dlo::parse_sp(plan.sp, "sp");
  if (!args.count("cfg-parallel") && !plan.cfg_parallel.empty())
    go.topology.cfg = dlo::parse_cfg_parallel(plan.cfg_parallel, "cfg_parallel");
  // Every rank reads the model folder itself (a rank that cannot see it says so, on every rank) and
  // proves it holds what rank 0 planned with: no rank renders from other weights.
  dlo::ModelInfo model;
  try {
    model = dlo::read_model_info(plan.model_dir);
    if (world.rank() != 0) {
      const std::string mine = dlo::model_identity(plan.model_dir);
      DLO_CHECK(mine == plan.model_identity, "the model folder '", plan.model_dir, "' holds other files here than on rank 0 ",
                "(identity ", mine, ", rank 0's ", plan.model_identity, "): every rank must render from the same weights");
    }
  } catch (const dlo::Error& e) {
    error = e.what();
  }
  world.check_all(error, "start-up check (model folder)");
  const bool talk = world.rank() == 0 && !args.count("quiet");
  if (talk && !thread_note.empty()) std::cerr << tool << ": note: " << thread_note << "\n";
  if (talk && lock && lock->took_over_stale())
    std::cerr << tool << ": note: took over the lock of the output folder from a run that is gone (" << lock->path() << ")\n";
  if (batch && talk) {
    std::cerr << world.tag() << " " << plan.jobs.size() << " job(s) to render"
              << (plan.skipped ? dlo::str(", ", plan.skipped, " already done (results.jsonl",
                                          plan.recovered.empty() ? "" : dlo::str("; ", plan.recovered.size(), " by their videos' metadata"),
                                          ")")
                               : "")
              << "; model "
              << plan.model_dir << "; output " << plan.output_dir << "; " << world.size() << " rank(s), "
              << at::get_num_threads() << " thread(s) each (" << threads_why << ")\n";
  } else if (talk) {
    std::cerr << world.tag() << " model " << model.dir << "; " << dlo::job_parameters_text(plan.jobs[0].spec, model) << "\n";
    std::cerr << world.tag() << " " << at::get_num_threads() << " thread(s) per rank (" << threads_why << "); " << world.size()
              << " rank(s) share the transformer's weights (how they split the job: the topology, at the end)\n";
  }
  if (args.count("dry-run")) {
    print_dry_run(world, model, plan, go);
    return dlo::kExitOk;
  }

  // Signals: stop at the next pass boundary on every rank.
  dlo::install_stop_handlers();

  std::unique_ptr<dlo::ResultsLog> log;
  if (batch && world.rank() == 0) {
    log = std::make_unique<dlo::ResultsLog>(plan.results);
    for (const dlo::BatchJob& j : plan.recovered) log->append(dlo::result_line(dlo::recovered_result(j, model)));
  }
  std::unique_ptr<dlo::BatchLatents> latents;
  if (batch && args.count("save-latents") && !plan.jobs.empty())  // nothing left to render: the file stays as it is
    latents = outputs.open_latents(world, dlo::canonical_path(args["save-latents"].as<std::string>()), model, plan.jobs,
                                   dlo::dtypes_label(go));

  dlo::Console console(world, plan, batch, args.count("quiet") > 0);
  dlo::GenerateCallbacks cb;
  cb.stop_requested = [] { return dlo::stop_signal() != 0; };
  cb.on_phase = [&](const std::string& p) { console.phase(p); };
  cb.on_step = [&](const dlo::StepEvent& e) { console.step(e); };
  cb.on_progress = [&](const dlo::ProgressEvent& e) { console.progress(e); };
  cb.on_result = [&](const dlo::JobResult& r) {
    if (log) log->append(dlo::result_line(r));
    console.result(r);
  };
  cb.open_sink = [&](const dlo::BatchJob& j, std::int64_t w, std::int64_t h, std::int64_t frames) {
    return outputs.format(j.spec.format).open(j, model, w, h, frames);
  };
  if (latents) {
    cb.save_latents = [&](const dlo::BatchJob& j, const at::Tensor& lat) {
      for (std::size_t i = 0; i < plan.jobs.size(); ++i)
        if (plan.jobs[i].index == j.index) latents->write(i, lat);
    };
  }
  const dlo::GenerateReport report = dlo::generate(world, model, plan.jobs, go, cb);
  latents.reset();  // collective close
  const int sig = dlo::stop_signal();
  if (world.rank() != 0) return report.stopped ? 128 + (sig ? sig : SIGTERM) : dlo::kExitOk;
  if (talk) std::cerr << world.tag() << " " << report.choice << "\n";
  if (args.count("report")) dlo::write_file_atomic(args["report"].as<std::string>(), dlo::report_json(report) + "\n");
  std::int64_t failed = 0;
  for (const auto& r : report.jobs) failed += r.status != "ok";
  if (report.stopped) {
    std::cerr << tool << ": stopped by signal " << sig << " with " << report.jobs.size() << " job(s) recorded; "
              << "run the same command again to continue\n";
    return 128 + (sig ? sig : SIGTERM);
  }
  if (!batch) {
    const dlo::JobResult& r = report.jobs.at(0);
    if (r.status != "ok") {
      std::cerr << tool << ": error: " << r.error << "\n";
      return dlo::kExitFailed;
    }
    if (talk)
      std::cerr << world.tag() << " phases: text " << dlo::Console::seconds(r.text_s) << ", denoise "
                << dlo::Console::seconds(r.denoise_s) << ", decode + write " << dlo::Console::seconds(r.decode_s)
                << " (writing " << dlo::Console::seconds(r.encode_s) << "); peak RSS " << r.rss_peak_kb / 1024
                << " MiB; frames sha256 " << r.frames_sha256 << "\n";
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
  // Exit codes, messages and fault handlers shared by every tool (dlo/app/tool.h).
  return dlo::run_tool(dlo::app_outputs().build, &world, [&] { return run(world, argc, argv); });
}
