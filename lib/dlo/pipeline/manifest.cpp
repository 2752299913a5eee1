#include "dlo/pipeline/manifest.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <tuple>
#include <sstream>
#include <variant>

#include <yaml-cpp/yaml.h>

#include "dlo/common/file.h"
#include "dlo/common/sha256.h"
#include "dlo/common/text.h"
#include "dlo/pipeline/topology.h"

namespace dlo {
namespace {

namespace fs = std::filesystem;

// The job fields a manifest may hold (in jobs or `defaults`), in the table's order.
const std::vector<std::string>& job_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& f : job_fields())
      if (f.from(kFromJob) || f.from(kFromDefaults)) k.push_back(f.key);
    return k;
  }();
  return keys;
}
const std::vector<std::string> kTopKeys = {"model", "output_dir", "defaults", "jobs", "sp", "cfg_parallel", "transformer",
                                           "transformer_2", "vae", "storage_dtype",
                                           "fuse_loras"};

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}


// A parsed value and where it came from.
struct Value {
  JobFieldValue v;
  ManifestFieldSource src;
};
using Fields = std::map<std::string, Value>;

class Problems {
 public:
  explicit Problems(std::string file) : file_(std::move(file)) {}
  void add(std::int64_t job, const std::string& field, const std::string& message, const YAML::Mark& mark) {
    ManifestProblem p{file_, job, "", field, message};
    if (!mark.is_null()) p.line = mark.line + 1, p.column = mark.column + 1;
    list.push_back(std::move(p));
  }
  void add(std::int64_t job, const std::string& field, const std::string& message, std::int64_t line = -1,
           std::int64_t column = -1) {
    list.push_back({file_, job, "", field, message, line, column});
  }
  // A problem of a flag's value: `flag` as written ("--steps").
  void add_flag(const std::string& flag, const std::string& message) {
    list.push_back({"command line", -1, "", flag, message});
  }
  std::vector<ManifestProblem> list;

 private:
  std::string file_;
};

ManifestFieldSource source_at(ManifestFieldSource::Kind kind, const YAML::Mark& m) {
  ManifestFieldSource s;
  s.kind = kind;
  if (!m.is_null()) s.line = m.line + 1, s.column = m.column + 1;
  return s;
}

const char* type_name(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Null: return "nothing";
    default: return "a value";
  }
}

bool is_plain_or_typed(const YAML::Node& n, const char* core_tag) {
  const std::string& t = n.Tag();
  return t == "?" || t == std::string("tag:yaml.org,2002:") + core_tag;
}

// Parses one field's YAML value; reports a wrong type or value and returns nothing then. The
// text of a scalar is parsed as flags are (parse_job_field); what is YAML's own (null, lists,
// quoted numbers) is checked here.
std::optional<Value> parse_value(const JobField& f, const YAML::Node& node, const YAML::Mark& key_mark,
                                 ManifestFieldSource::Kind kind, std::int64_t job, const std::string& field,
                                 const OutputFormatNames& formats, Problems& problems) {
  const auto bad = [&](const std::string& msg) {
    problems.add(job, field, msg, key_mark);
    return std::optional<Value>{};
  };
  const bool is_text = f.type == JobFieldType::kText;
  const char* want = is_text ? "a string" : f.type == JobFieldType::kNumber ? "a number" : "an integer";
  if (node.IsNull()) return bad(str("has no value (", is_text ? "write \"\" for an empty string; " : "",
                                    "expected ", want, ")"));
  if (f.key == "loras" && node.IsSequence()) {  // a list: the field's text is its entries joined by commas
    std::string joined;
    for (std::size_t i = 0; i < node.size(); ++i) {
      if (!node[i].IsScalar()) return bad(str("must be a list of [high=|low=]PATH[:STRENGTH], got ", type_name(node[i])));
      joined += str(i ? ", " : "", node[i].Scalar());
    }
    std::string problem;
    auto v = parse_job_field(f, joined, formats, &problem);
    if (!v) return bad(problem);
    return Value{*v, source_at(kind, key_mark)};
  }
  if (!node.IsScalar()) return bad(str("must be ", want, ", got ", type_name(node)));
  const std::string& text = node.Scalar();  // text fields: as written (`no`, `1.5` and `~x` are text)
  if (!is_text) {
    const bool numeric_tag = is_plain_or_typed(node, f.type == JobFieldType::kNumber ? "float" : "int") ||
                             (f.type == JobFieldType::kNumber && node.Tag() == "tag:yaml.org,2002:int");
    if (!numeric_tag) return bad(str("must be ", want, ", got the string \"", text, "\" (drop the quotes)"));
  }
  std::string problem;
  auto v = parse_job_field(f, text, formats, &problem);
  if (!v) return bad(problem);
  return Value{*v, source_at(kind, key_mark)};
}

// Reads the fields of a mapping (a job or `defaults`); reports unknown and duplicate keys.
Fields read_fields(const YAML::Node& map, bool is_defaults, std::int64_t job, const OutputFormatNames& formats,
                   Problems& problems) {
  Fields out;
  std::map<std::string, std::int64_t> seen;  // key -> line
  for (auto it = map.begin(); it != map.end(); ++it) {
    // A copy (a handle): yaml-cpp's operator-> returns a proxy by value, so a reference to
    // it->first would dangle once this statement ends (GCC 12's -Wdangling-pointer saw it).
    const YAML::Node kn = it->first;
    const YAML::Mark km = kn.Mark();
    const std::string where = is_defaults ? "defaults" : "";
    if (!kn.IsScalar()) {
      problems.add(job, where, str("a key must be a name, got ", type_name(kn)), km);
      continue;
    }
    const std::string key = kn.Scalar();
    if (auto [pos, fresh] = seen.emplace(key, km.line + 1); !fresh) {
      problems.add(job, is_defaults ? "defaults." + key : key, str("given twice (also on line ", pos->second, ")"), km);
      continue;
    }
    if (!contains(job_keys(), key)) {
      std::string msg = str("unknown key '", key, "'");
      if (contains(kTopKeys, key))
        msg += str(" (", key, " is a top-level key: one per manifest)");
      else
        msg += did_you_mean(key, job_keys());
      problems.add(job, where, msg, km);
      continue;
    }
    const JobField& f = *find_job_field(key);
    if (is_defaults && !f.from(kFromDefaults)) {
      problems.add(job, "defaults." + key, "is per job: it cannot be a default", km);
      continue;
    }
    auto v = parse_value(f, it->second, km, is_defaults ? ManifestFieldSource::kDefaults : ManifestFieldSource::kJob,
                         job, is_defaults ? "defaults." + key : key, formats, problems);
    if (v) out.emplace(key, std::move(*v));
  }
  return out;
}

// The command line's values as fields, parsed and checked once (problems name the flag).
Fields flag_fields(const JobFlags& flags, const OutputFormatNames& formats, Problems& problems) {
  Fields out;
  ManifestFieldSource src;
  src.kind = ManifestFieldSource::kFlag;
  for (const auto& [key, text] : flags) {
    const JobField* f = find_job_field(key);
    DLO_ASSERT(f != nullptr && !f->flag.empty(), "flag for the unknown job field '", key, "'");
    if (!f->from(kFromBatchFlag)) {
      problems.add_flag("--" + f->flag, str("is for one prompt; with --jobs each job has its own (manifest key ", f->key, ")"));
      continue;
    }
    std::string problem;
    if (auto v = parse_job_field(*f, text, formats, &problem))
      out.emplace(key, Value{*v, src});
    else
      problems.add_flag("--" + f->flag, problem);
  }
  return out;
}

}  // namespace

void throw_manifest_problems(std::vector<ManifestProblem> problems) {
  const auto rank = [](const ManifestProblem& p) {
    return std::make_tuple(p.file == "command line" ? 0 : 1, p.line, p.column);
  };
  std::stable_sort(problems.begin(), problems.end(),
                   [&](const ManifestProblem& a, const ManifestProblem& b) { return rank(a) < rank(b); });
  throw ManifestError(std::move(problems));
}

namespace {

[[noreturn]] void fail(std::vector<ManifestProblem> problems) { throw_manifest_problems(std::move(problems)); }

std::string resolve(const std::string& base, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute() || base.empty()) return p;
  return (fs::path(base) / p).lexically_normal().string();
}

// A path's identity for duplicate checks: absolute, normalised, no trailing separator.
std::string path_key(const std::string& p) {
  fs::path a = fs::absolute(fs::path(p)).lexically_normal();
  if (a.filename().empty() && a.has_parent_path()) a = a.parent_path();
  return a.string();
}

const OutputFormatName* find_format(const OutputFormatNames& formats, const std::string& name) {
  for (const auto& f : formats)
    if (f.name == name) return &f;
  return nullptr;
}

// A format whose output is a folder (its default output has no extension).
bool is_folder_format(const OutputFormatNames& formats, const std::string& name) {
  const OutputFormatName* f = find_format(formats, name);
  return f != nullptr && f->extension.empty();
}

// One job as read: its fields and where the entry is.
struct RawJob {
  Fields fields;
  std::int64_t line = -1, column = -1;
  std::string shown_id;  // an id given but refused: named in messages
  bool usable = true;  // false: not a job at all (a list, nothing)
};

std::string folder_of(const std::string& path);

Manifest resolve_jobs(const std::string& path, std::vector<RawJob> raw, const Fields& defaults, const Fields& flags,
                      std::string model, std::string output_dir, const OutputFormatNames& formats, Problems& problems) {
  Manifest m;
  m.path = path;
  m.formats = formats;
  m.model = std::move(model);
  m.output_dir = std::move(output_dir);
  const std::size_t n = raw.size();

  // Ids: the given ones (checked for duplicates), then the made ones, unique among all.
  std::vector<std::string> ids(n);
  std::map<std::string, std::size_t> given;
  std::vector<bool> duplicate_id(n, false);  // its default output clashes too: not reported twice
  for (std::size_t i = 0; i < n; ++i) {
    auto it = raw[i].fields.find("id");
    if (it == raw[i].fields.end()) continue;
    const std::string& id = std::get<std::string>(it->second.v);
    ids[i] = id;
    if (auto [pos, fresh] = given.emplace(id, i); !fresh) {
      duplicate_id[i] = true;
      problems.add(static_cast<std::int64_t>(i), "id", str("'", id, "' is also the id of job ", pos->second),
                   it->second.src.line, it->second.src.column);
    }
  }
  std::size_t width = 4;
  for (std::size_t c = n; c >= 10000; c /= 10) ++width;
  for (std::size_t i = 0; i < n; ++i) {
    if (!ids[i].empty() || raw[i].fields.count("id")) continue;
    std::string base = std::to_string(i);
    base = "job-" + std::string(width > base.size() ? width - base.size() : 0, '0') + base;
    std::string id = base;
    for (int k = 2; given.count(id); ++k) id = base + "-" + std::to_string(k);
    given.emplace(id, i);
    ids[i] = id;
  }
  std::vector<std::string> shown = ids;  // in messages: a refused id as written
  for (std::size_t i = 0; i < n; ++i)
    if (!raw[i].shown_id.empty()) shown[i] = raw[i].shown_id;

  std::map<std::string, std::size_t> outputs;  // path_key -> job
  const std::string results = path_key(resolve(m.output_dir, kResultsFileName));
  // What the batch reads may never be written: the manifest, anything in the model folder.
  const std::string manifest_file = canonical_path(path);
  const std::string model_folder = m.model.empty() ? "" : canonical_path(m.model) + "/";
  // The model folder's recommendations (dlo_defaults.json), below everything the manifest says.
  Fields model_defaults;
  if (!m.model.empty()) {
    std::vector<FieldError> bad;
    for (auto& [key, v] : read_model_job_defaults(m.model, &bad)) {
      Value value;
      value.v = std::move(v);
      value.src.kind = ManifestFieldSource::kModel;
      model_defaults.emplace(key, std::move(value));
    }
    for (const auto& b : bad) problems.list.push_back({model_job_defaults_path(m.model), -1, "", b.field, b.message});
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (!raw[i].usable) continue;
    const auto ji = static_cast<std::int64_t>(i);
    JobSpec job;
    std::map<std::string, ManifestFieldSource> src;
    // The precedence rule: the job's own value > the command line > `defaults` > the model
    // folder's > built in.
    for (const auto& f : job_fields()) {
      const Value* v = nullptr;
      for (const Fields* layer : {static_cast<const Fields*>(&raw[i].fields), &flags, &defaults,
                                   static_cast<const Fields*>(&model_defaults)})
        if (auto it = layer->find(f.key); it != layer->end()) {
          v = &it->second;
          break;
        }
      if (!v) continue;
      src[f.key] = v->src;
      f.set(job, v->v);
    }
    if (job.format.empty() && !formats.empty()) job.format = formats.front().name;
    if (!job.loras.empty()) {
      // LoRA paths as given: beside the manifest (from it), or from the working folder (flags).
      try {
        std::vector<LoraSpec> loras = parse_lora_list(job.loras, "loras");
        for (LoraSpec& l : loras)
          l.path = canonical_path(src["loras"].kind == ManifestFieldSource::kFlag ? l.path : resolve(folder_of(path), l.path));
        job.loras = lora_list_text(loras);
      } catch (const Error&) {
        // Reported by the field's own check.
      }
    }
    job.id = ids[i];
    if (!src.count("seed")) job.seed = default_seed_for_id(job.id);
    const OutputFormatName* fmt = find_format(formats, job.format);
    const std::string name_problem = src.count("output") ? output_name_problem(job.output) : std::string();
    job.output = resolve(m.output_dir, src.count("output") ? job.output : job.id + (fmt ? fmt->extension : ""));
    if (!src.count("output")) {
      ManifestFieldSource s;  // made from the id: reported at the job's entry
      s.kind = ManifestFieldSource::kBuiltIn;
      s.line = raw[i].line;
      s.column = raw[i].column;
      src["output"] = s;
    }
    const ManifestFieldSource& os = src["output"];
    const std::string key = path_key(job.output);
    const std::string real = canonical_path(job.output);
    const bool folder = is_folder_format(formats, job.format);
    if (!name_problem.empty())
      problems.add(ji, "output", name_problem, os.line, os.column);
    else if (key == results)
      problems.add(ji, "output", str("'", job.output, "' is the batch's results file"), os.line, os.column);
    else if (folder && key == path_key(m.output_dir))
      problems.add(ji, "output", str("'", job.output, "' is the output folder itself (a ", job.format,
                                     " job writes a folder of its own: name one inside it)"), os.line, os.column);
    else if (!folder && fmt && job.output.back() != '/' && fs::path(job.output).extension().empty())
      problems.add(ji, "output", str("'", job.output, "' has no extension (a ", job.format, " video: e.g. '",
                                     fs::path(job.output).filename().string(), fmt->extension, "')"), os.line, os.column);
    else if (real == manifest_file)
      problems.add(ji, "output", str("'", job.output, "' is this manifest"), os.line, os.column);
    else if (!model_folder.empty() && (real + "/").rfind(model_folder, 0) == 0)
      problems.add(ji, "output", str("'", job.output, "' is inside the model folder '", m.model, "'"), os.line, os.column);
    else if (auto [pos, fresh] = outputs.emplace(key, i);
             !fresh && !(duplicate_id[i] && os.kind == ManifestFieldSource::kBuiltIn))
      problems.add(ji, "output", str("'", job.output, "' is also the output of job ", pos->second, " (id '",
                                     shown[pos->second], "')"), os.line, os.column);
    m.jobs.push_back(std::move(job));
    m.sources.push_back(std::move(src));
    m.job_lines.push_back(raw[i].line);
  }
  // An output inside another job's PNG folder (the PNG writer replaces that folder whole).
  std::map<std::string, std::size_t> png_folders;  // path_key -> index into m.jobs
  for (std::size_t k = 0; k < m.jobs.size(); ++k)
    if (is_folder_format(formats, m.jobs[k].format)) png_folders.emplace(path_key(m.jobs[k].output), k);
  for (std::size_t k = 0; k < m.jobs.size() && !png_folders.empty(); ++k) {
    for (fs::path p = fs::path(path_key(m.jobs[k].output)).parent_path(); p.has_relative_path(); p = p.parent_path()) {
      auto it = png_folders.find(p.string());
      if (it == png_folders.end()) continue;
      const ManifestFieldSource& os = m.sources[k].at("output");
      const JobSpec& other = m.jobs[it->second];
      std::string kind = other.format;  // "PNG folder"
      for (auto& c : kind) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      problems.add(static_cast<std::int64_t>(k), "output", str("'", m.jobs[k].output, "' is inside the ", kind,
                                                              " folder of job ", other.id, " ('", other.output, "')"),
                   os.line, os.column);
      break;
    }
  }
  for (auto& p : problems.list)
    if (p.job_index >= 0 && p.job_index < static_cast<std::int64_t>(n) && p.job_id.empty()) p.job_id = shown[p.job_index];
  return m;
}

std::string folder_of(const std::string& path) {
  const std::string f = fs::path(path).parent_path().string();
  return f;
}

// A top-level path key of `top` (none for a text manifest) resolved against `folder` into `out`;
// false when absent. A value that is not a non-empty string is a problem (then true, `out` unset).
bool top_path_key(const std::string& folder, const YAML::Node* top, const char* key, std::string& out, Problems& problems) {
  if (!top) return false;
  const YAML::Node n = (*top)[key];
  if (!n) return false;
  YAML::Mark km;
  for (auto it = top->begin(); it != top->end(); ++it)
    if (it->first.IsScalar() && it->first.Scalar() == key) km = it->first.Mark();
  if (!n.IsScalar()) {
    problems.add(-1, key, str("must be a path (a string), got ", type_name(n)), km);
    return true;
  }
  if (n.Scalar().empty()) {
    problems.add(-1, key, "is empty", km);
    return true;
  }
  out = resolve(folder, n.Scalar());
  return true;
}

// The top-level `fuse_loras`: a list of `[high=|low=]PATH[:STRENGTH]`, each path resolved against
// the manifest's folder.
void top_fuse_loras(const std::string& folder, const YAML::Node& top, std::vector<LoraSpec>& out, Problems& problems) {
  const YAML::Node n = top["fuse_loras"];
  if (!n) return;
  YAML::Mark km;
  for (auto it = top.begin(); it != top.end(); ++it)
    if (it->first.IsScalar() && it->first.Scalar() == "fuse_loras") km = it->first.Mark();
  if (!n.IsSequence()) {
    problems.add(-1, "fuse_loras", str("must be a list of [high=|low=]PATH[:STRENGTH], got ", type_name(n)), km);
    return;
  }
  for (std::size_t i = 0; i < n.size(); ++i) {
    const std::string what = str("fuse_loras[", i, "]");
    if (!n[i].IsScalar()) {
      problems.add(-1, what, str("must be [high=|low=]PATH[:STRENGTH], got ", type_name(n[i])), n[i].Mark());
      continue;
    }
    try {
      LoraSpec l = parse_lora_spec(n[i].Scalar(), what);
      l.path = resolve(folder, l.path);
      out.push_back(std::move(l));
    } catch (const Error& e) {
      problems.add(-1, "", e.what(), n[i].Mark());
    }
  }
}

void model_and_output_dir(const std::string& folder, const std::optional<std::string>& model_flag,
                          const std::optional<std::string>& output_dir_flag, const YAML::Node* top,
                          std::string& model, std::string& output_dir, Problems& problems) {
  const auto path_key_value = [&](const char* key, std::string& out) { return top_path_key(folder, top, key, out, problems); };
  std::string from_file;
  const bool model_in_file = path_key_value("model", from_file);
  if (model_flag) {
    model = *model_flag;
    if (model.empty()) problems.add_flag("model", "is empty");
  } else if (model_in_file) {
    model = from_file;
  } else {
    problems.add(-1, "model", top ? "missing: give `model: FOLDER` in the manifest or --model FOLDER"
                                  : "missing: a text manifest takes the model from --model FOLDER");
  }
  from_file.clear();
  const bool out_in_file = path_key_value("output_dir", from_file);
  if (output_dir_flag) {
    output_dir = *output_dir_flag;
    if (output_dir.empty()) problems.add_flag("output_dir", "is empty");
  } else if (out_in_file) {
    output_dir = from_file;
  } else {
    output_dir = folder.empty() ? "." : folder;
  }
}

Manifest load_text(const std::string& path, const std::string& text, const JobFlags& flags,
                   const std::optional<std::string>& model_flag, const std::optional<std::string>& output_dir_flag,
                   const OutputFormatNames& formats) {
  Problems problems(path);
  std::string model, output_dir;
  model_and_output_dir(folder_of(path), model_flag, output_dir_flag, nullptr, model, output_dir, problems);
  const Fields ff = flag_fields(flags, formats, problems);
  std::vector<RawJob> raw;
  // A UTF-8 byte order mark (editors on some systems write one) is not part of the first prompt.
  std::istringstream in(text.rfind("\xEF\xBB\xBF", 0) == 0 ? text.substr(3) : text);
  std::string line;
  for (std::int64_t no = 1; std::getline(in, line); ++no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    RawJob job;
    job.line = no;
    job.column = 1;
    const auto ji = static_cast<std::int64_t>(raw.size());
    std::size_t bad = 0;
    if (line.find('\0') != std::string::npos)
      problems.add(ji, "prompt", "holds a NUL byte", no);
    else if (!valid_utf8(line, &bad))
      problems.add(ji, "prompt", str("is not valid UTF-8 (byte ", bad, " of the line)"), no, static_cast<std::int64_t>(bad) + 1);
    Value v;
    v.v = line;
    v.src.kind = ManifestFieldSource::kJob;
    v.src.line = no;
    v.src.column = 1;
    job.fields.emplace("prompt", std::move(v));
    raw.push_back(std::move(job));
  }
  if (raw.empty()) problems.add(-1, "", "holds no prompt (empty lines and lines starting with '#' are skipped)");
  Manifest m = resolve_jobs(path, std::move(raw), {}, ff, model, output_dir, formats, problems);
  m.problems = std::move(problems.list);
  return m;
}

Manifest load_yaml(const std::string& path, const std::string& text, const JobFlags& flags,
                   const std::optional<std::string>& model_flag, const std::optional<std::string>& output_dir_flag,
                   const OutputFormatNames& formats) {
  Problems problems(path);
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    problems.add(-1, "", str("not valid YAML: ", e.msg), e.mark);
    fail(std::move(problems.list));
  }
  if (docs.size() > 1) {
    problems.add(-1, "", str("holds ", docs.size(), " YAML documents; a manifest is one"), docs[1].Mark());
    fail(std::move(problems.list));
  }
  if (docs.empty() || docs[0].IsNull()) {
    problems.add(-1, "", "is empty (a manifest has `model`, `output_dir`, `defaults` and `jobs`)");
    fail(std::move(problems.list));
  }
  const YAML::Node& top = docs[0];
  if (!top.IsMap()) {
    problems.add(-1, "", str("must be a mapping with the keys model, output_dir, defaults and jobs, got ", type_name(top)),
                 top.Mark());
    fail(std::move(problems.list));
  }
  // Top-level keys.
  std::map<std::string, std::int64_t> seen;
  YAML::Node defaults_node, jobs_node;
  YAML::Mark defaults_mark, jobs_mark;
  bool has_jobs = false;
  std::string top_sp, top_cfg, top_storage;
  for (auto it = top.begin(); it != top.end(); ++it) {
    const YAML::Mark km = it->first.Mark();
    if (!it->first.IsScalar()) {
      problems.add(-1, "", str("a key must be a name, got ", type_name(it->first)), km);
      continue;
    }
    const std::string key = it->first.Scalar();
    if (auto [pos, fresh] = seen.emplace(key, km.line + 1); !fresh) {
      problems.add(-1, key, str("given twice (also on line ", pos->second, ")"), km);
      continue;
    }
    if (!contains(kTopKeys, key)) {
      std::string msg = str("unknown key '", key, "'");
      msg += contains(job_keys(), key) ? str(" (", key, " is a job field: put it under `defaults` or in a job)")
                                       : did_you_mean(key, kTopKeys);
      problems.add(-1, "", msg, km);
      continue;
    }
    if (key == "defaults") defaults_node = it->second, defaults_mark = km;
    if (key == "jobs") jobs_node = it->second, jobs_mark = km, has_jobs = true;
    if (key == "storage_dtype") {  // checked against --dtype by the plan (BatchPlanOptions::dtypes_with)
      if (it->second.IsScalar() && !it->second.Scalar().empty())
        top_storage = it->second.Scalar();
      else
        problems.add(-1, key, str("must be auto, fp8, bf16, fp16 or fp32, got ", type_name(it->second)), it->second.Mark());
      continue;
    }
    if (key == "sp" || key == "cfg_parallel") {
      const YAML::Mark vm = it->second.Mark();
      if (!it->second.IsScalar()) {
        problems.add(-1, key, str("must be ", key == "sp" ? "auto or a rank count" : "on, off or auto", ", got ",
                                  type_name(it->second)), vm);
        continue;
      }
      const std::string v = it->second.Scalar();
      try {
        if (key == "sp")
          (void)parse_sp(v, key), top_sp = v;
        else
          (void)parse_cfg_parallel(v, key), top_cfg = v;
      } catch (const Error& e) {
        problems.add(-1, "", e.what(), vm);
      }
    }
  }
  std::string model, output_dir;
  model_and_output_dir(folder_of(path), model_flag, output_dir_flag, &top, model, output_dir, problems);

  Fields defaults;
  if (defaults_node && !defaults_node.IsNull()) {
    if (!defaults_node.IsMap())
      problems.add(-1, "defaults", str("must be a mapping of job fields, got ", type_name(defaults_node)), defaults_mark);
    else
      defaults = read_fields(defaults_node, true, -1, formats, problems);
  }
  const Fields ff = flag_fields(flags, formats, problems);

  std::vector<RawJob> raw;
  if (!has_jobs) {
    problems.add(-1, "jobs", "missing: a manifest needs `jobs:`, a list of jobs");
  } else if (jobs_node.IsNull() || (jobs_node.IsSequence() && jobs_node.size() == 0)) {
    problems.add(-1, "jobs", "is empty: nothing to render", jobs_mark);
  } else if (!jobs_node.IsSequence()) {
    problems.add(-1, "jobs", str("must be a list of jobs, got ", type_name(jobs_node)), jobs_mark);
  } else {
    for (std::size_t i = 0; i < jobs_node.size(); ++i) {
      const YAML::Node e = jobs_node[i];
      const auto ji = static_cast<std::int64_t>(i);
      RawJob job;
      if (!e.Mark().is_null()) job.line = e.Mark().line + 1, job.column = e.Mark().column + 1;
      if (e.IsScalar()) {
        // A bare string is the prompt, as written.
        auto v = parse_value(*find_job_field("prompt"), e, e.Mark(), ManifestFieldSource::kJob, ji, "prompt", formats, problems);
        if (v) job.fields.emplace("prompt", std::move(*v));
      } else if (e.IsMap()) {
        job.fields = read_fields(e, false, ji, formats, problems);
        if (!job.fields.count("id") && e["id"] && e["id"].IsScalar()) job.shown_id = e["id"].Scalar();
        bool has_prompt = false;
        for (auto it = e.begin(); it != e.end(); ++it) has_prompt |= it->first.IsScalar() && it->first.Scalar() == "prompt";
        if (!has_prompt)
          problems.add(ji, "prompt", "missing (every job needs one; \"\" is a valid, empty prompt)", e.Mark());
      } else {
        job.usable = e.IsNull();
        problems.add(ji, "", e.IsNull() ? "an empty entry (write - \"\" for an empty prompt)"
                                        : str("a job must be a mapping of fields or a prompt string, got ", type_name(e)),
                     e.Mark());
      }
      raw.push_back(std::move(job));
    }
  }
  std::string transformer, transformer_2, vae;  // (the flags win over them: plan_batch)
  top_path_key(folder_of(path), &top, "transformer", transformer, problems);
  top_path_key(folder_of(path), &top, "transformer_2", transformer_2, problems);
  top_path_key(folder_of(path), &top, "vae", vae, problems);
  std::vector<LoraSpec> fused_loras;
  top_fuse_loras(folder_of(path), top, fused_loras, problems);
  Manifest m = resolve_jobs(path, std::move(raw), defaults, ff, model, output_dir, formats, problems);
  m.sp = top_sp;
  m.cfg_parallel = top_cfg;
  m.storage_dtype = top_storage;
  m.transformer = transformer;
  m.transformer_2 = transformer_2;
  m.vae = vae;
  m.fused_loras = std::move(fused_loras);
  m.problems = std::move(problems.list);
  return m;
}

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// The nearest existing path at or above `dir` ("." for a relative path with none).
std::string nearest_existing(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  while (!p.empty() && !exists(p.string())) p = p.parent_path();
  return p.empty() ? "." : p.string();
}

// "" when `dir` exists as a writable folder or can be created; else why not.
std::string folder_problem(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  if (exists(d)) {
    if (!is_dir(d)) return str("'", d, "' is not a folder");
    if (::access(d.c_str(), W_OK | X_OK) != 0) return str("folder '", d, "' is not writable");
    return "";
  }
  const std::string up = nearest_existing(d);
  if (!is_dir(up)) return str("'", d, "' cannot be created: '", up, "' is not a folder");
  if (::access(up.c_str(), W_OK | X_OK) != 0)
    return str("folder '", d, "' does not exist and cannot be created: '", up, "' is not writable");
  return "";
}

}  // namespace

std::string format_problems(const std::vector<ManifestProblem>& problems) {
  std::string out;
  for (const auto& p : problems) {
    if (!out.empty()) out += "\n";
    out += p.file.empty() ? "manifest" : p.file;
    if (p.line > 0) {
      out += ":" + std::to_string(p.line);
      if (p.column > 0) out += ":" + std::to_string(p.column);
    }
    out += ": ";
    if (p.job_index >= 0) out += str("job ", p.job_index, " (id '", p.job_id, "'): ");
    if (!p.field.empty()) {
      std::string f = p.field;
      if (f.rfind("defaults.", 0) == 0) f = "defaults: " + f.substr(9);
      out += f + ": ";
    }
    out += p.message;
  }
  return out;
}

ManifestError::ManifestError(std::vector<ManifestProblem> problems)
    : Error(format_problems(problems)), problems_(std::move(problems)) {}

std::uint64_t default_seed_for_id(const std::string& id) {
  Sha256 h;
  h.update(id.data(), id.size());
  const auto d = h.digest();
  return (std::uint64_t{d[0]} << 24) | (std::uint64_t{d[1]} << 16) | (std::uint64_t{d[2]} << 8) | std::uint64_t{d[3]};
}

Manifest load_manifest(const std::string& path, const JobFlags& flags, const std::optional<std::string>& model_flag,
                       const std::optional<std::string>& output_dir_flag, const OutputFormatNames& formats) {
  Manifest m = read_manifest(path, flags, model_flag, output_dir_flag, formats);
  if (!m.problems.empty()) throw_manifest_problems(std::move(m.problems));
  return m;
}

Manifest read_manifest(const std::string& path, const JobFlags& flags, const std::optional<std::string>& model_flag,
                       const std::optional<std::string>& output_dir_flag, const OutputFormatNames& formats) {
  DLO_ASSERT(!formats.empty(), "read_manifest without output formats");
  const std::string text = with_context(str("manifest '", path, "'"), [&] {
    check_regular_file(path);
    return read_file(path);
  });
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".txt") return load_text(path, text, flags, model_flag, output_dir_flag, formats);
  return load_yaml(path, text, flags, model_flag, output_dir_flag, formats);
}

std::vector<ManifestProblem> check_manifest(const Manifest& manifest, const ModelInfo& model,
                                            const std::function<void(const JobSpec&)>& check_output) {
  std::vector<ManifestProblem> out;
  std::set<std::string> reported;  // a default's or a flag's problem, once
  for (std::size_t i = 0; i < manifest.jobs.size(); ++i) {
    const JobSpec& job = manifest.jobs[i];
    const auto ji = static_cast<std::int64_t>(i);
    const std::int64_t entry_line = i < manifest.job_lines.size() ? manifest.job_lines[i] : -1;
    const auto source = [&](const std::string& field) {
      ManifestFieldSource s;
      if (i < manifest.sources.size())
        if (auto it = manifest.sources[i].find(field); it != manifest.sources[i].end()) s = it->second;
      return s;
    };
    for (const FieldError& fe : validate_job(job, model, manifest.formats)) {
      const ManifestFieldSource s = source(fe.field);
      // How specific a layer is (the precedence: the job's, the command line, defaults, the model's).
      const auto rank = [](ManifestFieldSource::Kind k) {
        switch (k) {
          case ManifestFieldSource::kJob: return 4;
          case ManifestFieldSource::kFlag: return 3;
          case ManifestFieldSource::kDefaults: return 2;
          case ManifestFieldSource::kModel: return 1;
          case ManifestFieldSource::kBuiltIn: break;
        }
        return 0;
      };
      if (!fe.beside.empty() && rank(s.kind) < rank(source(fe.beside).kind)) continue;
      // Both values from the model folder's file (its guidance 1 beside its guidance_2 4): that
      // file is wrong, whatever job meets it.
      const bool model_pair = s.kind == ManifestFieldSource::kModel && source(fe.beside).kind == ManifestFieldSource::kModel;
      if (fe.with_job && !model_pair) {
        const bool at_key = s.kind == ManifestFieldSource::kJob;
        out.push_back({manifest.path, ji, job.id, fe.field, fe.message, at_key ? s.line : entry_line,
                       at_key ? s.column : -1});
      } else if (s.kind == ManifestFieldSource::kDefaults) {
        if (reported.insert("defaults." + fe.field + "\n" + fe.message).second)
          out.push_back({manifest.path, -1, "", "defaults." + fe.field, fe.message, s.line, s.column});
      } else if (s.kind == ManifestFieldSource::kModel) {
        // The model recommends what it cannot render: the folder's file is wrong, not the job.
        if (reported.insert("model." + fe.field + "\n" + fe.message).second)
          out.push_back({model_job_defaults_path(manifest.model), -1, "", "defaults." + fe.field, fe.message});
      } else if (s.kind == ManifestFieldSource::kFlag) {
        const std::string flag = "--" + find_job_field(fe.field)->flag;
        if (reported.insert(flag + "\n" + fe.message).second) out.push_back({"command line", -1, "", flag, fe.message});
      } else {
        const bool at_key = s.kind == ManifestFieldSource::kJob;
        out.push_back({manifest.path, ji, job.id, fe.field, fe.message, at_key ? s.line : entry_line,
                       at_key ? s.column : -1});
      }
    }
  }
  const std::string od_problem = folder_problem(manifest.output_dir);
  if (!od_problem.empty()) out.push_back({manifest.path, -1, "", "output_dir", od_problem});
  for (std::size_t i = 0; i < manifest.jobs.size(); ++i) {
    const JobSpec& job = manifest.jobs[i];
    const auto ji = static_cast<std::int64_t>(i);
    ManifestFieldSource s;
    if (i < manifest.sources.size())
      if (auto it = manifest.sources[i].find("output"); it != manifest.sources[i].end()) s = it->second;
    // "a.mp4/" is the file a.mp4 in its folder, with the '/' kept for the format's check.
    std::string bare = job.output;
    while (bare.size() > 1 && bare.back() == '/') bare.pop_back();
    const std::string slash = bare.size() < job.output.size() ? "/" : "";
    const std::string dir = fs::path(bare).parent_path().string();
    const std::string d = dir.empty() ? "." : dir;
    const bool in_output_dir =
        fs::path(d).lexically_normal() == fs::path(manifest.output_dir.empty() ? "." : manifest.output_dir).lexically_normal();
    if (in_output_dir && !od_problem.empty()) continue;  // reported once, above
    const bool reported_output = std::any_of(manifest.problems.begin(), manifest.problems.end(), [&](const ManifestProblem& p) {
      return p.job_index == ji && p.field == "output";
    });
    if (reported_output) continue;  // by read_manifest (the manifest itself, another job's output, ...)
    if (!in_output_dir)
      if (std::string p = folder_problem(d); !p.empty()) {
        out.push_back({manifest.path, ji, job.id, "output", p, s.line, s.column});
        continue;
      }
    if (!check_output) continue;
    JobSpec probe = job;
    if (!is_dir(d))  // the folder is created by the run: check the rest in the nearest existing one
      probe.output = (fs::path(nearest_existing(d)) / (".dlo-check-" + fs::path(bare).filename().string())).string() + slash;
    try {
      check_output(probe);
    } catch (const Error& e) {
      out.push_back({manifest.path, ji, job.id, "output", e.what(), s.line, s.column});
    }
  }
  return out;
}

void create_output_folders(const Manifest& manifest) {
  std::set<std::string> dirs = {manifest.output_dir.empty() ? "." : manifest.output_dir};
  for (const auto& job : manifest.jobs) {
    const std::string d = fs::path(job.output).parent_path().string();
    if (!d.empty()) dirs.insert(d);
  }
  for (const auto& d : dirs) {
    std::error_code ec;
    fs::create_directories(d, ec);
    DLO_CHECK(!ec && is_dir(d), "cannot create the output folder '", d, "': ", ec ? ec.message() : "not a folder");
  }
}

}  // namespace dlo
