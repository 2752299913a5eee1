#include "dlo/pipeline/job.h"

#include <sys/stat.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/models/json_config.h"

namespace dlo {
namespace {

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// "12.5" not "12.500000"; integers without a fraction.
std::string number(double v) {
  std::ostringstream os;
  os.precision(10);
  os << v;
  return os.str();
}

}  // namespace

const char* dlo_version() {
#ifdef DLO_VERSION
  return DLO_VERSION;
#else
  return "unknown";
#endif
}

std::int64_t ModelInfo::spatial_multiple() const { return vae.scale_factor_spatial * transformer.patch_size[1]; }
std::int64_t ModelInfo::temporal_factor() const { return vae.scale_factor_temporal; }

std::vector<std::int64_t> ModelInfo::latent_shape(const JobSpec& job) const {
  return {1, transformer.in_channels, (job.frames - 1) / vae.scale_factor_temporal + 1,
          job.height / vae.scale_factor_spatial, job.width / vae.scale_factor_spatial};
}

ModelInfo read_model_info(const std::string& dir) {
  return with_context(str("model folder '", dir, "'"), [&] {
    DLO_CHECK(is_dir(dir), "not a folder");
    std::vector<std::string> missing;
    for (const char* part : {"transformer", "vae", "text_encoder", "tokenizer", "scheduler"})
      if (!is_dir(dir + "/" + part)) missing.push_back(part);
    if (!missing.empty()) {
      std::string list;
      for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m + "/";
      DLO_CHECK(false, "lacks ", list, " (a diffusers Wan2.1 text-to-video folder has transformer/, vae/, ",
                "text_encoder/, tokenizer/ and scheduler/)");
    }
    check_regular_file(dir + "/model_index.json");
    ModelInfo info;
    info.dir = dir;
    info.transformer = WanTransformerConfig::from_json(JsonConfig::load(dir + "/transformer/config.json"));
    info.vae = WanVaeConfig::from_json(JsonConfig::load(dir + "/vae/config.json"));
    info.text_encoder = Umt5Config::from_json(JsonConfig::load(dir + "/text_encoder/config.json"));
    info.scheduler = NoiseSchedulerConfig::from_json_file(dir + "/scheduler/scheduler_config.json");
    DLO_CHECK(info.text_encoder.d_model == info.transformer.text_dim, "the text encoder's d_model (",
              info.text_encoder.d_model, ") differs from the transformer's text_dim (", info.transformer.text_dim, ")");
    DLO_CHECK(info.transformer.in_channels == info.vae.z_dim && info.transformer.out_channels == info.vae.z_dim,
              "the transformer's latent channels (in ", info.transformer.in_channels, ", out ",
              info.transformer.out_channels, ") differ from the VAE's z_dim (", info.vae.z_dim, ")");
    return info;
  });
}

std::vector<FieldError> validate_job(const JobSpec& job, const ModelInfo& info) {
  std::vector<FieldError> e;
  const std::int64_t m = info.spatial_multiple(), t = info.temporal_factor();
  if (job.steps < 1) e.push_back({"steps", str("must be >= 1, got ", job.steps)});
  for (auto [name, v] : {std::pair<const char*, std::int64_t>{"height", job.height}, {"width", job.width}}) {
    if (v < 1)
      e.push_back({name, str("must be positive, got ", v)});
    else if (v % m != 0)
      e.push_back({name, str(v, " is not a multiple of ", m, " (the VAE's spatial factor ", info.vae.scale_factor_spatial,
                             " x the transformer's patch ", info.transformer.patch_size[1], "); e.g. ",
                             std::max<std::int64_t>(m, v / m * m))});
  }
  if (job.frames < 1 || (job.frames - 1) % t != 0)
    e.push_back({"frames", str(job.frames, " is not of the form ", t, "k+1 (e.g. ",
                               std::max<std::int64_t>(1, (job.frames - 1) / t * t + 1), "; Wan's default is 81)")});
  if (!std::isfinite(job.guidance)) e.push_back({"guidance", "must be a finite number"});
  if (job.flow_shift && !(std::isfinite(*job.flow_shift) && *job.flow_shift > 0))
    e.push_back({"flow_shift", str("must be a positive number, got ", number(*job.flow_shift))});
  if (job.fps < 1 || job.fps > 240) e.push_back({"fps", str("must be in 1..240, got ", job.fps)});
  if (job.crf < 0 || job.crf > 51) e.push_back({"crf", str("must be in 0..51 (libx264), got ", job.crf)});
  if (job.format != "mp4" && job.format != "png" && job.format != "ffv1")
    e.push_back({"format", str("'", job.format, "' is not mp4, png or ffv1")});
  if (job.output.empty()) e.push_back({"output", "is empty"});
  return e;
}

NoiseSchedulerConfig job_scheduler_config(const JobSpec& job, const ModelInfo& info) {
  return info.scheduler.with_overrides(job.scheduler, job.flow_shift);
}

std::string job_parameters_json(const JobSpec& job, const ModelInfo& info) {
  const NoiseSchedulerConfig s = job_scheduler_config(job, info);
  nlohmann::ordered_json j = {
      {"id", job.id},
      {"prompt", job.prompt},
      {"negative_prompt", job.guided() ? job.negative_prompt : ""},
      {"seed", job.seed},
      {"steps", job.steps},
      {"guidance", job.guidance},
      {"scheduler", noise_scheduler_name(s.kind)},
      {"flow_shift", s.flow_shift},
      {"height", job.height},
      {"width", job.width},
      {"frames", job.frames},
      {"fps", job.fps},
      {"model", info.dir},
      {"dlo_version", dlo_version()},
  };
  return j.dump();
}

std::string jobs_to_json(const std::vector<JobSpec>& jobs) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& j : jobs) {
    nlohmann::json o = {{"id", j.id},         {"prompt", j.prompt}, {"negative_prompt", j.negative_prompt},
                        {"seed", j.seed},     {"steps", j.steps},   {"guidance", j.guidance},
                        {"height", j.height}, {"width", j.width},   {"frames", j.frames},
                        {"output", j.output}, {"format", j.format}, {"fps", j.fps},
                        {"crf", j.crf},       {"preset", j.preset}, {"save_latents", j.save_latents}};
    o["scheduler"] = j.scheduler ? nlohmann::json(noise_scheduler_name(*j.scheduler)) : nlohmann::json(nullptr);
    o["flow_shift"] = j.flow_shift ? nlohmann::json(*j.flow_shift) : nlohmann::json(nullptr);
    arr.push_back(std::move(o));
  }
  return arr.dump();
}

std::vector<JobSpec> jobs_from_json(const std::string& text) {
  try {
    std::vector<JobSpec> jobs;
    for (const auto& o : nlohmann::json::parse(text)) {
      JobSpec j;
      j.id = o.at("id");
      j.prompt = o.at("prompt");
      j.negative_prompt = o.at("negative_prompt");
      j.seed = o.at("seed");
      j.steps = o.at("steps");
      j.guidance = o.at("guidance");
      j.height = o.at("height");
      j.width = o.at("width");
      j.frames = o.at("frames");
      j.output = o.at("output");
      j.format = o.at("format");
      j.fps = o.at("fps");
      j.crf = o.at("crf");
      j.preset = o.at("preset");
      j.save_latents = o.at("save_latents");
      if (!o.at("scheduler").is_null()) j.scheduler = parse_noise_scheduler_kind(o.at("scheduler"));
      if (!o.at("flow_shift").is_null()) j.flow_shift = o.at("flow_shift").get<double>();
      jobs.push_back(std::move(j));
    }
    return jobs;
  } catch (const nlohmann::json::exception& e) {
    throw Error(str("a job list that is not valid JSON: ", e.what()));
  }
}

std::string job_parameters_text(const JobSpec& job, const ModelInfo& info) {
  const NoiseSchedulerConfig s = job_scheduler_config(job, info);
  return str("prompt: ", job.prompt, "; negative prompt: ", job.guided() ? job.negative_prompt : "(none: no guidance)",
             "; seed ", job.seed, "; ", job.steps, " steps; guidance ", number(job.guidance), "; scheduler ",
             noise_scheduler_name(s.kind), " (flow shift ", number(s.flow_shift), "); ", job.width, "x", job.height,
             ", ", job.frames, " frames at ", job.fps, " fps; model ", info.dir, "; dlo ", dlo_version());
}

}  // namespace dlo
