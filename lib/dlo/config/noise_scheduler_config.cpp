// Reading, overriding and printing the noise scheduler config.
#include "dlo/config/noise_scheduler_config.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/common/file.h"
#include "dlo/io/json_config.h"

namespace dlo {

namespace {

constexpr const char* kUniPCClass = "UniPCMultistepScheduler";
constexpr const char* kEulerClass = "FlowMatchEulerDiscreteScheduler";

using json = nlohmann::json;

// diffusers' constructor defaults and the "supported only at one value" rules over one
// JsonConfig (the one JSON reader, which also keeps track of the keys read, so that the rest can be
// refused as unknown). A key present as null is an error unless the key allows null.
class Reader {
 public:
  explicit Reader(const JsonConfig& j) : j_(j), label_(j.path()) {}

  // The value of `key`, or nullptr if the key is absent (a JSON null is returned as a null value).
  const json* find(const std::string& key) { return j_.find(key); }

  std::int64_t integer(const std::string& key, std::int64_t def) {
    if (!present(key, "an integer")) return def;
    return j_.get_int(key);
  }
  double number(const std::string& key, double def) {
    if (!present(key, "a number")) return def;
    return j_.get_double(key);
  }
  bool boolean(const std::string& key, bool def) {
    if (!present(key, "true or false")) return def;
    return j_.get_bool(key);
  }
  std::string string(const std::string& key, const std::string& def) {
    if (!present(key, "a string")) return def;
    return j_.get_string(key);
  }
  std::vector<std::int64_t> int_list(const std::string& key) {
    if (!present(key, "a list of integers")) return {};
    return j_.get_int_list(key);
  }

  // A key dlo supports only at one value (diffusers' default `def` applies when it is missing).
  void require_bool(const std::string& key, bool def, bool want, const std::string& why) {
    const bool got = boolean(key, def);
    DLO_CHECK(got == want, label_, ": '", key, "' is ", shown(key, got ? "true" : "false"), ", not supported", why);
  }
  void require_string(const std::string& key, const std::string& def, const std::set<std::string>& allowed,
                      const std::string& why) {
    const std::string got = string(key, def);
    DLO_CHECK(allowed.count(got), label_, ": '", key, "' is ", shown(key, json(got).dump()), ", not supported",
              why);
  }
  // A key that must be absent or null (diffusers' default None).
  void require_null(const std::string& key, const std::string& why) {
    const json* v = find(key);
    DLO_CHECK(!v || v->is_null(), label_, ": '", key, "' is ", v ? v->dump() : "", ", not supported", why);
  }
  // A key without effect in the supported mode: only its type is checked.
  void ignore_number_or_null(const std::string& key) {
    const json* v = find(key);
    DLO_CHECK(!v || v->is_null() || v->is_number(), label_, ": field '", key, "' must be a number or null, got ",
              v->dump());
  }
  void ignore_list_or_null(const std::string& key) {
    const json* v = find(key);
    DLO_CHECK(!v || v->is_null() || v->is_array(), label_, ": field '", key, "' must be a list or null, got ",
              v->dump());
  }

  // Every key not starting with '_' must have been read.
  void refuse_unknown(const std::string& cls) const {
    const auto unread = j_.unread_keys();
    DLO_CHECK(unread.empty(), label_, ": unknown key '", unread.empty() ? "" : unread[0], "' (= ",
              unread.empty() ? "" : j_.dump(unread[0]), ") for ", cls,
              ": not a key of diffusers 0.42.1, which dlo follows");
  }

  const std::string& label() const { return label_; }

 private:
  // False for an absent key; an error for a null one (diffusers would read None, which these keys
  // do not take); true otherwise (the getter then checks the type).
  bool present(const std::string& key, const char* type) {
    const json* v = find(key);
    if (!v) return false;
    DLO_CHECK(!v->is_null(), label_, ": field '", key, "' must be ", type, ", got null");
    return true;
  }
  // "x" for a key present in the file, "missing (diffusers' default x)" otherwise.
  std::string shown(const std::string& key, const std::string& value) const {
    return j_.contains(key) ? value : "missing (diffusers' default " + value + ")";
  }

  const JsonConfig& j_;
  std::string label_;
};

NoiseSchedulerConfig read_unipc(Reader& r) {
  NoiseSchedulerConfig c;
  c.kind = NoiseSchedulerKind::kUniPC;
  const std::string& f = r.label();
  c.num_train_timesteps = r.integer("num_train_timesteps", 1000);
  r.ignore_number_or_null("beta_start");  // the beta schedule is not used with flow sigmas
  r.ignore_number_or_null("beta_end");
  const json* trained = r.find("trained_betas");
  r.ignore_list_or_null("trained_betas");
  if (!trained || trained->is_null())  // diffusers refuses other schedules in __init__ even in flow mode
    r.require_string("beta_schedule", "linear", {"linear", "scaled_linear", "squaredcos_cap_v2"},
                     " (diffusers: linear, scaled_linear, squaredcos_cap_v2)");
  else
    r.string("beta_schedule", "linear");
  c.solver_order = r.integer("solver_order", 2);
  DLO_CHECK(c.solver_order >= 1 && c.solver_order <= 3, f, ": 'solver_order' is ", c.solver_order,
            ", not supported (dlo supports 1, 2 and 3)");
  r.require_string("prediction_type", "epsilon", {"flow_prediction"},
                   " (dlo supports \"flow_prediction\", the Wan models' type)");
  r.require_bool("thresholding", false, false, " (dynamic thresholding is not implemented)");
  r.ignore_number_or_null("dynamic_thresholding_ratio");  // thresholding only
  r.ignore_number_or_null("sample_max_value");
  r.require_bool("predict_x0", true, true, " (dlo supports predict_x0 true)");
  std::string solver_type = r.string("solver_type", "bh2");
  // diffusers' __init__ maps these to bh2 (and raises NotImplementedError for anything else).
  if (solver_type == "midpoint" || solver_type == "heun" || solver_type == "logrho") solver_type = "bh2";
  DLO_CHECK(solver_type == "bh1" || solver_type == "bh2", f, ": 'solver_type' is \"", solver_type,
            "\", not supported (\"bh1\", \"bh2\"; diffusers reads \"midpoint\", \"heun\", \"logrho\" as \"bh2\")");
  c.solver_type = solver_type;
  c.lower_order_final = r.boolean("lower_order_final", true);
  c.disable_corrector = r.int_list("disable_corrector");
  r.require_null("solver_p", " (a custom predictor scheduler is not implemented)");
  r.require_bool("use_karras_sigmas", false, false, " (dlo supports flow sigmas only)");
  r.require_bool("use_exponential_sigmas", false, false, " (dlo supports flow sigmas only)");
  r.require_bool("use_beta_sigmas", false, false, " (dlo supports flow sigmas only)");
  r.require_bool("use_flow_sigmas", false, true, " (dlo supports use_flow_sigmas true, the Wan models' schedule)");
  c.flow_shift = r.number("flow_shift", 1.0);
  DLO_CHECK(std::isfinite(c.flow_shift) && c.flow_shift > 0, f, ": 'flow_shift' is ", c.flow_shift,
            ", must be a positive number");
  r.require_string("timestep_spacing", "linspace", {"linspace", "leading", "trailing"},
                   " (diffusers: linspace, leading, trailing)");  // overwritten by the flow sigmas
  r.integer("steps_offset", 0);
  c.final_sigmas_type = r.string("final_sigmas_type", "zero");
  DLO_CHECK(c.final_sigmas_type == "zero" || c.final_sigmas_type == "sigma_min", f, ": 'final_sigmas_type' is \"",
            c.final_sigmas_type, "\", not supported (\"zero\", \"sigma_min\")");
  r.boolean("rescale_betas_zero_snr", false);  // changes the betas only, unused with flow sigmas
  r.require_bool("use_dynamic_shifting", false, false, " (dynamic shifting needs a per-resolution mu)");
  r.require_string("time_shift_type", "exponential", {"exponential", "linear"},
                   " (diffusers: exponential, linear)");  // dynamic shifting only
  r.ignore_number_or_null("sigma_min");  // karras/exponential/beta sigmas only
  r.ignore_number_or_null("sigma_max");
  r.require_null("shift_terminal", " (stretching the schedule to a terminal value is not implemented)");
  r.refuse_unknown(kUniPCClass);
  return c;
}

NoiseSchedulerConfig read_euler(Reader& r) {
  NoiseSchedulerConfig c;
  c.kind = NoiseSchedulerKind::kFlowEuler;
  const std::string& f = r.label();
  c.num_train_timesteps = r.integer("num_train_timesteps", 1000);
  c.flow_shift = r.number("shift", 1.0);
  DLO_CHECK(std::isfinite(c.flow_shift) && c.flow_shift > 0, f, ": 'shift' is ", c.flow_shift,
            ", must be a positive number");
  r.require_bool("use_dynamic_shifting", false, false, " (dynamic shifting needs a per-resolution mu)");
  r.ignore_number_or_null("base_shift");  // dynamic shifting only
  r.ignore_number_or_null("max_shift");
  r.ignore_number_or_null("base_image_seq_len");
  r.ignore_number_or_null("max_image_seq_len");
  r.require_bool("invert_sigmas", false, false, " (inverted sigmas are not implemented)");
  r.require_null("shift_terminal", " (stretching the schedule to a terminal value is not implemented)");
  r.require_bool("use_karras_sigmas", false, false, " (dlo supports the shifted linear schedule only)");
  r.require_bool("use_exponential_sigmas", false, false, " (dlo supports the shifted linear schedule only)");
  r.require_bool("use_beta_sigmas", false, false, " (dlo supports the shifted linear schedule only)");
  r.require_string("time_shift_type", "exponential", {"exponential", "linear"},
                   " (diffusers: exponential, linear)");
  r.require_bool("stochastic_sampling", false, false, " (stochastic sampling is not implemented)");
  r.refuse_unknown(kEulerClass);
  return c;
}

}  // namespace

const char* noise_scheduler_name(NoiseSchedulerKind kind) {
  return kind == NoiseSchedulerKind::kUniPC ? "unipc" : "euler";
}

NoiseSchedulerKind parse_noise_scheduler_kind(const std::string& name) {
  if (name == "unipc") return NoiseSchedulerKind::kUniPC;
  if (name == "euler") return NoiseSchedulerKind::kFlowEuler;
  throw Error(str("unknown noise scheduler '", name, "' (unipc, euler)"));
}

const char* noise_schedule_name(NoiseSchedule schedule) {
  return schedule == NoiseSchedule::kLightx2v ? "lightx2v" : "default";
}

NoiseSchedule parse_noise_schedule(const std::string& name) {
  if (name == "default") return NoiseSchedule::kDefault;
  if (name == "lightx2v") return NoiseSchedule::kLightx2v;
  throw Error(str("unknown schedule '", name, "' (default, lightx2v)"));
}

NoiseSchedulerConfig NoiseSchedulerConfig::from_json_file(const std::string& path) {
  return from_json_text(read_file(path), path);
}

NoiseSchedulerConfig NoiseSchedulerConfig::from_json_text(const std::string& text, const std::string& label) {
  const JsonConfig j = JsonConfig::parse(text, label);
  const json* cls_value = j.find("_class_name");
  DLO_CHECK(cls_value, label, ": no '_class_name' (", kUniPCClass, " or ", kEulerClass, " expected)");
  DLO_CHECK(cls_value->is_string(), label, ": '_class_name' must be a string, got ", cls_value->dump());
  const std::string cls = cls_value->get<std::string>();
  Reader r(j);
  NoiseSchedulerConfig c;
  if (cls == kUniPCClass) {
    c = read_unipc(r);
  } else if (cls == kEulerClass) {
    c = read_euler(r);
  } else {
    throw Error(str(label, ": '_class_name' is \"", cls, "\", not supported (dlo supports ", kUniPCClass, " and ",
                    kEulerClass, ")"));
  }
  with_context(label, [&] { c.validate(); });
  return c;
}

void NoiseSchedulerConfig::validate() const {
  // The Euler scheduler builds a training schedule of this many entries (Wan: 1000).
  DLO_CHECK(num_train_timesteps >= 1 && num_train_timesteps <= 1000000, "noise scheduler: num_train_timesteps is ",
            num_train_timesteps, ", must be in 1..1000000");
  DLO_CHECK(std::isfinite(flow_shift) && flow_shift > 0, "noise scheduler: flow shift is ", flow_shift,
            ", must be a positive number");
  DLO_CHECK(schedule == NoiseSchedule::kDefault || kind == NoiseSchedulerKind::kFlowEuler, "noise scheduler: schedule '",
            noise_schedule_name(schedule), "' samples with euler, not ", noise_scheduler_name(kind));
  if (kind == NoiseSchedulerKind::kFlowEuler) return;
  DLO_CHECK(solver_order >= 1 && solver_order <= 3, "noise scheduler: solver_order is ", solver_order,
            ", dlo supports 1, 2 and 3");
  DLO_CHECK(solver_type == "bh1" || solver_type == "bh2", "noise scheduler: solver_type is '", solver_type,
            "', dlo supports bh1 and bh2");
  DLO_CHECK(final_sigmas_type == "zero" || final_sigmas_type == "sigma_min",
            "noise scheduler: final_sigmas_type is '", final_sigmas_type, "', dlo supports zero and sigma_min");
  // In diffusers the last bh1 step to a zero sigma computes alpha * B(h) * 0 with B(h) = h = -inf: NaN.
  DLO_CHECK(!(solver_type == "bh1" && final_sigmas_type == "zero"),
            "noise scheduler: solver_type 'bh1' with final_sigmas_type 'zero' is not supported (diffusers' last "
            "step is NaN there: B(h) = h = -inf); use bh2, or bh1 with sigma_min");
}

NoiseSchedulerConfig NoiseSchedulerConfig::with_overrides(std::optional<NoiseSchedulerKind> new_kind,
                                                          std::optional<double> new_shift,
                                                          std::optional<NoiseSchedule> new_schedule) const {
  if (new_schedule && *new_schedule != NoiseSchedule::kDefault && !new_kind) new_kind = NoiseSchedulerKind::kFlowEuler;
  if (new_shift)
    DLO_CHECK(std::isfinite(*new_shift) && *new_shift > 0, "--flow-shift ", *new_shift,
              ": must be a positive number");
  NoiseSchedulerConfig c;
  if (!new_kind || *new_kind == kind) {
    c = *this;
  } else {
    c = NoiseSchedulerConfig{};  // the Wan2.1 UniPC config; for euler only the common fields matter
    c.kind = *new_kind;
    c.num_train_timesteps = num_train_timesteps;
    c.flow_shift = flow_shift;
  }
  if (new_shift) c.flow_shift = *new_shift;
  if (new_schedule) c.schedule = *new_schedule;
  return c;
}

std::string NoiseSchedulerConfig::to_json() const {
  json j;  // std::map: keys sorted
  if (kind == NoiseSchedulerKind::kFlowEuler) {
    j["_class_name"] = kEulerClass;
    j["num_train_timesteps"] = num_train_timesteps;
    j["shift"] = flow_shift;
  } else {
    j["_class_name"] = kUniPCClass;
    j["num_train_timesteps"] = num_train_timesteps;
    j["flow_shift"] = flow_shift;
    j["use_flow_sigmas"] = true;
    j["prediction_type"] = "flow_prediction";
    j["predict_x0"] = true;
    j["solver_order"] = solver_order;
    j["solver_type"] = solver_type;
    j["lower_order_final"] = lower_order_final;
    j["disable_corrector"] = disable_corrector;
    j["final_sigmas_type"] = final_sigmas_type;
  }
  return j.dump();
}

}  // namespace dlo
