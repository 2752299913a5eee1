// How the ranks start a wave together. A wave is a set of forward passes that all ranks run in
// lockstep: rank r has its own inputs and P_r passes (different prompts, different step counts,
// or none at all). Every rank joins every traversal: it computes in its own passes and joins the
// gathers without computing ("ghost" passes) in the rest, so no rank repeats another's work and
// none waits on a collective the others will never join. dlo-forward runs one fixed wave;
// render/generate runs an open-ended one whose passes the job scheduler decides.
//
// Every function here is collective: every rank calls it, in the same order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "dlo/dist/device.h"
#include "dlo/offload/engine.h"
#include "dlo/offload/runner.h"
#include "dlo/offload/strategy.h"

namespace dlo {

class MpiWorld;

// The device of every rank, checked together: pick_device (named `what` in messages: the flag),
// then two ranks on one GPU refused (check_exclusive_devices), before anything is loaded. A
// refusal is the same dlo::Error on every rank.
struct WaveDevice {
  c10::Device device = c10::kCPU;
  DeviceSharing sharing;
};
WaveDevice agree_device(const MpiWorld& world, const DeviceRequest& requested, const std::string& host_id,
                        const std::string& what);

// Everyone's view of a fixed wave.
struct WaveSchedule {
  std::vector<std::int64_t> passes;  // per rank
  std::int64_t length = 0;           // max over ranks: traversals every rank makes
};
// Gathers each rank's pass count and layout fingerprint. Throws dlo::Error on every rank (the same
// message) if the fingerprints differ.
WaveSchedule agree_wave(const MpiWorld& world, std::int64_t my_passes, std::uint64_t fingerprint);

// Starts `stack`'s engine with `choice` on `device`: the collective (NCCL on CUDA, MPI on the CPU)
// when the strategy is sharded over several ranks, `options`' other fields as given, the gather
// timeout from world.timeout_s(); then waits until every rank has packed its shards (so the
// gathers' timeout counts from there). A failure here would strand the other ranks in a gather:
// it ends every rank (MpiWorld::abort) naming the rank.
void start_engine(const MpiWorld& world, OffloadStack& stack, const StrategyChoice& choice, c10::Device device,
                  EngineOptions options);

}  // namespace dlo
