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
// The output folder, and a --save-latents file, are locked while a batch runs (a second batch on
// either is refused); a batch whose output folder is removed stops at the next pass boundary.
// Exit codes: 0 ok, 2 bad invocation or input (found before any weight is read; nothing written),
// 3 a batch finished with some jobs failed, 130/143 stopped by SIGINT/SIGTERM, 1 anything else.
//
// The flags, the run options they give and rank 0's plan are dlo/app/generate_cli.h's; this file
// joins them to the collective start-up, the console and dlo::generate. The outputs this build
// writes come from its format table (dlo/app/output_formats.h), linked by CMake: libav's for
// dlo-generate, frames as .safetensors for dlo-generate-bare.
#include <ATen/Parallel.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "dlo/app/console.h"
#include "dlo/app/generate_cli.h"
#include "dlo/app/generate_hooks.h"
#include "dlo/app/job_flags.h"
#include "dlo/app/output_formats.h"
#include "dlo/app/tool.h"
#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/common/folder_lock.h"
#include "dlo/common/settings.h"
#include "dlo/dist/device.h"
#include "dlo/models/weights.h"
#include "dlo/models/wan_lora_fuse.h"
#include "dlo/mpi/mpi_world.h"

namespace {

int run(dlo::MpiWorld& world, int argc, char** argv) {
  const dlo::AppOutputs& outputs = dlo::app_outputs();
  const std::string tool = outputs.build;
  const dlo::GenerateHooks& hooks = dlo::generate_hooks();  // none, except in the tests' build
  cxxopts::Options opts = dlo::generate_flag_table(outputs);
  hooks.add_flags(opts);
  // Everything checkable is checked before any weight is read: the flags and options on every
  // rank, the jobs on rank 0, which shares the plan. A problem is the same error on every rank.
  std::string error, thread_note, plan_text;
  std::optional<dlo::FolderLock> lock, latents_lock;  // rank 0, a batch: held until every result is written
  dlo::ErrorKind error_kind = dlo::ErrorKind::kInput;
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
    const int threads = dlo::bound_threads(static_cast<int>(dlo::integer_flag(args, "threads")), "--threads", &thread_note);
    if (threads > 0) at::set_num_threads(threads);
    go = dlo::generate_options_from_flags(args);
    (void)dlo::pick_device(go.device, world, "--device");  // a bad --device before anything is written
    DLO_CHECK(batch || args.count("prompt"),
              "give --prompt TEXT (one video; an empty prompt is allowed: --prompt \"\") or --jobs FILE (a batch)");
    DLO_CHECK(!(batch && args.count("prompt")), "give --prompt or --jobs, not both");
    if (world.rank() == 0) {
      if (args.count("report")) dlo::with_context("--report", [&] { dlo::check_output_path(args["report"].as<std::string>()); });
      const dlo::JobFlags flags = dlo::job_field_flags(args);
      const std::string dtypes = dlo::dtypes_label(go);
      const dlo::BatchPlan plan = batch ? dlo::batch_plan_from_flags(args, flags, outputs, dtypes, world.size(), lock, latents_lock)
                                          : dlo::prompt_plan_from_flags(args, flags, outputs, dtypes, world.size());
      plan_text = dlo::plan_to_json(plan);
    }
  } catch (const cxxopts::exceptions::exception& e) {
    error = e.what();  // a bad flag: the same on every rank
  } catch (const dlo::Error& e) {
    error = e.what();
    error_kind = e.kind();  // no room for the lock is an I/O error, not bad input
  }
  world.check_all(error, "start-up check", error_kind);
  std::string threads_why = "--threads";
  if (dlo::integer_flag(args, "threads") == 0) {
    try {
      at::set_num_threads(dlo::default_threads(world, &threads_why));  // collective
    } catch (const dlo::Error& e) {
      error = e.what();  // OMP_NUM_THREADS is the same text everywhere a launcher copies it
    }
    world.check_all(error);
  }
  const dlo::BatchPlan plan = dlo::plan_from_json(world.broadcast_string(plan_text, 0, "sharing the plan"));
  // The manifest's storage_dtype (checked on rank 0) where the flag does not say.
  if (!plan.storage_dtype.empty()) go = dlo::generate_options_from_flags(args, plan.storage_dtype);
  // The manifest's topology keys (checked on rank 0) where the flags do not say.
  go.topology = dlo::batch_topology_request(dlo::topology_flags(args), plan.sp, plan.cfg_parallel);
  try {
    hooks.apply(args, world, go);
  } catch (const dlo::Error& e) {
    error = e.what();
  }
  world.check_all(error);
  // Every rank reads the model folder itself (a rank that cannot see it says so, on every rank) and
  // proves it holds what rank 0 planned with: no rank renders from other weights.
  dlo::ModelInfo model;
  try {
    model = dlo::read_model_info(plan.model);
    if (world.rank() != 0) {
      const std::string mine = dlo::model_identity(plan.model);
      DLO_CHECK(mine == plan.model_identity, "the model folder '", plan.model.dir, "'",
                plan.model.transformer.empty() && plan.model.transformer_2.empty() && plan.model.vae_file.empty() &&
                        plan.model.fused_loras.empty()
                    ? ""
                    : " (with the weights given)",
                " holds other files here than on rank 0 ",
                "(identity ", mine, ", rank 0's ", plan.model_identity, "): every rank must render from the same weights");
    }
  } catch (const dlo::Error& e) {
    error = e.what();
  }
  world.check_all(error, "start-up check (model folder)");
  const bool talk = world.rank() == 0 && !args.count("quiet");
  if (talk && !thread_note.empty()) std::cerr << tool << ": note: " << thread_note << "\n";
  if (talk)
    for (const auto& n : dlo::lora_ignored_notes(model.parts.fused_loras)) std::cerr << tool << ": warning: " << n << "\n";
  if (talk && lock && lock->took_over_stale())
    std::cerr << tool << ": note: took over the lock of the output folder from a run that is gone (" << lock->path() << ")\n";
  if (batch && talk) {
    std::cerr << world.tag() << " " << plan.jobs.size() << " job(s) to render"
              << (plan.skipped ? dlo::str(", ", plan.skipped, " already done (results.jsonl",
                                          plan.recovered.empty() ? "" : dlo::str("; ", plan.recovered.size(), " by their videos' metadata"),
                                          ")")
                               : "")
              << "; model "
              << plan.model.dir << "; output " << plan.output_dir << "; " << world.size() << " rank(s), "
              << at::get_num_threads() << " thread(s) each (" << threads_why << ")\n";
  } else if (talk) {
    std::cerr << world.tag() << " model " << model.parts.dir << "; " << dlo::job_parameters_text(plan.jobs[0].spec, model) << "\n";
    std::cerr << world.tag() << " " << at::get_num_threads() << " thread(s) per rank (" << threads_why << "); " << world.size()
              << " rank(s) share the transformer's weights (how they split the job: the topology, at the end)\n";
  }
  if (args.count("dry-run")) {
    dlo::print_dry_run(world, model, plan, go);
    return dlo::kExitOk;
  }

  // Signals: stop at the next pass boundary on every rank.
  dlo::install_stop_handlers();

  std::unique_ptr<dlo::ResultsLog> log;
  if (batch && world.rank() == 0) {
    log = std::make_unique<dlo::ResultsLog>(plan.results);
    for (const dlo::BatchJob& j : plan.recovered) {
      const dlo::OutputFormat& f = outputs.format(j.spec.format);
      const std::optional<dlo::RecordedJob> r = f.recorded ? f.recorded(j.spec.output, true) : std::nullopt;
      log->append(dlo::result_line(dlo::recovered_result(j, model, r ? r->frames_sha256 : std::string())));
    }
  }
  std::unique_ptr<dlo::BatchLatents> latents;
  if (batch && args.count("save-latents") && !plan.jobs.empty())  // nothing left to render: the file stays as it is
    latents = outputs.open_latents(world, dlo::canonical_path(args["save-latents"].as<std::string>()), model, plan.jobs,
                                   dlo::dtypes_label(go));

  dlo::Console console(world, plan, batch, args.count("quiet") > 0);
  dlo::GenerateCallbacks cb;
  cb.stop_requested = [&] {
    // Rank 0: an output folder removed (or its lock replaced) mid-batch ends every rank here, at
    // the next pass boundary, with an I/O error, rather than denoising jobs nothing can record.
    if (lock) lock->check_held();
    return dlo::stop_signal() != 0;
  };
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
  const std::unique_ptr<dlo::BatchWork> work = hooks.work(args, world, model, go, cb);
  const dlo::GenerateReport report = dlo::generate(world, model, plan.jobs, go, cb, *work);
  latents.reset();  // collective close
  const int sig = dlo::stop_signal();
  if (world.rank() != 0) return report.stopped ? 128 + (sig ? sig : SIGTERM) : dlo::kExitOk;
  if (talk) std::cerr << world.tag() << " " << report.choice << "\n";
  if (args.count("report")) dlo::write_file_atomic(args["report"].as<std::string>(), dlo::report_json(report) + "\n");
  std::int64_t failed = 0;
  for (const auto& r : report.jobs) failed += !r.ok();
  if (report.stopped) {
    std::cerr << tool << ": stopped by signal " << sig << " with " << report.jobs.size() << " job(s) recorded; "
              << "run the same command again to continue\n";
    return 128 + (sig ? sig : SIGTERM);
  }
  if (!batch) {
    const dlo::JobResult& r = report.jobs.at(0);
    if (!r.ok()) {
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
