// Move-only owners of CUDA runtime handles: streams, events and page-locked host memory. Internal
// to lib/dlo/offload (included only by CUDA-only sources). Creation failures throw dlo::Error with
// the CUDA error string; destruction never throws. Each handle belongs to the device that was
// current when it was made: callers set it (c10::cuda::CUDAGuard) around creation and use.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "dlo/common/error.h"

namespace dlo::cuda {

// Throws dlo::Error "CUDA <what> failed: <CUDA's error string>" unless `e` is cudaSuccess.
inline void check(cudaError_t e, const char* what) {
  DLO_CHECK(e == cudaSuccess, "CUDA ", what, " failed: ", cudaGetErrorString(e));
}

class Stream {
 public:
  Stream() = default;
  // A stream that does not synchronise with the legacy default stream.
  static Stream non_blocking() {
    Stream s;
    check(cudaStreamCreateWithFlags(&s.s_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  ~Stream() {
    if (s_ != nullptr) cudaStreamDestroy(s_);
  }
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  Event() = default;
  // cudaEventDisableTiming for events only waited on; cudaEventDefault for timing.
  static Event create(unsigned flags) {
    Event e;
    check(cudaEventCreateWithFlags(&e.e_, flags), "cudaEventCreateWithFlags");
    return e;
  }
  ~Event() {
    if (e_ != nullptr) cudaEventDestroy(e_);
  }
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// Page-locked host memory of exactly `bytes` (cudaHostAlloc; not the caching host allocator,
// which rounds up to powers of two).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::uint64_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    DLO_CHECK(e == cudaSuccess, "CUDA cudaHostAlloc of ", bytes, " bytes of page-locked host memory failed: ",
              cudaGetErrorString(e));
    data_ = static_cast<std::byte*>(p);
  }
  ~PinnedBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  std::byte* data() const { return data_; }
  std::uint64_t bytes() const { return bytes_; }

 private:
  std::byte* data_ = nullptr;
  std::uint64_t bytes_ = 0;
};

}  // namespace dlo::cuda
