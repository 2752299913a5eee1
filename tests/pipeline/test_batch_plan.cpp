// Resume and fingerprints (pipeline/batch_plan, pipeline/results): a job recorded ok is skipped
// only while its output is whole (not missing, not emptied, not cut) and its fingerprint is
// unchanged; the fingerprint covers every field that decides the output, the model folder's
// contents (not its path), never the output's location (checked on its own, however spelled).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "common/model_folder.h"
#include "common/formats.h"
#include "common/test_util.h"
#include "dlo/pipeline/batch_plan.h"
#include "dlo/pipeline/results.h"

namespace {

namespace fs = std::filesystem;
using dlo::test::TempDir;

using dlo::test::kVideoFormats;

std::string read(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs fn() in `dir` as the working directory.
template <typename Fn>
auto in_dir(const fs::path& dir, Fn&& fn) {
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  struct Back {
    fs::path p;
    ~Back() { fs::current_path(p); }
  } back{cwd};
  return fn();
}

void append_result(const std::string& results, const std::string& id, std::int64_t index, const std::string& output,
                   const std::string& fingerprint, std::int64_t bytes, const char* status = "ok") {
  dlo::JobResult r;
  r.id = id;
  r.index = index;
  r.status = dlo::parse_job_status(status);
  r.output = output;
  r.output_bytes = bytes;
  r.fingerprint = fingerprint;
  std::ofstream(results, std::ios::app) << dlo::result_line(r) << "\n";
}

}  // namespace

TEST_CASE("an output is intact when it exists, is not empty and has the recorded size") {
  TempDir d;
  CHECK(dlo::output_bytes(d.file("none.mp4")) == -1);
  CHECK_FALSE(dlo::output_intact(d.file("none.mp4"), -1));
  dlo::test::write_file(d.file("empty.mp4"), "");
  CHECK_FALSE(dlo::output_intact(d.file("empty.mp4"), -1));
  dlo::test::write_file(d.file("v.mp4"), std::string(1000, 'v'));
  CHECK(dlo::output_intact(d.file("v.mp4"), 1000));
  CHECK(dlo::output_intact(d.file("v.mp4"), -1));        // a line of an earlier version: no size to compare
  CHECK_FALSE(dlo::output_intact(d.file("v.mp4"), 1200));  // cut
  fs::create_directories(d.path() / "frames");
  dlo::test::write_file(d.file("frames/frame_00000.png"), std::string(10, 'a'));
  dlo::test::write_file(d.file("frames/frame_00001.png"), std::string(15, 'b'));
  CHECK(dlo::output_bytes(d.file("frames")) == 25);
  CHECK(dlo::output_intact(d.file("frames"), 25));
}

TEST_CASE("resume: skip what is done and whole, render what is missing, emptied, cut or failed, refuse what changed") {
  TempDir d;
  dlo::Manifest m;
  m.path = "m.yaml";
  for (const char* id : {"done", "gone", "empty", "cut", "failed", "changed", "new"}) {
    dlo::JobSpec j;
    j.id = id;
    j.output = d.file(std::string(id) + ".mp4");
    m.jobs.push_back(j);
    m.job_lines.push_back(static_cast<std::int64_t>(m.jobs.size()) + 2);
  }
  std::vector<std::string> fps;
  for (const auto& j : m.jobs) fps.push_back("fp-" + j.id);
  const std::string results = d.file("results.jsonl");
  for (std::size_t i = 0; i < 6; ++i) {
    const auto& j = m.jobs[i];
    if (j.id != "gone") dlo::test::write_file(j.output, std::string(j.id == "empty" ? 0 : 100, 'x'));
    append_result(results, j.id, static_cast<std::int64_t>(i), j.output, j.id == "changed" ? "fp-old" : fps[i],
                  j.id == "cut" ? 180 : 100, j.id == "failed" ? "failed" : "ok");
  }
  const auto past = dlo::read_results(results);
  const dlo::ResumeResult r = dlo::plan_resume(m, fps, past, /*force=*/false);
  CHECK(r.skipped == 1);
  CHECK(r.render == std::vector<std::int64_t>{1, 2, 3, 4, 6});
  REQUIRE(r.problems.size() == 1);
  CHECK(r.problems[0].job_id == "changed");
  CHECK(r.problems[0].line == 8);
  CHECK(r.problems[0].message.find("changed since its video") == 0);
  CHECK(r.problems[0].message.find("parameters fingerprint fp-old, now fp-changed") != std::string::npos);
  const dlo::ResumeResult forced = dlo::plan_resume(m, fps, past, /*force=*/true);
  CHECK(forced.skipped == 0);
  CHECK(forced.render.size() == 7);
  CHECK(forced.problems.empty());
}

// N2 and V11 of the 2026-12-07 probe: a rerun said "already done" for jobs whose latents were lost
// (their flags 0), and a batch with the same ids silently replaced another job's latents.
TEST_CASE("resume with a latents file: a done job renders again unless its entry is complete and its own, another job's entry is refused") {
  TempDir d;
  dlo::Manifest m;
  m.path = "m.yaml";
  const std::vector<std::string> ids = {"kept", "unflagged", "missing", "other", "other-cut", "new-other", "new"};
  for (const std::string& id : ids) {
    dlo::JobSpec j;
    j.id = id;
    j.output = d.file(id + ".mp4");
    m.jobs.push_back(j);
    m.job_lines.push_back(static_cast<std::int64_t>(m.jobs.size()) + 2);
  }
  std::vector<std::string> fps;
  for (const auto& j : m.jobs) fps.push_back("fp-" + j.id);
  const std::string results = d.file("results.jsonl");
  for (std::size_t i = 0; i < 5; ++i) {  // the first five are done, their videos whole
    dlo::test::write_file(m.jobs[i].output, std::string(100, 'x'));
    append_result(results, ids[i], static_cast<std::int64_t>(i), m.jobs[i].output, fps[i], 100);
  }
  dlo::LatentsIndex lat{"/x/lat.h5", {}};
  lat.entries["kept"] = {"fp-kept", true};
  lat.entries["unflagged"] = {"fp-unflagged", false};  // its writing was cut off, or another batch's view won
  lat.entries["other"] = {"fp-someone-else", true};
  lat.entries["other-cut"] = {"fp-someone-else", false};  // incomplete: nothing to lose
  lat.entries["new-other"] = {"fp-someone-else", true};
  const auto past = dlo::read_results(results);
  const dlo::ResumeResult r = dlo::plan_resume(m, fps, past, false, {}, &lat);
  CHECK(r.skipped == 1);
  CHECK(r.render == std::vector<std::int64_t>{1, 2, 4, 6});
  REQUIRE(r.problems.size() == 2);
  CHECK(r.problems[0].job_id == "other");
  CHECK(r.problems[1].job_id == "new-other");
  CHECK(r.problems[1].line == 8);
  CHECK(r.problems[0].message ==
        "its entry in the latents file '/x/lat.h5' holds other parameters (fingerprint fp-someone-else, now fp-other); "
        "--force renders it again and replaces them");
  // Without a latents file the same results skip all five; --force renders everything.
  CHECK(dlo::plan_resume(m, fps, past, false).skipped == 5);
  const dlo::ResumeResult forced = dlo::plan_resume(m, fps, past, true, {}, &lat);
  CHECK(forced.render.size() == ids.size());
  CHECK(forced.problems.empty());
}

TEST_CASE("the fingerprint: every field that decides the video changes it, the id and the output's place do not") {
  dlo::ModelInfo info;
  info.transformer = dlo::WanTransformerConfig::preset("wan-test");
  dlo::JobSpec base;
  base.format = "mp4";
  base.output = "/videos/a.mp4";
  const std::string fp = dlo::job_fingerprint(base, info, "model-1", "bf16/fp32");
  CHECK(fp.size() == 16);
  TempDir d;  // a job's LoRAs are read for the fingerprint (their content is part of it)
  { std::ofstream(d.file("l.safetensors")) << "a LoRA's bytes"; }
  for (const auto& f : dlo::job_fields()) {
    CAPTURE(f.key);
    dlo::JobSpec changed = base;
    switch (f.type) {
      case dlo::JobFieldType::kText:
        f.set(changed, f.key == "scheduler" ? std::string("euler") : f.key == "format" ? std::string("ffv1")
                       : f.key == "loras"   ? d.file("l.safetensors")
                       : f.key == "schedule" ? std::string("lightx2v")
                                            : std::string("other"));
        break;
      case dlo::JobFieldType::kSeed: f.set(changed, std::uint64_t{99}); break;
      case dlo::JobFieldType::kInteger: f.set(changed, std::get<std::int64_t>(*f.get(base)) + 16); break;
      case dlo::JobFieldType::kNumber: f.set(changed, 7.25); break;
    }
    // The output decides where the video goes, not what it is: plan_resume checks it on its own.
    const bool decides = f.effect != dlo::JobFieldEffect::kNone && f.key != "output";
    CHECK((dlo::job_fingerprint(changed, info, "model-1", "bf16/fp32") != fp) == decides);
  }
  CHECK(dlo::job_fingerprint(base, info, "model-2", "bf16/fp32") != fp);  // other weights
  CHECK(dlo::job_fingerprint(base, info, "model-1", "fp32/fp32") != fp);  // other dtypes
  // A job's LoRA: its strength and its file's content, not only its path.
  dlo::JobSpec lora = base;
  lora.loras = d.file("l.safetensors");
  const std::string with = dlo::job_fingerprint(lora, info, "model-1", "bf16/fp32");
  lora.loras = d.file("l.safetensors") + ":0.5";
  CHECK(dlo::job_fingerprint(lora, info, "model-1", "bf16/fp32") != with);
  lora.loras = d.file("l.safetensors");
  { std::ofstream(d.file("l.safetensors")) << "other bytes"; }
  CHECK(dlo::job_fingerprint(lora, info, "model-1", "bf16/fp32") != with);
}

TEST_CASE("the fingerprint says what a video is, not where: a job whose output moved is rendered at its new place") {
  TempDir d;
  fs::create_directories(d.path() / "out");
  dlo::ModelInfo info;
  dlo::JobSpec a;
  a.id = "a";
  a.format = "mp4";
  a.output = d.file("out/a.mp4");
  dlo::JobSpec moved = a;
  moved.output = d.file("elsewhere/a.mp4");
  CHECK(dlo::job_fingerprint(moved, info, "m", "x") == dlo::job_fingerprint(a, info, "m", "x"));
  // Recorded ok at out/a.mp4 (whole); the manifest now puts it elsewhere: rendered there, not
  // skipped and not refused as changed. Spelled another way, the same place is still done.
  const std::string fp = dlo::job_fingerprint(a, info, "m", "x");
  dlo::test::write_file(a.output, std::string(500, 'v'));
  dlo::test::write_file(moved.output, std::string(500, 'v'));
  std::map<std::string, dlo::PastResult> past;
  past["a"] = {dlo::JobStatus::kOk, fp, a.output, 500};
  dlo::Manifest m;
  m.jobs = {moved};
  auto r = dlo::plan_resume(m, {fp}, past, false, {});
  CHECK(r.skipped == 0);
  CHECK(r.problems.empty());
  REQUIRE(r.render.size() == 1);
  m.jobs[0].output = d.file("out/../out/./a.mp4");
  r = dlo::plan_resume(m, {fp}, past, false, {});
  CHECK(r.skipped == 1);
  CHECK(r.render.empty());
}

TEST_CASE("the model's identity: what the folder holds, not where it is, new weights under the same header differ") {
  TempDir d;
  const std::string header = R"({"w":{"dtype":"F32","shape":[1024],"data_offsets":[0,4096]}})";
  for (const char* m : {"m1", "m2"}) {
    dlo::test::write_config_only_model(d.file(m));
    dlo::test::write_file(d.file(m) + "/transformer/diffusion_pytorch_model.safetensors",
                          dlo::test::safetensors_bytes(header, 4096));
  }
  const std::string id1 = dlo::model_identity(d.file("m1"));
  CHECK(id1.size() == 16);
  CHECK(dlo::model_identity(d.file("m2")) == id1);  // a copy elsewhere
  // The same header, other data (dlo-checkpoint make --seed 7 into the same folder).
  std::string bytes = read(d.file("m2") + "/transformer/diffusion_pytorch_model.safetensors");
  bytes[bytes.size() - 10] = 'x';
  dlo::test::write_file(d.file("m2") + "/transformer/diffusion_pytorch_model.safetensors", bytes);
  CHECK(dlo::model_identity(d.file("m2")) != id1);
  // A config changed.
  dlo::test::write_config_only_model(d.file("m3"));
  dlo::test::write_file(d.file("m3") + "/transformer/diffusion_pytorch_model.safetensors",
                        dlo::test::safetensors_bytes(header, 4096));
  CHECK(dlo::model_identity(d.file("m3")) == id1);
  dlo::test::write_file(d.file("m3") + "/scheduler/scheduler_config.json",
                        R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 5.0})");
  CHECK(dlo::model_identity(d.file("m3")) != id1);
  // A writer's hidden temporary is not part of the model.
  dlo::test::write_file(d.file("m1") + "/transformer/.x.tmp-host-1-0", "partial");
  CHECK(dlo::model_identity(d.file("m1")) == id1);
  // A second expert (Wan2.2 A14B) is part of the model: its weights change the identity.
  std::filesystem::create_directories(d.file("m1") + "/transformer_2");
  dlo::test::write_file(d.file("m1") + "/transformer_2/diffusion_pytorch_model.safetensors",
                        dlo::test::safetensors_bytes(header, 4096));
  const std::string id2 = dlo::model_identity(d.file("m1"));
  CHECK(id2 != id1);
  bytes = read(d.file("m1") + "/transformer_2/diffusion_pytorch_model.safetensors");
  bytes[bytes.size() - 10] = 'x';
  dlo::test::write_file(d.file("m1") + "/transformer_2/diffusion_pytorch_model.safetensors", bytes);
  CHECK(dlo::model_identity(d.file("m1")) != id2);
}

TEST_CASE("plan_batch: fingerprints, resume by manifest index, the same plan from another folder or an absolute path") {
  TempDir d;
  dlo::test::write_config_only_model(d.file("model"));
  dlo::test::write_file(d.file("b.yaml"),
                        "model: model\noutput_dir: out\ndefaults: {height: 32, width: 32, frames: 5, steps: 2}\n"
                        "jobs:\n  - {id: a, prompt: x}\n  - {id: b, prompt: y}\n  - {id: c, prompt: z}\n");
  dlo::BatchPlanOptions o;
  o.manifest = "b.yaml";
  o.formats = kVideoFormats;
  o.dtypes = "bf16/fp32";
  const dlo::BatchPlan first = in_dir(d.path(), [&] { return dlo::plan_batch(o); });
  REQUIRE(first.jobs.size() == 3);
  CHECK(fs::is_directory(d.path() / "out"));  // created (not a dry run)
  // Jobs a and c were rendered; record them as a run would.
  for (const std::size_t i : {0u, 2u}) {
    const auto& j = first.jobs[i];
    dlo::test::write_file((d.path() / j.spec.output).string(), std::string(500, 'v'));
    append_result((d.path() / first.results).string(), j.spec.id, j.index, j.spec.output, j.fingerprint, 500);
  }
  const dlo::BatchPlan again = in_dir(d.path(), [&] { return dlo::plan_batch(o); });
  REQUIRE(again.jobs.size() == 1);
  CHECK(again.skipped == 2);
  CHECK(again.jobs[0].spec.id == "b");
  CHECK(again.jobs[0].index == 1);  // the manifest's index, not the plan's
  CHECK(again.jobs[0].fingerprint == first.jobs[1].fingerprint);
  // From the parent folder, and with an absolute path: the same jobs are done.
  dlo::BatchPlanOptions up = o;
  up.manifest = d.path().filename().string() + "/b.yaml";
  CHECK(in_dir(d.path().parent_path(), [&] { return dlo::plan_batch(up); }).skipped == 2);
  dlo::BatchPlanOptions abs = o;
  abs.manifest = d.file("b.yaml");
  CHECK(dlo::plan_batch(abs).skipped == 2);
  // An edited job is refused (its video would be replaced) unless forced.
  dlo::test::write_file(d.file("b.yaml"),
                        "model: model\noutput_dir: out\ndefaults: {height: 32, width: 32, frames: 5, steps: 2}\n"
                        "jobs:\n  - {id: a, prompt: w}\n  - {id: b, prompt: y}\n  - {id: c, prompt: z}\n");
  const std::string err = in_dir(d.path(), [&] { return dlo::test::error_of([&] { dlo::plan_batch(o); }); });
  CHECK_MESSAGE(err.find("b.yaml:5: job 0 (id 'a'): changed since its video") == 0, err);
  o.force = true;
  CHECK(in_dir(d.path(), [&] { return dlo::plan_batch(o); }).jobs.size() == 3);
  // A dry run creates nothing.
  dlo::BatchPlanOptions dry = o;
  dry.dry_run = true;
  dry.output_dir = d.file("elsewhere");
  (void)in_dir(d.path(), [&] { return dlo::plan_batch(dry); });
  CHECK_FALSE(fs::exists(d.path() / "elsewhere"));
}

TEST_CASE("a --prompt job from flags: parsed by the table, the seed drawn when not given, every problem at once") {
  const dlo::JobSpec j = dlo::prompt_job({{"prompt", "a fox"}, {"steps", "4"}, {"format", "png"}}, kVideoFormats, 1234);
  CHECK(j.prompt == "a fox");
  CHECK(j.steps == 4);
  CHECK(j.seed == 1234);
  CHECK(j.output == "video");  // png: a folder
  CHECK(dlo::prompt_job({{"prompt", ""}, {"seed", "7"}}, kVideoFormats, 1).seed == 7);
  CHECK(dlo::prompt_job({{"prompt", ""}}, kVideoFormats, 1).output == "video.mp4");
  CHECK(dlo::test::error_of([] { dlo::prompt_job({{"prompt", "x"}, {"seed", "-1"}, {"steps", "abc"}}, kVideoFormats, 1); }) ==
        "--seed: must be >= 0 (a seed is 0 .. 18446744073709551615), got -1\n  --steps: must be an integer, got 'abc'");
  dlo::ModelInfo info;
  info.transformer = dlo::WanTransformerConfig::preset("wan-test");
  const dlo::JobFlags flags = {{"prompt", "x"}, {"height", "500"}, {"width", "64"}, {"frames", "5"}};
  dlo::JobSpec bad = dlo::prompt_job(flags, kVideoFormats, 1);
  CHECK(dlo::test::error_of([&] { dlo::check_prompt_job(bad, info, kVideoFormats, flags); })
            .find("--height: 500 is not a multiple of 16") == 0);
}

TEST_CASE("a --prompt job's values from dlo_defaults.json: named at the file, moot beside a flag as in a manifest") {
  dlo::ModelInfo info;
  info.parts.dir = "m";
  info.transformer = dlo::WanTransformerConfig::preset("wan-test");
  info.transformer_2 = info.transformer;
  info.boundary_ratio = 0.875;
  const std::map<std::string, dlo::JobFieldValue> recommended = {
      {"guidance", 4.0}, {"guidance_2", 3.0}, {"height", std::int64_t{500}}};
  // The folder recommends a height the model cannot render: the file is wrong, not a flag.
  const dlo::JobFlags plain = {{"prompt", "x"}, {"width", "64"}, {"frames", "5"}};
  const dlo::JobSpec j = dlo::prompt_job(plain, kVideoFormats, 1, recommended);
  CHECK(dlo::test::error_of([&] { dlo::check_prompt_job(j, info, kVideoFormats, plain); }) ==
        "m/dlo_defaults.json: defaults.height: 500 is not a multiple of 16 (the VAE's spatial factor 8 x the "
        "transformer's patch 2); e.g. 496");
  // Its guidance_2 beside --guidance 1: the user turned guidance off, nothing to refuse ...
  dlo::JobFlags off = {{"prompt", "x"}, {"height", "64"}, {"width", "64"}, {"frames", "5"}, {"guidance", "1"}};
  const dlo::JobSpec k = dlo::prompt_job(off, kVideoFormats, 1, recommended);
  CHECK(k.guidance == 1.0);
  CHECK(dlo::test::error_of([&] { dlo::check_prompt_job(k, info, kVideoFormats, off); }) == "(no error)");
  // ... but --guidance-2 3 beside it is the user's own contradiction.
  off["guidance_2"] = "3";
  const dlo::JobSpec l = dlo::prompt_job(off, kVideoFormats, 1, recommended);
  CHECK(dlo::test::error_of([&] { dlo::check_prompt_job(l, info, kVideoFormats, off); })
            .find("--guidance-2: 3 has no effect with guidance 1") == 0);
}

TEST_CASE("plan_batch: a model folder whose parts are broken is refused before the output folder exists (V2)") {
  TempDir d;
  dlo::test::write_config_only_model(d.file("model"));
  dlo::test::write_file(d.file("b.yaml"), "model: model\noutput_dir: out\ndefaults: {height: 32, width: 32, frames: 5, steps: 2}\n"
                                          "jobs:\n  - {id: a, prompt: x}\n");
  dlo::BatchPlanOptions o;
  o.manifest = "b.yaml";
  o.formats = kVideoFormats;
  o.dtypes = "bf16/fp32";
  bool held = false;
  o.hold_output_dir = [&](const std::string&) { held = true; };
  o.check_model = [](const dlo::ModelInfo&) { throw dlo::Error("model/tokenizer/tokenizer.json: not JSON"); };
  const std::string err = in_dir(d.path(), [&] { return dlo::test::error_of([&] { dlo::plan_batch(o); }); });
  CHECK_MESSAGE(err.find("model: model/tokenizer/tokenizer.json: not JSON") != std::string::npos, err);
  CHECK_FALSE(held);
  CHECK_FALSE(fs::exists(d.path() / "out"));
}
