// Text to video on every rank at once: a batch of jobs rendered through one wave of the offload
// engine, which all ranks drive together.
//
// generate() is a short loop of named stages (render/stages.h) around the job scheduler
// (pipeline/job_scheduler.h): at every pass boundary each rank reports its state in one small
// allgather and every rank computes the same decision from the reports: who takes which job next,
// whether results go to rank 0, whether to stop. Then one traversal: a denoising step of each
// rank's current job (prepare: its prompts, encoded ahead on a worker thread), or a ghost pass; a
// job whose steps are done goes to a second worker thread that decodes and writes it (finish)
// while the next one denoises. So a rank never waits behind another rank's longer job, and jobs
// may differ in steps, size, frames and guidance.
//
// Groups (pipeline/topology.h): with sequence or CFG parallelism the scheduler hands jobs to
// groups of consecutive ranks instead of ranks. The group's first rank (its leader) holds the
// job as a rank does in data parallelism and reports for the group; the others prepare the same
// job, follow the decisions for the leader's slot, compute their share of every step with it
// (StepGroups) and keep the same latents. The group's ranks take turns decoding and writing its
// finished jobs (by job position), so decodes spread over the group as they do over ranks.
//
// Which rank renders a job never changes its video: latents come from a CPU generator seeded with
// the job's seed alone, and every strategy and rank count computes the same block outputs.
//
// The work of the stages is a BatchWork (render/batch_work.h): the model's, or a test's fake.
//
// Faults: a job's own failure (its prompt, a computation, the decode, writing its output) fails
// that job alone (BlockComputeError inside the wave) and the batch goes on. A failure of the
// transfers, or any other error on one rank once the wave runs (an I/O error writing
// results.jsonl, ...), ends every rank at once with that rank's message (MpiWorld::abort), instead
// of leaving the others in a gather; with one rank it is thrown.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/config/job.h"
#include "dlo/dist/device.h"
#include "dlo/offload/memory_model.h"
#include "dlo/pipeline/batch_plan.h"
#include "dlo/pipeline/results.h"
#include "dlo/pipeline/topology.h"
#include "dlo/render/stages.h"

namespace dlo {

class BatchWork;
class MpiWorld;

struct GenerateOptions {
  at::ScalarType dtype = at::kBFloat16;      // transformer and text encoder
  at::ScalarType vae_dtype = at::kFloat;     // diffusers recommends (and Wan ships) an fp32 VAE
  // What the transformer's block Linears are kept in (--storage-dtype; resolve_wan_dtypes): in
  // host shards, gathers and device slots; cast to `dtype` just before their matmul.
  LinearStorage storage = LinearStorage::kAuto;
  StrategyRequest offload;                   // default auto
  DeviceRequest device;                      // default auto
  // Where the text encoder and the VAE run when the transformer runs on CUDA (memory_model.h):
  // auto (the device when the transformer's strategy stays the same), the device, or the CPU.
  AuxPlacement text_vae = AuxPlacement::kAuto;
  // Device memory each rank may use (auto's budget; mixed: blocks kept on the device). Unset: the
  // device's free memory (CPU: the host's, as the page cache).
  std::optional<std::uint64_t> device_budget;
  // This rank's host as NCCL sees it (NCCL_HOSTID, read by the app); empty: the hostname.
  std::string host_id;
  bool keep_page_cache = false;
  // Two experts: keep the ranks on one expert per pass where they can, by parking a job or
  // starting the next one early (JobScheduler). false: every rank always steps its current job.
  bool align_experts = true;
  // How ranks are grouped into jobs (--sp, --cfg-parallel; pipeline/topology.h). Default auto.
  TopologyRequest topology;
  // At every pass boundary a rank waits until its next job's prompts are prepared, so that the
  // scheduler's decisions (which rank takes which job, parks for expert alignment) do not depend
  // on how fast the text worker is: the same batch makes the same passes (the tests' expert
  // alignment). Costs the overlap of preparation with denoising at the boundary.
  bool await_prepared = false;
};

// Rank-local: one denoising step of this rank's job.
struct StepEvent {
  std::string job_id;
  std::int64_t job_index = 0;
  std::int64_t step = 0, steps = 0;  // step counts from 1
  double seconds = 0;
};

// Rank 0, once per pass: where the batch is.
struct ProgressEvent {
  std::int64_t pass = 0;
  std::int64_t jobs_total = 0, jobs_done = 0, jobs_failed = 0;
  std::vector<std::int64_t> rank_job;   // each rank's current job (a position in the jobs given), -1: none
  std::vector<std::int64_t> rank_step;  // its steps done
  double eta_s = -1;                    // from the measured step times; -1: not known yet
};

struct GenerateCallbacks {
  std::function<void(const std::string& phase)> on_phase;  // rank-local: "text", "denoise", "decode"
  std::function<void(const StepEvent&)> on_step;           // rank-local
  std::function<void(const ProgressEvent&)> on_progress;   // rank 0
  // Rank 0: every job's result as it reaches rank 0 (finished, or failed with its error). May
  // throw (an I/O error recording it): that ends every rank.
  std::function<void(const JobResult&)> on_result;
  // The job's frames go here (worker thread of the rank that renders it).
  SinkFactory open_sink;
  // Keeps a job's final latents (worker thread). Unset: save_latents as .safetensors.
  LatentsKeeper save_latents;
  // Polled at every pass boundary: true stops the batch on every rank (signals).
  std::function<bool()> stop_requested;
};

struct GenerateReport {
  std::string choice;           // "offload: dlo (reason); device ...; N rank(s)"
  std::vector<JobResult> jobs;  // rank 0: every job that finished or failed; others: their own
  std::string ranks_json;       // rank 0: per-rank engine, wave and memory facts (JSON array)
  bool stopped = false;         // a stop was requested: jobs not finished were left for a rerun
};

// "bf16/fp32": the dtypes that decide a job's bytes (for job_fingerprint): the transformer's and
// the VAE's compute dtypes, and a storage asked for ("bf16+fp8/fp32").
std::string dtypes_label(const GenerateOptions& options);

// The report as JSON: {"choice", "stopped", "jobs": [results.jsonl records], "ranks": [...]}.
std::string report_json(const GenerateReport& report);

// What generate() will decide about memory, without loading anything (--dry-run): the device of
// every rank, the agreed budget, and plan_batch_memory over the stack the config describes (the
// same figures generate() gets from the checkpoint's plan). Collective; a plan that cannot fit is
// the same dlo::Error on every rank.
struct RenderPlan {
  std::string device;  // this rank's, e.g. "cpu"
  BatchMemoryPlan memory;
  TopologyPlan topology;  // over the jobs that fit (the jobs not in memory.refused, in order)
  std::string weights;    // the transformer's dtypes, each expert's (WanDtypes::describe)
};
RenderPlan plan_render(const MpiWorld& world, const ModelInfo& model, const std::vector<BatchJob>& jobs,
                       const GenerateOptions& options);

// Collective: every rank calls it with the same model, jobs (in the same order, checked by the
// caller: validate_job) and options. Bad input found before the wave (the device, the checkpoint,
// a batch none of whose jobs fits in memory) is a dlo::Error on every rank (the same message). A
// job that alone does not fit fails, recorded, before anything is prepared for it. A failure of
// one job (its text, a computation, decoding, writing) is recorded in its JobResult and the batch
// goes on. Anything else ends every rank (see the header comment).
GenerateReport generate(const MpiWorld& world, const ModelInfo& model, const std::vector<BatchJob>& jobs,
                        const GenerateOptions& options, const GenerateCallbacks& callbacks);
// The same with the stages' work given (make_model_work's, wrapped by a test build, or a fake):
// `work` is loaded, started and ended by this call.
GenerateReport generate(const MpiWorld& world, const ModelInfo& model, const std::vector<BatchJob>& jobs,
                        const GenerateOptions& options, const GenerateCallbacks& callbacks, BatchWork& work);

}  // namespace dlo
