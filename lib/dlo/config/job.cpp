#include "dlo/config/job.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/common/text.h"
#include "dlo/config/version.h"

namespace dlo {
namespace {

using ojson = nlohmann::ordered_json;

// "12.5" not "12.500000"; integers without a fraction.
std::string number(double v) {
  std::ostringstream os;
  os.precision(10);
  os << v;
  return os.str();
}

constexpr std::int64_t kMaxSteps = 10000;
constexpr std::int64_t kMaxPixels = 65536;  // per side; the model's RoPE bounds it further
constexpr std::int64_t kMaxFrames = 65537;

// ---- value accessors for the rows
template <typename T>
const T* as(const JobFieldValue& v) {
  return std::get_if<T>(&v);
}

std::function<std::string(const JobFieldValue&)> int_check(std::function<std::string(std::int64_t)> f) {
  return [f](const JobFieldValue& v) { return as<std::int64_t>(v) ? f(*as<std::int64_t>(v)) : "must be an integer"; };
}
std::function<std::string(const JobFieldValue&)> number_check(std::function<std::string(double)> f) {
  return [f](const JobFieldValue& v) { return as<double>(v) ? f(*as<double>(v)) : "must be a number"; };
}
std::function<std::string(const JobFieldValue&)> text_check(std::function<std::string(const std::string&)> f) {
  return [f](const JobFieldValue& v) { return as<std::string>(v) ? f(*as<std::string>(v)) : "must be a string"; };
}

std::string positive_size(std::int64_t v, std::int64_t max) {
  if (v < 1) return str("must be positive, got ", v);
  if (v > max) return str("must be at most ", max, ", got ", v);
  return "";
}

// Text fields: valid UTF-8 without NUL bytes (a NUL would cut the metadata and the messages).
std::string text_problem(const std::string& s) {
  if (s.find('\0') != std::string::npos) return "holds a NUL byte";
  std::size_t bad = 0;
  if (!valid_utf8(s, &bad)) return str("is not valid UTF-8 (byte ", bad, ")");
  return "";
}

std::vector<JobField> make_table() {
  constexpr unsigned kAll = kFromJob | kFromDefaults | kFromBatchFlag | kFromPromptFlag;
  constexpr unsigned kAllModel = kAll | kFromModel;  // also a model folder's recommendation
  std::vector<JobField> t;
  auto add = [&](JobField f) { t.push_back(std::move(f)); };
  // Text members.
  auto text = [](std::string JobSpec::*m) {
    return std::make_pair(
        std::function<std::optional<JobFieldValue>(const JobSpec&)>(
            [m](const JobSpec& j) { return std::optional<JobFieldValue>(j.*m); }),
        std::function<void(JobSpec&, const JobFieldValue&)>(
            [m](JobSpec& j, const JobFieldValue& v) { j.*m = std::get<std::string>(v); }));
  };
  auto integer = [](std::int64_t JobSpec::*m) {
    return std::make_pair(
        std::function<std::optional<JobFieldValue>(const JobSpec&)>(
            [m](const JobSpec& j) { return std::optional<JobFieldValue>(j.*m); }),
        std::function<void(JobSpec&, const JobFieldValue&)>(
            [m](JobSpec& j, const JobFieldValue& v) { j.*m = std::get<std::int64_t>(v); }));
  };

  {
    auto [get, set] = text(&JobSpec::id);
    add({"id", "", JobFieldType::kText, JobFieldEffect::kNone, kFromJob, true,
         "the job's name: its output's and its results.jsonl line's", "`job-NNNN` (below)",
         "1..128 of `A-Z a-z 0-9 . _ -`, not starting with `.` or `-`; unique", {}, false, get, set,
         text_check([](const std::string& s) -> std::string {
           if (!is_safe_job_id(s))
             return str("'", s, "' is not a safe file name: use 1..128 of A-Z a-z 0-9 . _ -, not starting with '.' or '-'");
           return "";
         }),
         {}});
  }
  {
    auto [get, set] = text(&JobSpec::prompt);
    add({"prompt", "prompt", JobFieldType::kText, JobFieldEffect::kFrames, kFromJob | kFromPromptFlag, true,
         "what to render", "required (`\"\"` is a valid, empty prompt, as in diffusers)", "valid UTF-8", {}, false, get,
         set, text_check(text_problem), {}});
  }
  {
    auto [get, set] = text(&JobSpec::negative_prompt);
    add({"negative_prompt", "negative-prompt", JobFieldType::kText, JobFieldEffect::kFrames, kAllModel, true,
         "what to steer away from (with guidance > 1)", "`\"\"` (used only when guidance > 1)", "valid UTF-8", {},
         false, get, set, text_check(text_problem),
         [](const JobSpec& j, const ModelInfo&) { return std::optional<JobFieldValue>(j.guided() ? j.negative_prompt : ""); }});
  }
  add({"seed", "seed", JobFieldType::kSeed, JobFieldEffect::kFrames, kAll, true,
       "seed of the initial noise (torch.Generator(\"cpu\").manual_seed)",
       "from the id (below); one prompt: random, printed and recorded", "", {}, false,
       [](const JobSpec& j) { return std::optional<JobFieldValue>(j.seed); },
       [](JobSpec& j, const JobFieldValue& v) { j.seed = std::get<std::uint64_t>(v); },
       [](const JobFieldValue& v) -> std::string { return as<std::uint64_t>(v) ? "" : "must be an integer"; }, {}});
  {
    auto [get, set] = integer(&JobSpec::steps);
    add({"steps", "steps", JobFieldType::kInteger, JobFieldEffect::kFrames, kAllModel, true, "denoising steps", "50",
         str("1..", kMaxSteps), {}, false, get, set, int_check([](std::int64_t v) -> std::string {
           if (v < 1) return str("must be >= 1, got ", v);
           if (v > kMaxSteps) return str("must be at most ", kMaxSteps, ", got ", v);
           return "";
         }),
         {}});
  }
  add({"guidance", "guidance", JobFieldType::kNumber, JobFieldEffect::kFrames, kAllModel, true,
       "classifier-free guidance scale (<= 1: off, no negative prompt)", "5.0 (<= 1: no classifier-free guidance)",
       "finite", {}, false, [](const JobSpec& j) { return std::optional<JobFieldValue>(j.guidance); },
       [](JobSpec& j, const JobFieldValue& v) { j.guidance = std::get<double>(v); },
       number_check([](double v) -> std::string { return std::isfinite(v) ? "" : "must be a finite number"; }), {}});
  add({"guidance_2", "guidance-2", JobFieldType::kNumber, JobFieldEffect::kFrames, kAllModel, true,
       "guidance scale of the low-noise expert (Wan2.2 A14B; guidance > 1 turns guidance on for both)",
       "`guidance` (models with two experts only)", "finite; only for a model with transformer_2", {}, false,
       [](const JobSpec& j) { return j.guidance_2 ? std::optional<JobFieldValue>(*j.guidance_2) : std::nullopt; },
       [](JobSpec& j, const JobFieldValue& v) { j.guidance_2 = std::get<double>(v); },
       number_check([](double v) -> std::string { return std::isfinite(v) ? "" : "must be a finite number"; }),
       [](const JobSpec& j, const ModelInfo& m) -> std::optional<JobFieldValue> {
         if (!m.two_experts()) return j.guidance_2 ? std::optional<JobFieldValue>(*j.guidance_2) : std::nullopt;
         if (!j.guided()) return std::nullopt;  // no guidance: the scale decides nothing
         return j.guidance_2.value_or(j.guidance);
       }});
  add({"boundary_ratio", "boundary-ratio", JobFieldType::kNumber, JobFieldEffect::kFrames, kAllModel, true,
       "steps with timestep >= boundary_ratio x num_train_timesteps run transformer/, the rest transformer_2/ "
       "(Wan2.2 A14B)",
       "model_index.json's (0.875 for T2V-A14B)", "in [0, 1]; only for a model with transformer_2", {}, false,
       [](const JobSpec& j) { return j.boundary_ratio ? std::optional<JobFieldValue>(*j.boundary_ratio) : std::nullopt; },
       [](JobSpec& j, const JobFieldValue& v) { j.boundary_ratio = std::get<double>(v); },
       number_check([](double v) -> std::string {
         return std::isfinite(v) && v >= 0 && v <= 1 ? "" : str("must be a number in [0, 1], got ", number(v));
       }),
       [](const JobSpec& j, const ModelInfo& m) -> std::optional<JobFieldValue> {
         if (!m.two_experts()) return j.boundary_ratio ? std::optional<JobFieldValue>(*j.boundary_ratio) : std::nullopt;
         return j.boundary_ratio.value_or(m.boundary_ratio.value_or(0));
       }});
  for (const char* side : {"height", "width"}) {
    auto [get, set] = integer(side[0] == 'h' ? &JobSpec::height : &JobSpec::width);
    add({side, side, JobFieldType::kInteger, JobFieldEffect::kFrames, kAllModel, true,
         str("pixels, a multiple of the model's (16 for Wan2.1)"), side[0] == 'h' ? "480" : "832",
         str("1..", kMaxPixels, "; a multiple of the model's (16 for Wan2.1); within the transformer's RoPE"), {}, false,
         get, set, int_check([](std::int64_t v) { return positive_size(v, kMaxPixels); }), {}});
  }
  {
    auto [get, set] = integer(&JobSpec::frames);
    add({"frames", "frames", JobFieldType::kInteger, JobFieldEffect::kFrames, kAllModel, true, "frames, 4k+1 for Wan2.1",
         "81", str("1..", kMaxFrames, "; of the form 4k+1 for Wan2.1"), {}, false, get, set,
         int_check([](std::int64_t v) { return positive_size(v, kMaxFrames); }), {}});
  }
  {
    auto [get, set] = integer(&JobSpec::fps);
    add({"fps", "fps", JobFieldType::kInteger, JobFieldEffect::kVideo, kAllModel, true, "frames per second of the video",
         "16", "1..240", {}, false, get, set, int_check([](std::int64_t v) -> std::string {
           return v < 1 || v > 240 ? str("must be in 1..240, got ", v) : "";
         }),
         {}});
  }
  add({"scheduler", "scheduler", JobFieldType::kText, JobFieldEffect::kFrames, kAll, true,
       "noise scheduler (default: the model folder's)", "the model folder's", "", {"unipc", "euler"}, false,
       [](const JobSpec& j) {
         return j.scheduler ? std::optional<JobFieldValue>(std::string(noise_scheduler_name(*j.scheduler))) : std::nullopt;
       },
       [](JobSpec& j, const JobFieldValue& v) { j.scheduler = parse_noise_scheduler_kind(std::get<std::string>(v)); },
       text_check([](const std::string& s) -> std::string {
         return s == "unipc" || s == "euler" ? "" : str("unknown noise scheduler '", s, "' (unipc, euler)");
       }),
       [](const JobSpec& j, const ModelInfo& m) {
         return std::optional<JobFieldValue>(std::string(noise_scheduler_name(job_scheduler_config(j, m).kind)));
       }});
  add({"loras", "lora", JobFieldType::kText, JobFieldEffect::kFrames, kAll, true,
       "LoRAs applied to this job alone, unfused, beside the shared weights: [high=|low=]PATH[:STRENGTH], separated by "
       "commas (a manifest may give a list)", "none", "each entry PATH[:STRENGTH], a regular file; high=/low= as the model has experts",
       {}, false,
       [](const JobSpec& j) { return j.loras.empty() ? std::nullopt : std::optional<JobFieldValue>(j.loras); },
       [](JobSpec& j, const JobFieldValue& v) { j.loras = std::get<std::string>(v); },
       text_check([](const std::string& s) -> std::string {
         try {
           (void)parse_lora_list(s, "loras");
         } catch (const Error& e) {
           const std::string m = e.what();
           return m.rfind("loras: ", 0) == 0 ? m.substr(7) : m;
         }
         return "";
       }),
       {}});
  add({"flow_shift", "flow-shift", JobFieldType::kNumber, JobFieldEffect::kFrames, kAll, true,
       "flow shift (default: the model folder's; Wan suggests 3 for 480p, 5 for 720p)", "the model folder's",
       "finite, > 0", {}, false,
       [](const JobSpec& j) { return j.flow_shift ? std::optional<JobFieldValue>(*j.flow_shift) : std::nullopt; },
       [](JobSpec& j, const JobFieldValue& v) { j.flow_shift = std::get<double>(v); },
       number_check([](double v) -> std::string {
         if (!std::isfinite(v)) return "must be a finite number";
         return v > 0 ? "" : str("must be a positive number, got ", number(v));
       }),
       [](const JobSpec& j, const ModelInfo& m) { return std::optional<JobFieldValue>(job_scheduler_config(j, m).flow_shift); }});
  add({"schedule", "schedule", JobFieldType::kText, JobFieldEffect::kFrames, kAllModel, true,
       "the steps' sigmas: `default` (the scheduler's own) or `lightx2v` (the distilled models' grid "
       "shift(1 - i/steps), Euler to 0; docs/distilled.md)",
       "`default`", "`lightx2v` not with scheduler `unipc`", {"default", "lightx2v"}, false,
       [](const JobSpec& j) {
         return j.schedule ? std::optional<JobFieldValue>(std::string(noise_schedule_name(*j.schedule))) : std::nullopt;
       },
       [](JobSpec& j, const JobFieldValue& v) { j.schedule = parse_noise_schedule(std::get<std::string>(v)); },
       text_check([](const std::string& s) -> std::string {
         return s == "default" || s == "lightx2v" ? "" : str("unknown schedule '", s, "' (default, lightx2v)");
       }),
       [](const JobSpec& j, const ModelInfo&) -> std::optional<JobFieldValue> {
         // The default is left out, so that the fingerprints of jobs without a schedule stay as they were.
         if (j.schedule.value_or(NoiseSchedule::kDefault) == NoiseSchedule::kDefault) return std::nullopt;
         return std::string(noise_schedule_name(*j.schedule));
       }});
  {
    auto [get, set] = text(&JobSpec::format);
    add({"format", "format", JobFieldType::kText, JobFieldEffect::kVideo, kAll, false,
         "output format (mp4: H.264; png: a folder of numbered PNGs; ffv1: lossless MKV)", "`mp4` (the build's first)",
         "one of the build's formats", {}, true, get,
         set, {}, {}});
  }
  {
    auto [get, set] = integer(&JobSpec::crf);
    add({"crf", "crf", JobFieldType::kInteger, JobFieldEffect::kVideo, kAll, false,
         "H.264 quality, 0 (lossless) .. 51", "25", "0..51 (mp4)", {}, false, get, set,
         int_check([](std::int64_t v) -> std::string { return v < 0 || v > 51 ? str("must be in 0..51 (libx264), got ", v) : ""; }),
         {}});
  }
  {
    auto [get, set] = text(&JobSpec::preset);
    add({"preset", "preset", JobFieldType::kText, JobFieldEffect::kVideo, kAll, false,
         "libx264 preset (ultrafast .. veryslow)", "`medium`", "a libx264 preset (mp4)", {}, false, get, set,
         text_check([](const std::string& s) -> std::string { return s.empty() ? "is empty" : text_problem(s); }), {}});
  }
  {
    auto [get, set] = text(&JobSpec::output);
    add({"output", "out", JobFieldType::kText, JobFieldEffect::kVideo, kFromJob | kFromPromptFlag, false,
         "the video file, or the folder of a png job", "`<id>.mp4` (mp4), `<id>.mkv` (ffv1), a folder `<id>` (png)",
         "unique; its folder can be created", {}, false, get, set,
         text_check([](const std::string& s) -> std::string { return s.empty() ? "is empty" : text_problem(s); }), {}});
  }
  {
    auto [get, set] = text(&JobSpec::save_latents);
    add({"save_latents", "save-latents", JobFieldType::kText, JobFieldEffect::kNone, kFromPromptFlag, false,
         "keep the final latents before decoding (FILE.safetensors)", "none", "", {}, false, get, set,
         text_check(text_problem), {}});
  }
  return t;
}

ojson to_json_value(const JobFieldValue& v) {
  return std::visit([](const auto& x) { return ojson(x); }, v);
}

}  // namespace

std::string output_name_problem(const std::string& s) {
  if (s.empty()) return "is empty";
  if (s.find_first_not_of(" \t") == std::string::npos) return "is blank";
  if (std::isspace(static_cast<unsigned char>(s.front())) || std::isspace(static_cast<unsigned char>(s.back())))
    return "begins or ends with a space";
  if (s == "-") return "'-' is not a file (dlo writes no video to standard output)";
  return text_problem(s);
}

const char* dlo_version() { return kDloVersion; }

bool is_safe_job_id(const std::string& id) {
  if (id.empty() || id.size() > 128 || id[0] == '.' || id[0] == '-') return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
  });
}

const std::vector<JobField>& job_fields() {
  static const std::vector<JobField> table = make_table();
  return table;
}

const JobField* find_job_field(const std::string& key) {
  for (const auto& f : job_fields())
    if (f.key == key) return &f;
  return nullptr;
}

std::string choice_list(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

std::string job_field_text(const JobFieldValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* u = std::get_if<std::uint64_t>(&v)) return std::to_string(*u);
  if (const auto* i = std::get_if<std::int64_t>(&v)) return std::to_string(*i);
  return number(std::get<double>(v));
}

std::string check_job_field(const JobField& f, const JobFieldValue& v, const OutputFormatNames& formats) {
  if (f.app_choices) {
    const auto* s = std::get_if<std::string>(&v);
    if (!s) return "must be a string";
    std::vector<std::string> names;
    for (const auto& fmt : formats) names.push_back(fmt.name);
    if (std::find(names.begin(), names.end(), *s) == names.end()) {
      if (std::string p = text_problem(*s); !p.empty()) return p;
      return str("'", *s, "' is not ", choice_list(names));
    }
    return "";
  }
  return f.check ? f.check(v) : "";
}

std::optional<JobFieldValue> parse_job_field(const JobField& f, const std::string& text,
                                             const OutputFormatNames& formats, std::string* problem) {
  const auto bad = [&](std::string msg) {
    *problem = std::move(msg);
    return std::optional<JobFieldValue>{};
  };
  JobFieldValue v;
  std::string t = text;
  const bool negative = !t.empty() && t[0] == '-';
  if (!t.empty() && t[0] == '+') t.erase(0, 1);
  switch (f.type) {
    case JobFieldType::kText:
      v = text;
      break;
    case JobFieldType::kNumber: {
      static const std::set<std::string> nonfinite = {".inf", ".Inf", ".INF", "+.inf", "-.inf", "-.Inf", "-.INF",
                                                      ".nan", ".NaN", ".NAN", "inf", "-inf", "nan", "infinity"};
      if (nonfinite.count(text)) return bad(str("must be a finite number, got '", text, "'"));
      const bool digits = !t.empty() && t.find_first_not_of("0123456789.eE+-") == std::string::npos &&
                          t.find_first_of("0123456789") != std::string::npos;
      char* end = nullptr;
      const double d = digits ? std::strtod(t.c_str(), &end) : 0.0;
      if (!digits || end != t.c_str() + t.size()) return bad(str("must be a number, got '", text, "'"));
      v = d;
      break;
    }
    case JobFieldType::kInteger:
    case JobFieldType::kSeed: {
      const std::string body = negative ? t.substr(1) : t;
      const bool digits = !body.empty() && body.find_first_not_of("0123456789") == std::string::npos;
      if (!digits) return bad(str("must be an integer, got '", text, "'"));
      if (f.type == JobFieldType::kSeed) {
        if (negative) return bad(str("must be >= 0 (a seed is 0 .. 18446744073709551615), got ", text));
        std::uint64_t u = 0;
        const auto r = std::from_chars(body.data(), body.data() + body.size(), u);
        if (r.ec != std::errc()) return bad(str("out of range (a seed is 0 .. 18446744073709551615), got ", text));
        v = u;
      } else {
        std::int64_t i = 0;
        const auto r = std::from_chars(t.data(), t.data() + t.size(), i);
        if (r.ec != std::errc()) return bad(str("out of range, got ", text));
        v = i;
      }
      break;
    }
  }
  if (std::string p = check_job_field(f, v, formats); !p.empty()) return bad(p);
  return v;
}

JobSpec resolve_job(const std::vector<const std::map<std::string, JobFieldValue>*>& layers,
                    const OutputFormatNames& formats, std::set<std::string>* given) {
  JobSpec job;
  for (const auto& f : job_fields())
    for (const auto* layer : layers) {
      if (!layer) continue;
      if (auto it = layer->find(f.key); it != layer->end()) {
        f.set(job, it->second);
        if (given) given->insert(f.key);
        break;
      }
    }
  if (job.format.empty() && !formats.empty()) job.format = formats.front().name;
  return job;
}

std::string model_job_defaults_path(const std::string& dir) {
  return (dir.empty() || dir.back() == '/' ? dir : dir + "/") + kModelDefaultsFile;
}

std::map<std::string, JobFieldValue> read_model_job_defaults(const std::string& dir, std::vector<FieldError>* problems) {
  const std::string path = model_job_defaults_path(dir);
  std::map<std::string, JobFieldValue> out;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return out;  // a folder without recommendations
  std::vector<FieldError> found;
  auto add = [&](const std::string& field, const std::string& message) { found.push_back({field, message}); };
  // Keys given twice in one object ("defaults.steps"): JSON keeps the last silently, a manifest
  // refuses them, and so does this file.
  struct Object {
    std::string name;  // "" for the top level, else the key it is the value of
    std::set<std::string> keys;
    std::string last;  // its last key, the name of an object that follows
  };
  std::vector<Object> open;
  std::set<std::string> twice;
  const ojson::parser_callback_t track = [&](int, ojson::parse_event_t event, ojson& parsed) {
    if (event == ojson::parse_event_t::object_start) {
      open.push_back({open.empty() ? "" : open.back().last, {}, {}});
    } else if (event == ojson::parse_event_t::object_end && !open.empty()) {
      open.pop_back();
    } else if (event == ojson::parse_event_t::key && !open.empty()) {
      Object& o = open.back();
      o.last = parsed.get<std::string>();
      const std::string where = o.name.empty() ? o.last : o.name + "." + o.last;
      if (!o.keys.insert(o.last).second && twice.insert(where).second)
        add(where, "given twice (JSON would keep the last value silently; give each key once)");
    }
    return true;
  };
  ojson doc;
  try {
    doc = ojson::parse(read_file(path), track);
    if (!doc.is_object()) add("", "must be a JSON object with the key \"defaults\"");
  } catch (const ojson::exception& e) {
    add("", str("not valid JSON: ", e.what()));
  } catch (const Error& e) {
    add("", e.what());
  }
  if (!doc.is_object()) doc = ojson::object();
  for (auto it = doc.begin(); it != doc.end(); ++it)
    if (it.key() != "defaults" && it.key() != "about") add(it.key(), "unknown key (dlo_defaults.json has defaults and about)");
  if (doc.contains("defaults")) {
    const ojson& d = doc["defaults"];
    if (!d.is_object()) add("defaults", "must be an object of job fields");
    std::vector<std::string> allowed;  // the fields a model folder may recommend, for messages
    for (const auto& row : job_fields())
      if (row.from(kFromModel)) allowed.push_back(row.key);
    for (auto it = d.is_object() ? d.begin() : d.end(); it != d.end(); ++it) {
      const std::string where = "defaults." + it.key();
      if (twice.count(where)) continue;  // reported
      const JobField* f = find_job_field(it.key());
      if (!f || !f->from(kFromModel)) {
        add(where, str(f ? "is not a setting a model folder may recommend" : "unknown job field", " (",
                       choice_list(allowed), ")"));
        continue;
      }
      const ojson& v = it.value();
      std::optional<JobFieldValue> value;
      switch (f->type) {
        case JobFieldType::kText:
          if (v.is_string()) value = v.get<std::string>();
          break;
        case JobFieldType::kSeed:
          if (v.is_number_unsigned()) value = v.get<std::uint64_t>();
          break;
        case JobFieldType::kInteger:
          if (v.is_number_integer()) value = v.get<std::int64_t>();
          break;
        case JobFieldType::kNumber:
          if (v.is_number()) value = v.get<double>();
          break;
      }
      if (!value) {
        const char* want = f->type == JobFieldType::kText ? "a string" : f->type == JobFieldType::kNumber ? "a number" : "an integer";
        add(where, str("must be ", want, ", got ", v.dump()));
        continue;
      }
      if (std::string p = check_job_field(*f, *value, {}); !p.empty()) {
        add(where, p);
        continue;
      }
      out.emplace(f->key, std::move(*value));
    }
  }
  if (problems) {
    problems->insert(problems->end(), found.begin(), found.end());
  } else if (!found.empty()) {
    std::string msg;
    for (const auto& p : found) msg += str(msg.empty() ? "" : "\n", path, ": ", p.field.empty() ? "" : p.field + ": ", p.message);
    throw Error(msg);
  }
  return out;
}

std::vector<FieldError> validate_job(const JobSpec& job, const ModelInfo& info, const OutputFormatNames& formats) {
  std::vector<FieldError> e;
  const std::int64_t m = info.spatial_multiple(), tf = info.temporal_factor();
  const auto& tc = info.transformer;
  for (const auto& f : job_fields()) {
    const auto v = f.get(job);
    if (!v) continue;
    if (f.key == "id" || f.key == "save_latents") continue;  // checked where they are made
    if (std::string p = check_job_field(f, *v, formats); !p.empty()) {
      e.push_back({f.key, p});
      continue;
    }
    // What the model adds.
    if ((f.key == "guidance_2" || f.key == "boundary_ratio") && !info.two_experts()) {
      e.push_back({f.key, "applies to models with two experts (Wan2.2 A14B: transformer_2 and boundary_ratio in "
                          "model_index.json); this model has one transformer"});
      continue;
    }
    if (f.key == "guidance_2" && *job.guidance_2 > 1 && !job.guided()) {
      e.push_back({f.key, str(number(*job.guidance_2), " has no effect with guidance ", number(job.guidance),
                              ": WanPipeline guides (either expert) only when guidance > 1; set guidance > 1, or "
                              "leave guidance_2 unset"),
                   /*with_job=*/true, "guidance"});
      continue;
    }
    if (f.key == "schedule" && *job.schedule != NoiseSchedule::kDefault && job.scheduler == NoiseSchedulerKind::kUniPC) {
      e.push_back({f.key, str("'", noise_schedule_name(*job.schedule), "' samples with euler (as its recipe does), and "
                              "this job sets scheduler unipc: set scheduler euler, or leave it unset"),
                   /*with_job=*/true});
      continue;
    }
    if (f.key == "height" || f.key == "width") {
      const std::int64_t px = std::get<std::int64_t>(*v);
      if (px % m != 0) {
        e.push_back({f.key, str(px, " is not a multiple of ", m, " (the VAE's spatial factor ", info.vae.scale_factor_spatial,
                                " x the transformer's patch ", tc.patch_size[1], "); e.g. ",
                                std::max<std::int64_t>(m, px / m * m))});
        continue;
      }
      const std::int64_t patches = px / m;
      if (patches > tc.rope_max_seq_len)
        e.push_back({f.key, str(px, " makes ", patches, " latent patches across, more than the transformer's RoPE covers "
                                "(rope_max_seq_len ", tc.rope_max_seq_len, "): at most ", tc.rope_max_seq_len * m)});
    } else if (f.key == "loras") {
      for (const LoraSpec& l : parse_lora_list(job.loras, "loras")) {
        const std::string text = lora_spec_text(l);
        if (l.expert >= 0 && !info.two_experts())
          e.push_back({"loras", str("'", text, "' names an expert (high=/low=), but the model has one transformer")});
        else if (l.expert < 0 && info.two_experts())
          e.push_back({"loras", str("'", text, "': the model has two experts; name the one it is for: high=PATH "
                                    "(transformer/, the high-noise steps) or low=PATH (transformer_2/)")});
        else
          try {
            check_regular_file(l.path);
          } catch (const Error& err) {
            e.push_back({"loras", err.what()});
          }
      }
    } else if (f.key == "frames") {
      const std::int64_t n = job.frames;
      if ((n - 1) % tf != 0) {
        e.push_back({"frames", str(n, " is not of the form ", tf, "k+1 (e.g. ",
                                   std::max<std::int64_t>(1, (n - 1) / tf * tf + 1), "; Wan's default is 81)")});
        continue;
      }
      const std::int64_t latent = (n - 1) / tf + 1, pt = tc.patch_size[0], patches = latent / pt;
      if (latent % pt != 0) {
        // The transformer takes pt latent frames per token (patch_size[0]); (n - 1) / tf + 1 must
        // be a multiple of it. The nearest frame counts that are: latent frames k * pt.
        const std::int64_t below = latent / pt * pt, above = below + pt;
        e.push_back({"frames", str(n, " frames make ", latent, " latent frames, not a multiple of the transformer's ", pt,
                                   " per token (patch_size[0]); e.g. ",
                                   below > 0 ? str((below - 1) * tf + 1, " or ") : std::string(), (above - 1) * tf + 1)});
        continue;
      }
      if (patches > tc.rope_max_seq_len)
        e.push_back({"frames", str(n, " frames make ", patches, " latent patches in time, more than the transformer's RoPE "
                                   "covers (rope_max_seq_len ", tc.rope_max_seq_len, ")")});
    }
  }
  return e;
}

NoiseSchedulerConfig job_scheduler_config(const JobSpec& job, const ModelInfo& info) {
  return info.scheduler.with_overrides(job.scheduler, job.flow_shift, job.schedule);
}

namespace {

std::optional<JobFieldValue> effective_value(const JobField& f, const JobSpec& job, const ModelInfo& info) {
  return f.effective ? f.effective(job, info) : f.get(job);
}

// " with LoRAs fused: A:1, low=B:0.5" (nothing without).
std::string fused_loras_text(const std::vector<LoraSpec>& loras) {
  std::string s;
  for (const auto& l : loras) s += str(s.empty() ? " with LoRAs fused: " : ", ", lora_spec_text(l));
  return s;
}

}  // namespace

std::string job_parameters_json(const JobSpec& job, const ModelInfo& info, const std::string& fingerprint) {
  ojson j = ojson::object();
  for (const auto& f : job_fields())
    if (f.in_parameters)
      if (auto v = effective_value(f, job, info)) j[f.key] = to_json_value(*v);
  j["model"] = info.parts.dir;
  // A transformer given as its own weights (only then, so other videos' metadata stays as it was).
  if (!info.parts.transformer.empty()) j["transformer"] = info.parts.transformer;
  if (!info.parts.transformer_2.empty()) j["transformer_2"] = info.parts.transformer_2;
  if (!info.parts.vae_file.empty()) j["vae"] = info.parts.vae_file;
  if (!info.parts.fused_loras.empty()) {
    j["fuse_loras"] = ojson::array();
    for (const auto& l : info.parts.fused_loras) j["fuse_loras"].push_back(lora_spec_text(l));
  }
  j["dlo_version"] = dlo_version();
  if (!fingerprint.empty()) j["fingerprint"] = fingerprint;
  return j.dump();
}

std::optional<RecordedJob> read_recorded_job(const std::string& text) {
  const ojson j = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("dlo_version")) return std::nullopt;
  RecordedJob r;
  if (const auto it = j.find("fingerprint"); it != j.end() && it->is_string()) r.fingerprint = it->get<std::string>();
  if (const auto it = j.find("frames"); it != j.end() && it->is_number_integer()) r.frames = it->get<std::int64_t>();
  if (const auto it = j.find("frames_sha256"); it != j.end() && it->is_string()) r.frames_sha256 = it->get<std::string>();
  return r;
}

std::string with_frames_sha256(const std::string& parameters_json, const std::string& frames_sha256) {
  ojson j = ojson::parse(parameters_json);
  j["frames_sha256"] = frames_sha256;
  return j.dump();
}

std::string job_output_fields_json(const JobSpec& job, const ModelInfo& info) {
  ojson j = ojson::object();
  for (const auto& f : job_fields()) {
    if (f.effect == JobFieldEffect::kNone) continue;
    // A field without an effective value is left out (the two-expert fields of a Wan2.1 job), so
    // the fingerprints of jobs that never had them stay what they were.
    if (const auto v = effective_value(f, job, info)) j[f.key] = to_json_value(*v);
  }
  return j.dump();
}

std::string job_parameters_text(const JobSpec& job, const ModelInfo& info) {
  const NoiseSchedulerConfig s = job_scheduler_config(job, info);
  return str("prompt: ", job.prompt, "; negative prompt: ", job.guided() ? job.negative_prompt : "(none: no guidance)",
             "; seed ", job.seed, "; ", job.steps, " steps; guidance ", number(job.guidance),
             info.two_experts() ? str(job.guided() ? str(" (low-noise expert ", number(job.guidance_2.value_or(job.guidance)), ";")
                                                   : std::string(" ("),
                                      " experts switch at boundary ratio ",
                                      number(job.boundary_ratio.value_or(info.boundary_ratio.value_or(0))), ")")
                                : std::string(),
             "; scheduler ",
             noise_scheduler_name(s.kind), " (flow shift ", number(s.flow_shift),
             s.schedule == NoiseSchedule::kDefault ? "" : str(", schedule ", noise_schedule_name(s.schedule)), "); ", job.width, "x", job.height,
             ", ", job.frames, " frames at ", job.fps, " fps; model ", info.parts.dir,
             info.parts.transformer.empty() ? std::string() : str(" with transformer ", info.parts.transformer),
             info.parts.transformer_2.empty() ? std::string() : str(" and transformer_2 ", info.parts.transformer_2),
             info.parts.vae_file.empty() ? std::string() : str(" with vae ", info.parts.vae_file),
             fused_loras_text(info.parts.fused_loras), "; dlo ", dlo_version());
}

std::string jobs_to_json(const std::vector<JobSpec>& jobs) {
  ojson arr = ojson::array();
  for (const auto& job : jobs) {
    ojson o = ojson::object();
    for (const auto& f : job_fields()) {
      const auto v = f.get(job);
      o[f.key] = v ? to_json_value(*v) : ojson(nullptr);
    }
    arr.push_back(std::move(o));
  }
  return arr.dump();
}

std::vector<JobSpec> jobs_from_json(const std::string& text) {
  try {
    std::vector<JobSpec> jobs;
    for (const auto& o : ojson::parse(text)) {
      JobSpec job;
      for (const auto& f : job_fields()) {
        const ojson& v = o.at(f.key);
        if (v.is_null()) continue;
        switch (f.type) {
          case JobFieldType::kText: f.set(job, v.get<std::string>()); break;
          case JobFieldType::kSeed: f.set(job, v.get<std::uint64_t>()); break;
          case JobFieldType::kInteger: f.set(job, v.get<std::int64_t>()); break;
          case JobFieldType::kNumber: f.set(job, v.get<double>()); break;
        }
      }
      jobs.push_back(std::move(job));
    }
    return jobs;
  } catch (const ojson::exception& e) {
    throw Error(str("a job list that is not valid JSON: ", e.what()), ErrorKind::kInternal);
  }
}

std::string job_fields_markdown() {
  std::string out = "| key | type | built-in default | flag | checked | decides |\n|---|---|---|---|---|---|\n";
  for (const auto& f : job_fields()) {
    if (!f.from(kFromJob) && !f.from(kFromDefaults)) continue;  // not a manifest key
    std::string type;
    switch (f.type) {
      case JobFieldType::kText: type = "string"; break;
      case JobFieldType::kSeed: type = "integer 0 .. 2^64-1"; break;
      case JobFieldType::kInteger: type = "integer"; break;
      case JobFieldType::kNumber: type = "number"; break;
    }
    if (!f.choices.empty()) {
      type.clear();
      for (const auto& c : f.choices) type += (type.empty() ? "`" : " \\| `") + c + "`";
    }
    if (f.app_choices) type = "`mp4` \\| `png` \\| `ffv1` (dlo-generate-bare: `safetensors`)";
    std::string flag;
    if (f.from(kFromBatchFlag)) flag = "`--" + f.flag + "`";
    else if (f.from(kFromPromptFlag)) flag = "`--" + f.flag + "` (one prompt)";
    std::string where = f.from(kFromDefaults) ? "" : " (per job: not in `defaults`)";
    if (f.from(kFromModel)) where += ", or the model folder's";
    const char* decides = f.effect == JobFieldEffect::kFrames ? "frames" : f.effect == JobFieldEffect::kVideo ? "video file" : "-";
    out += str("| `", f.key, "` | ", type, " | ", f.default_text, where, " | ", flag, " | ", f.checked_text, " | ", decides,
               " |\n");
  }
  return out;
}

}  // namespace dlo
