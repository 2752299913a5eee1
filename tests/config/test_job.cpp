// The job-field table (config/job.h): one row per field drives parsing, checks, JSON, the
// parameters recorded with a video, what the fingerprint covers, the flags and the schema in
// docs/manifest.md. These tests hold the rows to that: the doc equals the table, every value
// parses and is checked with its message, a job survives the JSON round trip field by field, and
// every field the table marks as deciding the output changes what the fingerprint covers.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/formats.h"
#include "common/test_util.h"
#include "common/source_tree.h"
#include "dlo/common/error.h"
#include "dlo/config/job.h"

namespace {

using dlo::test::kVideoFormats;

dlo::ModelInfo tiny_model() {
  dlo::ModelInfo info;
  info.parts.dir = "m";
  info.transformer = dlo::WanTransformerConfig::preset("wan-test");  // rope_max_seq_len 32
  return info;
}

std::string problem_of(const std::string& key, const std::string& text) {
  std::string p;
  const auto v = dlo::parse_job_field(*dlo::find_job_field(key), text, kVideoFormats, &p);
  return v ? "(parsed)" : p;
}

// A valid value of `f` different from the job's (for the "changes the output" checks).
dlo::JobFieldValue other_value(const dlo::JobField& f, const dlo::JobSpec& job) {
  const auto now = f.get(job);
  switch (f.type) {
    case dlo::JobFieldType::kText: {
      std::vector<std::string> names = f.choices;
      if (f.app_choices)
        for (const auto& fmt : kVideoFormats) names.push_back(fmt.name);
      const std::string cur = now ? std::get<std::string>(*now) : "";
      // From the end: the first choice is the default (the folder's UniPC, mp4), which an unset
      // field already means.
      for (auto n = names.rbegin(); n != names.rend(); ++n)
        if (*n != cur) return *n;
      return cur + "x";
    }
    case dlo::JobFieldType::kSeed: return std::get<std::uint64_t>(*now) + 1;
    case dlo::JobFieldType::kInteger: {
      const std::int64_t v = std::get<std::int64_t>(*now);
      if (f.key == "height" || f.key == "width") return v + 16;
      if (f.key == "frames") return v + 4;
      return v + 1;
    }
    case dlo::JobFieldType::kNumber: return (now ? std::get<double>(*now) : 3.0) + 0.5;
  }
  return std::string();
}

}  // namespace

TEST_CASE("the table: unique keys and flags, a flag for every command-line field, checks that accept the defaults") {
  std::set<std::string> keys, flags;
  const dlo::JobSpec defaults;
  for (const auto& f : dlo::job_fields()) {
    CAPTURE(f.key);
    CHECK(keys.insert(f.key).second);
    if (!f.flag.empty()) CHECK(flags.insert(f.flag).second);
    CHECK((f.flag.empty() == !(f.from(dlo::kFromBatchFlag) || f.from(dlo::kFromPromptFlag))));
    CHECK(!f.help.empty());
    CHECK(f.get);
    CHECK(f.set);
    // Every built-in value passes its own check (what is unset is optional).
    if (const auto v = f.get(defaults); v && f.key != "format" && f.key != "output" && f.key != "prompt")
      CHECK(dlo::check_job_field(f, *v, kVideoFormats) == "");
  }
  CHECK(dlo::find_job_field("steps") != nullptr);
  CHECK(dlo::find_job_field("step") == nullptr);
}

TEST_CASE("docs/manifest.md shows the table as job_fields_markdown() writes it") {
  std::ifstream in(dlo::test::source_dir() + "/docs/manifest.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  const std::string begin = "<!-- job-fields: begin (generated: dlo-generate --help-fields) -->\n";
  const std::string end = "<!-- job-fields: end -->";
  const auto a = doc.find(begin), b = doc.find(end);
  REQUIRE_MESSAGE(a != std::string::npos, "docs/manifest.md lacks the marker " << begin);
  REQUIRE(b != std::string::npos);
  const std::string shown = doc.substr(a + begin.size(), b - a - begin.size());
  CHECK_MESSAGE(shown == dlo::job_fields_markdown(),
                "docs/manifest.md's job-field table differs from the table in lib/dlo/config/job.cpp; replace it with "
                "the output of `build/bin/dlo-generate --help-fields`:\n"
                    << dlo::job_fields_markdown());
}

TEST_CASE("values parse as the table's types, with the messages the manifest and the flags show") {
  CHECK(problem_of("steps", "10") == "(parsed)");
  CHECK(problem_of("steps", "0") == "must be >= 1, got 0");
  CHECK(problem_of("steps", "1000000000") == "must be at most 10000, got 1000000000");
  CHECK(problem_of("steps", "ten") == "must be an integer, got 'ten'");
  CHECK(problem_of("steps", "99999999999999999999") == "out of range, got 99999999999999999999");
  CHECK(problem_of("height", "0") == "must be positive, got 0");
  CHECK(problem_of("height", "1099511627776") == "must be at most 65536, got 1099511627776");
  CHECK(problem_of("seed", "-1") == "must be >= 0 (a seed is 0 .. 18446744073709551615), got -1");
  CHECK(problem_of("seed", "18446744073709551615") == "(parsed)");
  CHECK(problem_of("seed", "18446744073709551616") ==
        "out of range (a seed is 0 .. 18446744073709551615), got 18446744073709551616");
  CHECK(problem_of("guidance", ".inf") == "must be a finite number, got '.inf'");
  CHECK(problem_of("guidance", "1.5.5") == "must be a number, got '1.5.5'");
  CHECK(problem_of("flow_shift", "-2") == "must be a positive number, got -2");
  CHECK(problem_of("fps", "500") == "must be in 1..240, got 500");
  CHECK(problem_of("crf", "52") == "must be in 0..51 (libx264), got 52");
  CHECK(problem_of("format", "gif") == "'gif' is not mp4, png or ffv1");
  CHECK(problem_of("scheduler", "ddim") == "unknown noise scheduler 'ddim' (unipc, euler)");
  CHECK(problem_of("id", "../x") ==
        "'../x' is not a safe file name: use 1..128 of A-Z a-z 0-9 . _ -, not starting with '.' or '-'");
  CHECK(problem_of("prompt", std::string("a\0b", 3)) == "holds a NUL byte");
  CHECK(problem_of("prompt", "caf\xc3") == "is not valid UTF-8 (byte 3)");
  CHECK(problem_of("output", "") == "is empty");
  CHECK(problem_of("preset", "") == "is empty");
}

TEST_CASE("validate_job: every problem of a job, each with its field and why, in the table's order") {
  const dlo::ModelInfo info = tiny_model();
  dlo::JobSpec job;
  job.output = "x.mp4";
  job.format = "mp4";
  job.height = 64;
  job.width = 64;
  job.frames = 5;
  CHECK(dlo::validate_job(job, info, kVideoFormats).empty());
  job.height = 500;
  job.width = 0;
  job.frames = 80;
  job.steps = 0;
  job.crf = 52;
  job.fps = 0;
  job.flow_shift = -1.0;
  job.format = "gif";
  const auto e = dlo::validate_job(job, info, kVideoFormats);
  REQUIRE(e.size() == 8);
  CHECK(e[0].field == "steps");
  CHECK(e[0].message == "must be >= 1, got 0");
  CHECK(e[1].field == "height");
  CHECK(e[1].message == "500 is not a multiple of 16 (the VAE's spatial factor 8 x the transformer's patch 2); e.g. 496");
  CHECK(e[2].field == "width");
  CHECK(e[2].message == "must be positive, got 0");
  CHECK(e[3].field == "frames");
  CHECK(e[3].message == "80 is not of the form 4k+1 (e.g. 77; Wan's default is 81)");
  CHECK(e[4].field == "fps");
  CHECK(e[5].field == "flow_shift");
  CHECK(e[6].field == "format");
  CHECK(e[6].message == "'gif' is not mp4, png or ffv1");
  CHECK(e[7].field == "crf");
}

TEST_CASE("validate_job: frames that do not fill the transformer's tokens in time are refused, with frame counts that do") {
  dlo::ModelInfo info = tiny_model();
  info.transformer.patch_size = {5, 2, 2};  // five latent frames per token, as the demo model has
  dlo::JobSpec job;
  job.output = "x.mp4";
  job.format = "mp4";
  job.height = 64;
  job.width = 64;
  for (std::int64_t ok : {17, 37}) {  // 5 and 10 latent frames
    job.frames = ok;
    CHECK(dlo::validate_job(job, info, kVideoFormats).empty());
  }
  job.frames = 21;  // 6 latent frames
  auto e = dlo::validate_job(job, info, kVideoFormats);
  REQUIRE(e.size() == 1);
  CHECK(e[0].field == "frames");
  CHECK(e[0].message ==
        "21 frames make 6 latent frames, not a multiple of the transformer's 5 per token (patch_size[0]); e.g. 17 or 37");
  job.frames = 9;  // 3 latent frames: nothing below fits
  e = dlo::validate_job(job, info, kVideoFormats);
  REQUIRE(e.size() == 1);
  CHECK(e[0].message ==
        "9 frames make 3 latent frames, not a multiple of the transformer's 5 per token (patch_size[0]); e.g. 17");
}

TEST_CASE("validate_job: a latent grid beyond the transformer's RoPE table is refused before any weight is read") {
  const dlo::ModelInfo info = tiny_model();  // rope_max_seq_len 32: 32 patches of 16 pixels per side
  dlo::JobSpec job;
  job.output = "x.mp4";
  job.format = "mp4";
  job.height = 512;
  job.width = 528;
  job.frames = 5;
  const auto e = dlo::validate_job(job, info, kVideoFormats);
  REQUIRE(e.size() == 1);
  CHECK(e[0].field == "width");
  CHECK(e[0].message ==
        "528 makes 33 latent patches across, more than the transformer's RoPE covers (rope_max_seq_len 32): at most 512");
  job.width = 512;
  job.frames = 129;  // 33 latent frames
  const auto f = dlo::validate_job(job, info, kVideoFormats);
  REQUIRE(f.size() == 1);
  CHECK(f[0].field == "frames");
}

TEST_CASE("a job survives the JSON plan round trip, field by field") {
  dlo::JobSpec job;
  for (const auto& f : dlo::job_fields()) f.set(job, other_value(f, job));
  job.save_latents = "l.safetensors";
  const auto back = dlo::jobs_from_json(dlo::jobs_to_json({job, dlo::JobSpec{}}));
  REQUIRE(back.size() == 2);
  for (const auto& f : dlo::job_fields()) {
    CAPTURE(f.key);
    CHECK((f.get(back[0]) == f.get(job)));
    CHECK((f.get(back[1]) == f.get(dlo::JobSpec{})));
  }
  CHECK(dlo::test::error_of([] { dlo::jobs_from_json("[{\"id\": 3}]"); }).find("a job list that is not valid JSON") == 0);
}

TEST_CASE("what the fingerprint covers: every field that decides the output changes it, the others do not") {
  const dlo::ModelInfo info = tiny_model();
  dlo::JobSpec base;
  base.format = "mp4";
  base.output = "a.mp4";
  const std::string fp0 = dlo::job_output_fields_json(base, info);
  for (const auto& f : dlo::job_fields()) {
    CAPTURE(f.key);
    dlo::JobSpec changed = base;
    f.set(changed, other_value(f, base));
    const bool decides = f.effect != dlo::JobFieldEffect::kNone;
    CHECK((dlo::job_output_fields_json(changed, info) != fp0) == decides);
  }
  // Effective values: without guidance the negative prompt decides nothing; an unset scheduler is
  // the folder's, so naming the folder's explicitly is the same job.
  dlo::JobSpec off = base;
  off.guidance = 1.0;
  dlo::JobSpec off_neg = off;
  off_neg.negative_prompt = "blurry";
  CHECK(dlo::job_output_fields_json(off, info) == dlo::job_output_fields_json(off_neg, info));
  dlo::JobSpec named = base;
  named.scheduler = dlo::NoiseSchedulerKind::kUniPC;
  named.flow_shift = 3.0;
  CHECK(dlo::job_output_fields_json(named, info) == dlo::job_output_fields_json(base, info));
}

TEST_CASE("resolve_job: the first layer that has a field wins, the format defaults to the app's first") {
  const std::map<std::string, dlo::JobFieldValue> job = {{"steps", std::int64_t{3}}};
  const std::map<std::string, dlo::JobFieldValue> flags = {{"steps", std::int64_t{7}}, {"crf", std::int64_t{18}}};
  const std::map<std::string, dlo::JobFieldValue> defaults = {{"crf", std::int64_t{30}}, {"fps", std::int64_t{24}}};
  std::set<std::string> given;
  const dlo::JobSpec j = dlo::resolve_job({&job, &flags, &defaults}, kVideoFormats, &given);
  CHECK(j.steps == 3);
  CHECK(j.crf == 18);
  CHECK(j.fps == 24);
  CHECK(j.frames == 81);
  CHECK(j.format == "mp4");
  CHECK((given == std::set<std::string>{"steps", "crf", "fps"}));
}

TEST_CASE("the parameters recorded with a video are the fields marked so, with their effective values") {
  const dlo::ModelInfo info = tiny_model();
  dlo::JobSpec job;
  job.id = "fox";
  job.guidance = 1.0;
  job.negative_prompt = "ignored without guidance";
  const auto j = nlohmann::ordered_json::parse(dlo::job_parameters_json(job, info));
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  std::vector<std::string> want;  // in the table's order, then the model and dlo's version
  // (a one-expert model: no guidance_2, no boundary_ratio; a job without LoRAs: no loras; the default
  // schedule: no schedule)
  for (const auto& f : dlo::job_fields())
    if (f.in_parameters && f.key != "guidance_2" && f.key != "boundary_ratio" && f.key != "loras" && f.key != "schedule")
      want.push_back(f.key);
  want.push_back("model");
  want.push_back("dlo_version");
  CHECK(keys == want);
  CHECK(j["negative_prompt"] == "");
  CHECK(j["scheduler"] == "unipc");
  CHECK(j["flow_shift"] == 3.0);
  CHECK(j["model"] == "m");
}

TEST_CASE("schedule: lightx2v makes the folder's UniPC euler, is in the fingerprint and the parameters, the default is not") {
  const dlo::ModelInfo info = tiny_model();
  dlo::JobSpec job;
  job.format = "mp4";
  const std::string plain = dlo::job_output_fields_json(job, info);
  job.schedule = dlo::NoiseSchedule::kDefault;  // written out: the same job, the same fingerprint fields
  CHECK(dlo::job_output_fields_json(job, info) == plain);
  CHECK(!nlohmann::ordered_json::parse(plain).contains("schedule"));
  job.schedule = dlo::NoiseSchedule::kLightx2v;
  const auto fields = nlohmann::ordered_json::parse(dlo::job_output_fields_json(job, info));
  CHECK(fields["schedule"] == "lightx2v");
  CHECK(fields["scheduler"] == "euler");
  CHECK(fields["flow_shift"] == 3.0);  // the folder's
  const auto params = nlohmann::ordered_json::parse(dlo::job_parameters_json(job, info));
  CHECK(params["schedule"] == "lightx2v");
  CHECK(dlo::job_parameters_text(job, info).find("scheduler euler (flow shift 3, schedule lightx2v)") != std::string::npos);
  const auto schedule_errors = [&] {
    std::vector<dlo::FieldError> out;
    for (const auto& fe : dlo::validate_job(job, info, kVideoFormats))
      if (fe.field == "schedule") out.push_back(fe);
    return out;
  };
  CHECK(schedule_errors().empty());
  job.scheduler = dlo::NoiseSchedulerKind::kFlowEuler;
  CHECK(schedule_errors().empty());
  job.scheduler = dlo::NoiseSchedulerKind::kUniPC;
  const auto e = schedule_errors();
  REQUIRE(e.size() == 1);
  CHECK(e[0].with_job);
  CHECK(e[0].message.find("'lightx2v' samples with euler") != std::string::npos);
}

TEST_CASE("two experts (Wan2.2 A14B): guidance_2 and boundary_ratio, their effective values, refused for one expert") {
  const dlo::ModelInfo one = tiny_model();
  dlo::ModelInfo two = tiny_model();
  two.transformer_2 = two.transformer;
  two.boundary_ratio = 0.875;
  dlo::JobSpec job;
  job.format = "mp4";
  job.guidance = 4.0;
  // A Wan2.1 job's fingerprint fields are what they were before the two-expert fields existed.
  const auto fields = nlohmann::ordered_json::parse(dlo::job_output_fields_json(job, one));
  CHECK(!fields.contains("guidance_2"));
  CHECK(!fields.contains("boundary_ratio"));
  // With two experts: guidance_2 defaults to guidance, the boundary to the folder's, as in WanPipeline.
  auto params = nlohmann::ordered_json::parse(dlo::job_parameters_json(job, two));
  CHECK(params["guidance_2"] == 4.0);
  CHECK(params["boundary_ratio"] == 0.875);
  dlo::JobSpec same = job;
  same.guidance_2 = 4.0;
  same.boundary_ratio = 0.875;
  CHECK(dlo::job_output_fields_json(same, two) == dlo::job_output_fields_json(job, two));
  dlo::JobSpec other = job;
  other.guidance_2 = 3.0;
  CHECK(dlo::job_output_fields_json(other, two) != dlo::job_output_fields_json(job, two));
  // Without guidance the scale decides nothing.
  dlo::JobSpec off = job;
  off.guidance = 1.0;
  dlo::JobSpec off2 = off;
  off2.guidance_2 = 0.5;
  CHECK(dlo::job_output_fields_json(off, two) == dlo::job_output_fields_json(off2, two));
  CHECK(dlo::job_parameters_text(other, two).find("guidance 4 (low-noise expert 3; experts switch at boundary ratio 0.875)") !=
        std::string::npos);
  // Validation: the fields need two experts; guidance_2 > 1 needs guidance > 1; ratios in [0, 1].
  const auto problems = [](const dlo::JobSpec& j, const dlo::ModelInfo& m) {
    std::string out;
    for (const auto& e : dlo::validate_job(j, m, kVideoFormats)) out += e.field + ": " + e.message + "\n";
    return out;
  };
  dlo::JobSpec both = job;
  both.output = "a.mp4";
  both.height = both.width = 32;
  both.frames = 5;
  both.guidance_2 = 3.0;
  both.boundary_ratio = 0.5;
  CHECK(problems(both, two) == "");
  const std::string refused = problems(both, one);
  CHECK(refused.find("guidance_2: applies to models with two experts") != std::string::npos);
  CHECK(refused.find("boundary_ratio: applies to models with two experts") != std::string::npos);
  dlo::JobSpec useless = both;
  useless.guidance = 1.0;
  const auto e = dlo::validate_job(useless, two, kVideoFormats);
  REQUIRE(e.size() == 1);
  CHECK(e[0].field == "guidance_2");
  CHECK(e[0].with_job);
  CHECK(e[0].message.find("3 has no effect with guidance 1") == 0);
  CHECK(problem_of("boundary_ratio", "1.5") == "must be a number in [0, 1], got 1.5");
  CHECK(problem_of("boundary_ratio", "0") == "(parsed)");
}

TEST_CASE("a model folder's dlo_defaults.json: the settings it was made for, typed and checked by the table") {
  dlo::test::TempDir d;
  const std::string dir = d.path().string();
  CHECK(dlo::read_model_job_defaults(dir).empty());  // no file: no recommendations
  dlo::test::write_file(d.file("dlo_defaults.json"),
                        R"({"about": "a tiny model", "defaults": {"height": 64, "width": 96, "frames": 17, "steps": 20,
                            "guidance": 4, "fps": 8, "negative_prompt": ""}})");
  const auto v = dlo::read_model_job_defaults(dir);
  REQUIRE(v.size() == 7);
  CHECK(std::get<std::int64_t>(v.at("height")) == 64);
  CHECK(std::get<std::int64_t>(v.at("width")) == 96);
  CHECK(std::get<std::int64_t>(v.at("frames")) == 17);
  CHECK(std::get<std::int64_t>(v.at("steps")) == 20);
  CHECK(std::get<double>(v.at("guidance")) == 4.0);  // an integer is a number
  CHECK(std::get<std::int64_t>(v.at("fps")) == 8);
  CHECK(std::get<std::string>(v.at("negative_prompt")).empty());
  // Below every other layer: a flag or a job's value wins, the rest is the model's.
  const std::map<std::string, dlo::JobFieldValue> flags = {{"steps", std::int64_t{5}}};
  const dlo::JobSpec j = dlo::resolve_job({&flags, &v}, kVideoFormats);
  CHECK(j.steps == 5);
  CHECK(j.height == 64);
  CHECK(j.guidance == 4.0);
  CHECK(j.crf == 25);  // not a model's to say: built in

  // Every bad key at once, each named with the file; the good ones kept when collecting.
  const std::string path = dir + "/dlo_defaults.json";
  dlo::test::write_file(path, R"({"defaults": {"steps": 0, "height": "64", "prompt": "a fox", "stepz": 3, "frames": 17},
                                  "version": 2})");
  std::vector<dlo::FieldError> problems;
  const auto kept = dlo::read_model_job_defaults(dir, &problems);
  CHECK(kept.size() == 1);
  CHECK(kept.count("frames") == 1);
  std::vector<std::string> seen;
  for (const auto& p : problems) seen.push_back(p.field + ": " + p.message);
  REQUIRE(seen.size() == 5);
  CHECK(seen[0] == "version: unknown key (dlo_defaults.json has defaults and about)");
  CHECK(seen[1] == "defaults.steps: must be >= 1, got 0");
  CHECK(seen[2] == "defaults.height: must be an integer, got \"64\"");
  CHECK(seen[3].rfind("defaults.prompt: is not a setting a model folder may recommend (negative_prompt, steps, ", 0) == 0);
  CHECK(seen[4].rfind("defaults.stepz: unknown job field (", 0) == 0);
  std::string what;
  try {
    dlo::read_model_job_defaults(dir);
  } catch (const dlo::Error& e) {
    what = e.what();
    CHECK(e.kind() == dlo::ErrorKind::kInput);
  }
  CHECK(what.find(path + ": defaults.steps: must be >= 1, got 0") != std::string::npos);
  CHECK(std::count(what.begin(), what.end(), '\n') == 4);  // one line per problem
  dlo::test::write_file(path, "{\"defaults\": {\"steps\": 3,}");
  problems.clear();
  CHECK(dlo::read_model_job_defaults(dir, &problems).empty());
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].field == "");
  CHECK(problems[0].message.rfind("not valid JSON", 0) == 0);
}

// V5 (batch probe 2026-12-07): a key given twice was accepted silently, the last value winning.
TEST_CASE("a key given twice in dlo_defaults.json is refused naming the file and the key") {
  dlo::test::TempDir d;
  const std::string dir = d.path().string(), path = dir + "/dlo_defaults.json";
  dlo::test::write_file(path, R"({"defaults": {"steps": 20, "height": 64, "steps": 3}, "about": "x", "about": "y"})");
  std::string what;
  try {
    dlo::read_model_job_defaults(dir);
  } catch (const dlo::Error& e) {
    what = e.what();
    CHECK(e.kind() == dlo::ErrorKind::kInput);
  }
  CHECK(what == path + ": defaults.steps: given twice (JSON would keep the last value silently; give each key once)\n" +
                    path + ": about: given twice (JSON would keep the last value silently; give each key once)");
  std::vector<dlo::FieldError> problems;
  const auto kept = dlo::read_model_job_defaults(dir, &problems);
  CHECK(problems.size() == 2);
  CHECK(kept.size() == 1);  // height; neither steps
  CHECK(kept.count("height") == 1);
  // The same key in two objects is no repetition.
  dlo::test::write_file(path, R"({"about": {"steps": 1}, "defaults": {"steps": 20}})");
  problems.clear();
  (void)dlo::read_model_job_defaults(dir, &problems);
  for (const auto& p : problems) CHECK(p.message.find("twice") == std::string::npos);
}

// V5: docs/manifest.md listed 7 of the 9 keys a model folder may recommend.
TEST_CASE("docs/manifest.md lists every key dlo_defaults.json may hold, as the table marks them") {
  std::ifstream in(dlo::test::source_dir() + "/docs/manifest.md");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string doc = ss.str();
  std::replace(doc.begin(), doc.end(), '\n', ' ');  // the sentence wraps
  const std::string begin = "The keys it may hold are ", end = " (the fields marked";
  const auto a = doc.find(begin);
  REQUIRE_MESSAGE(a != std::string::npos, "docs/manifest.md lacks the sentence starting '" << begin << "'");
  const auto b = doc.find(end, a);
  REQUIRE(b != std::string::npos);
  std::vector<std::string> listed;
  const std::string sentence = doc.substr(a + begin.size(), b - a - begin.size());
  for (std::size_t i = sentence.find('`'); i != std::string::npos; i = sentence.find('`', i)) {
    const std::size_t j = sentence.find('`', i + 1);
    REQUIRE(j != std::string::npos);
    listed.push_back(sentence.substr(i + 1, j - i - 1));
    i = j + 1;
  }
  std::vector<std::string> table;
  for (const auto& f : dlo::job_fields())
    if (f.from(dlo::kFromModel)) table.push_back(f.key);
  CHECK(listed == table);
}
