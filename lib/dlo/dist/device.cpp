#include "dlo/dist/device.h"

#include <map>
#include <sstream>

#include "dlo/common/error.h"
#include "dlo/mpi/mpi_world.h"

#ifdef DLO_HAVE_CUDA
#include <ATen/Context.h>
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

namespace {

c10::Device make_current(c10::Device d) {
#ifdef DLO_HAVE_CUDA
  if (d.is_cuda()) {
    const cudaError_t e = cudaSetDevice(d.index());
    DLO_CHECK(e == cudaSuccess, "cannot use ", d.str(), ": cudaSetDevice failed: ", cudaGetErrorString(e));
  }
#endif
  return d;
}

std::string bus_id(c10::Device d) {
#ifdef DLO_HAVE_CUDA
  if (d.is_cuda()) {
    char id[32] = {0};
    if (cudaDeviceGetPCIBusId(id, sizeof id, d.index()) == cudaSuccess) return id;
    return "cuda:" + std::to_string(d.index());
  }
#endif
  (void)d;
  return "cpu";
}

}  // namespace

std::string DeviceRequest::text() const {
  switch (kind) {
    case Kind::kAuto: return "auto";
    case Kind::kCpu: return "cpu";
    case Kind::kCuda: return index < 0 ? std::string("cuda") : "cuda:" + std::to_string(index);
  }
  return "auto";
}

DeviceRequest parse_device_request(const std::string& text, const std::string& field) {
  DeviceRequest r;
  if (text == "auto") return r;
  if (text == "cpu") {
    r.kind = DeviceRequest::Kind::kCpu;
    return r;
  }
  DLO_CHECK(text == "cuda" || text.rfind("cuda:", 0) == 0, field, ": '", text, "' is not auto, cpu, cuda or cuda:N");
  r.kind = DeviceRequest::Kind::kCuda;
  if (text.size() > 5) {
    const std::string n = text.substr(5);
    DLO_CHECK(!n.empty() && n.find_first_not_of("0123456789") == std::string::npos && n.size() < 4, field, ": '", text,
              "' is not cuda:N");
    r.index = std::stoi(n);
  }
  return r;
}

c10::Device pick_device(const DeviceRequest& requested, const MpiWorld& world, const std::string& what) {
  if (requested.kind == DeviceRequest::Kind::kCpu) return c10::kCPU;
  const int count = cuda_device_count();
  if (requested.kind == DeviceRequest::Kind::kAuto) {
    if (count == 0) return c10::kCPU;
    return make_current(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank() % count)));
  }
  DLO_CHECK(count > 0, what, " ", requested.text(), ": no CUDA device is visible");
  const int index = requested.index < 0 ? world.local_rank() % count : requested.index;
  DLO_CHECK(index < count, what, " ", requested.text(), ": only ", count, " device(s) are visible");
  return make_current(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index)));
}

DeviceSharing device_sharing(const MpiWorld& world, c10::Device device, const std::string& host_id) {
  DeviceSharing mine;
  mine.id = (host_id.empty() ? world.host() : host_id) + "/" + bus_id(device);
  // Every rank's id, on every rank (gather to 0, then one broadcast of the joined list).
  const auto ids = world.gather_strings(mine.id, 0, "device agreement");
  std::string joined;
  for (const auto& s : ids) joined += s + "\n";
  joined = world.broadcast_string(joined, 0, "device agreement");
  std::istringstream in(joined);
  std::string line;
  mine.ranks_on_device = 0;
  for (int r = 0; std::getline(in, line); ++r) {
    if (line != mine.id) continue;
    ++mine.ranks_on_device;
    mine.peers += (mine.peers.empty() ? "" : ",") + std::to_string(r);
  }
  DLO_ASSERT(mine.ranks_on_device >= 1, "this rank's own device id is missing from the list");
  return mine;
}

void check_exclusive_devices(const MpiWorld& world, c10::Device device, const DeviceSharing& mine) {
  std::string error;
  if (device.is_cuda() && mine.ranks_on_device > 1)
    error = str("ranks ", mine.peers, " all use ", device.str(), " (", mine.id,
                "): one GPU per rank. Start as many ranks per node as there are GPUs, or give each rank its own "
                "device (--device cuda:N, CUDA_VISIBLE_DEVICES). For a test on one GPU, give every rank its own "
                "NCCL_HOSTID (NCCL then talks between them over sockets)");
  world.check_all(error, "device check");
}

DeviceMemory device_memory(c10::Device d, bool release_cache) {
  DeviceMemory m;
#ifdef DLO_HAVE_CUDA
  if (d.is_cuda()) {
    // The caching allocator exists only once CUDA is initialised (the first CUDA tensor does it):
    // before that its stats assert "Invalid device argument: did you call init?" (seen on the
    // first GPU run, dlo-forward asking for free memory before loading anything).
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    if (release_cache) c10::cuda::CUDACachingAllocator::emptyCache();
    std::size_t free = 0, total = 0;
    if (cudaSetDevice(d.index()) == cudaSuccess && cudaMemGetInfo(&free, &total) == cudaSuccess) {
      m.total = static_cast<std::int64_t>(total);
      m.free = static_cast<std::int64_t>(free);
      m.used = m.total - m.free;
    }
    const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
    m.allocator_reserved = s.reserved_bytes[0].current;
    m.allocator_reserved_peak = s.reserved_bytes[0].peak;
    m.allocator_allocated_peak = s.allocated_bytes[0].peak;
  }
#endif
  (void)d;
  (void)release_cache;
  return m;
}

void reset_device_peaks(c10::Device d) {
#ifdef DLO_HAVE_CUDA
  if (d.is_cuda()) {
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    c10::cuda::CUDACachingAllocator::resetPeakStats(d.index());
  }
#endif
  (void)d;
}

}  // namespace dlo
