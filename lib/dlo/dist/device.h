// Which compute device a rank uses, who else uses it, and what it reports about its memory.
//
// Works with and without CUDA compiled in; without a visible GPU every request but "cpu" and
// "auto" is refused.
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/Device.h>

namespace dlo {

class MpiWorld;

// What a run asks for (--device): read once from text where it enters (parse_device_request).
struct DeviceRequest {
  enum class Kind { kAuto, kCpu, kCuda } kind = Kind::kAuto;
  int index = -1;  // kCuda: "cuda:N"'s N; -1: "cuda", local rank modulo the visible devices
  std::string text() const;  // as written: "auto", "cpu", "cuda", "cuda:N"
};
// "auto", "cpu", "cuda" or "cuda:N"; anything else is a dlo::Error (input) naming `field`.
DeviceRequest parse_device_request(const std::string& text, const std::string& field);

// kAuto: the CUDA device (local rank mod visible devices) when a GPU is visible, else the CPU;
// kCpu; kCuda: the auto pick among GPUs, or device N. Throws dlo::Error naming `what` (the flag
// or field) for a device that is not there. On CUDA it also makes the device current for the
// calling thread, so that nothing (streams, events, a context) lands on device 0 by accident.
// Not collective.
c10::Device pick_device(const DeviceRequest& requested, const MpiWorld& world, const std::string& what = "device");

// Visible CUDA devices (0 without CUDA or a driver).
int cuda_device_count();

// Which ranks compute on the same physical device as this one. Collective.
struct DeviceSharing {
  std::string id;          // "<host>/<PCI bus id>" (CUDA) or "<host>/cpu"
  int ranks_on_device = 1; // ranks (this one included) whose id equals this rank's
  std::string peers;       // those ranks, e.g. "0,1" (for messages)
};
// `host_id` names this rank's host: the hostname, or NCCL_HOSTID where the launcher gives every
// rank its own (NCCL then treats the ranks as separate hosts talking over sockets, which is how
// two ranks can share one GPU in a test). The app reads the environment, not the library.
DeviceSharing device_sharing(const MpiWorld& world, c10::Device device, const std::string& host_id);

// Collective: refuses (the same dlo::Error on every rank) a run in which two ranks share one CUDA
// device (NCCL cannot build a communicator over them, and each would count the whole device's
// memory as its own). The message names the ranks, the host and the device, and what to do.
void check_exclusive_devices(const MpiWorld& world, c10::Device device, const DeviceSharing& mine);

// What a device reports about its memory, in bytes (-1 where it cannot tell, e.g. on the CPU).
struct DeviceMemory {
  std::int64_t total = -1;                    // the device's memory
  std::int64_t free = -1;                     // free as the driver sees it (other processes count as used)
  std::int64_t used = -1;                     // total - free: contexts, NCCL buffers, the caching allocator, others
  std::int64_t allocator_reserved = -1;       // held by libtorch's caching allocator now
  std::int64_t allocator_reserved_peak = -1;  // its peak since start (or reset_device_peaks)
  std::int64_t allocator_allocated_peak = -1; // peak of bytes in live tensors
};
// On CUDA, first returns the caching allocator's unused cached blocks to the driver when
// `release_cache` (so `free` counts them), then reads cudaMemGetInfo and the allocator's stats.
DeviceMemory device_memory(c10::Device device, bool release_cache = false);

// Resets the allocator's peak counters (CUDA; nothing on the CPU).
void reset_device_peaks(c10::Device device);

}  // namespace dlo
