// The CUDA transport (see transport.h). Built only with DLO_HAVE_CUDA.
//
// Per transfer into slot s:
//   copy stream:  wait free[s] (the slot's last reader on the compute stream), copy this rank's part
//                 (host -> device, or device -> device for device shards), record copied[s];
//   comm stream:  wait copied[s], in-place AllGather (NCCL), record ready[s];
//   compute:      wait_ready waits on ready[s] (between two timing events: the exposed transfer);
//                 release records free[s].
// A block that is not sharded records ready[s] on the copy stream directly. Every handle is made
// and used with the engine's device current (c10::cuda::CUDAGuard), so it belongs to that device
// whatever the thread's current device was.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "dlo/common/error.h"
#include "dlo/dist/collective.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/offload/cuda_handles.h"
#include "dlo/offload/transport.h"

namespace dlo {
namespace {

using cuda::check;

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class PinnedHostMemory final : public HostMemory {
 public:
  explicit PinnedHostMemory(std::uint64_t bytes) : buf_(bytes) {}
  std::byte* data() const override { return buf_.data(); }
  std::uint64_t bytes() const override { return buf_.bytes(); }
  bool pinned() const override { return true; }

 private:
  cuda::PinnedBuffer buf_;
};

// Upload staging: two page-locked buffers of this size, filled and copied alternately.
constexpr std::uint64_t kBounceBytes = 32ull << 20;

class CudaTransport final : public Transport {
 public:
  explicit CudaTransport(const TransportOptions& o)
      : opt_(o), index_(o.device.has_index() ? o.device.index() : c10::cuda::current_device()) {
    DLO_ASSERT(o.device.is_cuda(), "the CUDA transport for device ", o.device.str());
    c10::cuda::CUDAGuard guard(index_);
    copy_ = cuda::Stream::non_blocking();
    comm_ = cuda::Stream::non_blocking();
    for (int s = 0; s < 2; ++s) {
      ready_[s] = cuda::Event::create(cudaEventDisableTiming);
      free_[s] = cuda::Event::create(cudaEventDisableTiming);
      copied_[s] = cuda::Event::create(cudaEventDisableTiming);
    }
  }

  ~CudaTransport() override {
    c10::cuda::CUDAGuard guard(index_);
    // Nothing may still write a slot when its memory goes back to the caching allocator.
    cudaStreamSynchronize(comm_.get());
    cudaStreamSynchronize(copy_.get());
    watchdog_stop_ = true;
    if (watchdog_.joinable()) watchdog_.join();
    // Streams, events and pinned memory are released by their owners after this body.
  }

  std::unique_ptr<HostMemory> host_memory(std::uint64_t bytes) override {
    c10::cuda::CUDAGuard guard(index_);
    return std::make_unique<PinnedHostMemory>(bytes);
  }

  at::Tensor device_memory(std::uint64_t bytes) override {
    return at::empty({static_cast<std::int64_t>(std::max<std::uint64_t>(bytes, 1))},
                     at::TensorOptions().dtype(at::kByte).device(at::Device(at::kCUDA, index_)));
  }

  void upload(const std::vector<Upload>& items) override {
    c10::cuda::CUDAGuard guard(index_);
    std::uint64_t largest = 0;
    for (const auto& u : items) largest = std::max(largest, u.bytes);
    if (largest == 0) return;
    const std::uint64_t chunk = std::min(largest, kBounceBytes);
    std::array<cuda::PinnedBuffer, 2> bounce{cuda::PinnedBuffer(chunk), cuda::PinnedBuffer(chunk)};
    std::array<cuda::Event, 2> done{cuda::Event::create(cudaEventDisableTiming),
                                    cuda::Event::create(cudaEventDisableTiming)};
    std::array<bool, 2> busy{false, false};
    order_after_compute(copy_.get());  // the caching allocator may hand out memory the compute stream used last
    int k = 0;
    for (const auto& u : items) {
      for (std::uint64_t off = 0; off < u.bytes; off += chunk) {
        const std::uint64_t len = std::min(chunk, u.bytes - off);
        if (busy[k]) check(cudaEventSynchronize(done[k].get()), "cudaEventSynchronize");
        u.fill(bounce[k].data(), off, off + len);  // packs while the other buffer's copy runs
        check(cudaMemcpyAsync(u.dst + off, bounce[k].data(), len, cudaMemcpyHostToDevice, copy_.get()),
              "cudaMemcpyAsync");
        check(cudaEventRecord(done[k].get(), copy_.get()), "cudaEventRecord");
        busy[k] = true;
        k ^= 1;
      }
    }
    check(cudaStreamSynchronize(copy_.get()), "cudaStreamSynchronize");
  }

  void request(const Transfer& t) override {
    c10::cuda::CUDAGuard guard(index_);
    if (t.fail) throw Error(str("injected fault while transferring block ", t.block, " (fail_at_block)"), ErrorKind::kTransfer);
    const int s = t.slot;
    // Write-after-read guard: the slot's previous block must be done on the compute stream (the
    // first time: whatever the compute stream did with this memory before the engine got it).
    if (!free_recorded_[s]) {
      check(cudaEventRecord(free_[s].get(), compute_stream()), "cudaEventRecord");
      free_recorded_[s] = true;
    }
    check(cudaStreamWaitEvent(copy_.get(), free_[s].get(), 0), "cudaStreamWaitEvent");
    check(cudaMemcpyAsync(t.slot_base + t.offset, t.src, t.bytes,
                          t.src_on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice, copy_.get()),
          "cudaMemcpyAsync");
    if (t.gather_shard == 0) {
      check(cudaEventRecord(ready_[s].get(), copy_.get()), "cudaEventRecord");
      return;
    }
    check(cudaEventRecord(copied_[s].get(), copy_.get()), "cudaEventRecord");
    check(cudaStreamWaitEvent(comm_.get(), copied_[s].get(), 0), "cudaStreamWaitEvent");
    if (opt_.collective != nullptr) {
      start_watchdog();
      opt_.collective->allgather_inplace(t.slot_base, t.gather_shard, comm_.get());
    }
    check(cudaEventRecord(ready_[s].get(), comm_.get()), "cudaEventRecord");
    if (opt_.collective != nullptr) {
      watch_since_ms_ = now_ms();
      watch_block_ = t.block;
      watch_slot_ = s;
    }
  }

  void wait_ready(std::int64_t block, int slot) override {
    c10::cuda::CUDAGuard guard(index_);
    ensure_stall_events();
    const cudaStream_t compute = compute_stream();
    const auto i = static_cast<std::size_t>(block);
    harvest_stall(i);
    check(cudaEventRecord(stall_begin_[i].get(), compute), "cudaEventRecord");
    check(cudaStreamWaitEvent(compute, ready_[slot].get(), 0), "cudaStreamWaitEvent");
    check(cudaEventRecord(stall_end_[i].get(), compute), "cudaEventRecord");
    stall_pending_[i] = true;
  }

  void release(int slot) override {
    c10::cuda::CUDAGuard guard(index_);
    check(cudaEventRecord(free_[slot].get(), compute_stream()), "cudaEventRecord");
    free_recorded_[slot] = true;
  }

  TransferWaits waits() override {
    c10::cuda::CUDAGuard guard(index_);
    for (std::size_t i = 0; i < stall_pending_.size(); ++i) harvest_stall(i);
    return waits_;
  }

 private:
  cudaStream_t compute_stream() const { return c10::cuda::getCurrentCUDAStream(index_).stream(); }

  // Makes `stream` wait for everything enqueued on the compute stream so far.
  void order_after_compute(cudaStream_t stream) {
    cuda::Event e = cuda::Event::create(cudaEventDisableTiming);
    check(cudaEventRecord(e.get(), compute_stream()), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream, e.get(), 0), "cudaStreamWaitEvent");
  }  // destroying a recorded event is fine: the wait keeps what it needs

  // Per block: the compute stream's wait for it, timed (made at the first wait: resident never needs them).
  void ensure_stall_events() {
    if (!stall_begin_.empty() || opt_.blocks == 0) return;
    for (std::int64_t i = 0; i < opt_.blocks; ++i) {
      stall_begin_.push_back(cuda::Event::create(cudaEventDefault));
      stall_end_.push_back(cuda::Event::create(cudaEventDefault));
    }
    stall_pending_.assign(static_cast<std::size_t>(opt_.blocks), false);
  }

  // Adds the compute stream's wait for block i's previous visit to the exposed time.
  void harvest_stall(std::size_t i) {
    if (!stall_pending_[i]) return;
    check(cudaEventSynchronize(stall_end_[i].get()), "cudaEventSynchronize");
    float ms = 0;
    if (cudaEventElapsedTime(&ms, stall_begin_[i].get(), stall_end_[i].get()) == cudaSuccess) {
      waits_.total_s += ms / 1e3;
      if (i == 0) waits_.entry_s.push_back(ms / 1e3);
    }
    stall_pending_[i] = false;
  }

  // A dead peer or a network fault must end the job with a message, not a hang: NCCL's
  // asynchronous errors are polled, and a gather that has not finished in gather_timeout_s
  // seconds, or whose completion event reports an error, ends every rank.
  void start_watchdog() {
    if (watchdog_.joinable()) return;
    const auto timeout_ms = static_cast<std::int64_t>(opt_.gather_timeout_s * 1000);
    watchdog_ = std::thread([this, timeout_ms] {
      cudaSetDevice(index_);
      while (!watchdog_stop_.load()) {
        try {
          opt_.collective->check_async_error();
          const int s = watch_slot_.load();
          if (s >= 0) {
            const cudaError_t e = cudaEventQuery(ready_[s].get());
            if (e == cudaErrorNotReady) {
              if (now_ms() - watch_since_ms_.load() > timeout_ms)
                throw Error(str("the gather of block ", watch_block_.load(), " has not finished in ",
                                opt_.gather_timeout_s, " s (DLO_GATHER_TIMEOUT_S): a rank is gone or stuck"),
                            ErrorKind::kTransfer);
            } else if (e != cudaSuccess) {
              throw Error(str("the gather of block ", watch_block_.load(), " failed on the device: ",
                              cudaGetErrorString(e)), ErrorKind::kTransfer);
            }
          }
        } catch (const std::exception& e) {
          opt_.collective->abort();
          MpiWorld::abort(std::string("weight gather: ") + e.what());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }

  TransportOptions opt_;
  c10::DeviceIndex index_;
  cuda::Stream copy_, comm_;
  std::array<cuda::Event, 2> ready_, free_, copied_;
  std::array<bool, 2> free_recorded_{false, false};
  std::vector<cuda::Event> stall_begin_, stall_end_;  // per block: compute-stream wait, for exposed time
  std::vector<bool> stall_pending_;
  TransferWaits waits_;
  std::thread watchdog_;
  std::atomic<bool> watchdog_stop_{false};
  // The newest gather the watchdog times: its slot (-1: none) and when it was enqueued.
  std::atomic<int> watch_slot_{-1};
  std::atomic<std::int64_t> watch_block_{-1};
  std::atomic<std::int64_t> watch_since_ms_{0};
};

}  // namespace

std::unique_ptr<Transport> make_cuda_transport(const TransportOptions& options) {
  return std::make_unique<CudaTransport>(options);
}

}  // namespace dlo
