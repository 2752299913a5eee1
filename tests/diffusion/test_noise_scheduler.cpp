// dlo/diffusion/noise_scheduler.h: the schedules and step chains against diffusers' own numbers
// (tests/data/schedulers/goldens.safetensors, written by tools/reference/make_scheduler_goldens.py),
// against values computed by hand from wan-spec 4 (a second, independent source), config parsing
// and refusals, overrides, and misuse.
#include "common/doctest_torch.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "common/source_tree.h"
#include "dlo/common/error.h"
#include "dlo/diffusion/noise_scheduler.h"
#include "dlo/io/safetensors.h"
#include "dlo/models/tensor_view.h"
#include "dlo/testing/make_model.h"

using namespace dlo;
using dlo::test::TempDir;

namespace {

// The parity test (make_scheduler_goldens.py --check) points this at goldens freshly computed by
// the installed diffusers.
std::string goldens_path() {
  const char* env = std::getenv("DLO_SCHEDULER_GOLDENS");
  return env && *env ? env : dlo::test::source_dir() + "/tests/data/schedulers/goldens.safetensors";
}

struct Goldens {
  Checkpoint ck;
  std::map<std::string, std::string> meta;
  // Case names ("sched/unipc/n10/s3", "chain/euler/n3", ...) in file order.
  std::vector<std::string> cases(const std::string& prefix) const {
    std::vector<std::string> out;
    for (const auto& [k, v] : meta) {
      const auto p = k.rfind("/config");
      if (k.rfind(prefix, 0) == 0 && p != std::string::npos && p + 7 == k.size()) out.push_back(k.substr(0, p));
    }
    return out;
  }
  at::Tensor get(const std::string& name) const { return tensor_view(ck, name).clone(); }
};

// The device the chains run on: DLO_SCHEDULER_DEVICE (the parity script's --device), else the CPU.
at::Device chain_device() {
  const char* env = std::getenv("DLO_SCHEDULER_DEVICE");
  return at::Device(env && *env ? env : "cpu");
}

const Goldens& goldens() {
  static const Goldens g = [] {
    Checkpoint ck = Checkpoint::open(goldens_path());
    auto meta = ck.metadata();
    return Goldens{std::move(ck), std::move(meta)};
  }();
  return g;
}

std::unique_ptr<NoiseScheduler> scheduler_for(const std::string& case_name) {
  const auto& g = goldens();
  auto config = NoiseSchedulerConfig::from_json_text(g.meta.at(case_name + "/config"), case_name);
  auto s = make_noise_scheduler(config);
  s->set_timesteps(std::stoll(g.meta.at(case_name + "/steps")));
  return s;
}

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor ad = a.to(at::kDouble), bd = b.to(at::kDouble);
  const double ref = bd.norm().item<double>();
  const double diff = (ad - bd).norm().item<double>();
  return ref > 0 ? diff / ref : diff;
}

std::string dtype_name(const at::Tensor& t) { return c10::toString(t.scalar_type()); }

// Runs a chain as WanPipeline does: sample = step(model_output[i], sample) for every i.
std::vector<at::Tensor> run_chain(NoiseScheduler& s, at::Tensor sample, const at::Tensor& model_outputs) {
  std::vector<at::Tensor> outs;
  for (std::int64_t i = 0; i < model_outputs.size(0); ++i) {
    sample = s.step(model_outputs[i], sample);
    outs.push_back(sample);
  }
  return outs;
}

using dlo::test::error_of;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The real Wan2.1-T2V-*-Diffusers scheduler/scheduler_config.json (wan-spec 3.6).
const char* kWanConfig =
    R"({"_class_name":"UniPCMultistepScheduler","_diffusers_version":"0.33.0.dev0","beta_end":0.02,"beta_schedule":"linear",
 "beta_start":0.0001,"disable_corrector":[],"dynamic_thresholding_ratio":0.995,"final_sigmas_type":"zero",
 "flow_shift":3.0,"lower_order_final":true,"num_train_timesteps":1000,"predict_x0":true,
 "prediction_type":"flow_prediction","rescale_betas_zero_snr":false,"sample_max_value":1.0,"solver_order":2,
 "solver_p":null,"solver_type":"bh2","steps_offset":0,"thresholding":false,"timestep_spacing":"linspace",
 "trained_betas":null,"use_beta_sigmas":false,"use_exponential_sigmas":false,"use_flow_sigmas":true,
 "use_karras_sigmas":false})";

// FlowMatchEulerDiscreteScheduler(shift=5.0).save_config() of diffusers 0.42.1.
const char* kEulerConfig =
    R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.42.1", "base_image_seq_len": 256,
  "base_shift": 0.5, "invert_sigmas": false, "max_image_seq_len": 4096, "max_shift": 1.15, "num_train_timesteps": 1000,
  "shift": 5.0, "shift_terminal": null, "stochastic_sampling": false, "time_shift_type": "exponential",
  "use_beta_sigmas": false, "use_dynamic_shifting": false, "use_exponential_sigmas": false, "use_karras_sigmas": false})";

// kWanConfig (or kEulerConfig) with `key` set to the JSON `value` ("" removes the key).
std::string with_key(const char* base, const std::string& key, const std::string& value) {
  auto j = nlohmann::json::parse(base);
  if (value.empty())
    j.erase(key);
  else
    j[key] = nlohmann::json::parse(value);
  return j.dump();
}

std::string parse_error(const std::string& text) {
  return error_of([&] { NoiseSchedulerConfig::from_json_text(text, "m/scheduler/scheduler_config.json"); });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Against diffusers (the goldens). The names contain "diffusers": the parity test selects them.

TEST_CASE("diffusers goldens: the file holds every case the issue asks for") {
  const auto& g = goldens();
  for (const char* cls : {"unipc", "euler"})
    for (int n : {1, 2, 3, 10, 50})
      for (int s : {1, 3, 5}) {
        const std::string c = str("sched/", cls, "/n", n, "/s", s);
        CHECK_MESSAGE(g.meta.count(c + "/config"), c);
      }
  for (const char* cls : {"unipc", "euler"}) {
    for (int n : {1, 2, 3, 10}) CHECK(g.meta.count(str("chain/", cls, "/n", n, "/config")));
    CHECK(g.meta.count(str("chain/", cls, "/n10/bf16/config")));
  }
  CHECK(g.cases("sched/").size() >= 33);
  CHECK(g.cases("chain/").size() >= 25);
}

TEST_CASE("diffusers goldens: timesteps and sigmas are bitwise diffusers' (both schedulers, all steps and shifts)") {
  const auto& g = goldens();
  int n = 0;
  for (const auto& c : g.cases("sched/")) {
    CAPTURE(c);
    auto s = scheduler_for(c);
    const at::Tensor ts = g.get(c + "/timesteps"), sig = g.get(c + "/sigmas");
    CHECK(dtype_name(s->timesteps()) == dtype_name(ts));
    CHECK(dtype_name(s->sigmas()) == "Float");
    CHECK(s->timesteps().device().is_cpu());
    CHECK(s->sigmas().device().is_cpu());
    CHECK(at::equal(s->timesteps(), ts));
    CHECK(at::equal(s->sigmas(), sig));
    ++n;
  }
  CHECK(n >= 33);
}

TEST_CASE("diffusers goldens: step chains are bitwise diffusers' (fp32 and bf16 model outputs, every option)") {
  // Bitwise: the same ATen ops run in the same order on the same dtypes and devices as diffusers.
  const auto& g = goldens();
  const at::Device dev = chain_device();
  int n = 0;
  for (const auto& c : g.cases("chain/")) {
    CAPTURE(c);
    auto s = scheduler_for(c);
    const at::Tensor mo = g.get(c + "/model_output").to(dev), want = g.get(c + "/out");
    auto outs = run_chain(*s, g.get(c + "/sample0").to(dev), mo);
    for (auto& o : outs) {
      CHECK(o.device() == dev);
      o = o.cpu();
    }
    REQUIRE(static_cast<std::int64_t>(outs.size()) == want.size(0));
    CHECK(s->step_index() == want.size(0));
    for (std::size_t i = 0; i < outs.size(); ++i) {
      CAPTURE(i);
      CHECK(dtype_name(outs[i]) == dtype_name(want[i]));
      const bool same = at::equal(outs[i], want[i]);
      if (!same) MESSAGE("relative error ", rel_err(outs[i], want[i]));
      CHECK(same);
    }
    ++n;
  }
  CHECK(n >= 25);
}

TEST_CASE("diffusers goldens: a scheduler reused after set_timesteps gives the same chain again") {
  const auto& g = goldens();
  for (const char* c : {"chain/unipc/n10", "chain/euler/n10", "chain/unipc/n10/order3"}) {
    CAPTURE(c);
    auto s = scheduler_for(c);
    const at::Tensor mo = g.get(str(c, "/model_output")), x0 = g.get(str(c, "/sample0"));
    run_chain(*s, x0, mo.slice(0, 0, 4));  // a job abandoned after 4 steps
    s->set_timesteps(mo.size(0));
    CHECK(s->step_index() == 0);
    const auto outs = run_chain(*s, x0, mo);
    CHECK(at::equal(outs.back(), g.get(str(c, "/out"))[-1]));
  }
}

// ---------------------------------------------------------------------------------------------
// By hand (wan-spec 4): a second source, independent of the goldens.

TEST_CASE("hand-checked: UniPC timesteps and sigmas of wan-spec 4.2") {
  auto timesteps = [](double shift, std::int64_t n) {
    NoiseSchedulerConfig c;
    c.flow_shift = shift;
    auto s = make_noise_scheduler(c);
    s->set_timesteps(n);
    const at::Tensor t = s->timesteps();
    return std::vector<std::int64_t>(t.data_ptr<std::int64_t>(), t.data_ptr<std::int64_t>() + t.numel());
  };
  CHECK(timesteps(3, 50) == std::vector<std::int64_t>{999, 993, 986, 979, 971, 964, 956, 948, 940, 931, 923, 914, 904,
                                                      895, 885, 875, 864, 853, 842, 830, 818, 805, 792, 779, 765, 750,
                                                      735, 719, 702, 685, 667, 648, 628, 607, 586, 563, 539, 514, 487,
                                                      459, 429, 398, 365, 329, 292, 251, 208, 162, 113, 60});
  CHECK(timesteps(5, 50) == std::vector<std::int64_t>{999, 995, 991, 987, 982, 978, 973, 968, 963, 957, 952, 946, 940,
                                                      934, 927, 921, 914, 906, 899, 890, 882, 873, 864, 854, 844, 833,
                                                      822, 810, 797, 783, 769, 754, 738, 720, 702, 682, 661, 638, 613,
                                                      586, 556, 524, 489, 450, 407, 359, 305, 244, 175, 96});
  CHECK(timesteps(3, 2) == std::vector<std::int64_t>{999, 750});
  CHECK(timesteps(3, 4) == std::vector<std::int64_t>{999, 900, 750, 500});

  auto sigmas = [](std::int64_t n) {
    auto s = make_noise_scheduler(NoiseSchedulerConfig{});
    s->set_timesteps(n);
    return s->sigmas();
  };
  auto near = [](const at::Tensor& got, std::vector<double> want) {
    REQUIRE(got.numel() == static_cast<std::int64_t>(want.size()));
    for (std::size_t i = 0; i < want.size(); ++i)
      CHECK(std::fabs(got[static_cast<std::int64_t>(i)].item<double>() - want[i]) <= 1e-9);
  };
  near(sigmas(2), {0.999998987, 0.750374794, 0});
  near(sigmas(4), {0.999998987, 0.90011996, 0.750374794, 0.500998974, 0});
  const at::Tensor s50 = sigmas(50);
  near(s50.slice(0, 0, 3), {0.999998987, 0.993250072, 0.986315429});
  near(s50.slice(0, 48), {0.113575868, 0.0604053885, 0});
}

TEST_CASE("hand-checked: FlowMatchEuler's schedule is the double-shifted linspace of wan-spec 4.1") {
  // sigma_max = 1, sigma_min = shift*0.001 / (1 + (shift-1)*0.001); linspace of sigma*1000 between
  // them, shifted again. Computed here in double from the closed form (diffusers gets sigma_min in
  // float32 and rounds the result to float32): relative error <= 1e-6.
  for (double shift : {1.0, 3.0, 5.0, 7.0}) {
    for (std::int64_t n : {1, 2, 3, 10}) {
      CAPTURE(shift);
      CAPTURE(n);
      NoiseSchedulerConfig c;
      c.kind = NoiseSchedulerKind::kFlowEuler;
      c.flow_shift = shift;
      auto s = make_noise_scheduler(c);
      s->set_timesteps(n);
      REQUIRE(s->sigmas().numel() == n + 1);
      CHECK(dtype_name(s->timesteps()) == "Float");
      const double smin = shift * 0.001 / (1 + (shift - 1) * 0.001);
      for (std::int64_t i = 0; i < n; ++i) {
        const double t = n == 1 ? 1000.0 : 1000.0 + (smin * 1000 - 1000.0) * static_cast<double>(i) / (n - 1);
        const double sg = shift * (t / 1000) / (1 + (shift - 1) * (t / 1000));
        CHECK(std::fabs(s->sigmas()[i].item<double>() - sg) <= 1e-6 * sg);
        CHECK(std::fabs(s->timesteps()[i].item<double>() - 1000 * sg) <= 1e-6 * 1000 * sg);
      }
      CHECK(s->sigmas()[n].item<double>() == 0.0);
    }
  }
  // Three steps, shift 3, by hand: 1000, 751.1211, 8.928571.
  NoiseSchedulerConfig c;
  c.kind = NoiseSchedulerKind::kFlowEuler;
  auto s = make_noise_scheduler(c);
  s->set_timesteps(3);
  CHECK(s->timesteps()[0].item<double>() == 1000.0);
  CHECK(std::fabs(s->timesteps()[1].item<double>() - 751.1211) < 1e-3);
  CHECK(std::fabs(s->timesteps()[2].item<double>() - 8.928571) < 1e-5);
}

namespace {

// wan-spec 4.2's UniPC (order 2, bh2, lower_order_final, corrector on) written from the formulas in
// double precision, with the float32 sigmas of the schedule. Independent of the scheduler's code.
std::vector<at::Tensor> unipc_by_hand(const at::Tensor& sigmas_f32, at::Tensor x, const at::Tensor& vs) {
  const std::int64_t n = vs.size(0);
  std::vector<double> sg, al, lam;
  for (std::int64_t i = 0; i <= n; ++i) {
    const double s = sigmas_f32[i].item<double>();
    sg.push_back(s);
    al.push_back(1 - s);
    lam.push_back(std::log(1 - s) - std::log(s));  // +inf at sigma 0
  }
  x = x.to(at::kDouble);
  std::vector<at::Tensor> ms, outs;
  at::Tensor last;
  int this_order = 0, lower = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const at::Tensor m = x - sg[i] * vs[i].to(at::kDouble);
    if (i > 0) {  // corrector with order this_order, from last (at i-1) to i
      const at::Tensor m0 = ms.back();
      const double h = lam[i] - lam[i - 1], hh = -h, hphi1 = std::expm1(hh), B = std::expm1(hh);
      const at::Tensor base = (sg[i] / sg[i - 1]) * last - al[i] * hphi1 * m0;
      if (this_order == 1) {
        x = base - al[i] * B * (0.5 * (m - m0));
      } else {
        const double r = (lam[i - 2] - lam[i - 1]) / h;
        const at::Tensor D = (ms[ms.size() - 2] - m0) / r;
        const double k1 = hphi1 / hh - 1, b1 = k1 / B, k2 = k1 / hh - 0.5, b2 = 2 * k2 / B;
        const double rho0 = (b1 - b2) / (1 - r), rho1 = b1 - rho0;  // [[1,1],[r,1]] rho = [b1,b2]
        x = base - al[i] * B * (rho0 * D + rho1 * (m - m0));
      }
    }
    ms.push_back(m);
    this_order = static_cast<int>(std::min<std::int64_t>({2, n - i, lower + 1}));
    last = x;
    const double h = lam[i + 1] - lam[i], hh = -h, hphi1 = std::expm1(hh), B = std::expm1(hh);
    at::Tensor next = (sg[i + 1] / sg[i]) * x - al[i + 1] * hphi1 * m;
    if (this_order == 2) {
      const double r = (lam[i - 1] - lam[i]) / h;
      next = next - al[i + 1] * B * 0.5 * ((ms[ms.size() - 2] - m) / r);
    }
    lower = std::min(lower + 1, 2);
    x = next;
    outs.push_back(x);
  }
  return outs;
}

}  // namespace

TEST_CASE("hand-checked: UniPC and Euler chains equal the spec's formulas in double (rel. error <= 1e-5)") {
  // float32 against float64 math: not bitwise; the bound is loose for 10 steps of float32 rounding.
  at::manual_seed(7);
  for (std::int64_t n : {1, 2, 3, 10}) {
    CAPTURE(n);
    const at::Tensor x0 = at::randn({2, 3, 2, 3, 4});
    const at::Tensor vs = at::randn({n, 2, 3, 2, 3, 4});
    auto s = make_noise_scheduler(NoiseSchedulerConfig{});
    s->set_timesteps(n);
    const auto want = unipc_by_hand(s->sigmas(), x0, vs);
    const auto got = run_chain(*s, x0, vs);
    double worst = 0;
    for (std::int64_t i = 0; i < n; ++i) worst = std::max(worst, rel_err(got[i], want[i]));
    MESSAGE("unipc, ", n, " steps: max relative error vs the spec in double ", worst);
    CHECK(worst <= 1e-5);
    // The last step returns the x0 prediction x - sigma * v (sigma_N = 0, alpha_N = 1).
    CHECK(rel_err(got.back(), (n == 1 ? x0 : got[n - 2]) - s->sigmas()[n - 1].item<float>() * vs[n - 1]) <= 1e-6);

    NoiseSchedulerConfig e;
    e.kind = NoiseSchedulerKind::kFlowEuler;
    auto se = make_noise_scheduler(e);
    se->set_timesteps(n);
    const auto got_e = run_chain(*se, x0, vs);
    at::Tensor xe = x0.to(at::kDouble);
    worst = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      xe = xe + (se->sigmas()[i + 1].item<double>() - se->sigmas()[i].item<double>()) * vs[i].to(at::kDouble);
      worst = std::max(worst, rel_err(got_e[i], xe));
    }
    MESSAGE("euler, ", n, " steps: max relative error vs the spec in double ", worst);
    CHECK(worst <= 1e-5);
  }
}

TEST_CASE("dtypes: UniPC keeps the sample's dtype, Euler returns the model output's") {
  const at::Tensor x = at::randn({1, 4, 2, 3, 5});
  const at::Tensor v = at::randn({1, 4, 2, 3, 5}).to(at::kBFloat16);
  auto u = make_noise_scheduler(NoiseSchedulerConfig{});
  u->set_timesteps(3);
  CHECK(dtype_name(u->step(v, x)) == "Float");
  NoiseSchedulerConfig ec;
  ec.kind = NoiseSchedulerKind::kFlowEuler;
  auto e = make_noise_scheduler(ec);
  e->set_timesteps(3);
  const at::Tensor x1 = e->step(v, x);
  CHECK(dtype_name(x1) == "BFloat16");
  CHECK(dtype_name(e->step(v, x1)) == "BFloat16");
}

// ---------------------------------------------------------------------------------------------
// Config files.

TEST_CASE("config: the real Wan2.1 scheduler_config.json is the default config") {
  TempDir tmp;
  dlo::test::write_file(tmp.file("scheduler_config.json"), kWanConfig);
  const auto c = NoiseSchedulerConfig::from_json_file(tmp.file("scheduler_config.json"));
  CHECK(c.kind == NoiseSchedulerKind::kUniPC);
  CHECK(c.num_train_timesteps == 1000);
  CHECK(c.flow_shift == 3.0);
  CHECK(c.solver_order == 2);
  CHECK(c.solver_type == "bh2");
  CHECK(c.lower_order_final);
  CHECK(c.disable_corrector.empty());
  CHECK(c.final_sigmas_type == "zero");
  CHECK(c.to_json() == NoiseSchedulerConfig{}.to_json());
  CHECK(c.to_json() ==
        R"({"_class_name":"UniPCMultistepScheduler","disable_corrector":[],"final_sigmas_type":"zero","flow_shift":3.0,)"
        R"("lower_order_final":true,"num_train_timesteps":1000,"predict_x0":true,"prediction_type":"flow_prediction",)"
        R"("solver_order":2,"solver_type":"bh2","use_flow_sigmas":true})");
}

TEST_CASE("config: dlo-checkpoint make's scheduler component parses (the Wan2.1 config)") {
  TempDir tmp;
  MakeModelOptions o;
  o.components = {"scheduler"};
  make_model(tmp.file("m"), o);
  const auto c = NoiseSchedulerConfig::from_json_file(tmp.file("m/scheduler/scheduler_config.json"));
  CHECK(c.to_json() == NoiseSchedulerConfig{}.to_json());
}

TEST_CASE("config: a FlowMatchEulerDiscreteScheduler config parses") {
  const auto c = NoiseSchedulerConfig::from_json_text(kEulerConfig, "x.json");
  CHECK(c.kind == NoiseSchedulerKind::kFlowEuler);
  CHECK(c.flow_shift == 5.0);
  CHECK(c.num_train_timesteps == 1000);
  CHECK(c.to_json() == R"({"_class_name":"FlowMatchEulerDiscreteScheduler","num_train_timesteps":1000,"shift":5.0})");
  // Missing keys take diffusers' defaults: shift 1.
  const auto d = NoiseSchedulerConfig::from_json_text(R"({"_class_name": "FlowMatchEulerDiscreteScheduler"})", "y");
  CHECK(d.flow_shift == 1.0);
}

TEST_CASE("config: options without effect in flow mode are accepted, and heun, midpoint, logrho are bh2 as in diffusers") {
  auto p = [](const std::string& t) { return NoiseSchedulerConfig::from_json_text(t, "f"); };
  CHECK(p(with_key(kWanConfig, "beta_schedule", R"("scaled_linear")")).to_json() == NoiseSchedulerConfig{}.to_json());
  CHECK(p(with_key(kWanConfig, "timestep_spacing", R"("trailing")")).to_json() == NoiseSchedulerConfig{}.to_json());
  CHECK(p(with_key(kWanConfig, "rescale_betas_zero_snr", "true")).to_json() == NoiseSchedulerConfig{}.to_json());
  CHECK(p(with_key(kWanConfig, "sigma_min", "0.002")).to_json() == NoiseSchedulerConfig{}.to_json());
  CHECK(p(with_key(kWanConfig, "_name_or_path", R"("x")")).to_json() == NoiseSchedulerConfig{}.to_json());
  for (const char* t : {"heun", "midpoint", "logrho"})
    CHECK(p(with_key(kWanConfig, "solver_type", str("\"", t, "\""))).solver_type == "bh2");
  CHECK(p(with_key(with_key(kWanConfig, "solver_type", R"("bh1")").c_str(), "final_sigmas_type", R"("sigma_min")"))
            .solver_type == "bh1");
  const auto c = p(with_key(with_key(kWanConfig, "disable_corrector", "[0, 3]").c_str(), "solver_order", "3"));
  CHECK(c.disable_corrector == std::vector<std::int64_t>{0, 3});
  CHECK(c.solver_order == 3);
  CHECK(p(with_key(kWanConfig, "final_sigmas_type", R"("sigma_min")")).final_sigmas_type == "sigma_min");
  CHECK(p(with_key(kWanConfig, "flow_shift", "5")).flow_shift == 5.0);  // an integer shift
}

TEST_CASE("config: unsupported classes and values are refused, naming the file, the key and the value") {
  const std::string f = "m/scheduler/scheduler_config.json";
  struct Case {
    std::string text, want;
  };
  const std::vector<Case> cases = {
      {with_key(kWanConfig, "_class_name", R"("DDIMScheduler")"),
       f + ": '_class_name' is \"DDIMScheduler\", not supported (dlo supports UniPCMultistepScheduler and "
           "FlowMatchEulerDiscreteScheduler)"},
      {with_key(kWanConfig, "_class_name", ""), f + ": no '_class_name'"},
      {with_key(kWanConfig, "prediction_type", R"("epsilon")"),
       f + ": 'prediction_type' is \"epsilon\", not supported (dlo supports \"flow_prediction\""},
      {with_key(kWanConfig, "prediction_type", ""),
       f + ": 'prediction_type' is missing (diffusers' default \"epsilon\"), not supported"},
      {with_key(kWanConfig, "use_flow_sigmas", ""),
       f + ": 'use_flow_sigmas' is missing (diffusers' default false), not supported"},
      {with_key(kWanConfig, "use_karras_sigmas", "true"), f + ": 'use_karras_sigmas' is true, not supported"},
      {with_key(kWanConfig, "use_exponential_sigmas", "true"), f + ": 'use_exponential_sigmas' is true, not supported"},
      {with_key(kWanConfig, "use_beta_sigmas", "true"), f + ": 'use_beta_sigmas' is true, not supported"},
      {with_key(kWanConfig, "solver_type", R"("bh3")"), f + ": 'solver_type' is \"bh3\", not supported"},
      {with_key(kWanConfig, "solver_type", R"("bh1")"),
       f + ": noise scheduler: solver_type 'bh1' with final_sigmas_type 'zero' is not supported"},
      {with_key(kWanConfig, "thresholding", "true"), f + ": 'thresholding' is true, not supported"},
      {with_key(kWanConfig, "predict_x0", "false"), f + ": 'predict_x0' is false, not supported"},
      {with_key(kWanConfig, "solver_order", "4"), f + ": 'solver_order' is 4, not supported (dlo supports 1, 2 and 3)"},
      {with_key(kWanConfig, "solver_order", "0"), f + ": 'solver_order' is 0, not supported"},
      {with_key(kWanConfig, "solver_p", "{}"), f + ": 'solver_p' is {}, not supported"},
      {with_key(kWanConfig, "use_dynamic_shifting", "true"), f + ": 'use_dynamic_shifting' is true, not supported"},
      {with_key(kWanConfig, "shift_terminal", "0.1"), f + ": 'shift_terminal' is 0.1, not supported"},
      {with_key(kWanConfig, "final_sigmas_type", R"("one")"), f + ": 'final_sigmas_type' is \"one\", not supported"},
      {with_key(kWanConfig, "beta_schedule", R"("cosine")"), f + ": 'beta_schedule' is \"cosine\", not supported"},
      {with_key(kWanConfig, "timestep_spacing", R"("even")"), f + ": 'timestep_spacing' is \"even\", not supported"},
      {with_key(kWanConfig, "flow_shift", "-1"), f + ": 'flow_shift' is -1, must be a positive number"},
      {with_key(kWanConfig, "flow_shift", R"("3")"), f + ": field 'flow_shift' must be a number, got \"3\""},
      {with_key(kWanConfig, "solver_order", "2.5"), f + ": field 'solver_order' must be an integer, got 2.5"},
      {with_key(kWanConfig, "disable_corrector", "[true]"),
       f + ": field 'disable_corrector' must be a list of integers, got [true]"},
      {with_key(kWanConfig, "lower_order_final", "null"), f + ": field 'lower_order_final' must be true or false, got null"},
      {with_key(kWanConfig, "clip_sample", "true"),
       f + ": unknown key 'clip_sample' (= true) for UniPCMultistepScheduler"},
      {with_key(kWanConfig, "num_train_timesteps", "0"), f + ": noise scheduler: num_train_timesteps is 0"},
      {with_key(kEulerConfig, "num_train_timesteps", "10000000000"),
       f + ": noise scheduler: num_train_timesteps is 10000000000, must be in 1..1000000"},
      {with_key(kEulerConfig, "use_dynamic_shifting", "true"), f + ": 'use_dynamic_shifting' is true, not supported"},
      {with_key(kEulerConfig, "invert_sigmas", "true"), f + ": 'invert_sigmas' is true, not supported"},
      {with_key(kEulerConfig, "stochastic_sampling", "true"), f + ": 'stochastic_sampling' is true, not supported"},
      {with_key(kEulerConfig, "use_karras_sigmas", "true"), f + ": 'use_karras_sigmas' is true, not supported"},
      {with_key(kEulerConfig, "shift_terminal", "0.02"), f + ": 'shift_terminal' is 0.02, not supported"},
      {with_key(kEulerConfig, "time_shift_type", R"("cubic")"), f + ": 'time_shift_type' is \"cubic\", not supported"},
      {with_key(kEulerConfig, "shift", "0"), f + ": 'shift' is 0, must be a positive number"},
      {with_key(kEulerConfig, "flow_shift", "3.0"),
       f + ": unknown key 'flow_shift' (= 3.0) for FlowMatchEulerDiscreteScheduler"},
      {"[1, 2]", f + ": must be a JSON object"},
      {"{", f + ": not valid JSON"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    const std::string e = parse_error(c.text);
    CHECK_MESSAGE(e.rfind(c.want, 0) == 0, e);
  }
  // A missing file names the path.
  CHECK(contains(error_of([] { NoiseSchedulerConfig::from_json_file("/nonexistent/scheduler_config.json"); }),
                 "/nonexistent/scheduler_config.json"));
}

TEST_CASE("config: to_json reads back to the same config (every golden case)") {
  for (const auto& c : goldens().cases("")) {
    CAPTURE(c);
    const auto a = NoiseSchedulerConfig::from_json_text(goldens().meta.at(c + "/config"), c);
    const auto b = NoiseSchedulerConfig::from_json_text(a.to_json(), "to_json");
    CHECK(a.to_json() == b.to_json());
    CHECK(b.kind == a.kind);
    CHECK(b.flow_shift == a.flow_shift);
    CHECK(b.solver_order == a.solver_order);
    CHECK(b.disable_corrector == a.disable_corrector);
  }
}

TEST_CASE("overrides: --scheduler and --flow-shift") {
  auto unipc3 = NoiseSchedulerConfig::from_json_text(with_key(kWanConfig, "solver_order", "3"), "f");
  // Nothing: unchanged.
  CHECK(unipc3.with_overrides(std::nullopt, std::nullopt).to_json() == unipc3.to_json());
  // The shift only: the folder's other options stay.
  auto a = unipc3.with_overrides(std::nullopt, 5.0);
  CHECK(a.kind == NoiseSchedulerKind::kUniPC);
  CHECK(a.flow_shift == 5.0);
  CHECK(a.solver_order == 3);
  CHECK(unipc3.with_overrides(NoiseSchedulerKind::kUniPC, 7.0).solver_order == 3);
  // euler: diffusers' FlowMatchEuler defaults with shift = the folder's flow_shift, or the override.
  auto e = unipc3.with_overrides(NoiseSchedulerKind::kFlowEuler, std::nullopt);
  CHECK(e.to_json() == R"({"_class_name":"FlowMatchEulerDiscreteScheduler","num_train_timesteps":1000,"shift":3.0})");
  CHECK(unipc3.with_overrides(NoiseSchedulerKind::kFlowEuler, 5.0).to_json() ==
        R"({"_class_name":"FlowMatchEulerDiscreteScheduler","num_train_timesteps":1000,"shift":5.0})");
  // From an Euler folder to unipc: the Wan2.1 UniPC config with the folder's shift (or the override).
  auto euler = NoiseSchedulerConfig::from_json_text(kEulerConfig, "f");
  auto u = euler.with_overrides(NoiseSchedulerKind::kUniPC, std::nullopt);
  NoiseSchedulerConfig wan5;
  wan5.flow_shift = 5.0;
  CHECK(u.to_json() == wan5.to_json());
  CHECK(euler.with_overrides(NoiseSchedulerKind::kUniPC, 3.0).to_json() == NoiseSchedulerConfig{}.to_json());
  CHECK(euler.with_overrides(std::nullopt, 2.0).flow_shift == 2.0);
  // Bad shifts.
  CHECK(contains(error_of([&] { euler.with_overrides(std::nullopt, 0.0); }), "--flow-shift 0: must be a positive"));
  CHECK(contains(error_of([&] { euler.with_overrides(std::nullopt, NAN); }), "--flow-shift"));
  // Names.
  CHECK(parse_noise_scheduler_kind("unipc") == NoiseSchedulerKind::kUniPC);
  CHECK(parse_noise_scheduler_kind("euler") == NoiseSchedulerKind::kFlowEuler);
  CHECK(std::string(noise_scheduler_name(NoiseSchedulerKind::kUniPC)) == "unipc");
  CHECK(std::string(noise_scheduler_name(NoiseSchedulerKind::kFlowEuler)) == "euler");
  CHECK(error_of([] { parse_noise_scheduler_kind("ddim"); }) == "unknown noise scheduler 'ddim' (unipc, euler)");
}

// ---------------------------------------------------------------------------------------------
// Misuse.

TEST_CASE("misuse: steps < 1, step before set_timesteps or past the end, mismatched tensors") {
  for (auto kind : {NoiseSchedulerKind::kUniPC, NoiseSchedulerKind::kFlowEuler}) {
    CAPTURE(noise_scheduler_name(kind));
    NoiseSchedulerConfig c;
    c.kind = kind;
    auto s = make_noise_scheduler(c);
    const at::Tensor x = at::randn({1, 2, 3}), v = at::randn({1, 2, 3});
    CHECK(contains(error_of([&] { s->step(v, x); }), "step() before set_timesteps()"));
    CHECK(contains(error_of([&] { s->set_timesteps(0); }), "the number of steps must be >= 1, got 0"));
    s->set_timesteps(2);
    CHECK(contains(error_of([&] { s->step(at::randn({1, 2, 4}), x); }), "shape"));
    s->step(v, x);
    s->step(v, x);
    CHECK(s->step_index() == 2);
    CHECK(contains(error_of([&] { s->step(v, x); }), "step() called 3 times for 2 steps"));
  }
  NoiseSchedulerConfig bad;
  bad.solver_order = 5;
  CHECK(contains(error_of([&] { make_noise_scheduler(bad); }), "solver_order is 5"));
  bad = NoiseSchedulerConfig{};
  bad.solver_type = "bh3";
  CHECK(contains(error_of([&] { make_noise_scheduler(bad); }), "solver_type is 'bh3'"));
}

// ---------------------------------------------------------------------------------------------
// The lightx2v schedule (docs/distilled.md).

TEST_CASE("lightx2v schedule: 4 steps at shift 5 are LightX2V's denoising_step_list [1000, 750, 500, 250]") {
  // LightX2V's WanStepDistillScheduler: sigma = 5s / (1 + 4s) at s = step / 1000, by hand:
  // 5 / 5 = 1, 3.75 / 4 = 0.9375, 2.5 / 3 (float32 0.8333333134651184), 1.25 / 2 = 0.625; then 0.
  NoiseSchedulerConfig c;
  c.kind = NoiseSchedulerKind::kFlowEuler;
  c.flow_shift = 5.0;
  c.schedule = NoiseSchedule::kLightx2v;
  auto s = make_noise_scheduler(c);
  s->set_timesteps(4);
  REQUIRE(s->sigmas().numel() == 5);
  CHECK(dtype_name(s->sigmas()) == "Float");
  CHECK(dtype_name(s->timesteps()) == "Float");
  const double sig[] = {1.0, 0.9375, static_cast<double>(2.5f / 3.0f), 0.625, 0.0};
  const double ts[] = {1000.0, 937.5, static_cast<double>((2.5f / 3.0f) * 1000.0f), 625.0};
  for (int i = 0; i < 5; ++i) CHECK(s->sigmas()[i].item<double>() == sig[i]);
  for (int i = 0; i < 4; ++i) CHECK(s->timesteps()[i].item<double>() == ts[i]);
  CHECK(s->timesteps()[2].item<double>() == 833.3333129882812);
  // Euler to 0: x + (sigma_next - sigma) v, by hand on a constant v.
  at::Tensor x = at::ones({1, 2, 1, 2, 2});
  at::Tensor v = at::full({1, 2, 1, 2, 2}, 2.0);
  for (int i = 0; i < 4; ++i) x = s->step(v, x);
  CHECK(at::allclose(x, at::full({1, 2, 1, 2, 2}, 1.0 - 2.0)));  // sum of the steps: (0 - 1) * 2
}

TEST_CASE("lightx2v schedule: other step counts and shifts are shift(1 - i/steps), in float32") {
  for (double shift : {1.0, 3.0, 5.0, 8.0}) {
    for (std::int64_t n : {1, 2, 3, 8, 50}) {
      CAPTURE(shift);
      CAPTURE(n);
      NoiseSchedulerConfig c;
      c.kind = NoiseSchedulerKind::kFlowEuler;
      c.flow_shift = shift;
      c.schedule = NoiseSchedule::kLightx2v;
      auto s = make_noise_scheduler(c);
      s->set_timesteps(n);
      REQUIRE(s->sigmas().numel() == n + 1);
      for (std::int64_t i = 0; i < n; ++i) {
        const double u = 1.0 - static_cast<double>(i) / static_cast<double>(n);
        const double sg = shift * u / (1 + (shift - 1) * u);
        CHECK(std::fabs(s->sigmas()[i].item<double>() - sg) <= 1e-6 * sg);
      }
      CHECK(s->sigmas()[0].item<double>() == 1.0);
      CHECK(s->sigmas()[n].item<double>() == 0.0);
    }
  }
  // The default schedule is not this one (diffusers shifts its sigma_min twice): 4 steps differ.
  NoiseSchedulerConfig c;
  c.kind = NoiseSchedulerKind::kFlowEuler;
  c.flow_shift = 5.0;
  auto d = make_noise_scheduler(c);
  d->set_timesteps(4);
  CHECK(std::fabs(d->sigmas()[3].item<double>() - 0.625) > 0.5);
}

TEST_CASE("lightx2v schedule: names, overrides (it makes a UniPC folder euler) and refusals") {
  CHECK(parse_noise_schedule("lightx2v") == NoiseSchedule::kLightx2v);
  CHECK(parse_noise_schedule("default") == NoiseSchedule::kDefault);
  CHECK(std::string(noise_schedule_name(NoiseSchedule::kLightx2v)) == "lightx2v");
  CHECK(std::string(noise_schedule_name(NoiseSchedule::kDefault)) == "default");
  CHECK(error_of([] { parse_noise_schedule("lightning"); }) == "unknown schedule 'lightning' (default, lightx2v)");
  const NoiseSchedulerConfig unipc;  // the Wan2.1 folder's
  auto e = unipc.with_overrides(std::nullopt, 5.0, NoiseSchedule::kLightx2v);
  CHECK(e.kind == NoiseSchedulerKind::kFlowEuler);
  CHECK(e.flow_shift == 5.0);
  CHECK(e.schedule == NoiseSchedule::kLightx2v);
  CHECK(unipc.with_overrides(std::nullopt, std::nullopt, NoiseSchedule::kLightx2v).flow_shift == 3.0);
  CHECK(unipc.with_overrides(NoiseSchedulerKind::kFlowEuler, std::nullopt, NoiseSchedule::kLightx2v).kind ==
        NoiseSchedulerKind::kFlowEuler);
  // The default schedule changes nothing.
  CHECK(unipc.with_overrides(std::nullopt, std::nullopt, NoiseSchedule::kDefault).kind == NoiseSchedulerKind::kUniPC);
  const auto clash = unipc.with_overrides(NoiseSchedulerKind::kUniPC, std::nullopt, NoiseSchedule::kLightx2v);
  CHECK(contains(error_of([&] { clash.validate(); }), "schedule 'lightx2v' samples with euler, not unipc"));
  NoiseSchedulerConfig bad;
  bad.schedule = NoiseSchedule::kLightx2v;
  CHECK(contains(error_of([&] { make_noise_scheduler(bad); }), "schedule 'lightx2v' samples with euler, not unipc"));
}
