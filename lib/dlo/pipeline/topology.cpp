#include "dlo/pipeline/topology.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <queue>

#include "dlo/common/error.h"
#include "dlo/config/job.h"
#include "dlo/config/model_info.h"

namespace dlo {
namespace {

std::string two_digits(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  return buf;
}

// Why `t` cannot run the batch ("": it can).
std::string violation(const Topology& t, const TopologyLimits& l) {
  if (t.group_size > l.ranks)
    return str(t.group_size, " ranks per job (", t.cfg ? "a CFG pair" : "along the sequence",
               t.cfg && t.group_size > 2 ? str(" of ", t.group_size / 2, " each") : std::string(), ") > ", l.ranks,
               " rank(s)");
  if (l.ranks % t.group_size != 0) return str("groups of ", t.group_size, " rank(s) do not divide ", l.ranks, " rank(s)");
  for (std::size_t j = 0; j < l.steps.size(); ++j) {
    const std::string job = j < l.names.size() ? str("job '", l.names[j], "'") : str("job ", j);
    const int sp = t.sp_of(l.guided[j]);
    if (sp > l.heads)
      return str(job, " (", l.guided[j] ? "guided" : "unguided", ", ", t.label(l.guided[j]), "): ", sp,
                 " ranks along the sequence exceed the model's ", l.heads, " attention heads");
    if (sp > 1 && l.tokens[j] < sp * kMinShareTokens)
      return str(job, ": ", l.tokens[j], " tokens give ", sp, " ranks along the sequence fewer than ",
                 kMinShareTokens, " each (shares that small can round differently from one rank)");
  }
  return {};
}

// The batch's time in single-rank steps: jobs in order, each to the group that frees up first.
double predicted_time(const Topology& t, const TopologyLimits& l) {
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
  for (int g = 0; g < t.groups(l.ranks); ++g) free_at.push(0);
  double end = 0;
  for (std::size_t j = 0; j < l.steps.size(); ++j) {
    const bool guided = l.guided[j];
    const double s = static_cast<double>(l.steps[j]) / predicted_speedup(t.sp_of(guided), t.cfg && guided, l.costs);
    const double done = free_at.top() + s;
    free_at.pop();
    free_at.push(done);
    end = std::max(end, done);
  }
  return end;
}

// "every rank its own job" or "2 group(s) of 2 ranks (guided jobs cfg 2, unguided sp 2)": the
// kinds of job the batch has.
std::string groups_of(const Topology& t, const TopologyLimits& l) {
  if (t.group_size == 1) return "every rank its own job";
  const std::size_t guided = static_cast<std::size_t>(std::count(l.guided.begin(), l.guided.end(), true));
  std::string how = str(t.groups(l.ranks), " group(s) of ", t.group_size, " ranks (");
  if (guided > 0) how += str("guided jobs ", t.label(true));
  if (guided < l.steps.size()) how += str(guided > 0 ? ", unguided " : "unguided jobs ", t.label(false));
  return how + ")";
}

}  // namespace

int parse_sp(const std::string& text, const std::string& flag) {
  if (text == "auto") return 0;
  std::size_t used = 0;
  long v = 0;
  try {
    v = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DLO_CHECK(used == text.size() && !text.empty() && v >= 1 && v <= 4096, flag, ": '", text,
            "' is not auto or a rank count (1 or more)");
  return static_cast<int>(v);
}

TopologyRequest::Cfg parse_cfg_parallel(const std::string& text, const std::string& flag) {
  if (text == "auto") return TopologyRequest::Cfg::kAuto;
  if (text == "on") return TopologyRequest::Cfg::kOn;
  if (text == "off") return TopologyRequest::Cfg::kOff;
  throw Error(str(flag, ": '", text, "' is not on, off or auto"));
}

std::string Topology::label(bool guided) const {
  const int sp = sp_of(guided);
  if (cfg && guided) return sp > 1 ? str("cfg 2 x sp ", sp) : std::string("cfg 2");
  return sp > 1 ? str("sp ", sp) : std::string("dp");
}

TopologyCosts topology_costs(const std::string& device_kind) {
  TopologyCosts c;
  c.device = device_kind;
  c.measured = device_kind == "cpu";
  return c;
}

double predicted_speedup(int sp, bool cfg, const TopologyCosts& costs) {
  const double along = std::pow(static_cast<double>(sp), std::log2(2 * costs.sp_efficiency));
  return along * (cfg ? 2 * costs.cfg_efficiency : 1.0);
}

Topology choose_topology(const TopologyRequest& request, const TopologyLimits& l) {
  DLO_ASSERT(l.ranks >= 1 && l.steps.size() == l.guided.size() && l.steps.size() == l.tokens.size());
  const bool explicit_sp = request.sp > 0;
  const bool cfg_on = request.cfg == TopologyRequest::Cfg::kOn, cfg_off = request.cfg == TopologyRequest::Cfg::kOff;
  Topology dp;
  dp.predicted = dp.predicted_dp = predicted_time(dp, l);
  const auto flags = [&] {
    return str("--sp ", explicit_sp ? std::to_string(request.sp) : std::string("auto"), " --cfg-parallel ",
               cfg_on ? "on" : cfg_off ? "off" : "auto");
  };
  if (!l.groups_supported) {
    // Only explicit requests for groups are refused; auto stays data parallel.
    DLO_CHECK(!(explicit_sp && request.sp > 1) && !cfg_on, flags(), ": ", l.unsupported_why);
    dp.reason = str("every rank its own job (", l.unsupported_why, ")");
    return dp;
  }
  const bool full = static_cast<int>(l.steps.size()) >= l.ranks;
  if (!explicit_sp && request.cfg == TopologyRequest::Cfg::kAuto && full) {
    // A job per rank keeps every rank busy without any exchange.
    dp.reason = str("every rank its own job: ", l.steps.size(), " job(s) on ", l.ranks, " rank(s)");
    return dp;
  }
  // Without figures for the device, auto splits only a single job, over every rank.
  const bool guarded = !l.costs.measured && !explicit_sp && request.cfg == TopologyRequest::Cfg::kAuto;
  const std::string unmeasured = str("no topology cost figures for ", l.costs.device, " yet");
  if (guarded && l.steps.size() != 1) {
    dp.reason = str("every rank its own job (", unmeasured, ": auto splits only a single job)");
    return dp;
  }
  DLO_CHECK(request.sp <= l.ranks, flags(), " on ", l.ranks, " rank(s): ", request.sp, " ranks along the sequence > ",
            l.ranks, " rank(s)");
  std::vector<Topology> candidates;
  std::string refused;
  for (int sp = 1; sp <= l.ranks; ++sp) {
    if (explicit_sp && sp != request.sp) continue;
    for (const bool cfg : {false, true}) {
      if ((cfg && cfg_off) || (!cfg && cfg_on)) continue;
      Topology t;
      t.group_size = sp * (cfg ? 2 : 1);
      t.cfg = cfg;
      if (guarded && t.group_size != l.ranks) continue;
      if (const std::string why = violation(t, l); !why.empty()) {
        if (refused.empty()) refused = why;
        continue;
      }
      t.predicted = predicted_time(t, l);
      t.predicted_dp = dp.predicted;
      candidates.push_back(t);
    }
  }
  if (guarded && candidates.empty()) {
    dp.reason = str("every rank its own job (", unmeasured, "; one group of all ", l.ranks, " ranks does not fit: ", refused, ")");
    return dp;
  }
  DLO_CHECK(!candidates.empty(), flags(), " on ", l.ranks, " rank(s): ", refused.empty() ? "no topology fits" : refused);
  // Candidates come by SP degree, then without CFG first: a tie keeps the smaller group.
  // Unmeasured: a guided job takes the CFG pair where there is one (its exchange is one prediction
  // per step), else the group along the sequence.
  const Topology* best = &candidates.front();
  for (const auto& t : candidates)
    if (guarded ? t.cfg && l.guided[0] : t.predicted < best->predicted * (1 - 1e-9)) best = &t;
  Topology t = *best;
  if (guarded) {
    t.reason = str(groups_of(t, l), ": a single job on every rank (", unmeasured, ": auto does not weigh topologies)");
    return t;
  }
  t.reason = str(groups_of(t, l), ": ", l.steps.size(), " job(s) on ", l.ranks, " rank(s), predicted ", two_digits(t.predicted),
                 " single-rank step times vs ", two_digits(t.predicted_dp), " data parallel",
                 explicit_sp || request.cfg != TopologyRequest::Cfg::kAuto ? str(" (", flags(), ")") : std::string());
  return t;
}

namespace {

// The limits of jobs [first, first + count) alone.
TopologyLimits part(const TopologyLimits& l, std::int64_t first, std::int64_t count) {
  TopologyLimits p = l;
  const auto b = static_cast<std::ptrdiff_t>(first), e = static_cast<std::ptrdiff_t>(first + count);
  p.steps.assign(l.steps.begin() + b, l.steps.begin() + e);
  p.guided.assign(l.guided.begin() + b, l.guided.begin() + e);
  p.tokens.assign(l.tokens.begin() + b, l.tokens.begin() + e);
  return p;
}

}  // namespace

TopologyPlan plan_topology(const TopologyRequest& request, const TopologyLimits& l) {
  TopologyPlan plan;
  const auto jobs = static_cast<std::int64_t>(l.steps.size());
  const Topology whole = choose_topology(request, l);
  plan.phases.push_back({0, jobs, whole});
  plan.predicted = whole.predicted;
  plan.predicted_dp = whole.predicted_dp;
  plan.reason = whole.reason;
  const bool automatic = request.sp == 0 && request.cfg == TopologyRequest::Cfg::kAuto;
  if (!automatic || !l.groups_supported || !l.costs.measured || whole.group_size != 1 || l.ranks < 2 || jobs < l.ranks + 1)
    return plan;
  // A data-parallel batch: a tail of K jobs on groups of their own, after the first jobs - K.
  double best = whole.predicted * (1 - kTailGain);
  for (std::int64_t k = 1; k < l.ranks && jobs - k >= l.ranks; ++k) {
    const TopologyLimits head = part(l, 0, jobs - k), tail = part(l, jobs - k, k);
    const Topology first = choose_topology(request, head), last = choose_topology(request, tail);
    if (last.group_size == 1) continue;  // the tail alone would stay data parallel: nothing gained
    const double t = first.predicted + last.predicted;
    if (t >= best) continue;
    best = t;
    plan.phases = {{0, jobs - k, first}, {jobs - k, k, last}};
    plan.predicted = t;
  }
  if (plan.phases.size() == 1) {
    plan.reason += str(" (no tail phase on groups predicts ", static_cast<int>(kTailGain * 100),
                       "% less than data parallel throughout)");
  } else {
    const TopologyPhase& tail = plan.phases[1];
    plan.reason = str("every rank its own job, then the last ", tail.count, " job(s) on ",
                      groups_of(tail.topology, part(l, tail.first, tail.count)),
                      " once the others are done: predicted ", two_digits(plan.predicted), " single-rank step times vs ",
                      two_digits(plan.predicted_dp), " data parallel throughout");
  }
  return plan;
}

TopologyLimits topology_limits(const ModelInfo& model, const std::vector<const JobSpec*>& jobs, int ranks,
                               const TopologyCosts& costs) {
  TopologyLimits l;
  l.ranks = ranks;
  l.costs = costs;
  const std::vector<WanTransformerConfig> configs = model.expert_configs();
  l.heads = std::numeric_limits<int>::max();
  for (const auto& c : configs) l.heads = std::min(l.heads, static_cast<int>(c.num_attention_heads));
  for (const JobSpec* j : jobs) {
    const std::vector<std::int64_t> shape = model.latent_shape(j->frames, j->height, j->width);
    l.steps.push_back(j->steps);
    l.guided.push_back(j->guided());
    l.tokens.push_back(wan_tokens(configs.front(), shape[2], shape[3], shape[4]));
    l.names.push_back(j->id);
  }
  return l;
}

void check_topology(const TopologyRequest& request, const ModelInfo& model, const std::vector<const JobSpec*>& jobs,
                    int ranks) {
  (void)plan_topology(request, topology_limits(model, jobs, ranks, topology_costs("cpu")));
}

}  // namespace dlo
