#include "dlo/pipeline/batch_plan.h"

#include <dirent.h>
#include <sys/stat.h>

#include <set>

#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/common/file.h"

namespace dlo {

using json = nlohmann::json;

std::string plan_to_json(const BatchPlan& p) {
  std::vector<JobSpec> specs;
  json meta = json::array();
  for (const auto& j : p.jobs) {
    specs.push_back(j.spec);
    meta.push_back({{"index", j.index}, {"fingerprint", j.fingerprint}});
  }
  return json({{"model", p.model_dir},
               {"output_dir", p.output_dir},
               {"results", p.results},
               {"skipped", p.skipped},
               {"jobs", json::parse(jobs_to_json(specs))},
               {"job_meta", meta}})
      .dump();
}

BatchPlan plan_from_json(const std::string& text) {
  try {
    const json j = json::parse(text);
    BatchPlan p;
    p.model_dir = j.at("model");
    p.output_dir = j.at("output_dir");
    p.results = j.at("results");
    p.skipped = j.at("skipped");
    const std::vector<JobSpec> specs = jobs_from_json(j.at("jobs").dump());
    const json& meta = j.at("job_meta");
    DLO_CHECK_KIND(ErrorKind::kInternal, meta.size() == specs.size(), "a plan whose jobs and job_meta differ in length");
    for (std::size_t i = 0; i < specs.size(); ++i)
      p.jobs.push_back({specs[i], meta[i].at("index").get<std::int64_t>(), meta[i].at("fingerprint").get<std::string>()});
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
                         const std::map<std::string, PastResult>& past, bool force) {
  DLO_ASSERT(fingerprints.size() == m.jobs.size(), fingerprints.size(), " fingerprints for ", m.jobs.size(), " jobs");
  ResumeResult r;
  for (std::size_t i = 0; i < m.jobs.size(); ++i) {
    const JobSpec& j = m.jobs[i];
    const auto it = past.find(j.id);
    const bool done = it != past.end() && it->second.status == "ok" && output_intact(j.output, it->second.output_bytes);
    if (done && !force) {
      if (fingerprints[i] == it->second.fingerprint) {
        ++r.skipped;
        continue;
      }
      r.problems.push_back({m.path, static_cast<std::int64_t>(i), j.id, "",
                            str("changed since its video '", j.output, "' was rendered (parameters fingerprint ",
                                it->second.fingerprint, ", now ", fingerprints[i], "); --force renders it again"),
                            i < m.job_lines.size() ? m.job_lines[i] : -1, -1});
      continue;
    }
    r.render.push_back(static_cast<std::int64_t>(i));
  }
  return r;
}

JobSpec prompt_job(const JobFlags& flags, const OutputFormatNames& formats, std::uint64_t random_seed) {
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
  JobSpec job = resolve_job({&values}, formats, &given);
  if (!given.count("seed")) job.seed = random_seed;
  if (!given.count("output")) {
    std::string ext;
    for (const auto& f : formats)
      if (f.name == job.format) ext = f.extension;
    job.output = "video" + ext;
  }
  return job;
}

void check_prompt_job(const JobSpec& job, const ModelInfo& model, const OutputFormatNames& formats) {
  std::string msg;
  for (const auto& p : validate_job(job, model, formats))
    msg += str(msg.empty() ? "" : "\n  ", "--", find_job_field(p.field)->flag, ": ", p.message);
  DLO_CHECK(msg.empty(), msg);
}

BatchPlan plan_batch(const BatchPlanOptions& o) {
  const Manifest m = load_manifest(o.manifest, o.flags, o.model, o.output_dir, o.formats);
  const ModelInfo model = read_model_info(m.model);
  auto problems = check_manifest(m, model, [&](const JobSpec& j) {
    if (o.check_output) o.check_output(j, model);
  });
  BatchPlan p;
  p.model_dir = m.model;
  p.output_dir = m.output_dir;
  p.results = m.output_dir + "/" + kResultsFileName;
  std::vector<std::string> fingerprints;
  if (problems.empty()) {
    const std::string identity = model_identity(m.model);
    for (const auto& j : m.jobs) fingerprints.push_back(job_fingerprint(j, model, identity, o.dtypes));
    const ResumeResult r = plan_resume(m, fingerprints, read_results(p.results), o.force);
    problems = r.problems;
    p.skipped = r.skipped;
    for (const std::int64_t i : r.render)
      p.jobs.push_back({m.jobs[static_cast<std::size_t>(i)], i, fingerprints[static_cast<std::size_t>(i)]});
  }
  if (!problems.empty()) throw ManifestError(std::move(problems));
  if (o.dry_run) return p;  // writes nothing
  create_output_folders(m);
  for (const auto& j : m.jobs) remove_stale_temporaries(j.output);  // left by a killed run
  return p;
}

}  // namespace dlo
