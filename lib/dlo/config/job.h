// One video to render (a job) and the one table of its fields.
//
// Every job field is one row of job_fields(): its key (the manifest's and the JSON records'), its
// flag, type, built-in default, the checks of its value that need no model, its help text, and
// what it decides (the frames, only the video file, or nothing: the fingerprint covers the first
// two). The manifest reader, the command-line flags, the plan shared between ranks, the results'
// parameters, the fingerprint and the schema in docs/manifest.md are all driven by this table, so
// adding a field is one row (plus its use).
//
// Field names in messages are the job's own keys (height, frames, ...), the same words a manifest
// uses; apps turn them into flag names where the value came from a flag.
//
// Torch-free. Thread-safety: everything here is thread-safe (the table is built once).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "dlo/config/model_info.h"
#include "dlo/config/noise_scheduler_config.h"

namespace dlo {

// What to render and where to put it. Defaults are WanPipeline's (480x832, 81 frames, 50 steps,
// guidance 5.0, negative prompt "") and Wan's 16 fps; the table's rows read and write these members.
struct JobSpec {
  std::string id = "video";
  std::string prompt;
  std::string negative_prompt;                   // used only when guidance > 1
  std::uint64_t seed = 0;
  std::int64_t steps = 50;
  double guidance = 5.0;                         // classifier-free guidance when > 1
  // Wan2.2 A14B (two experts) only: the low-noise expert's guidance (unset: `guidance`) and the
  // boundary between the experts (unset: the folder's boundary_ratio). Guidance is on for both
  // experts when guidance > 1, as in WanPipeline.
  std::optional<double> guidance_2;
  std::optional<double> boundary_ratio;
  std::int64_t height = 480, width = 832, frames = 81;
  std::int64_t fps = 16;
  std::optional<NoiseSchedulerKind> scheduler;   // unset: the model folder's scheduler
  std::optional<double> flow_shift;              // unset: the folder's flow_shift
  std::optional<NoiseSchedule> schedule;         // unset: kDefault (the scheduler's own sigmas)
  // Outputs. The pipeline does not interpret these; the frame sink the app opens does.
  std::string format;                            // one of the app's output formats ("": its first)
  std::int64_t crf = 25;
  std::string preset = "medium";
  std::string output;                            // a file, or a folder (a format's choice)
  std::string save_latents;                      // "": none; else a .safetensors path
  // Unfused LoRAs applied to this job alone (parse_lora_list: "A.safetensors:0.8, low=B"; "": none).
  std::string loras;

  bool guided() const { return guidance > 1.0; }
};

// An output format as the job table sees it: its name (a `format` value) and the extension of a
// job's default output ("<id><extension>"; "" for a folder). The app owns the formats
// (app/output_formats.h); the first is the default.
struct OutputFormatName {
  std::string name;
  std::string extension;
};
using OutputFormatNames = std::vector<OutputFormatName>;

// A field's value as read (flags, YAML, JSON): text, a seed, an integer or a number.
using JobFieldValue = std::variant<std::string, std::uint64_t, std::int64_t, double>;

enum class JobFieldType { kText, kSeed, kInteger, kNumber };

// What a field decides. kFrames: the frames (so the video, its metadata and the fingerprint);
// kVideo: the video file but not its frames (fingerprint); kNone: nothing about the output.
enum class JobFieldEffect { kFrames, kVideo, kNone };

// Where a field's value may come from (bits).
enum JobFieldSource : unsigned {
  kFromJob = 1,         // a job's own entry in a manifest
  kFromDefaults = 2,    // a manifest's `defaults`
  kFromBatchFlag = 4,   // the command line of a batch (--jobs), as every job's value
  kFromPromptFlag = 8,  // the command line of one prompt (--prompt)
  kFromModel = 16,      // the model folder's dlo_defaults.json: the settings the model was made for
};

struct JobField {
  std::string key;    // manifest key and JSON key, e.g. "negative_prompt"
  std::string flag;   // command-line flag without "--", e.g. "negative-prompt" ("" for none)
  JobFieldType type;
  JobFieldEffect effect;
  unsigned sources;   // JobFieldSource bits
  bool in_parameters; // one of the parameters recorded with the video (job_parameters_json)
  std::string help;           // one line, for --help and docs/manifest.md
  std::string default_text;   // the built-in default, as documented
  std::string checked_text;   // what is checked without a model, as documented ("" nothing)
  std::vector<std::string> choices;  // names the value must be one of (empty: any)
  bool app_choices = false;          // the choices are the app's output formats
  // The job's value (nullopt: unset, for the optional fields).
  std::function<std::optional<JobFieldValue>(const JobSpec&)> get;
  // Sets the job's value (of this field's type; choices already checked).
  std::function<void(JobSpec&, const JobFieldValue&)> set;
  // A problem with a value of this field's type that needs no model ("" when fine), without the
  // field's name: "must be >= 1, got 0".
  std::function<std::string(const JobFieldValue&)> check;
  // The value that decides the output once the model is known (the folder's scheduler and shift
  // where the job sets none, no negative prompt without guidance). Unset: get().
  std::function<std::optional<JobFieldValue>(const JobSpec&, const ModelInfo&)> effective;

  bool from(JobFieldSource s) const { return (sources & s) != 0; }
};

// The table, in the documented order.
const std::vector<JobField>& job_fields();
// The row of `key` (nullptr if there is none).
const JobField* find_job_field(const std::string& key);

// Parses `text` (a flag's value, a YAML scalar) as `field`'s type and checks it (choices, the
// row's check). On success returns the value; else nullopt and *problem says why, without the
// field's name ("must be an integer, got 'x'"). `formats` gives the app's format names.
std::optional<JobFieldValue> parse_job_field(const JobField& field, const std::string& text,
                                             const OutputFormatNames& formats, std::string* problem);
// The problem with an already-typed value (choices, the row's check); "" when fine.
std::string check_job_field(const JobField& field, const JobFieldValue& value, const OutputFormatNames& formats);
// The value as text ("12.5" not "12.500000"; text as it is).
std::string job_field_text(const JobFieldValue& value);
// "is not one of mp4, png or ffv1" style list of names: "mp4, png or ffv1".
std::string choice_list(const std::vector<std::string>& names);

// A job from explicit values (key -> value), the rest built in: the one precedence rule, first
// value wins, over `layers` in order (e.g. {job's, flags', defaults'}). Values are of each field's
// type (parse_job_field's). `format` empty afterwards takes formats' first name.
// `given` (if not null) gets the keys some layer set.
JobSpec resolve_job(const std::vector<const std::map<std::string, JobFieldValue>*>& layers,
                    const OutputFormatNames& formats, std::set<std::string>* given = nullptr);

// One problem with a job's field.
struct FieldError {
  std::string field;    // the job's key, e.g. "height"
  std::string message;  // what is wrong and why, without the field name
  // The value is wrong only beside another of the job's values, `beside` (guidance_2 > 1 with
  // guidance <= 1): reported at the job even where the value came from defaults or flags; a
  // manifest drops it where the value comes from a less specific layer than `beside`'s (defaults'
  // guidance_2 beside a job's own guidance 1: the job turned guidance off, nothing to refuse).
  bool with_job = false;
  std::string beside;

  // (A constructor, so that the common {field, message} needs no placeholder for the rest.)
  FieldError(std::string field_, std::string message_, bool with_job_ = false, std::string beside_ = {})
      : field(std::move(field_)), message(std::move(message_)), with_job(with_job_), beside(std::move(beside_)) {}
};

// The file in a model folder that says which settings the model was made for (a model trained
// at 64x64 and 17 frames renders noise at WanPipeline's 480x832): {"defaults": {"height": 64,
// ...}}, keys of the fields the table allows from the model (kFromModel). Diffusers ignores it.
inline constexpr const char* kModelDefaultsFile = "dlo_defaults.json";

// What is wrong with an output's name as given ("": nothing): empty, blank, a space at either end
// (a name other than the one the user sees), or "-" (dlo writes no video to standard output).
std::string output_name_problem(const std::string& name);

// `dir`'s dlo_defaults.json as job values (of each field's type, checked as parse_job_field
// does); none when the folder has no such file. Every value of a manifest, a flag or a job wins
// over these. Throws dlo::Error (input) naming the file and each bad key, one per line
// ("m/dlo_defaults.json: defaults.steps: must be >= 1, got 0"), or, given `problems`, adds them
// there (field "defaults.steps"; "" for the file itself) and leaves those keys out. Reads nothing else.
std::map<std::string, JobFieldValue> read_model_job_defaults(const std::string& dir,
                                                            std::vector<FieldError>* problems = nullptr);
// `dir`/dlo_defaults.json.
std::string model_job_defaults_path(const std::string& dir);

// Every check of `job` that needs no weights, in the table's order: each field's own check (as
// parse_job_field's), the output format among `formats`, sizes multiples of
// info.spatial_multiple(), frames of the form temporal * k + 1, and a latent grid the
// transformer's RoPE covers. Returns every problem (empty: the job is good). Output paths are
// checked by the app (they depend on the format).
std::vector<FieldError> validate_job(const JobSpec& job, const ModelInfo& info, const OutputFormatNames& formats);

// The job's noise scheduler config: the folder's with the job's overrides (a schedule other
// than default makes it euler; validate_job refuses one beside scheduler unipc).
NoiseSchedulerConfig job_scheduler_config(const JobSpec& job, const ModelInfo& info);

// The job's parameters (the fields the table marks in_parameters, with their effective values,
// then the model folder, dlo's version and, when given, the job's fingerprint) as JSON, for
// metadata and logs; and the same as one human line ("prompt: ...; seed 42; ...").
std::string job_parameters_json(const JobSpec& job, const ModelInfo& info, const std::string& fingerprint = "");
std::string job_parameters_text(const JobSpec& job, const ModelInfo& info);

// What an output's metadata (job_parameters_json's text, as a video's "description" tag or a
// .safetensors' "dlo_job") says of the job that wrote it: nullopt when `text` is not dlo's (no
// "dlo_version"); fingerprint "" when the writer recorded none (before dlo 0.2), frames -1 when
// absent.
struct RecordedJob {
  std::string fingerprint;
  std::int64_t frames = -1;
  std::string frames_sha256;  // "" when absent (a Matroska file, whose tags precede its frames)
};
std::optional<RecordedJob> read_recorded_job(const std::string& text);
// `parameters_json` (job_parameters_json's text) with "frames_sha256": the hash of the frames the
// output holds, known once they are all written (results.jsonl's frames_sha256).
std::string with_frames_sha256(const std::string& parameters_json, const std::string& frames_sha256);

// Jobs as JSON (every field, by the table), to share a plan between ranks, and back.
// jobs_from_json throws dlo::Error for text that is not such a list.
std::string jobs_to_json(const std::vector<JobSpec>& jobs);
std::vector<JobSpec> jobs_from_json(const std::string& text);

// The fields that decide the output (effect kFrames or kVideo) with their effective values, as
// one JSON object in the table's order (fields without an effective value left out): what a
// fingerprint covers of the job itself.
std::string job_output_fields_json(const JobSpec& job, const ModelInfo& info);

// The job-field table as docs/manifest.md shows it (a Markdown table, one row per field).
std::string job_fields_markdown();

// Whether `id` may name a job: 1..128 characters of [A-Za-z0-9._-], not starting with '.' or '-'.
bool is_safe_job_id(const std::string& id);

// dlo's version ("0.1.0").
const char* dlo_version();

}  // namespace dlo
