// Noise schedulers of the denoising loop: diffusers' UniPCMultistepScheduler in flow mode (the Wan2.1
// default) and FlowMatchEulerDiscreteScheduler, op for op and dtype for dtype as diffusers 0.42.1
// computes them (wan-spec sections 3.5, 3.6 and 4), so a run gives diffusers' numbers bit for bit.
//
// ("Noise scheduler" because "scheduler" in dlo means placing jobs on ranks.)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/config/noise_scheduler_config.h"

namespace dlo {

// One denoising run's scheduler state (one per job: jobs on one rank each own theirs).
// Not thread-safe; the state is not shared between instances.
class NoiseScheduler {
 public:
  virtual ~NoiseScheduler() = default;
  virtual const NoiseSchedulerConfig& config() const = 0;
  // diffusers' set_timesteps(steps) followed by set_begin_index(0): computes the schedule and
  // resets the step state. Throws dlo::Error if steps < 1.
  virtual void set_timesteps(std::int64_t steps) = 0;
  // [steps] timesteps in the dtype diffusers gives them (int64 for UniPC, float32 for
  // FlowMatchEuler), on the CPU. Undefined before set_timesteps.
  virtual const at::Tensor& timesteps() const = 0;
  // [steps + 1] float32 sigmas (the last one 0 or sigma_min), on the CPU.
  virtual const at::Tensor& sigmas() const = 0;
  // diffusers' scheduler.step(model_output, timesteps[i], sample)[0] for the i-th call since
  // set_timesteps (i = step_index(), counted from 0). Same ops and dtypes as diffusers: UniPC
  // returns sample's dtype, Euler model_output's dtype. model_output and sample must be on one
  // device, of one shape; the schedule's scalars are placed as diffusers places them (UniPC: CPU
  // sigmas moved per step; Euler: sigmas on the tensors' device, as WanPipeline's
  // set_timesteps(device=...) puts them). Throws dlo::Error before set_timesteps, after the last
  // step, or for mismatched tensors.
  virtual at::Tensor step(const at::Tensor& model_output, const at::Tensor& sample) = 0;
  // The number of step() calls since set_timesteps.
  virtual std::int64_t step_index() const = 0;
};

// A scheduler for `config` (validated; throws dlo::Error). set_timesteps must be called next.
std::unique_ptr<NoiseScheduler> make_noise_scheduler(const NoiseSchedulerConfig& config);

}  // namespace dlo
