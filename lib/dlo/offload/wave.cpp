#include "dlo/offload/wave.h"

#include <algorithm>

#include "dlo/common/error.h"
#include "dlo/dist/collective.h"
#include "dlo/models/torch_errors.h"
#include "dlo/mpi/mpi_world.h"

namespace dlo {

WaveDevice agree_device(const MpiWorld& world, const DeviceRequest& requested, const std::string& host_id,
                        const std::string& what) {
  WaveDevice d;
  std::string error;
  try {
    d.device = pick_device(requested, world, what);
  } catch (const Error& e) {
    error = e.what();
  }
  world.check_all(error, "start-up check (device)");
  d.sharing = device_sharing(world, d.device, host_id);
  check_exclusive_devices(world, d.device, d.sharing);
  return d;
}

WaveSchedule agree_wave(const MpiWorld& world, std::int64_t my_passes, std::uint64_t fingerprint) {
  DLO_CHECK(my_passes >= 0, "a rank's pass count must be >= 0");
  WaveSchedule w;
  w.passes = world.allgather(my_passes, "wave agreement (pass counts)");
  auto prints = world.allgather(static_cast<std::int64_t>(fingerprint), "wave agreement (block layout)");
  for (int r = 1; r < world.size(); ++r)
    if (prints[r] != prints[0])
      throw Error(str("rank ", r, " planned a different block layout than rank 0 (fingerprint ", prints[r], " vs ",
                      prints[0], "): all ranks must load the same checkpoint with the same dtype"),
                  ErrorKind::kInput, /*on_every_rank=*/true);
  for (auto p : w.passes) w.length = std::max(w.length, p);
  return w;
}

void start_engine(const MpiWorld& world, OffloadStack& stack, const StrategyChoice& choice, c10::Device device,
                  EngineOptions options) {
  try {
    std::unique_ptr<Collective> collective;
    if (is_sharded(choice.strategy) && world.size() > 1)
      collective = device.is_cuda() ? make_nccl_collective(world, device.index()) : make_mpi_collective(world);
    options.strategy = choice.strategy;
    options.device_blocks = choice.device_blocks;
    options.gather_timeout_s = world.timeout_s();
    options.device = device;
    stack.start(options, std::move(collective));
  } catch (const std::exception& e) {
    MpiWorld::abort(str(world.tag(), " setting up the offload engine: ", describe_exception(e)));
  }
  // Ranks finish packing their shards at different times (storage, page cache).
  world.barrier("engine start (every rank packed its shards)");
}

}  // namespace dlo
