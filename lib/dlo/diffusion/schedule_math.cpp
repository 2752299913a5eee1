#include <ATen/ATen.h>

#include "dlo/common/error.h"
#include "dlo/diffusion/detail.h"

namespace dlo::diffusion_detail {

// Each step is one ATen op on float64, so every element is rounded once per op exactly as numpy
// rounds it (no fused multiply-add can creep in from the compiler).
at::Tensor numpy_linspace(double start, double stop, std::int64_t num) {
  DLO_ASSERT(num >= 1);
  const std::int64_t div = num - 1;
  const double delta = stop - start;
  at::Tensor y = at::arange(num, at::kDouble);
  if (div > 0) {
    const double step = delta / static_cast<double>(div);
    if (step == 0) {
      y = at::mul(at::div(y, static_cast<double>(div)), delta);  // numpy's denormal branch (gh-5437)
    } else {
      y = at::mul(y, step);
    }
  } else {
    y = at::mul(y, delta);
  }
  y = at::add(y, start);
  if (num > 1) y.select(0, num - 1).fill_(stop);
  return y;
}

at::Tensor numpy_flow_shift(const at::Tensor& s, double shift) {
  DLO_ASSERT(s.scalar_type() == at::kDouble);
  return at::div(at::mul(s, shift), at::add(at::mul(s, shift - 1.0), 1.0));
}

void check_step_inputs(const char* who, const at::Tensor& model_output, const at::Tensor& sample) {
  DLO_CHECK(model_output.defined() && sample.defined(), who, " step: undefined tensor");
  DLO_CHECK(model_output.sizes() == sample.sizes(), who, " step: model_output shape ", model_output.sizes(),
            " differs from sample shape ", sample.sizes());
  DLO_CHECK(model_output.device() == sample.device(), who, " step: model_output on ", model_output.device(),
            ", sample on ", sample.device());
  DLO_CHECK(at::isFloatingType(model_output.scalar_type()) && at::isFloatingType(sample.scalar_type()), who,
            " step: model_output and sample must be floating point, got ", model_output.scalar_type(), " and ",
            sample.scalar_type());
}

}  // namespace dlo::diffusion_detail
