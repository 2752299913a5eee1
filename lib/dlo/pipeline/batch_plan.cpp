#include "dlo/pipeline/batch_plan.h"

#include <dirent.h>
#include <sys/stat.h>

#include <set>

#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/common/file.h"

namespace dlo {

using json = nlohmann::json;

namespace {

json batch_jobs_json(const std::vector<BatchJob>& jobs) {
  std::vector<JobSpec> specs;
  json meta = json::array();
  for (const auto& j : jobs) {
    specs.push_back(j.spec);
    meta.push_back({{"index", j.index}, {"fingerprint", j.fingerprint}});
  }
  return {{"specs", json::parse(jobs_to_json(specs))}, {"meta", meta}};
}

std::vector<BatchJob> batch_jobs_from_json(const json& j) {
  const std::vector<JobSpec> specs = jobs_from_json(j.at("specs").dump());
  const json& meta = j.at("meta");
  DLO_CHECK_KIND(ErrorKind::kInternal, meta.size() == specs.size(), "a plan whose jobs and their indices differ in length");
  std::vector<BatchJob> jobs;
  for (std::size_t i = 0; i < specs.size(); ++i)
    jobs.push_back({specs[i], meta[i].at("index").get<std::int64_t>(), meta[i].at("fingerprint").get<std::string>()});
  return jobs;
}

std::vector<std::string> lora_texts(const std::vector<LoraSpec>& loras) {
  std::vector<std::string> out;
  for (const auto& l : loras) out.push_back(lora_spec_text(l));
  return out;
}

}  // namespace

std::string plan_to_json(const BatchPlan& p) {
  return json({{"model", p.model.dir},
               {"transformer", p.model.transformer},
               {"transformer_2", p.model.transformer_2},
               {"vae", p.model.vae_file},
               {"fuse_loras", lora_texts(p.model.fused_loras)},
               {"model_identity", p.model_identity},
               {"output_dir", p.output_dir},
               {"results", p.results},
               {"skipped", p.skipped},
               {"sp", p.sp},
               {"cfg_parallel", p.cfg_parallel},
               {"storage_dtype", p.storage_dtype},
               {"jobs", batch_jobs_json(p.jobs)},
               {"recovered", batch_jobs_json(p.recovered)}})
      .dump();
}

BatchPlan plan_from_json(const std::string& text) {
  try {
    const json j = json::parse(text);
    BatchPlan p;
    p.model = {j.at("model"), j.at("transformer"), j.at("transformer_2"), j.at("vae")};
    for (const auto& t : j.at("fuse_loras")) p.model.fused_loras.push_back(parse_lora_spec(t.get<std::string>(), "plan"));
    p.model_identity = j.at("model_identity");
    p.output_dir = j.at("output_dir");
    p.results = j.at("results");
    p.skipped = j.at("skipped");
    p.sp = j.at("sp");
    p.cfg_parallel = j.at("cfg_parallel");
    p.storage_dtype = j.at("storage_dtype");
    p.jobs = batch_jobs_from_json(j.at("jobs"));
    p.recovered = batch_jobs_from_json(j.at("recovered"));
    return p;
  } catch (const json::exception& e) {
    throw Error(str("a batch plan that is not valid JSON: ", e.what()), ErrorKind::kInternal);
  }
}

std::int64_t output_bytes(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return -1;
  if (S_ISREG(st.st_mode)) return static_cast<std::int64_t>(st.st_size);
  if (!S_ISDIR(st.st_mode)) return -1;
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return -1;
  std::int64_t total = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    struct stat fs;
    if (name.empty() || name[0] == '.') continue;
    if (::stat((path + "/" + name).c_str(), &fs) == 0 && S_ISREG(fs.st_mode)) total += static_cast<std::int64_t>(fs.st_size);
  }
  ::closedir(d);
  return total;
}

bool output_intact(const std::string& path, std::int64_t recorded_bytes) {
  const std::int64_t n = output_bytes(path);
  if (n <= 0) return false;
  return recorded_bytes < 0 || n == recorded_bytes;
}

ResumeResult plan_resume(const Manifest& m, const std::vector<std::string>& fingerprints,
                         const std::map<std::string, PastResult>& past, bool force,
                         const std::function<std::string(const JobSpec&)>& recorded_fingerprint,
                         const LatentsIndex* latents) {
  DLO_ASSERT(fingerprints.size() == m.jobs.size(), fingerprints.size(), " fingerprints for ", m.jobs.size(), " jobs");
  ResumeResult r;
  for (std::size_t i = 0; i < m.jobs.size(); ++i) {
    const JobSpec& j = m.jobs[i];
    const auto ji = static_cast<std::int64_t>(i);
    auto changed = [&](const std::string& was, const char* where) {
      r.problems.push_back({m.path, ji, j.id, "",
                            str("changed since its video '", j.output, "' was rendered (parameters fingerprint ", was,
                                where, ", now ", fingerprints[i], "); --force renders it again"),
                            i < m.job_lines.size() ? m.job_lines[i] : -1, -1});
    };
    auto latents_changed = [&](const std::string& was) {
      r.problems.push_back({m.path, ji, j.id, "",
                            str("its entry in the latents file '", latents->path, "' holds other parameters (fingerprint ",
                                was, ", now ", fingerprints[i], "); --force renders it again and replaces them"),
                            i < m.job_lines.size() ? m.job_lines[i] : -1, -1});
    };
    const auto it = past.find(j.id);
    if (force) {
      r.render.push_back(ji);
      continue;
    }
    // The job's entry in the latents file: kept (complete, this job's), another job's, or neither.
    const SavedLatents* saved = nullptr;
    if (latents)
      if (const auto e = latents->entries.find(j.id); e != latents->entries.end()) saved = &e->second;
    const bool latents_other = saved && saved->complete && saved->fingerprint != fingerprints[i];
    const bool latents_kept = !latents || (saved && saved->complete && saved->fingerprint == fingerprints[i]);
    auto done = [&](bool recovered) {
      if (latents_other) return latents_changed(saved->fingerprint);
      if (!latents_kept) return r.render.push_back(ji);  // its video is there, its latents are not
      ++r.skipped;
      if (recovered) r.recovered.push_back(ji);
    };
    // An ok line for this job's video where the job now puts it (a job whose output moved is rendered
    // at its new place; the fingerprint says what a video is, not where).
    const bool ok_here = it != past.end() && it->second.status == JobStatus::kOk &&
                         canonical_path(it->second.output) == canonical_path(j.output);
    if (ok_here && output_intact(j.output, it->second.output_bytes)) {
      if (fingerprints[i] == it->second.fingerprint)
        done(false);
      else
        changed(it->second.fingerprint, "");
      continue;
    }
    // No ok line for this place: the run that wrote the video may have stopped before recording it.
    if (!ok_here && recorded_fingerprint) {
      if (const std::string was = recorded_fingerprint(j); !was.empty()) {
        if (was == fingerprints[i])
          done(true);
        else
          changed(was, " in its metadata");
        continue;
      }
    }
    if (latents_other)
      latents_changed(saved->fingerprint);
    else
      r.render.push_back(ji);
  }
  return r;
}

JobResult recovered_result(const BatchJob& job, const ModelInfo& model, const std::string& frames_sha256) {
  JobResult r;
  r.id = job.spec.id;
  r.index = job.index;
  r.output = job.spec.output;
  r.output_bytes = output_bytes(job.spec.output);
  r.fingerprint = job.fingerprint;
  r.frames = job.spec.frames;
  r.height = job.spec.height;
  r.width = job.spec.width;
  r.parameters_json = job_parameters_json(job.spec, model);
  r.recovered = true;
  r.frames_sha256 = frames_sha256;
  return r;
}

JobSpec prompt_job(const JobFlags& flags, const OutputFormatNames& formats, std::uint64_t random_seed,
                   const std::map<std::string, JobFieldValue>& model_defaults) {
  std::map<std::string, JobFieldValue> values;
  std::string problems;
  for (const auto& [key, text] : flags) {
    const JobField* f = find_job_field(key);
    DLO_ASSERT(f != nullptr && !f->flag.empty(), "flag for the unknown job field '", key, "'");
    std::string problem;
    if (!f->from(kFromPromptFlag))
      problem = "is for batches (--jobs)";
    else if (auto v = parse_job_field(*f, text, formats, &problem))
      values.emplace(key, *v);
    if (!problem.empty()) problems += str(problems.empty() ? "" : "\n  ", "--", f->flag, ": ", problem);
  }
  DLO_CHECK(problems.empty(), problems);
  std::set<std::string> given;
  JobSpec job = resolve_job({&values, &model_defaults}, formats, &given);
  if (!given.count("seed")) job.seed = random_seed;
  if (!given.count("output")) {
    std::string ext;
    for (const auto& f : formats)
      if (f.name == job.format) ext = f.extension;
    job.output = "video" + ext;
  }
  return job;
}

void check_prompt_job(const JobSpec& job, const ModelInfo& model, const OutputFormatNames& formats,
                      const JobFlags& flags) {
  std::string msg;
  for (const auto& p : validate_job(job, model, formats)) {
    const bool flagged = flags.count(p.field) > 0;
    // The manifest's rule: a value from the model's defaults beside a flag that makes it moot
    // (its guidance_2 beside --guidance 1) is no error; any other problem with it is the file's.
    if (!flagged && !p.beside.empty() && flags.count(p.beside) > 0) continue;
    const std::string where = flagged || model.parts.dir.empty() ? str("--", find_job_field(p.field)->flag)
                                                           : str(model_job_defaults_path(model.parts.dir), ": defaults.", p.field);
    msg += str(msg.empty() ? "" : "\n  ", where, ": ", p.message);
  }
  DLO_CHECK(msg.empty(), msg);
}

TopologyRequest batch_topology_request(const TopologyFlags& flags, const std::string& sp_key, const std::string& cfg_key) {
  TopologyRequest r;
  r.sp = flags.sp ? *flags.sp : sp_key.empty() ? 0 : parse_sp(sp_key, "sp");
  r.cfg = flags.cfg ? *flags.cfg : cfg_key.empty() ? TopologyRequest::Cfg::kAuto : parse_cfg_parallel(cfg_key, "cfg_parallel");
  return r;
}

BatchPlan plan_batch(const BatchPlanOptions& o) {
  // Every problem in one run: the manifest's own, then those that need the model's configs and
  // the outputs (a misspelt key and a height that is not a multiple of 16 both show at once).
  const Manifest m = read_manifest(o.manifest, o.flags, o.model, o.output_dir, o.formats);
  std::vector<ManifestProblem> problems = m.problems;
  if (m.model.empty()) throw_manifest_problems(std::move(problems));  // no model: reported among them
  // A transformer given as its own weights: read as given (its errors name it so), planned canonical.
  ModelParts parts{m.model, o.transformer.empty() ? m.transformer : o.transformer,
                   o.transformer_2.empty() ? m.transformer_2 : o.transformer_2, o.vae.empty() ? m.vae : o.vae};
  parts.fused_loras = o.fused_loras.empty() ? m.fused_loras : o.fused_loras;
  ModelInfo model;
  try {
    model = read_model_info(parts);
  } catch (const Error& e) {
    if (problems.empty()) throw;
    problems.push_back({m.path, -1, "", "model", e.what()});
    throw_manifest_problems(std::move(problems));
  }
  for (auto& p : check_manifest(m, model, [&](const JobSpec& j) {
         if (o.check_output) o.check_output(j, model);
       }))
    problems.push_back(std::move(p));
  if (o.check_model) {
    try {
      o.check_model(model);
    } catch (const Error& e) {
      problems.push_back({m.path, -1, "", "model", e.what()});
    }
  }
  if (problems.empty() && o.ranks > 0) {
    // Every job of the manifest, done or not: the topology is the batch's, not its remainder's.
    const bool keys = (!o.topology.sp && !m.sp.empty()) || (!o.topology.cfg && !m.cfg_parallel.empty());
    try {
      std::vector<const JobSpec*> all;
      for (const auto& j : m.jobs) all.push_back(&j);
      check_topology(batch_topology_request(o.topology, m.sp, m.cfg_parallel), model, all, o.ranks);
    } catch (const Error& e) {
      problems.push_back({keys ? m.path : "command line", -1, "", "", e.what()});
    }
  }
  std::string dtypes = o.dtypes;
  if (o.dtypes_with) {
    try {
      dtypes = o.dtypes_with(m.storage_dtype);
    } catch (const Error& e) {
      problems.push_back({m.path, -1, "", "", e.what()});  // e.what() names the key
    }
  }
  BatchPlan p;
  p.storage_dtype = m.storage_dtype;
  p.model = {canonical_path(m.model), parts.transformer.empty() ? "" : canonical_path(parts.transformer),
             parts.transformer_2.empty() ? "" : canonical_path(parts.transformer_2),
             parts.vae_file.empty() ? "" : canonical_path(parts.vae_file)};
  for (LoraSpec l : parts.fused_loras) {
    l.path = canonical_path(l.path);
    p.model.fused_loras.push_back(std::move(l));
  }
  p.sp = m.sp;
  p.cfg_parallel = m.cfg_parallel;
  p.output_dir = canonical_path(m.output_dir);
  p.results = p.output_dir + "/" + kResultsFileName;
  if (!o.latents.empty() && !m.model.empty() &&
      (canonical_path(o.latents) + "/").rfind(canonical_path(m.model) + "/", 0) == 0)
    problems.push_back({"command line", -1, "", "--save-latents",
                        str("'", o.latents, "' is inside the model folder '", m.model, "'")});
  std::vector<std::string> fingerprints;
  if (problems.empty() && !o.dry_run && o.hold_output_dir) {
    // Held before results.jsonl and the outputs are read: a batch ending meanwhile cannot leave
    // this one a stale plan. (Only the output folder itself is made this early.)
    if (!o.latents.empty() && o.hold_latents) o.hold_latents(o.latents);
    make_folders(p.output_dir);
    o.hold_output_dir(p.output_dir);
  }
  if (problems.empty()) {
    p.model_identity = model_identity(parts);
    for (const auto& j : m.jobs) fingerprints.push_back(job_fingerprint(j, model, p.model_identity, dtypes));
    std::optional<LatentsIndex> latents;
    if (!o.latents.empty() && o.read_latents) latents = o.read_latents(o.latents);
    const ResumeResult r = plan_resume(m, fingerprints, read_results(p.results), o.force, o.recorded_fingerprint,
                                       latents ? &*latents : nullptr);
    problems = r.problems;
    p.skipped = r.skipped;
    auto planned = [&](std::int64_t i) {
      JobSpec spec = m.jobs[static_cast<std::size_t>(i)];
      spec.output = canonical_path(spec.output);
      return BatchJob{std::move(spec), i, fingerprints[static_cast<std::size_t>(i)]};
    };
    for (const std::int64_t i : r.render) p.jobs.push_back(planned(i));
    for (const std::int64_t i : r.recovered) p.recovered.push_back(planned(i));
  }
  if (!problems.empty()) throw_manifest_problems(std::move(problems));
  if (o.dry_run) return p;  // writes nothing
  create_output_folders(m);
  for (const auto& j : m.jobs) remove_stale_temporaries(j.output);  // left by a killed run, not a running one
  return p;
}

}  // namespace dlo
