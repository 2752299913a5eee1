// Whether a test can use a CUDA device, and why not (shared by the gpu-labelled tests).
#pragma once

#include <filesystem>
#include <string>

#ifdef DLO_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dlo::test {

// An NVIDIA device node (/dev/nvidia0.., /dev/nvidiactl): the machine has a GPU and a driver
// loaded, whatever CUDA says.
inline bool nvidia_device_node() {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev", ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("nvidia", 0) == 0 && n != "nvidia-caps") return true;
  }
  return false;
}

// Empty when a CUDA device is usable; else why not. Sets `absent` when that is because the
// machine has no GPU at all (the only reason to skip).
inline std::string why_no_device(bool& absent) {
  const bool node = nvidia_device_node();
#ifdef DLO_HAVE_CUDA
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return "";
  const bool none = (e == cudaSuccess && n == 0) || e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver;
  absent = none && !node;
  return std::string("cudaGetDeviceCount: ") + (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)) +
         (node ? " although an NVIDIA device node exists in /dev (driver or runtime fault, or devices hidden by "
                 "CUDA_VISIBLE_DEVICES)"
               : "");
#else
  absent = !node;
  return node ? "this build has no CUDA (libtorch without CUDA), but the machine has an NVIDIA device"
              : "this build has no CUDA";
#endif
}

}  // namespace dlo::test
