// Batch manifests: every validation error's exact message (file, line, job index and id, field),
// all errors at once, precedence, path resolution, ids, outputs, seeds (against Python's hashlib),
// the text form, and the checks against a model folder.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <filesystem>

#include "common/formats.h"
#include "common/test_util.h"
#include "common/source_tree.h"
#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "common/model_folder.h"
#include "dlo/pipeline/manifest.h"

namespace {

namespace fs = std::filesystem;
using dlo::test::TempDir;

using dlo::test::kVideoFormats;

struct Loaded {
  std::string what;  // the ManifestError's message ("" when it loaded)
  std::vector<dlo::ManifestProblem> problems;
  dlo::Manifest manifest;
};

// Loads `text` written as `dir/name` (run from `dir`, so "m.yaml" is the file as given).
Loaded load(const TempDir& dir, const std::string& name, const std::string& text, const dlo::JobFlags& flags = {},
            std::optional<std::string> model_flag = std::nullopt, std::optional<std::string> out_flag = std::nullopt) {
  dlo::test::write_file(dir.file(name), text);
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  Loaded r;
  try {
    r.manifest = dlo::load_manifest(name, flags, model_flag, out_flag, kVideoFormats);
  } catch (const dlo::ManifestError& e) {
    r.what = e.what();
    r.problems = e.problems();
  }
  fs::current_path(cwd);
  return r;
}

// The single message of a manifest with one problem.
std::string one_problem(const TempDir& dir, const std::string& text, const dlo::JobFlags& flags = {}) {
  const Loaded r = load(dir, "m.yaml", text, flags);
  CHECK(r.problems.size() == 1);
  return r.what;
}

const char* kHead = "model: model\njobs:\n";

}  // namespace

TEST_CASE("a manifest resolves every field: job > command line > defaults > built in") {
  TempDir d;
  dlo::JobFlags flags;
  flags["steps"] = "7";
  flags["crf"] = "18";
  const Loaded r = load(d, "m.yaml",
                        "model: model\n"
                        "defaults:\n"
                        "  steps: 20\n"
                        "  guidance: 1\n"
                        "  height: 64\n"
                        "  negative_prompt: blurry\n"
                        "  scheduler: euler\n"
                        "jobs:\n"
                        "  - prompt: a fox\n"
                        "    steps: 4\n"
                        "    width: 96\n"
                        "  - prompt: a cat\n",
                        flags);
  REQUIRE(r.what == "");
  const auto& j = r.manifest.jobs;
  REQUIRE(j.size() == 2);
  CHECK(j[0].steps == 4);   // job
  CHECK(j[1].steps == 7);   // command line over defaults
  CHECK(j[0].crf == 18);    // command line over built in
  CHECK(j[0].height == 64);  // defaults
  CHECK(j[0].width == 96);
  CHECK(j[1].width == 832);  // built in (JobSpec)
  CHECK(j[1].frames == 81);
  CHECK(j[1].guidance == 1.0);
  CHECK(j[1].negative_prompt == "blurry");
  REQUIRE(j[1].scheduler.has_value());
  CHECK((*j[1].scheduler == dlo::NoiseSchedulerKind::kFlowEuler));
  CHECK(!j[0].flow_shift.has_value());
  CHECK(j[0].format == "mp4");
  // Where each value came from.
  CHECK(r.manifest.sources[0].at("steps").kind == dlo::ManifestFieldSource::kJob);
  CHECK(r.manifest.sources[0].at("steps").line == 10);
  CHECK(r.manifest.sources[1].at("steps").kind == dlo::ManifestFieldSource::kFlag);
  CHECK(r.manifest.sources[1].at("height").kind == dlo::ManifestFieldSource::kDefaults);
  CHECK(r.manifest.sources[1].at("height").line == 5);
  CHECK(r.manifest.sources[1].count("frames") == 0);
  CHECK(r.manifest.job_lines == std::vector<std::int64_t>{9, 12});
}

TEST_CASE("relative paths are relative to the manifest's folder, --model and --output-dir win, as given") {
  TempDir d;
  fs::create_directories(d.path() / "sub");
  Loaded r = load(d, "sub/m.yaml",
                  "model: ../models/wan\noutput_dir: out\njobs:\n"
                  "  - {prompt: a, output: x/y.mp4}\n  - {prompt: b, output: /abs/b.mp4}\n  - {prompt: c}\n");
  REQUIRE(r.what == "");
  CHECK(r.manifest.path == "sub/m.yaml");
  CHECK(r.manifest.model == "models/wan");
  CHECK(r.manifest.output_dir == "sub/out");
  CHECK(r.manifest.jobs[0].output == "sub/out/x/y.mp4");
  CHECK(r.manifest.jobs[1].output == "/abs/b.mp4");
  CHECK(r.manifest.jobs[2].output == "sub/out/job-0002.mp4");

  r = load(d, "sub/m.yaml", "model: ../models/wan\noutput_dir: out\njobs: [a]\n", {}, std::string("flag/model"),
           std::string("flag/out"));
  REQUIRE(r.what == "");
  CHECK(r.manifest.model == "flag/model");
  CHECK(r.manifest.output_dir == "flag/out");
  CHECK(r.manifest.jobs[0].output == "flag/out/job-0000.mp4");

  // No output_dir: the manifest's folder ("." for a bare file name).
  r = load(d, "sub/m.yaml", "model: /m\njobs: [a]\n");
  CHECK(r.manifest.output_dir == "sub");
  r = load(d, "m.yaml", "model: /m\njobs: [a]\n");
  CHECK(r.manifest.output_dir == ".");
  CHECK(r.manifest.jobs[0].output == "job-0000.mp4");
}

TEST_CASE("ids and outputs when absent: job-NNNN, unique, the format's extension or a folder") {
  TempDir d;
  const Loaded r = load(d, "m.yaml",
                        "model: m\njobs:\n"
                        "  - {prompt: a, id: job-0001}\n"
                        "  - {prompt: b}\n"
                        "  - {prompt: c, format: png}\n"
                        "  - {prompt: d, format: ffv1, id: fox.v2}\n");
  REQUIRE(r.what == "");
  const auto& j = r.manifest.jobs;
  CHECK(j[0].id == "job-0001");
  CHECK(j[1].id == "job-0001-2");  // never equal to a given id
  CHECK(j[2].id == "job-0002");
  CHECK(j[3].id == "fox.v2");
  CHECK(j[0].output == "job-0001.mp4");
  CHECK(j[1].output == "job-0001-2.mp4");
  CHECK(j[2].output == "job-0002");  // a folder of PNGs
  CHECK(j[3].output == "fox.v2.mkv");
  // Ids are strings as written: a number is its text.
  const Loaded n = load(d, "m.yaml", "model: m\njobs: [{prompt: a, id: 7}, {prompt: b, id: 007}]\n");
  REQUIRE(n.what == "");
  CHECK(n.manifest.jobs[0].id == "7");
  CHECK(n.manifest.jobs[1].id == "007");
  CHECK(dlo::is_safe_job_id("a.b_c-D9"));
  CHECK(!dlo::is_safe_job_id(".hidden"));
  CHECK(!dlo::is_safe_job_id("-x"));
  CHECK(!dlo::is_safe_job_id("a/b"));
  CHECK(!dlo::is_safe_job_id(std::string(129, 'a')));
}

TEST_CASE("made ids have 4 digits, 5 from 10000 jobs on") {
  TempDir d;
  std::string lines;
  for (int i = 0; i < 9999; ++i) lines += "p\n";
  Loaded r = load(d, "p.txt", lines, {}, std::string("m"));
  REQUIRE(r.manifest.jobs.size() == 9999);
  CHECK(r.manifest.jobs.front().id == "job-0000");
  CHECK(r.manifest.jobs.back().id == "job-9998");
  r = load(d, "p.txt", lines + "p\n", {}, std::string("m"));
  REQUIRE(r.manifest.jobs.size() == 10000);
  CHECK(r.manifest.jobs.front().id == "job-00000");
  CHECK(r.manifest.jobs.back().id == "job-09999");
}

TEST_CASE("seeds: given anywhere wins, else the first 4 bytes of sha256(id), the same on every load") {
  // Python: int.from_bytes(hashlib.sha256(b"job-0000").digest()[:4], "big")
  CHECK(dlo::default_seed_for_id("job-0000") == 1316378323u);
  CHECK(dlo::default_seed_for_id("job-0001") == 1271563607u);
  CHECK(dlo::default_seed_for_id("fox") == 2003612454u);
  TempDir d;
  const std::string text = "model: m\njobs:\n  - a\n  - {prompt: b, id: fox}\n  - {prompt: c, seed: 18446744073709551615}\n";
  const Loaded r1 = load(d, "m.yaml", text), r2 = load(d, "m.yaml", text);
  REQUIRE(r1.what == "");
  CHECK(r1.manifest.jobs[0].seed == 1316378323u);
  CHECK(r1.manifest.jobs[1].seed == 2003612454u);
  CHECK(r1.manifest.jobs[2].seed == 18446744073709551615u);
  for (int i = 0; i < 3; ++i) CHECK(r2.manifest.jobs[i].seed == r1.manifest.jobs[i].seed);
  // A seed in defaults or on the command line applies to every job without its own.
  const Loaded r3 = load(d, "m.yaml", "model: m\ndefaults: {seed: 5}\njobs: [a, {prompt: b, seed: 6}]\n");
  CHECK(r3.manifest.jobs[0].seed == 5);
  CHECK(r3.manifest.jobs[1].seed == 6);
  dlo::JobFlags f;
  f["seed"] = "9";
  const Loaded r4 = load(d, "m.yaml", "model: m\ndefaults: {seed: 5}\njobs: [a]\n", f);
  CHECK(r4.manifest.jobs[0].seed == 9);
}

TEST_CASE("YAML pitfalls: prompts are text as written, block scalars, unicode, bare strings") {
  TempDir d;
  const Loaded r = load(d, "m.yaml",
                        "model: m\njobs:\n"
                        "  - no\n"
                        "  - yes\n"
                        "  - 1.5\n"
                        "  - prompt: |\n"
                        "      two\n"
                        "      lines\n"
                        "  - prompt: >-\n"
                        "      folded\n"
                        "      text\n"
                        "  - \"\"\n"
                        "  - {prompt: '', negative_prompt: Off}\n"
                        "  - \"un renard \\u00e9 \xe7\x8b\x90\xe7\x8b\xb8 \xf0\x9f\xa6\x8a\"\n"
                        "  - {prompt: \"# not a comment\"}\n");
  REQUIRE(r.what == "");
  const auto& j = r.manifest.jobs;
  REQUIRE(j.size() == 9);
  CHECK(j[0].prompt == "no");
  CHECK(j[1].prompt == "yes");
  CHECK(j[2].prompt == "1.5");
  CHECK(j[3].prompt == "two\nlines\n");
  CHECK(j[4].prompt == "folded text");
  CHECK(j[5].prompt == "");  // an empty prompt is a prompt
  CHECK(j[6].prompt == "");
  CHECK(j[6].negative_prompt == "Off");
  CHECK(j[7].prompt == "un renard \xc3\xa9 \xe7\x8b\x90\xe7\x8b\xb8 \xf0\x9f\xa6\x8a");
  CHECK(j[8].prompt == "# not a comment");
}

TEST_CASE("each problem's message names the file, the line, the job (index and id) and the field") {
  TempDir d;
  const std::string h = kHead;
  // Unknown keys, with "did you mean".
  CHECK(one_problem(d, "model: m\ndefaults:\n  step: 4\njobs: [a]\n") ==
        "m.yaml:3:3: defaults: unknown key 'step' (did you mean 'steps'?)");
  CHECK(one_problem(d, h + "  - {prompt: a, id: fox, num_frames: 9}\n") ==
        "m.yaml:3:26: job 0 (id 'fox'): unknown key 'num_frames' (did you mean 'frames'?)");
  CHECK(one_problem(d, h + "  - {prompt: a, negative-prompt: x}\n") ==
        "m.yaml:3:17: job 0 (id 'job-0000'): unknown key 'negative-prompt' (did you mean 'negative_prompt'?)");
  CHECK(one_problem(d, h + "  - {prompt: a, colour: red}\n") == "m.yaml:3:17: job 0 (id 'job-0000'): unknown key 'colour'");
  CHECK(one_problem(d, "model: m\njob: [a]\njobs: [a]\n") == "m.yaml:2:1: unknown key 'job' (did you mean 'jobs'?)");
  CHECK(one_problem(d, "model: m\nsteps: 4\njobs: [a]\n") ==
        "m.yaml:2:1: unknown key 'steps' (steps is a job field: put it under `defaults` or in a job)");
  CHECK(one_problem(d, h + "  - {prompt: a, model: x}\n") ==
        "m.yaml:3:17: job 0 (id 'job-0000'): unknown key 'model' (model is a top-level key: one per manifest)");
  CHECK(one_problem(d, "model: m\ndefaults: {prompt: x}\njobs: [a]\n") ==
        "m.yaml:2:12: defaults: prompt: is per job: it cannot be a default");
  // Duplicate keys (yaml-cpp keeps both; we refuse).
  CHECK(one_problem(d, h + "  - prompt: a\n    steps: 4\n    steps: 5\n") ==
        "m.yaml:5:5: job 0 (id 'job-0000'): steps: given twice (also on line 4)");
  CHECK(one_problem(d, "model: m\nmodel: n\njobs: [a]\n") == "m.yaml:2:1: model: given twice (also on line 1)");
  CHECK(one_problem(d, "model: m\ndefaults:\n  fps: 8\n  fps: 8\njobs: [a]\n") ==
        "m.yaml:4:3: defaults: fps: given twice (also on line 3)");
  // Wrong types.
  CHECK(one_problem(d, h + "  - {prompt: a, steps: \"10\"}\n") ==
        "m.yaml:3:17: job 0 (id 'job-0000'): steps: must be an integer, got the string \"10\" (drop the quotes)");
  CHECK(one_problem(d, h + "  - {prompt: a, steps: ten}\n") ==
        "m.yaml:3:17: job 0 (id 'job-0000'): steps: must be an integer, got 'ten'");
  CHECK(one_problem(d, h + "  - {prompt: a, height: 64.5}\n") ==
        "m.yaml:3:17: job 0 (id 'job-0000'): height: must be an integer, got '64.5'");
  CHECK(one_problem(d, h + "  - {prompt: [a, b]}\n") == "m.yaml:3:6: job 0 (id 'job-0000'): prompt: must be a string, got a list");
  CHECK(one_problem(d, h + "  - {prompt: a, guidance: high}\n") ==
        "m.yaml:3:17: job 0 (id 'job-0000'): guidance: must be a number, got 'high'");
  CHECK(one_problem(d, h + "  - {prompt: a, guidance: .inf}\n") ==
        "m.yaml:3:17: job 0 (id 'job-0000'): guidance: must be a finite number, got '.inf'");
  CHECK(one_problem(d, h + "  - {prompt: a, seed: -1}\n") ==
        "m.yaml:3:17: job 0 (id 'job-0000'): seed: must be >= 0 (a seed is 0 .. 18446744073709551615), got -1");
  CHECK(one_problem(d, h + "  - {prompt: a, seed: 18446744073709551616}\n") ==
        "m.yaml:3:17: job 0 (id 'job-0000'): seed: out of range (a seed is 0 .. 18446744073709551615), got "
        "18446744073709551616");
  CHECK(one_problem(d, h + "  - prompt: a\n    negative_prompt:\n") ==
        "m.yaml:4:5: job 0 (id 'job-0000'): negative_prompt: has no value (write \"\" for an empty string; expected a "
        "string)");
  CHECK(one_problem(d, h + "  - prompt: null\n") ==
        "m.yaml:3:5: job 0 (id 'job-0000'): prompt: has no value (write \"\" for an empty string; expected a string)");
  CHECK(one_problem(d, "model: [a]\njobs: [a]\n") == "m.yaml:1:1: model: must be a path (a string), got a list");
  CHECK(one_problem(d, "model: m\ndefaults: [steps]\njobs: [a]\n") ==
        "m.yaml:2:1: defaults: must be a mapping of job fields, got a list");
  CHECK(one_problem(d, h + "  - [a, b]\n") ==
        "m.yaml:3:5: job 0 (id 'job-0000'): a job must be a mapping of fields or a prompt string, got a list");
  // A missing prompt (an empty one is fine), no jobs.
  CHECK(one_problem(d, h + "  - {steps: 4}\n") ==
        "m.yaml:3:5: job 0 (id 'job-0000'): prompt: missing (every job needs one; \"\" is a valid, empty prompt)");
  CHECK(one_problem(d, h + "  - a\n  -\n") ==
        "m.yaml:5:1: job 1 (id 'job-0001'): an empty entry (write - \"\" for an empty prompt)");
  CHECK(one_problem(d, "model: m\njobs: []\n") == "m.yaml:2:1: jobs: is empty: nothing to render");
  CHECK(one_problem(d, "model: m\n") == "m.yaml: jobs: missing: a manifest needs `jobs:`, a list of jobs");
  CHECK(one_problem(d, "jobs: [a]\n") == "m.yaml: model: missing: give `model: FOLDER` in the manifest or --model FOLDER");
  // Values that are wrong without any model.
  CHECK(one_problem(d, h + "  - {prompt: a, id: fox, steps: 0}\n") == "m.yaml:3:26: job 0 (id 'fox'): steps: must be >= 1, got 0");
  CHECK(one_problem(d, h + "  - {prompt: a, width: -16}\n") ==
        "m.yaml:3:17: job 0 (id 'job-0000'): width: must be positive, got -16");
  CHECK(one_problem(d, h + "  - {prompt: a, fps: 0}\n") == "m.yaml:3:17: job 0 (id 'job-0000'): fps: must be in 1..240, got 0");
  CHECK(one_problem(d, h + "  - {prompt: a, crf: 52}\n") ==
        "m.yaml:3:17: job 0 (id 'job-0000'): crf: must be in 0..51 (libx264), got 52");
  CHECK(one_problem(d, h + "  - {prompt: a, flow_shift: 0}\n") ==
        "m.yaml:3:17: job 0 (id 'job-0000'): flow_shift: must be a positive number, got 0");
  CHECK(one_problem(d, h + "  - {prompt: a, scheduler: ddim}\n") ==
        "m.yaml:3:17: job 0 (id 'job-0000'): scheduler: unknown noise scheduler 'ddim' (unipc, euler)");
  CHECK(one_problem(d, "model: m\ndefaults: {format: gif}\njobs: [a]\n") ==
        "m.yaml:2:12: defaults: format: 'gif' is not mp4, png or ffv1");
  // Ids and outputs.
  CHECK(one_problem(d, h + "  - {prompt: a, id: a/b}\n") ==
        "m.yaml:3:17: job 0 (id 'a/b'): id: 'a/b' is not a safe file name: use 1..128 of A-Z a-z 0-9 . _ -, not "
        "starting with '.' or '-'");
  CHECK(one_problem(d, h + "  - {prompt: a, id: fox}\n  - {prompt: b, id: fox}\n") ==
        "m.yaml:4:17: job 1 (id 'fox'): id: 'fox' is also the id of job 0");
  CHECK(one_problem(d, h + "  - {prompt: a, output: v.mp4}\n  - {prompt: b, output: ./sub/../v.mp4}\n") ==
        "m.yaml:4:17: job 1 (id 'job-0001'): output: 'v.mp4' is also the output of job 0 (id 'job-0000')");
  // A given output equal to another job's default one.
  CHECK(one_problem(d, h + "  - {prompt: a, output: job-0001.mp4}\n  - b\n") ==
        "m.yaml:4:5: job 1 (id 'job-0001'): output: 'job-0001.mp4' is also the output of job 0 (id 'job-0000')");
  CHECK(one_problem(d, h + "  - {prompt: a, id: a, format: png}\n  - {prompt: b, output: a/b.mp4}\n") ==
        "m.yaml:4:17: job 1 (id 'job-0001'): output: 'a/b.mp4' is inside the PNG folder of job a ('a')");
  CHECK(one_problem(d, h + "  - {prompt: a, output: results.jsonl}\n") ==
        "m.yaml:3:17: job 0 (id 'job-0000'): output: 'results.jsonl' is the batch's results file");
  // Command-line values are checked once, named by their flag.
  dlo::JobFlags f;
  f["steps"] = "0";
  CHECK(one_problem(d, h + "  - a\n  - b\n", f) == "command line: --steps: must be >= 1, got 0");
  f = {};
  f["format"] = "avi";
  CHECK(one_problem(d, h + "  - a\n", f) == "command line: --format: 'avi' is not mp4, png or ffv1");
  // Not YAML at all, several documents, not a mapping.
  CHECK(one_problem(d, "model: m\njobs: [a\n") == "m.yaml:3:1: not valid YAML: end of sequence flow not found");
  CHECK(one_problem(d, "model: m\njobs: [a]\n---\nx: 1\n") == "m.yaml:4:1: holds 2 YAML documents; a manifest is one");
  CHECK(one_problem(d, "- a\n- b\n") ==
        "m.yaml:1:1: must be a mapping with the keys model, output_dir, defaults and jobs, got a list");
  CHECK(one_problem(d, "") == "m.yaml: is empty (a manifest has `model`, `output_dir`, `defaults` and `jobs`)");
}

TEST_CASE("every problem of a manifest is reported at once, in file order") {
  TempDir d;
  const Loaded r = load(d, "m.yaml",
                        "defaults:\n"
                        "  step: 4\n"
                        "jobs:\n"
                        "  - {prompt: a, id: fox, steps: 0}\n"
                        "  - {prompt: b, id: fox, height: \"64\"}\n"
                        "  - {id: c}\n");
  REQUIRE(r.problems.size() == 6);
  CHECK(r.what ==
        "m.yaml: model: missing: give `model: FOLDER` in the manifest or --model FOLDER\n"
        "m.yaml:2:3: defaults: unknown key 'step' (did you mean 'steps'?)\n"
        "m.yaml:4:26: job 0 (id 'fox'): steps: must be >= 1, got 0\n"
        "m.yaml:5:17: job 1 (id 'fox'): id: 'fox' is also the id of job 0\n"
        "m.yaml:5:26: job 1 (id 'fox'): height: must be an integer, got the string \"64\" (drop the quotes)\n"
        "m.yaml:6:5: job 2 (id 'c'): prompt: missing (every job needs one; \"\" is a valid, empty prompt)");
  const dlo::ManifestProblem& p = r.problems[2];
  CHECK(p.file == "m.yaml");
  CHECK(p.job_index == 0);
  CHECK(p.job_id == "fox");
  CHECK(p.field == "steps");
  CHECK(p.message == "must be >= 1, got 0");
  CHECK(p.line == 4);
  CHECK(p.column == 26);
  CHECK(r.problems[1].field == "defaults");
  CHECK(r.problems[1].job_index == -1);
}

TEST_CASE("the text form: a prompt per line, '#' lines and blank lines skipped, the rest from flags") {
  TempDir d;
  dlo::JobFlags f;
  f["steps"] = "3";
  f["format"] = "ffv1";
  const Loaded r = load(d, "p.txt", "# prompts\na fox\r\n\n   \n  # indented comment\n  two  spaces kept  \nno\n", f,
                        std::string("model"));
  REQUIRE(r.what == "");
  const auto& j = r.manifest.jobs;
  REQUIRE(j.size() == 3);
  CHECK(j[0].prompt == "a fox");
  CHECK(j[1].prompt == "  two  spaces kept  ");
  CHECK(j[2].prompt == "no");
  CHECK(j[2].id == "job-0002");
  CHECK(j[2].output == "job-0002.mkv");
  CHECK(j[0].steps == 3);
  CHECK(j[0].seed == 1316378323u);
  CHECK(r.manifest.job_lines == std::vector<std::int64_t>{2, 6, 7});
  CHECK(r.manifest.model == "model");
  // --model is required; no prompts is an error; bytes that are not UTF-8 are named by line.
  const Loaded e = load(d, "p.txt", "# nothing\n\n");
  CHECK(e.what ==
        "p.txt: model: missing: a text manifest takes the model from --model FOLDER\n"
        "p.txt: holds no prompt (empty lines and lines starting with '#' are skipped)");
  const Loaded u = load(d, "p.txt", "ok\nbad \xff byte\n", {}, std::string("m"));
  CHECK(u.what == "p.txt:2:5: job 1 (id 'job-0001'): prompt: is not valid UTF-8 (byte 4 of the line)");
}

TEST_CASE("a manifest that is not a readable regular file is a dlo::Error, and a FIFO does not block") {
  TempDir d;
  const std::string fifo = d.file("fifo.yaml");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::string msg;
  try {
    dlo::load_manifest(fifo, {}, std::nullopt, std::nullopt, kVideoFormats);
  } catch (const dlo::Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("manifest '" + fifo + "'") == 0);
  CHECK(msg.find("FIFO") != std::string::npos);
  msg.clear();
  try {
    dlo::load_manifest(d.file("missing.yaml"), {}, std::nullopt, std::nullopt, kVideoFormats);
  } catch (const dlo::Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("missing.yaml") != std::string::npos);
}

TEST_CASE("check_manifest: sizes and frames per job against the model, defaults' and flags' problems once, outputs") {
  TempDir d;
  dlo::test::write_config_only_model(d.file("model"));
  const dlo::ModelInfo info = dlo::read_model_info(d.file("model"));
  REQUIRE(info.spatial_multiple() == 16);
  REQUIRE(info.temporal_factor() == 4);

  dlo::JobFlags f;
  f["width"] = "100";
  dlo::test::write_file(d.file("afile"), "x");
  const Loaded r = load(d, "m.yaml",
                        "model: model\n"
                        "output_dir: videos/new\n"
                        "defaults: {frames: 10}\n"
                        "jobs:\n"
                        "  - {prompt: a, id: fox, height: 64, frames: 9}\n"
                        "  - {prompt: b, height: 72}\n"
                        "  - {prompt: c, width: 64, output: " + d.file("afile") + "/sub/c.mp4}\n",
                        f);
  REQUIRE(r.what == "");
  std::vector<std::string> checked;
  const fs::path cwd = fs::current_path();
  fs::current_path(d.path());
  const auto problems = dlo::check_manifest(r.manifest, info, [&](const dlo::JobSpec& job) {
    checked.push_back(job.output);
    if (job.id == "job-0001") throw dlo::Error("preset 'fastest' is not a libx264 preset");
  });
  fs::current_path(cwd);
  REQUIRE(problems.size() == 5);
  CHECK(problems[0].file == "command line");  // --width 100, once for jobs 0 and 1
  CHECK(problems[0].field == "--width");
  CHECK(problems[0].job_index == -1);
  CHECK(problems[0].message.find("100 is not a multiple of 16") == 0);
  CHECK(dlo::format_problems({problems[1]}).find("m.yaml:6:17: job 1 (id 'job-0001'): height: 72 is not a multiple of 16") == 0);
  CHECK(problems[1].job_index == 1);
  CHECK(problems[1].job_id == "job-0001");
  CHECK(problems[1].field == "height");
  CHECK(problems[2].field == "defaults.frames");  // frames 10 from defaults, once for jobs 1 and 2
  CHECK(problems[2].job_index == -1);
  CHECK(problems[2].line == 3);
  CHECK(problems[2].message.find("10 is not of the form 4k+1") == 0);
  CHECK(problems[3].field == "output");  // the app's check, as a problem of that job
  CHECK(problems[3].job_index == 1);
  CHECK(problems[3].message == "preset 'fastest' is not a libx264 preset");
  CHECK(problems[4].field == "output");  // afile/sub cannot be made: afile is a file
  CHECK(problems[4].job_index == 2);
  CHECK(problems[4].line == 7);
  CHECK(problems[4].message == "'" + d.file("afile") + "/sub' cannot be created: '" + d.file("afile") + "' is not a folder");
  // videos/new does not exist yet (the run creates it): the outputs are checked in the nearest
  // existing folder, here the manifest's.
  CHECK(checked == std::vector<std::string>{"./.dlo-check-fox.mp4", "./.dlo-check-job-0001.mp4"});
  CHECK(!fs::exists(d.path() / "videos"));  // nothing written

  // A good manifest has no problems; create_output_folders makes the folders.
  const Loaded g = load(d, "g.yaml", "model: model\noutput_dir: videos/new\njobs:\n  - {prompt: a, height: 64, width: 64, frames: 9}\n");
  REQUIRE(g.what == "");
  fs::current_path(d.path());
  CHECK(dlo::check_manifest(g.manifest, info).empty());
  dlo::create_output_folders(g.manifest);
  CHECK(fs::is_directory("videos/new"));
  fs::current_path(cwd);

  // An output folder that is a file.
  const Loaded b = load(d, "b.yaml", "model: model\noutput_dir: afile\njobs:\n  - {prompt: a, height: 64, width: 64, frames: 9}\n");
  fs::current_path(d.path());
  const auto bp = dlo::check_manifest(b.manifest, info);
  fs::current_path(cwd);
  CHECK(dlo::format_problems(bp) == "b.yaml: output_dir: 'afile' is not a folder");
}

TEST_CASE("the shipped examples (jobs/) load and pass the checks of their model's geometry") {
  TempDir d;
  const std::string src = dlo::test::source_dir();
  // jobs/demo.yaml: the demo model tools/demo.sh installs as out/demo/model (configs/demo-model).
  dlo::Manifest demo = dlo::load_manifest(src + "/jobs/demo.yaml", {}, std::nullopt, d.path().string(), kVideoFormats);
  CHECK(demo.model == src + "/out/demo/model");
  // Its size, frames, steps and guidance are the model's own (configs/demo-model/dlo_defaults.json).
  const std::string demo_model = src + "/configs/demo-model";
  demo = dlo::load_manifest(src + "/jobs/demo.yaml", {}, demo_model, d.path().string(), kVideoFormats);
  REQUIRE(demo.jobs.size() == 7);
  CHECK(demo.jobs[0].id == "red-circle-left");
  CHECK(demo.jobs[0].seed == 42);
  for (const auto& j : demo.jobs) {
    CHECK(j.height == 64);
    CHECK(j.width == 64);
    CHECK(j.frames == 17);
    CHECK(j.negative_prompt == "");
  }
  CHECK(demo.jobs[0].steps == 20);
  CHECK(demo.jobs[0].guidance == 4.0);
  CHECK(demo.jobs[1].steps == 10);
  CHECK(demo.jobs[5].guidance == 1.0);
  CHECK(demo.sources[0].at("steps").kind == dlo::ManifestFieldSource::kModel);
  CHECK(demo.jobs[4].output == d.file("white-square-right.mkv"));
  CHECK(demo.jobs[6].id == "job-0006");
  CHECK(dlo::format_problems(dlo::check_manifest(demo, dlo::read_model_info(demo_model))) == "");
  dlo::ModelInfo small;
  small.transformer = dlo::WanTransformerConfig::preset("wan-test");
  small.vae = dlo::WanVaeConfig::preset("wan2.1-vae-small");
  // jobs/wan2.1-t2v-1.3b.yaml: the real model's geometry.
  dlo::Manifest wan = dlo::load_manifest(src + "/jobs/wan2.1-t2v-1.3b.yaml", {}, std::nullopt, d.path().string(), kVideoFormats);
  dlo::ModelInfo real;
  real.transformer = dlo::WanTransformerConfig::preset("wan2.1-t2v-1.3b");
  real.vae = dlo::WanVaeConfig::preset("wan2.1-vae");
  CHECK(dlo::format_problems(dlo::check_manifest(wan, real)) == "");
  CHECK(wan.jobs.size() == 6);
  // jobs/wan2.2-t2v-a14b.yaml: two experts with the official settings; fine for A14B, refused
  // (guidance_2, by name) for the one-expert 1.3B.
  dlo::Manifest a14b = dlo::load_manifest(src + "/jobs/wan2.2-t2v-a14b.yaml", {}, std::nullopt, d.path().string(), kVideoFormats);
  dlo::ModelInfo two = real;
  two.transformer = dlo::WanTransformerConfig::preset("wan2.2-t2v-a14b");
  two.transformer_2 = two.transformer;
  two.boundary_ratio = 0.875;
  CHECK(dlo::format_problems(dlo::check_manifest(a14b, two)) == "");
  REQUIRE(a14b.jobs.size() == 4);
  CHECK(a14b.jobs[0].steps == 40);
  CHECK(a14b.jobs[0].guidance == 4.0);
  CHECK(a14b.jobs[0].guidance_2 == 3.0);
  CHECK(a14b.jobs[0].flow_shift == 12.0);
  CHECK(a14b.jobs[0].height == 720);
  CHECK(a14b.jobs[3].width == 832);
  CHECK(dlo::format_problems(dlo::check_manifest(a14b, real)).find("defaults: guidance_2: applies to models with two experts") !=
        std::string::npos);
  // jobs/wan2.2-ti2v-5b.yaml: the official settings fit TI2V-5B (sizes multiples of 32: the Wan2.2
  // VAE's 16 x the patch's 2; 121 = 4 x 30 + 1 frames); 720p's height does not.
  dlo::Manifest ti2v = dlo::load_manifest(src + "/jobs/wan2.2-ti2v-5b.yaml", {}, std::nullopt, d.path().string(), kVideoFormats);
  dlo::ModelInfo five;
  five.transformer = dlo::WanTransformerConfig::preset("wan2.2-ti2v-5b");
  five.vae = dlo::WanVaeConfig::preset("wan2.2-vae");
  five.expand_timesteps = true;
  CHECK(dlo::format_problems(dlo::check_manifest(ti2v, five)) == "");
  REQUIRE(ti2v.jobs.size() == 3);
  for (const auto& j : ti2v.jobs) {
    CHECK(j.frames == 121);
    CHECK(j.fps == 24);
    CHECK(j.steps == 50);
    CHECK(j.guidance == 5.0);
    CHECK(j.flow_shift == 5.0);
  }
  CHECK(ti2v.jobs[0].height == 704);
  CHECK(ti2v.jobs[0].width == 1280);
  CHECK(ti2v.jobs[2].height == 1280);
  CHECK(ti2v.jobs[2].width == 704);
  ti2v.jobs[1].height = 720;  // a 720p height: a multiple of 16, not of 32
  CHECK(dlo::format_problems(dlo::check_manifest(ti2v, five)).find("720 is not a multiple of 32") != std::string::npos);
  for (const auto& j : wan.jobs) {
    CHECK(j.height == 480);
    CHECK(j.width == 832);
    CHECK(j.frames == 81);
    CHECK(j.steps == 50);
    CHECK(j.guidance == 5.0);
    CHECK(j.negative_prompt.rfind("Bright tones, overexposed", 0) == 0);
  }
  // jobs/prompts.txt, with the flags its comment shows.
  dlo::JobFlags f = {{"steps", "6"}, {"height", "64"}, {"width", "64"}, {"frames", "9"}};
  dlo::Manifest txt = dlo::load_manifest(src + "/jobs/prompts.txt", f, std::string("out/demo/model"), d.path().string(), kVideoFormats);
  CHECK(txt.jobs.size() == 4);
  CHECK(dlo::format_problems(dlo::check_manifest(txt, small)) == "");
}

TEST_CASE("precedence for every field the table lets all three set: the job's value > the command line > defaults > built in") {
  TempDir d;
  int fields = 0;
  for (const auto& f : dlo::job_fields()) {
    if (!(f.from(dlo::kFromJob) && f.from(dlo::kFromDefaults) && f.from(dlo::kFromBatchFlag))) continue;
    CAPTURE(f.key);
    ++fields;
    // Three texts of the field's type (A for defaults, B for the flag, C for the job); a field with
    // two names uses {a, b, a}, which still tells every pair apart.
    std::vector<std::string> v;
    switch (f.type) {
      case dlo::JobFieldType::kText:
        if (!f.choices.empty()) v = {f.choices[0], f.choices[1], f.choices[0]};
        else if (f.app_choices) v = {"png", "ffv1", "mp4"};
        else v = {"alpha", "beta", "gamma"};
        break;
      case dlo::JobFieldType::kSeed:
      case dlo::JobFieldType::kInteger: v = {"17", "18", "19"}; break;
      case dlo::JobFieldType::kNumber:
        v = f.key == "boundary_ratio" ? std::vector<std::string>{"0.25", "0.5", "0.75"}  // a share, in [0, 1]
                                      : std::vector<std::string>{"1.25", "2.5", "3.75"};
        break;
    }
    const bool text = f.type == dlo::JobFieldType::kText;
    const auto yaml = [&](const std::string& s) { return text ? "\"" + s + "\"" : s; };
    const auto parsed = [&](const std::string& s) {
      std::string p;
      auto x = dlo::parse_job_field(f, s, kVideoFormats, &p);
      REQUIRE_MESSAGE(x, p);
      // LoRA paths come back absolute: beside the manifest, or (from a flag) from the working
      // folder (load's: the manifest's folder here), with the strength written out.
      if (f.key == "loras") return dlo::JobFieldValue(dlo::canonical_path(d.file(s)) + ":1");
      return *x;
    };
    const std::string jobs = "jobs:\n  - {id: own, prompt: x, " + f.key + ": " + yaml(v[2]) + "}\n  - {id: other, prompt: y}\n";
    const std::string with_defaults = "model: m\ndefaults: {" + f.key + ": " + yaml(v[0]) + "}\n" + jobs;
    Loaded r = load(d, "m.yaml", with_defaults, {{f.key, v[1]}});
    REQUIRE_MESSAGE(r.what == "", r.what);
    CHECK((f.get(r.manifest.jobs[0]) == parsed(v[2])));  // the job's own value
    CHECK((f.get(r.manifest.jobs[1]) == parsed(v[1])));  // the command line over defaults
    CHECK(r.manifest.sources[1].at(f.key).kind == dlo::ManifestFieldSource::kFlag);
    r = load(d, "m.yaml", with_defaults);
    CHECK((f.get(r.manifest.jobs[1]) == parsed(v[0])));  // defaults over built in
    CHECK(r.manifest.sources[1].at(f.key).kind == dlo::ManifestFieldSource::kDefaults);
    r = load(d, "m.yaml", "model: m\n" + jobs);
    if (f.key == "seed") {
      CHECK(r.manifest.jobs[1].seed == dlo::default_seed_for_id("other"));
    } else if (f.key == "format") {
      CHECK(r.manifest.jobs[1].format == "mp4");  // the app's first
    } else {
      CHECK((f.get(r.manifest.jobs[1]) == f.get(dlo::JobSpec{})));  // built in
    }
  }
  CHECK(fields >= 12);
}

TEST_CASE("a model folder's recommended settings sit below the manifest: job > command line > defaults > model > built in") {
  TempDir d;
  dlo::test::write_config_only_model(d.file("model"));
  dlo::test::write_file(d.file("model/dlo_defaults.json"),
                        R"({"defaults": {"height": 32, "width": 48, "frames": 9, "steps": 12, "guidance": 3.5}})");
  dlo::JobFlags flags;
  flags["guidance"] = "2";
  const Loaded r = load(d, "m.yaml",
                        "model: model\n"
                        "defaults:\n"
                        "  width: 64\n"
                        "jobs:\n"
                        "  - prompt: a fox\n"
                        "    steps: 4\n"
                        "  - prompt: a cat\n",
                        flags);
  REQUIRE(r.what == "");
  const auto& j = r.manifest.jobs;
  CHECK(j[0].steps == 4);     // the job's own
  CHECK(j[1].steps == 12);    // the model's
  CHECK(j[1].guidance == 2.0);  // the command line over the model
  CHECK(j[1].width == 64);    // `defaults` over the model
  CHECK(j[1].height == 32);
  CHECK(j[1].frames == 9);
  CHECK(j[1].fps == 16);      // built in: the model says nothing
  CHECK(r.manifest.sources[1].at("height").kind == dlo::ManifestFieldSource::kModel);
  CHECK(r.manifest.sources[1].at("width").kind == dlo::ManifestFieldSource::kDefaults);

  // A merged 4-step checkpoint's recipe (docs/distilled.md): its schedule from the folder too,
  // Euler chosen for it over the folder's UniPC as for a job's own schedule.
  dlo::test::write_file(d.file("model/dlo_defaults.json"),
                        R"({"defaults": {"steps": 4, "guidance": 1.0, "schedule": "lightx2v"}})");
  const Loaded distilled = load(d, "m.yaml", "model: model\njobs:\n  - a fox\n");
  REQUIRE(distilled.what == "");
  const dlo::JobSpec& dj = distilled.manifest.jobs[0];
  CHECK(dj.steps == 4);
  REQUIRE(dj.schedule.has_value());
  CHECK(*dj.schedule == dlo::NoiseSchedule::kLightx2v);
  CHECK(distilled.manifest.sources[0].at("schedule").kind == dlo::ManifestFieldSource::kModel);
  const dlo::NoiseSchedulerConfig sc = dlo::job_scheduler_config(dj, dlo::read_model_info(d.file("model")));
  CHECK(sc.kind == dlo::NoiseSchedulerKind::kFlowEuler);
  CHECK(sc.schedule == dlo::NoiseSchedule::kLightx2v);

  // A recommendation the model cannot render is the folder's problem, named once with its file.
  dlo::test::write_file(d.file("model/dlo_defaults.json"), R"({"defaults": {"height": 40, "steps": -1}})");
  const Loaded bad = load(d, "m.yaml", "model: model\njobs:\n  - a fox\n  - a cat\n");
  REQUIRE(bad.problems.size() == 1);
  CHECK(bad.problems[0].file.find("model/dlo_defaults.json") != std::string::npos);
  CHECK(bad.problems[0].field == "defaults.steps");
  dlo::test::write_file(d.file("model/dlo_defaults.json"), R"({"defaults": {"height": 40, "width": 32}})");
  const Loaded ok = load(d, "m.yaml", "model: model\njobs:\n  - a fox\n  - a cat\n");
  REQUIRE(ok.what == "");
  const dlo::ModelInfo info = dlo::read_model_info(d.file("model"));
  const auto checked = dlo::check_manifest(ok.manifest, info);
  INFO(dlo::format_problems(checked));
  REQUIRE(checked.size() == 1);  // not once per job
  CHECK(checked[0].file.find("model/dlo_defaults.json") != std::string::npos);
  CHECK(checked[0].field == "defaults.height");
  CHECK(checked[0].message.find("multiple of 16") != std::string::npos);
}

// V5 (batch probe 2026-12-07, D16): guidance 1 and guidance_2 4, both from dlo_defaults.json, were
// reported against the manifest's first job line.
TEST_CASE("guidance_2 beside guidance 1, both from the model folder's dlo_defaults.json, names that file") {
  TempDir d;
  dlo::test::write_config_only_model(d.file("model"));
  dlo::ModelInfo two = dlo::read_model_info(d.file("model"));
  two.transformer_2 = two.transformer;
  two.boundary_ratio = 0.875;
  dlo::test::write_file(d.file("model/dlo_defaults.json"), R"({"defaults": {"height": 64, "width": 64, "guidance": 1, "guidance_2": 4}})");
  const Loaded r = load(d, "m.yaml", "model: model\njobs:\n  - a fox\n  - a cat\n");
  REQUIRE(r.what == "");
  const auto checked = dlo::check_manifest(r.manifest, two);
  INFO(dlo::format_problems(checked));
  REQUIRE(checked.size() == 1);  // once, not per job
  CHECK(checked[0].file.find("model/dlo_defaults.json") != std::string::npos);
  CHECK(checked[0].job_index == -1);
  CHECK(checked[0].field == "defaults.guidance_2");
  CHECK(checked[0].message.find("4 has no effect with guidance 1") == 0);
  // A job's own guidance 1 beside the folder's guidance_2 turns guidance off: nothing to refuse;
  // the job's own guidance_2 beside the folder's guidance 1 is the job's.
  const Loaded off = load(d, "m.yaml", "model: model\njobs:\n  - {prompt: a fox, guidance: 1}\n");
  CHECK(dlo::check_manifest(off.manifest, two).empty());
  dlo::test::write_file(d.file("model/dlo_defaults.json"), R"({"defaults": {"height": 64, "width": 64, "guidance": 1}})");
  const Loaded own = load(d, "m.yaml", "model: model\njobs:\n  - {prompt: a fox, guidance_2: 4}\n");
  const auto at_job = dlo::check_manifest(own.manifest, two);
  REQUIRE(at_job.size() == 1);
  CHECK(at_job[0].file.find("m.yaml") != std::string::npos);
  CHECK(at_job[0].job_index == 0);
}

TEST_CASE("the batch's topology keys: sp and cfg_parallel, checked with their line") {
  TempDir d;
  Loaded r = load(d, "m.yaml", "model: m\nsp: 2\ncfg_parallel: on\njobs: [a]\n");
  CHECK(r.problems.empty());
  CHECK(r.manifest.sp == "2");
  CHECK(r.manifest.cfg_parallel == "on");
  r = load(d, "m.yaml", "model: m\njobs: [a]\n");
  CHECK(r.manifest.sp.empty());
  CHECK(r.manifest.cfg_parallel.empty());
  CHECK(one_problem(d, "model: m\nsp: two\njobs: [a]\n") == "m.yaml:2:5: sp: 'two' is not auto or a rank count (1 or more)");
  CHECK(one_problem(d, "model: m\ncfg_parallel: yes\njobs: [a]\n") == "m.yaml:2:15: cfg_parallel: 'yes' is not on, off or auto");
  CHECK(one_problem(d, "model: m\nsp: [2]\njobs: [a]\n") == "m.yaml:2:5: sp: must be auto or a rank count, got a list");
  // A job field, not a top-level key: refused in a job.
  CHECK(one_problem(d, kHead + std::string("  - {prompt: a, sp: 2}\n")) ==
        "m.yaml:3:17: job 0 (id 'job-0000'): unknown key 'sp' (sp is a top-level key: one per manifest)");
}

TEST_CASE("the top-level transformer keys: paths resolved against the manifest's folder, checked with their line") {
  TempDir d;
  fs::create_directories(d.path() / "sub");
  Loaded r = load(d, "sub/m.yaml", "model: m\ntransformer: w/high.safetensors\ntransformer_2: /abs/low\njobs: [a]\n");
  CHECK(r.problems.empty());
  CHECK(r.manifest.transformer == "sub/w/high.safetensors");
  CHECK(r.manifest.transformer_2 == "/abs/low");
  r = load(d, "m.yaml", "model: m\njobs: [a]\n");
  CHECK(r.manifest.transformer.empty());
  CHECK(r.manifest.transformer_2.empty());
  CHECK(one_problem(d, "model: m\ntransformer: [a]\njobs: [a]\n") == "m.yaml:2:1: transformer: must be a path (a string), got a list");
  CHECK(one_problem(d, "model: m\ntransformer_2: ''\njobs: [a]\n") == "m.yaml:2:1: transformer_2: is empty");
}

TEST_CASE("the top-level vae key: a path resolved against the manifest's folder, checked with its line") {
  TempDir d;
  fs::create_directories(d.path() / "sub");
  Loaded r = load(d, "sub/m.yaml", "model: m\nvae: v/wan_2.1_vae.safetensors\njobs: [a]\n");
  CHECK(r.problems.empty());
  CHECK(r.manifest.vae == "sub/v/wan_2.1_vae.safetensors");
  CHECK(load(d, "m.yaml", "model: m\njobs: [a]\n").manifest.vae.empty());
  CHECK(one_problem(d, "model: m\nvae: {a: 1}\njobs: [a]\n") == "m.yaml:2:1: vae: must be a path (a string), got a mapping");
}

TEST_CASE("odd output names are refused when the manifest is read (V14): blank, spaced, '-', no extension, the output folder") {
  TempDir d;
  const std::string h = kHead;
  CHECK(one_problem(d, h + "  - {prompt: a, output: \"  \"}\n") == "m.yaml:3:17: job 0 (id 'job-0000'): output: is blank");
  CHECK(one_problem(d, h + "  - {prompt: a, output: \"trail.mp4 \"}\n") ==
        "m.yaml:3:17: job 0 (id 'job-0000'): output: begins or ends with a space");
  CHECK(one_problem(d, h + "  - {prompt: a, output: \"-\"}\n") ==
        "m.yaml:3:17: job 0 (id 'job-0000'): output: '-' is not a file (dlo writes no video to standard output)");
  const std::string noext = one_problem(d, h + "  - {prompt: a, output: clip}\n");
  CHECK_MESSAGE(noext.find("job 0 (id 'job-0000'): output: '") != std::string::npos, noext);
  CHECK_MESSAGE(noext.find("clip' has no extension (a mp4 video: e.g. 'clip.mp4')") != std::string::npos, noext);
  const std::string self = one_problem(d, "model: model\noutput_dir: out\njobs:\n  - {prompt: a, format: png, output: .}\n");
  CHECK_MESSAGE(self.find("is the output folder itself (a png job writes a folder of its own") != std::string::npos, self);
  // A PNG folder has no extension, and an MKV has its own: both fine.
  TempDir e;
  const Loaded ok = load(e, "m.yaml", h + "  - {prompt: a, format: png, output: frames}\n  - {prompt: b, format: ffv1, output: b.mkv}\n");
  CHECK(ok.problems.empty());
}
