// Which compute device a rank uses, and what the device reports about its memory.
//
// Works with and without CUDA compiled in; without a visible GPU every request but "cpu" and
// "auto" is refused.
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/Device.h>

namespace dlo {

class MpiWorld;

// "auto": CUDA device (local rank mod visible devices) when a GPU is visible, else the CPU;
// "cpu"; "cuda" (the auto pick among GPUs); "cuda:N". Throws dlo::Error naming `what` (the flag
// or field) for anything else or a device that is not there. Not collective.
c10::Device pick_device(const std::string& requested, const MpiWorld& world, const std::string& what = "device");

// Visible CUDA devices (0 without CUDA or a driver).
int cuda_device_count();

// Peak bytes the caching allocator reserved on a CUDA device since start; -1 on the CPU.
std::int64_t device_peak_bytes(c10::Device device);

}  // namespace dlo
