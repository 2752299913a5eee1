// diffusers' FlowMatchEulerDiscreteScheduler (0.42.1) with a static shift, op for op
// (wan-spec 4.1): the schedule in numpy float64 cast to float32 (the lightx2v schedule: in float32,
// as set_timesteps(sigmas=...) computes it), the step in float32 with the result in model_output's
// dtype.
#include <ATen/ATen.h>

#include "dlo/common/error.h"
#include "dlo/diffusion/detail.h"

namespace dlo::diffusion_detail {
namespace {

class FlowEulerScheduler final : public NoiseScheduler {
 public:
  explicit FlowEulerScheduler(const NoiseSchedulerConfig& config) : config_(config) {
    // __init__: the training schedule in torch float32, shifted once; only its ends are kept.
    const std::int64_t n = config_.num_train_timesteps;
    const double shift = config_.flow_shift;
    at::Tensor ts = numpy_linspace(1.0, static_cast<double>(n), n).to(at::kFloat).flip(0);
    at::Tensor s = at::div(ts, n);
    s = at::div(at::mul(s, shift), at::add(at::mul(s, shift - 1.0), 1));
    sigma_max_ = s[0].item<double>();
    sigma_min_ = s[-1].item<double>();
  }

  const NoiseSchedulerConfig& config() const override { return config_; }

  void set_timesteps(std::int64_t steps) override {
    DLO_CHECK(steps >= 1, "euler scheduler: the number of steps must be >= 1, got ", steps);
    const std::int64_t n = config_.num_train_timesteps;
    const double nd = static_cast<double>(n);
    at::Tensor sigmas;
    if (config_.schedule == NoiseSchedule::kLightx2v) {
      // Wan2.2-Lightning's EulerScheduler: t = float32(numpy linspace(N, 0, steps + 1)), s = t / N,
      // shifted once, all in float32 (diffusers' set_timesteps(sigmas=s) shifts s alike).
      at::Tensor s = at::div(numpy_linspace(nd, 0.0, steps + 1).slice(0, 0, steps).to(at::kFloat), nd);
      const double shift = config_.flow_shift;
      sigmas = at::div(at::mul(s, shift), at::add(at::mul(s, shift - 1.0), 1));
    } else {
      // numpy: t = linspace(sigma_max * N, sigma_min * N, steps); s = t / N; shifted again.
      at::Tensor t = numpy_linspace(sigma_max_ * nd, sigma_min_ * nd, steps);
      sigmas = numpy_flow_shift(at::div(t, nd), config_.flow_shift).to(at::kFloat);
    }
    timesteps_ = at::mul(sigmas, n);
    sigmas_ = at::cat({sigmas, at::zeros({1}, at::kFloat)});
    sigmas_on_device_ = at::Tensor();
    steps_ = steps;
    step_index_ = 0;
  }

  const at::Tensor& timesteps() const override { return timesteps_; }
  const at::Tensor& sigmas() const override { return sigmas_; }
  std::int64_t step_index() const override { return step_index_; }

  at::Tensor step(const at::Tensor& model_output, const at::Tensor& sample) override {
    DLO_CHECK(steps_ > 0, "euler scheduler: step() before set_timesteps()");
    DLO_CHECK(step_index_ < steps_, "euler scheduler: step() called ", step_index_ + 1, " times for ", steps_,
              " steps");
    check_step_inputs("euler scheduler", model_output, sample);
    // WanPipeline calls set_timesteps(device=the execution device), so diffusers' sigmas live there
    // and dt is a 0-dim tensor on that device (on CUDA that is not the same kernel as a CPU scalar).
    if (!sigmas_on_device_.defined() || sigmas_on_device_.device() != sample.device())
      sigmas_on_device_ = sigmas_.to(sample.device());
    at::Tensor x = sample.to(at::kFloat);
    at::Tensor sigma = sigmas_on_device_[step_index_];
    at::Tensor sigma_next = sigmas_on_device_[step_index_ + 1];
    at::Tensor dt = sigma_next - sigma;
    at::Tensor prev = x + dt * model_output;
    ++step_index_;
    return prev.to(model_output.scalar_type());
  }

 private:
  NoiseSchedulerConfig config_;
  double sigma_max_ = 1.0, sigma_min_ = 0.0;
  at::Tensor timesteps_, sigmas_, sigmas_on_device_;
  std::int64_t steps_ = 0, step_index_ = 0;
};

}  // namespace

std::unique_ptr<NoiseScheduler> make_flow_euler(const NoiseSchedulerConfig& config) {
  return std::make_unique<FlowEulerScheduler>(config);
}

}  // namespace dlo::diffusion_detail
