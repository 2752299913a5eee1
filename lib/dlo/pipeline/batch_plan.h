// What rank 0 decides about a batch before any weight is read, and shares with every rank: the
// jobs to render (resume already applied), each with its place in the manifest and its
// fingerprint. Torch-free; no MPI (the app shares the plan's JSON).
//
// Thread-safety: the functions are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dlo/config/job.h"
#include "dlo/pipeline/manifest.h"
#include "dlo/pipeline/results.h"
#include "dlo/pipeline/topology.h"

namespace dlo {

// One job of a batch as the ranks share it.
struct BatchJob {
  JobSpec spec;
  std::int64_t index = 0;   // in the manifest: the number in messages and results.jsonl
  std::string fingerprint;  // job_fingerprint, computed once by rank 0
};

// Paths in a plan are canonical (canonical_path: absolute, links resolved), resolved once by rank 0,
// so every rank reads and writes the same locations whatever its working directory.
struct BatchPlan {
  ModelParts model;             // the model folder and any transformer given as its own weights
  std::string output_dir;
  std::string model_identity;   // model_identity(model) on rank 0: every rank must hold the same
  std::string results;          // results.jsonl's path ("": one prompt, no results file)
  std::vector<BatchJob> jobs;   // to render, in manifest order
  std::string sp, cfg_parallel; // the manifest's topology keys ("": not given; the flags win)
  std::string storage_dtype;    // the manifest's storage_dtype ("": not given; the flag wins)
  std::int64_t skipped = 0;     // recorded as done, unchanged, with their outputs intact
  // Of the skipped: done by their outputs' own metadata (plan_resume), with no line in
  // results.jsonl yet; rank 0 records them before rendering.
  std::vector<BatchJob> recovered;
};

// The plan as JSON, and back (dlo::Error, kind internal, for text that is not a plan).
std::string plan_to_json(const BatchPlan& plan);
BatchPlan plan_from_json(const std::string& text);

// The bytes of an output: a regular file's size, or the sum of the regular files directly in a
// folder (a PNG sequence); -1 when `path` does not exist.
std::int64_t output_bytes(const std::string& path);

// Whether an output recorded as written is still whole: it exists, is not empty, and has the size
// results.jsonl recorded (`recorded_bytes`; -1 for lines of earlier versions, which recorded none:
// then existing and not empty is all that can be checked). A deleted, emptied or cut video fails.
bool output_intact(const std::string& path, std::int64_t recorded_bytes);

// A batch's latents file (--save-latents) as resume sees it: its entries by name (a job's id),
// each with the fingerprint it was saved for and whether its data are complete (its flag).
struct SavedLatents {
  std::string fingerprint;
  bool complete = false;
};
struct LatentsIndex {
  std::string path;
  std::map<std::string, SavedLatents> entries;
};

struct ResumeResult {
  std::vector<std::int64_t> render;       // indices into manifest.jobs, in order
  std::vector<std::int64_t> recovered;    // skipped by their outputs' metadata (no line), in order
  std::int64_t skipped = 0;
  std::vector<ManifestProblem> problems;  // jobs that changed since their video was rendered
};

// Resume: a job of `manifest` (fingerprints[i] its fingerprint) is skipped when `past` records it
// ok with the same fingerprint and its output is intact; a job recorded ok whose output is intact
// but whose fingerprint changed is a problem (its video would be replaced) unless `force`. A job
// `past` has no ok line for is skipped as recovered when `recorded_fingerprint` (the app's reader of
// an output's own metadata; "" for none, a damaged or a cut output) gives its fingerprint, and is
// a problem when it gives another. With a latents file (`latents`), a job is skipped only when its
// entry there is also complete and of its fingerprint (a done job whose latents are missing or
// were cut off renders again), and a job whose complete entry has another fingerprint is a
// problem (rendering it would replace them) unless `force`. Every other job renders; `force`
// renders every job. Reads only the outputs' sizes, and the metadata of outputs without a line.
ResumeResult plan_resume(const Manifest& manifest, const std::vector<std::string>& fingerprints,
                         const std::map<std::string, PastResult>& past, bool force,
                         const std::function<std::string(const JobSpec&)>& recorded_fingerprint = {},
                         const LatentsIndex* latents = nullptr);

// The results.jsonl record of a recovered job (BatchPlan::recovered): ok, its output's size now,
// `recovered` set, the frames' hash its output records (`frames_sha256`; "" when unknown), no timings.
JobResult recovered_result(const BatchJob& job, const ModelInfo& model, const std::string& frames_sha256);

// ---- planning on rank 0, before any weight is read

// One job from the command line (dlo-generate --prompt): each field from its flag (`flags`: field
// key -> text), else the model folder's recommendation (`model_defaults`: read_model_job_defaults),
// else built in; the seed, when not given, is `random_seed`; the output, when not given, "video" +
// the format's extension. Throws dlo::Error (input) listing every problem of the
// flags, one per line ("--seed: must be >= 0 ..."). Reads nothing.
JobSpec prompt_job(const JobFlags& flags, const OutputFormatNames& formats, std::uint64_t random_seed,
                   const std::map<std::string, JobFieldValue>& model_defaults = {});

// The checks of a --prompt job that need the model's configs (validate_job), as one dlo::Error
// (input) naming the flags ("--height: 500 is not a multiple of 16 ..."), one per line; a value
// the job took from the model's dlo_defaults.json (not in `flags`) is named there, and is no
// error where a flag makes it moot (FieldError::beside), as in a manifest.
void check_prompt_job(const JobSpec& job, const ModelInfo& model, const OutputFormatNames& formats,
                      const JobFlags& flags);

// The topology given on the command line (--sp, --cfg-parallel; unset: not given).
struct TopologyFlags {
  std::optional<int> sp;
  std::optional<TopologyRequest::Cfg> cfg;
};
// A batch's topology request: each flag given, else the manifest's key (`sp_key`, `cfg_key`: ""
// when absent), else auto. Throws dlo::Error (kind input) naming a bad key.
TopologyRequest batch_topology_request(const TopologyFlags& flags, const std::string& sp_key, const std::string& cfg_key);

struct BatchPlanOptions {
  std::string manifest;                      // --jobs FILE
  JobFlags flags;                            // job fields given on the command line
  std::optional<std::string> model, output_dir;  // --model, --output-dir
  std::string transformer, transformer_2;         // --transformer, --transformer-2 ("": the manifest's, else the folder's)
  std::string vae;                                // --vae (likewise)
  std::vector<LoraSpec> fused_loras;              // --fuse-lora (likewise: the manifest's fuse_loras when none)
  OutputFormatNames formats;                 // the app's
  bool force = false;                        // render jobs done or changed again
  bool dry_run = false;                      // create nothing
  std::string dtypes;                        // the dtypes (they decide the bytes): generate.h's dtypes_label
  // The dtypes label when the manifest's storage_dtype is `key` ("" when absent): the app's, which
  // lets --storage-dtype win; throws dlo::Error for a bad key (a problem of the manifest's key).
  // Unset: `dtypes`.
  std::function<std::string(const std::string& key)> dtypes_with;
  // The app's check of a job's output (its format's options and path); throws dlo::Error.
  std::function<void(const JobSpec& job, const ModelInfo& model)> check_output;
  // The fingerprint a job's existing output records in its metadata ("" for none): plan_resume.
  std::function<std::string(const JobSpec& job)> recorded_fingerprint;
  // Called (unless dry_run, and only when the manifest has no problem) once the output folder
  // exists, before results.jsonl, the latents file or any output in it is read: the app takes the
  // folder's lock here (FolderLock), so a second batch on it is refused.
  std::function<void(const std::string& output_dir)> hold_output_dir;
  // The same for the latents file (`latents`, when given), called before the output folder is
  // made: a batch refused for its latents file leaves no folder behind.
  std::function<void(const std::string& latents)> hold_latents;
  // Checks the model folder's parts beyond their configs (checkpoint headers, the tokenizer); a
  // failure is a problem of the plan, found before anything is written. Unset: not checked here.
  std::function<void(const ModelInfo& model)> check_model;
  // --save-latents: the batch's latents file ("": none). It may not lie in the model folder (a
  // problem of the command line). Its entries, read by `read_latents` (the app's reader: an empty
  // index for a file that does not exist yet; throws dlo::Error for one it would not write) once
  // the folders are held, take part in resume (plan_resume).
  std::string latents;
  std::function<LatentsIndex(const std::string& path)> read_latents;
  // The ranks the batch runs on (0: the topology is not checked here) and its topology flags: the
  // request (batch_topology_request) must hold for every job of the manifest (check_topology), a
  // problem of the command line or of the manifest's keys found before anything is written.
  int ranks = 0;
  TopologyFlags topology;
};

// Rank 0: the manifest read and checked (load_manifest, check_manifest), every job fingerprinted
// (job_fingerprint with the model folder's identity), resume applied (plan_resume against
// results.jsonl in the output folder and the latents file, if any), the topology checked, the paths made canonical, and, unless dry_run, the output
// folders created (the output folder itself and its hold_output_dir before resume is planned) and
// the temporaries of killed writers removed. Throws ManifestError with every problem (bad fields,
// changed jobs) or dlo::Error (an unreadable manifest, model folder or results file).
BatchPlan plan_batch(const BatchPlanOptions& options);

}  // namespace dlo
