// The configuration of a denoising run's noise scheduler, read from a diffusers
// scheduler/scheduler_config.json (and the job's overrides). Torch-free: jobs, manifests and
// fingerprints use it without libtorch; diffusion/noise_scheduler.h runs it.
//
// ("Noise scheduler" because "scheduler" in dlo means placing jobs on ranks.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dlo {

enum class NoiseSchedulerKind { kUniPC, kFlowEuler };

// "unipc" / "euler" (the names of dlo-generate's --scheduler).
const char* noise_scheduler_name(NoiseSchedulerKind kind);
// "unipc" or "euler"; anything else throws dlo::Error naming the value and the choices.
NoiseSchedulerKind parse_noise_scheduler_kind(const std::string& name);

// Where the steps' sigmas come from. kDefault: the scheduler's own set_timesteps(steps).
// kLightx2v: the grid of lightx2v's step-distilled models, sampled with Euler to 0: sigmas
// shift(1 - i/steps) for i < steps, in float32 as Wan2.2-Lightning's EulerScheduler computes them
// (float32(linspace(N, 0, steps + 1)) / N, shifted once; timesteps sigmas x N). At 4 steps and
// shift 5 that is LightX2V's WanStepDistillScheduler with denoising_step_list [1000, 750, 500, 250]:
// sigmas [1, 0.9375, 0.8333333, 0.625], timesteps [1000, 937.5, 833.3333, 625]. The same numbers
// as diffusers' FlowMatchEulerDiscreteScheduler(shift).set_timesteps(sigmas=float32(1 - i/steps)),
// which applies the shift to the sigmas it is given.
enum class NoiseSchedule { kDefault, kLightx2v };
// "default" / "lightx2v" (the values of the job field `schedule`).
const char* noise_schedule_name(NoiseSchedule schedule);
// "default" or "lightx2v"; anything else throws dlo::Error naming the value and the choices.
NoiseSchedule parse_noise_schedule(const std::string& name);

// The resolved configuration of one noise scheduler. Default-constructed, it is the Wan2.1-T2V
// repos' scheduler (UniPC, flow_shift 3).
//
// Supported: UniPCMultistepScheduler with prediction_type "flow_prediction", use_flow_sigmas true,
// predict_x0 true, solver_order 1..3, solver_type "bh1"/"bh2" (diffusers maps "midpoint", "heun",
// "logrho" to "bh2"), lower_order_final, disable_corrector, final_sigmas_type "zero"/"sigma_min"
// (not bh1 with "zero": diffusers' last step is NaN there);
// FlowMatchEulerDiscreteScheduler with a static shift. Everything else (thresholding, solver_p,
// karras/exponential/beta sigmas, dynamic shifting, shift_terminal, invert_sigmas, stochastic
// sampling, other prediction types, other classes, keys diffusers 0.42.1 does not know) is refused
// when the file is read. Keys that have no effect in flow mode (the beta schedule, timestep_spacing,
// steps_offset, the thresholding parameters, base/max shift) are read, checked as diffusers checks
// them, and ignored.
struct NoiseSchedulerConfig {
  NoiseSchedulerKind kind = NoiseSchedulerKind::kUniPC;
  std::int64_t num_train_timesteps = 1000;
  double flow_shift = 3.0;  // UniPC `flow_shift`, or FlowMatchEuler `shift`; finite, > 0
  // UniPC only (ignored by Euler).
  std::int64_t solver_order = 2;  // 1..3
  bool lower_order_final = true;
  std::string solver_type = "bh2";  // "bh1" | "bh2"
  std::vector<std::int64_t> disable_corrector;  // step indices whose corrector is skipped
  std::string final_sigmas_type = "zero";  // "zero" | "sigma_min"
  // The steps' sigmas (not a key of scheduler_config.json: a job's choice). kLightx2v needs kFlowEuler.
  NoiseSchedule schedule = NoiseSchedule::kDefault;

  // Reads a diffusers scheduler/scheduler_config.json. A key missing from the file takes the
  // default of diffusers' constructor (not the Wan value: a UniPC file without prediction_type is
  // epsilon and refused). Throws dlo::Error naming the file, the key and the value for a class or
  // value we do not support, an unknown key, a wrong type, or an unreadable file.
  static NoiseSchedulerConfig from_json_file(const std::string& path);
  // The same from JSON text; `label` names it in errors.
  static NoiseSchedulerConfig from_json_text(const std::string& text, const std::string& label);

  // dlo-generate's --scheduler and --flow-shift. The same kind (or none) keeps this config and
  // only replaces the shift. Switching to euler gives FlowMatchEulerDiscreteScheduler's defaults
  // with num_train_timesteps kept and shift = the override, else this config's flow_shift (what
  // diffusers' FlowMatchEulerDiscreteScheduler.from_config(unipc_config, shift=...) gives).
  // Switching to unipc gives the Wan2.1 UniPC config (wan-spec 3.6) with num_train_timesteps kept
  // and flow_shift = the override, else this config's shift. A schedule other than kDefault
  // samples with Euler: without a kind it switches a UniPC config to euler as above (with kind
  // unipc the result fails validate()). Throws dlo::Error for a shift that is not finite and > 0.
  NoiseSchedulerConfig with_overrides(std::optional<NoiseSchedulerKind> kind, std::optional<double> flow_shift,
                                      std::optional<NoiseSchedule> schedule = std::nullopt) const;

  // Checks the values (the checks from_json_file makes on a struct filled in by hand, and a
  // schedule other than kDefault only with kFlowEuler). Throws dlo::Error naming the field.
  void validate() const;

  // The resolved config as a diffusers scheduler_config.json (one line, keys sorted, with
  // _class_name and only the keys that matter), for logs and metadata. from_json_text and
  // diffusers' from_config read it back to the same scheduler. The schedule is not in it.
  std::string to_json() const;
};

}  // namespace dlo
