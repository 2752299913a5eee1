#include "dlo/dist/device.h"

#include "dlo/common/error.h"
#include "dlo/dist/mpi_world.h"

#ifdef DLO_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

namespace dlo {

int cuda_device_count() {
  int count = 0;
#ifdef DLO_HAVE_CUDA
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
#endif
  return count;
}

c10::Device pick_device(const std::string& requested, const MpiWorld& world, const std::string& what) {
  if (requested == "cpu") return c10::kCPU;
  const int count = cuda_device_count();
  if (requested == "auto") {
    if (count == 0) return c10::kCPU;
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank() % count));
  }
  DLO_CHECK(requested == "cuda" || requested.rfind("cuda:", 0) == 0, what, ": '", requested,
            "' is not auto, cpu, cuda or cuda:N");
  DLO_CHECK(count > 0, what, " ", requested, ": no CUDA device is visible");
  int index = world.local_rank() % count;
  if (requested.size() > 5) {
    const std::string n = requested.substr(5);
    DLO_CHECK(!n.empty() && n.find_first_not_of("0123456789") == std::string::npos && n.size() < 4, what, ": '",
              requested, "' is not cuda:N");
    index = std::stoi(n);
  }
  DLO_CHECK(index >= 0 && index < count, what, " ", requested, ": only ", count, " device(s) are visible");
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

std::int64_t device_peak_bytes(c10::Device d) {
#ifdef DLO_HAVE_CUDA
  if (d.is_cuda()) return c10::cuda::CUDACachingAllocator::getDeviceStats(d.index()).reserved_bytes[0].peak;
#endif
  (void)d;
  return -1;
}

}  // namespace dlo
