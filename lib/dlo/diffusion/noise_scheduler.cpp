// The noise scheduler factory.
#include "dlo/diffusion/detail.h"
#include "dlo/diffusion/noise_scheduler.h"

namespace dlo {

std::unique_ptr<NoiseScheduler> make_noise_scheduler(const NoiseSchedulerConfig& config) {
  config.validate();
  if (config.kind == NoiseSchedulerKind::kUniPC) return diffusion_detail::make_unipc(config);
  return diffusion_detail::make_flow_euler(config);
}

}  // namespace dlo
