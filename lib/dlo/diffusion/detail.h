// Internal to lib/dlo/diffusion: the numpy arithmetic diffusers' set_timesteps uses, and the two
// scheduler factories. Not a public header.
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "dlo/diffusion/noise_scheduler.h"

namespace dlo::diffusion_detail {

// numpy.linspace(start, stop, num) (endpoint=True, float64) op for op: y = arange(num) * step +
// start with step = (stop - start) / (num - 1) (or y / div * delta if step underflows to 0), the
// last element set to stop. A [num] kDouble CPU tensor. num >= 1.
at::Tensor numpy_linspace(double start, double stop, std::int64_t num);

// shift * s / (1 + (shift - 1) * s) on a float64 tensor, as numpy evaluates it (one rounding per op).
at::Tensor numpy_flow_shift(const at::Tensor& s, double shift);

std::unique_ptr<NoiseScheduler> make_unipc(const NoiseSchedulerConfig& config);
std::unique_ptr<NoiseScheduler> make_flow_euler(const NoiseSchedulerConfig& config);

// dlo::Error unless model_output and sample have one shape and one device and are floating point.
// `who` names the scheduler in the message.
void check_step_inputs(const char* who, const at::Tensor& model_output, const at::Tensor& sample);

}  // namespace dlo::diffusion_detail
