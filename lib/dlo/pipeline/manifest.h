// A batch manifest: the jobs dlo-generate --jobs renders, read from YAML (or a text file of
// prompts), every field resolved and checked before any weight is read. The schema, with examples,
// is docs/manifest.md.
//
// Precedence for every job field: the job's own value > the command line > the manifest's
// `defaults` > built in (JobSpec's). Paths written in the manifest are relative to the manifest's
// folder; paths given by flags are relative to the working directory, as given.
//
// Thread-safety: the functions are thread-safe (they share no state). None is collective: rank 0
// reads the manifest and shares the result.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dlo/common/error.h"
#include "dlo/config/job.h"

namespace dlo {

// Job fields given on the command line: field key -> the flag's text as given (parsed and checked
// by the field table, parse_job_field).
using JobFlags = std::map<std::string, std::string>;

// Where a job's field got its value (for messages: a value from `defaults` or a flag is reported
// once, where it was written, not once per job).
struct ManifestFieldSource {
  enum Kind { kBuiltIn, kModel, kFlag, kDefaults, kJob };  // kModel: the model folder's dlo_defaults.json
  Kind kind = kBuiltIn;
  std::int64_t line = -1, column = -1;  // 1-based, in the manifest; -1: none (flag, built-in)
};

// One problem: file, job (index from 0 and id; -1 and "" for top-level keys and `defaults`),
// field (a job's key; "defaults.<key>" for a default; a top-level key; "--flag" for a command-line
// value, then file is "command line"; "" for the entry itself), message, and where (1-based line
// and column in the file; -1: unknown).
struct ManifestProblem {
  std::string file;
  std::int64_t job_index = -1;
  std::string job_id;
  std::string field;
  std::string message;
  std::int64_t line = -1, column = -1;
};

struct Manifest {
  std::string path;        // the manifest file as given
  // The model folder: --model when given (as given), else the manifest's `model` resolved against
  // the manifest's folder. Neither: load_manifest reports a problem.
  std::string model;
  // Likewise: --output-dir (as given), else `output_dir` resolved against the manifest's folder,
  // else the manifest's folder ("." when the manifest path has no folder part).
  std::string output_dir;
  // The top-level `sp` and `cfg_parallel` (the batch's topology, pipeline/topology.h), checked;
  // "": not given.
  std::string sp, cfg_parallel;
  // The top-level `transformer`, `transformer_2` and `vae` (weights given instead of the folder's),
  // resolved against the manifest's folder; "": not given. --transformer / --transformer-2 / --vae win.
  std::string transformer, transformer_2, vae;
  // The top-level `storage_dtype` (the transformer's Linears, as --storage-dtype; checked by the
  // plan against the compute dtype); "": not given. --storage-dtype wins.
  std::string storage_dtype;
  // The top-level `fuse_loras` (as --fuse-lora, paths resolved against the manifest's folder);
  // --fuse-lora wins.
  std::vector<LoraSpec> fused_loras;
  std::vector<JobSpec> jobs;  // every field resolved; `output` resolved against output_dir
  OutputFormatNames formats;  // the app's output formats it was read with
  // Per job (same index as jobs), per field name (the manifest's keys): where its value came from.
  std::vector<std::map<std::string, ManifestFieldSource>> sources;
  // Per job: the 1-based line of its entry in the manifest (-1: unknown).
  std::vector<std::int64_t> job_lines;
  // read_manifest: the file's own problems (load_manifest throws them instead).
  std::vector<ManifestProblem> problems;
};

// The name of the batch's results file in output_dir; no job's output may be it.
inline constexpr const char* kResultsFileName = "results.jsonl";

// One line per problem, joined by '\n' (no trailing newline):
//   "prompts.yaml:12:5: job 3 (id 'fox'): steps: must be >= 1, got 0"
//   "prompts.yaml:4:3: defaults: unknown key 'step' (did you mean 'steps'?)"
//   "command line: --height: 100 is not a multiple of 16 (...)"
// (":line:column" only where known; "defaults.steps" is written "defaults: steps".)
std::string format_problems(const std::vector<ManifestProblem>& problems);

// Throws ManifestError with `problems` in file order: the command line's first, then those
// without a line, then by line and column.
[[noreturn]] void throw_manifest_problems(std::vector<ManifestProblem> problems);

// Every problem of a manifest; what() is format_problems(problems()).
class ManifestError : public Error {
 public:
  explicit ManifestError(std::vector<ManifestProblem> problems);
  const std::vector<ManifestProblem>& problems() const { return problems_; }

 private:
  std::vector<ManifestProblem> problems_;
};

// Reads a manifest and resolves every job, applying `flags`:
//   * YAML (any name not ending in ".txt"): a mapping with the keys `model`, `output_dir`,
//     `defaults` (a mapping of job fields) and `jobs` (a list; each entry a mapping of job fields,
//     or a string: the prompt).
//   * text (".txt"): one prompt per line, as written (a trailing "\r" dropped); lines that are empty
//     or blank, and lines whose first non-blank character is '#', are skipped. An empty prompt or
//     one starting with '#' cannot be written there (use YAML: `- ""`). Everything else comes from
//     the flags (--model is required).
// Ids when absent: "job-" + the index zero-padded to 4 digits (more when there are 10000 jobs or
// more), with "-2", "-3", ... appended if that equals another job's id. Output when absent: the id +
// its format's extension (a folder named the id for a folder format), in output_dir. Seed when given
// nowhere: the first 4 bytes of sha256(id) as a big-endian uint32, so a rerun renders the same video.
// Collects every problem of the file (unknown keys with "did you mean", duplicate keys, wrong types,
// values out of range that need no model, a missing prompt, no jobs, duplicate ids, ids that are not
// filesystem-safe, duplicate outputs after resolution, invalid scheduler/format names) and throws
// ManifestError with all of them. Throws dlo::Error for an unreadable file (a FIFO is refused
// without blocking). Reads nothing but the manifest; writes nothing.
// `formats`: the app's output formats (the first is the default `format`). A flag of a field that is
// not a batch field (--prompt, --out) is a problem of its own.
Manifest load_manifest(const std::string& path, const JobFlags& flags, const std::optional<std::string>& model_flag,
                       const std::optional<std::string>& output_dir_flag, const OutputFormatNames& formats);
// The same, keeping the file's problems in Manifest::problems instead of throwing them (a file that
// is not valid YAML, or not a mapping, still throws): the jobs are resolved as far as they can be,
// so that the checks that need the model (check_manifest) report theirs in the same run.
Manifest read_manifest(const std::string& path, const JobFlags& flags, const std::optional<std::string>& model_flag,
                       const std::optional<std::string>& output_dir_flag, const OutputFormatNames& formats);

// The checks that need the model's configs and the output locations: validate_job per job (a
// problem of a value from `defaults` or a flag is reported once, at its source); output_dir and
// each output's folder exist, or can be created (the nearest existing folder above is a writable
// folder); and `check_output(job)` per job when given (the app passes check_video_output: the
// format's options and the path; where the output's folder does not exist yet, it is called with the
// output moved into the nearest existing folder). Its dlo::Error becomes a problem on `output`.
// A job whose output already has one of manifest.problems is not checked again. Returns every
// problem (empty: good). Writes nothing.
std::vector<ManifestProblem> check_manifest(const Manifest& manifest, const ModelInfo& model,
                                            const std::function<void(const JobSpec&)>& check_output = {});

// Creates output_dir and the folder of every job's output (mkdir -p; png outputs' own folders are
// left to the writer). Throws dlo::Error naming the folder.
void create_output_folders(const Manifest& manifest);

// The seed a job gets when none is given: the first 4 bytes of sha256(id), big-endian.
std::uint64_t default_seed_for_id(const std::string& id);


}  // namespace dlo
