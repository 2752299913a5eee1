// diffusers' UniPCMultistepScheduler (0.42.1) in flow mode, op for op (wan-spec 4.2): the schedule
// in numpy float64 cast to float32 (timesteps truncated to int64); the step with every scalar a
// 0-dim float32 tensor placed where diffusers places it (the x0 conversion uses the CPU sigma, the
// predictor and corrector move theirs to the sample's device), the same expression order, and the
// same dtypes (bf16 model outputs make a bf16 sigma * v, the result takes the sample's dtype).
#include <algorithm>
#include <cmath>
#include <vector>

#include <ATen/ATen.h>

#include "dlo/common/error.h"
#include "dlo/diffusion/detail.h"

namespace dlo::diffusion_detail {
namespace {

class UniPCScheduler final : public NoiseScheduler {
 public:
  explicit UniPCScheduler(const NoiseSchedulerConfig& config) : config_(config) {}

  const NoiseSchedulerConfig& config() const override { return config_; }

  void set_timesteps(std::int64_t steps) override {
    DLO_CHECK(steps >= 1, "unipc scheduler: the number of steps must be >= 1, got ", steps);
    const std::int64_t n = config_.num_train_timesteps;
    const double nd = static_cast<double>(n);
    // numpy: s = linspace(1, 1/N, steps + 1)[:-1], shifted; s[0] -= 1e-6 when it is within 1e-6 of 1.
    at::Tensor s = numpy_flow_shift(numpy_linspace(1.0, 1.0 / nd, steps + 1).slice(0, 0, steps), config_.flow_shift);
    s = s.contiguous();
    double* sp = s.data_ptr<double>();
    const double eps = 1e-6;
    if (std::fabs(sp[0] - 1) < eps) sp[0] -= eps;
    at::Tensor t = at::mul(s, nd);
    const double last = config_.final_sigmas_type == "sigma_min" ? sp[steps - 1] : 0.0;
    sigmas_ = at::cat({s, at::full({1}, last, at::kDouble)}).to(at::kFloat);
    timesteps_ = t.to(at::kLong);  // truncation toward zero, as torch casts float64 to int64
    steps_ = steps;
    step_index_ = 0;
    model_outputs_.assign(static_cast<std::size_t>(config_.solver_order), at::Tensor());
    last_sample_ = at::Tensor();
    lower_order_nums_ = 0;
    this_order_ = 0;
    shape_.clear();
  }

  const at::Tensor& timesteps() const override { return timesteps_; }
  const at::Tensor& sigmas() const override { return sigmas_; }
  std::int64_t step_index() const override { return step_index_; }

  at::Tensor step(const at::Tensor& model_output, const at::Tensor& sample) override {
    DLO_CHECK(steps_ > 0, "unipc scheduler: step() before set_timesteps()");
    DLO_CHECK(step_index_ < steps_, "unipc scheduler: step() called ", step_index_ + 1, " times for ", steps_,
              " steps");
    check_step_inputs("unipc scheduler", model_output, sample);
    DLO_CHECK(sample.dim() >= 2, "unipc scheduler: samples need a batch and a channel dimension, got shape ",
              sample.sizes());
    if (step_index_ == 0) shape_ = sample.sizes().vec();
    DLO_CHECK(sample.sizes() == at::IntArrayRef(shape_), "unipc scheduler: sample shape ", sample.sizes(),
              " differs from the first step's ", at::IntArrayRef(shape_));

    const std::int64_t i = step_index_;
    const auto& dc = config_.disable_corrector;
    const bool use_corrector = i > 0 && std::find(dc.begin(), dc.end(), i - 1) == dc.end() && last_sample_.defined();

    // convert_model_output (flow_prediction, predict_x0): the CPU sigma, not moved.
    at::Tensor sigma_t = sigmas_[i];
    at::Tensor m = sample - sigma_t * model_output;

    at::Tensor x = sample;
    if (use_corrector) x = corrector(m, last_sample_, x, this_order_);

    for (std::size_t k = 0; k + 1 < model_outputs_.size(); ++k) model_outputs_[k] = model_outputs_[k + 1];
    model_outputs_.back() = m;

    std::int64_t order = config_.lower_order_final ? std::min(config_.solver_order, steps_ - i) : config_.solver_order;
    this_order_ = std::min(order, lower_order_nums_ + 1);
    DLO_ASSERT(this_order_ > 0);

    last_sample_ = x;
    at::Tensor prev = predictor(x, this_order_);
    if (lower_order_nums_ < config_.solver_order) ++lower_order_nums_;
    ++step_index_;
    return prev;
  }

 private:
  // alpha = 1 - sigma, lambda = log(alpha) - log(sigma) of sigmas[idx] moved to `device`.
  struct Point {
    at::Tensor alpha, sigma, lambda;
  };
  Point point(std::int64_t idx, const at::Device& device) const {
    Point p;
    p.sigma = sigmas_[idx].to(device);
    p.alpha = at::rsub(p.sigma, 1);
    p.lambda = at::log(p.alpha) - at::log(p.sigma);
    return p;
  }

  // The model output k steps back (k = 0: the newest).
  const at::Tensor& history(std::int64_t k) const {
    const at::Tensor& t = model_outputs_[model_outputs_.size() - 1 - static_cast<std::size_t>(k)];
    DLO_ASSERT(t.defined(), "UniPC history entry ", k, " is empty");
    return t;
  }

  // The B(h) coefficients shared by predictor and corrector: h_phi_1, B_h, and the right-hand side
  // b of R rho = b (b[k-1] for k = 1..order), with R[k-1] = rks^(k-1).
  struct Coefficients {
    at::Tensor hh, h_phi_1, B_h, R, b;
  };
  Coefficients coefficients(const at::Tensor& h, std::vector<at::Tensor> rks, std::int64_t order,
                            const at::Device& device) const {
    Coefficients c;
    rks.push_back(at::ones({}, at::TensorOptions().dtype(at::kFloat).device(device)));
    at::Tensor rk = at::stack(rks);
    c.hh = at::neg(h);  // predict_x0
    c.h_phi_1 = at::expm1(c.hh);
    at::Tensor h_phi_k = c.h_phi_1 / c.hh - 1;
    std::int64_t factorial_i = 1;
    c.B_h = config_.solver_type == "bh1" ? c.hh : at::expm1(c.hh);
    std::vector<at::Tensor> R, b;
    for (std::int64_t k = 1; k <= order; ++k) {
      R.push_back(at::pow(rk, k - 1));
      b.push_back(h_phi_k * factorial_i / c.B_h);
      factorial_i *= k + 1;
      h_phi_k = h_phi_k / c.hh - 1.0 / static_cast<double>(factorial_i);
    }
    c.R = at::stack(R);
    c.b = at::stack(b);
    return c;
  }

  // multistep_uni_p_bh_update: from x at sigmas[i] to sigmas[i + 1].
  at::Tensor predictor(const at::Tensor& x, std::int64_t order) const {
    const std::int64_t i = step_index_;
    const at::Device device = x.device();
    const at::Tensor& m0 = history(0);
    const Point t = point(i + 1, device);
    const Point s0 = point(i, device);
    at::Tensor h = t.lambda - s0.lambda;

    std::vector<at::Tensor> rks, D1s;
    for (std::int64_t k = 1; k < order; ++k) {
      const Point si = point(i - k, device);
      at::Tensor rk = (si.lambda - s0.lambda) / h;
      rks.push_back(rk);
      D1s.push_back((history(k) - m0) / rk);
    }
    const Coefficients c = coefficients(h, rks, order, device);

    at::Tensor x_t_ = t.sigma / s0.sigma * x - t.alpha * c.h_phi_1 * m0;
    at::Tensor x_t;
    if (!D1s.empty()) {
      at::Tensor D1 = at::stack(D1s, 1);
      at::Tensor rhos_p;
      if (order == 2) {
        rhos_p = at::ones({1}, at::TensorOptions().dtype(x.scalar_type()).device(device)) * 0.5;
      } else {
        rhos_p = at::linalg_solve(c.R.slice(0, 0, -1).slice(1, 0, -1), c.b.slice(0, 0, -1))
                     .to(device)
                     .to(x.scalar_type());
      }
      at::Tensor pred_res = at::einsum("k,bkc...->bc...", {rhos_p, D1});
      x_t = x_t_ - t.alpha * c.B_h * pred_res;
    } else {
      // pred_res is the Python int 0: alpha_t * B_h * 0 is a 0-dim tensor.
      x_t = x_t_ - at::mul(t.alpha * c.B_h, at::Scalar(std::int64_t{0}));
    }
    return x_t.to(x.scalar_type());
  }

  // multistep_uni_c_bh_update: corrects this_sample (at sigmas[i]) from last_sample (at sigmas[i-1])
  // with the new x0 prediction model_t.
  at::Tensor corrector(const at::Tensor& model_t, const at::Tensor& last_sample, const at::Tensor& this_sample,
                       std::int64_t order) const {
    const std::int64_t i = step_index_;
    const at::Device device = this_sample.device();
    const at::Tensor& m0 = history(0);
    const at::Tensor& x = last_sample;
    const Point t = point(i, device);
    const Point s0 = point(i - 1, device);
    at::Tensor h = t.lambda - s0.lambda;

    std::vector<at::Tensor> rks, D1s;
    for (std::int64_t k = 1; k < order; ++k) {
      const Point si = point(i - (k + 1), device);
      at::Tensor rk = (si.lambda - s0.lambda) / h;
      rks.push_back(rk);
      D1s.push_back((history(k) - m0) / rk);
    }
    const Coefficients c = coefficients(h, rks, order, device);

    at::Tensor rhos_c;
    if (order == 1) {
      rhos_c = at::ones({1}, at::TensorOptions().dtype(x.scalar_type()).device(device)) * 0.5;
    } else {
      rhos_c = at::linalg_solve(c.R, c.b).to(device).to(x.scalar_type());
    }
    at::Tensor x_t_ = t.sigma / s0.sigma * x - t.alpha * c.h_phi_1 * m0;
    at::Tensor D1_t = model_t - m0;
    at::Tensor last_term = rhos_c[-1] * D1_t;
    at::Tensor sum;
    if (!D1s.empty()) {
      at::Tensor corr_res = at::einsum("k,bkc...->bc...", {rhos_c.slice(0, 0, -1), at::stack(D1s, 1)});
      sum = corr_res + last_term;
    } else {
      sum = at::add(last_term, at::Scalar(std::int64_t{0}));  // corr_res is the Python int 0: 0 + t
    }
    at::Tensor x_t = x_t_ - t.alpha * c.B_h * sum;
    return x_t.to(x.scalar_type());
  }

  NoiseSchedulerConfig config_;
  at::Tensor timesteps_, sigmas_;
  std::int64_t steps_ = 0, step_index_ = 0;
  std::vector<at::Tensor> model_outputs_;  // x0 predictions, oldest first
  at::Tensor last_sample_;
  std::int64_t lower_order_nums_ = 0, this_order_ = 0;
  std::vector<std::int64_t> shape_;
};

}  // namespace

std::unique_ptr<NoiseScheduler> make_unipc(const NoiseSchedulerConfig& config) {
  return std::make_unique<UniPCScheduler>(config);
}

}  // namespace dlo::diffusion_detail
