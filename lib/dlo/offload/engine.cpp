#include "dlo/offload/engine.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include <ATen/ATen.h>

#include "dlo/common/error.h"
#include "dlo/dist/collective.h"
#include "dlo/dist/mpi_world.h"
#include "dlo/io/tensor_view.h"

#ifdef DLO_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace dlo {

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kResident: return "resident";
    case Strategy::kDeviceShards: return "device-shards";
    case Strategy::kMixed: return "mixed";
    case Strategy::kDlo: return "dlo";
    case Strategy::kLayerwise: return "layerwise";
  }
  return "?";
}

std::optional<Strategy> parse_strategy(const std::string& name) {
  for (auto s : {Strategy::kResident, Strategy::kDeviceShards, Strategy::kMixed, Strategy::kDlo, Strategy::kLayerwise})
    if (name == strategy_name(s)) return s;
  return std::nullopt;
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
[[maybe_unused]] std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
}

#ifdef DLO_HAVE_CUDA
void cuda_check(cudaError_t e, const char* what) {
  DLO_CHECK(e == cudaSuccess, "CUDA ", what, " failed: ", cudaGetErrorString(e));
}
#endif

// Host memory for shards or whole blocks: page-locked for CUDA (exact size, not the caching
// host allocator's power-of-two rounding), 4 KiB-aligned pageable memory otherwise.
class HostArena {
 public:
  HostArena() = default;
  HostArena(std::uint64_t bytes, bool pinned) : bytes_(bytes), pinned_(pinned) {
    if (bytes == 0) return;
#ifdef DLO_HAVE_CUDA
    if (pinned) {
      void* p = nullptr;
      cuda_check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc");
      data_ = static_cast<std::byte*>(p);
      return;
    }
#endif
    DLO_ASSERT(!pinned, "pinned memory without CUDA");
    void* p = nullptr;
    DLO_CHECK(posix_memalign(&p, 4096, bytes) == 0, "cannot allocate ", bytes, " bytes of host memory");
    data_ = static_cast<std::byte*>(p);
  }
  ~HostArena() { reset(); }
  HostArena(HostArena&& o) noexcept { *this = std::move(o); }
  HostArena& operator=(HostArena&& o) noexcept {
    reset();
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(pinned_, o.pinned_);
    return *this;
  }
  std::byte* data() const { return data_; }
  std::uint64_t bytes() const { return bytes_; }
  bool pinned() const { return pinned_; }

 private:
  void reset() {
    if (data_ == nullptr) return;
#ifdef DLO_HAVE_CUDA
    if (pinned_) {
      cudaFreeHost(data_);
      data_ = nullptr;
      return;
    }
#endif
    std::free(data_);
    data_ = nullptr;
  }
  std::byte* data_ = nullptr;
  std::uint64_t bytes_ = 0;
  bool pinned_ = false;
};

}  // namespace

struct BlockEngine::Impl {
  const StackPlan& plan;
  EngineOptions opt;
  int rank = 0, ranks = 1;
  bool cuda = false;
  std::int64_t n = 0;
  EngineStats stats;

  // resident: per-block views (and the device buffers behind them on CUDA)
  std::vector<std::vector<at::Tensor>> resident;
  std::vector<at::Tensor> resident_buffers;

  // layerwise / dlo: what this rank keeps on the host, and where each block's part starts
  HostArena host;
  std::vector<std::uint64_t> host_offset;
  // two slots, their block views, and their state
  std::array<at::Tensor, 2> slot;
  std::array<std::vector<std::vector<at::Tensor>>, 2> views;  // [slot][block]
  std::array<std::int64_t, 2> slot_block{-1, -1};            // block requested into the slot
  std::array<bool, 2> in_use{false, false};
  int next_slot = 0;

  // CPU transfer thread
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<std::int64_t, int>> queue;  // (block, slot)
  std::array<std::int64_t, 2> slot_done{-1, -1};   // block whose transfer into the slot finished
  bool stopping = false;
  std::exception_ptr worker_error;

#ifdef DLO_HAVE_CUDA
  cudaStream_t copy_stream = nullptr, comm_stream = nullptr;
  std::array<cudaEvent_t, 2> ready_event{}, free_event{}, copied_event{};
  std::array<bool, 2> free_recorded{false, false};
  std::vector<cudaEvent_t> stall_begin, stall_end;  // per block: compute-stream wait, for exposed time
  std::vector<bool> stall_pending;
  std::thread watchdog;
  std::atomic<bool> watchdog_stop{false};
  // The newest gather the watchdog times: its slot (-1: none) and when it was enqueued.
  std::atomic<int> watch_slot{-1};
  std::atomic<std::int64_t> watch_block{-1};
  std::atomic<std::int64_t> watch_since_ms{0};
  cudaStream_t compute_stream() const { return c10::cuda::getCurrentCUDAStream(opt.device.index()).stream(); }
#endif

  Impl(const StackPlan& p, const EngineOptions& o) : plan(p), opt(o), n(p.num_blocks()) {
    cuda = opt.device.is_cuda();
    stats.strategy = strategy_name(opt.strategy);
    if (opt.collective != nullptr) {
      rank = opt.collective->rank();
      ranks = opt.collective->size();
    }
    DLO_CHECK(opt.strategy != Strategy::kDlo || ranks == plan.ranks(), "the stack was planned for ", plan.ranks(),
              " ranks but the collective has ", ranks);
#ifndef DLO_HAVE_CUDA
    DLO_CHECK(!cuda, "this dlo was built without CUDA");
#endif
    DLO_CHECK(opt.strategy != Strategy::kDeviceShards && opt.strategy != Strategy::kMixed, "the ",
              strategy_name(opt.strategy), " strategy is not implemented yet");
  }

  // ---- set-up
  void build() {
    const auto t0 = Clock::now();
    if (opt.strategy == Strategy::kResident) {
      build_resident();
    } else {
      build_host();
      build_slots();
    }
    stats.pack_s = seconds_since(t0);
  }

  void build_resident() {
    for (std::int64_t i = 0; i < n; ++i) {
      const BlockPlan& b = plan.block(i);
      if (!cuda) {
        // The checkpoint's own pages: shared by all ranks, no copy unless the dtype differs.
        std::vector<at::Tensor> v;
        for (const auto& t : b.tensors) v.push_back(as_packed(tensor_view(plan.checkpoint(), *t.source), t.dtype));
        resident.push_back(std::move(v));
        continue;
      }
#ifdef DLO_HAVE_CUDA
      HostArena staging(b.bytes, false);
      plan.pack(i, 0, b.bytes, staging.data(), false);
      at::Tensor buf = at::empty({static_cast<std::int64_t>(std::max<std::uint64_t>(b.bytes, 1))},
                                 at::TensorOptions().dtype(at::kByte).device(opt.device));
      cuda_check(cudaMemcpy(buf.data_ptr(), staging.data(), b.bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
      resident.push_back(plan.views(i, static_cast<std::byte*>(buf.data_ptr()), opt.device));
      resident_buffers.push_back(buf);
      stats.device_bytes += b.bytes;
#endif
    }
  }

  static at::Tensor as_packed(const at::Tensor& t, DType d) {
    const auto st = to_scalar_type(d);
    return t.scalar_type() == st ? t : t.to(st);
  }

  void build_host() {
    const bool dlo = opt.strategy == Strategy::kDlo;
    std::uint64_t total = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      host_offset.push_back(total);
      total += dlo ? plan.shard_bytes(i) : (plan.block(i).bytes + kShardAlign - 1) / kShardAlign * kShardAlign;
    }
    host = HostArena(total, cuda);
    stats.host_bytes = total;
    stats.pinned_bytes = cuda ? total : 0;
    for (std::int64_t i = 0; i < n; ++i) {
      if (dlo) {
        const std::uint64_t s = plan.shard_bytes(i), begin = s * static_cast<std::uint64_t>(rank);
        plan.pack(i, begin, begin + s, host.data() + host_offset[i], !opt.keep_page_cache);
      } else {
        plan.pack(i, 0, plan.block(i).bytes, host.data() + host_offset[i], !opt.keep_page_cache);
      }
    }
  }

  void build_slots() {
    const std::uint64_t bytes = std::max<std::uint64_t>(plan.slot_bytes(), kShardAlign);
    stats.slot_bytes = bytes;
    for (int s = 0; s < 2; ++s) {
      slot[s] = at::empty({static_cast<std::int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(opt.device));
      if (!cuda) std::memset(slot[s].data_ptr(), 0, bytes);
      for (std::int64_t i = 0; i < n; ++i)
        views[s].push_back(plan.views(i, static_cast<std::byte*>(slot[s].data_ptr()), opt.device));
    }
    stats.device_bytes = cuda ? 2 * bytes : 0;
    if (!cuda) {
      worker = std::thread([this] { worker_loop(); });
      return;
    }
#ifdef DLO_HAVE_CUDA
    cuda_check(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking), "cudaStreamCreate");
    for (int s = 0; s < 2; ++s) {
      cuda_check(cudaEventCreateWithFlags(&ready_event[s], cudaEventDisableTiming), "cudaEventCreate");
      cuda_check(cudaEventCreateWithFlags(&free_event[s], cudaEventDisableTiming), "cudaEventCreate");
      cuda_check(cudaEventCreateWithFlags(&copied_event[s], cudaEventDisableTiming), "cudaEventCreate");
    }
    stall_begin.resize(static_cast<std::size_t>(n));
    stall_end.resize(static_cast<std::size_t>(n));
    stall_pending.assign(static_cast<std::size_t>(n), false);
    for (std::int64_t i = 0; i < n; ++i) {
      cuda_check(cudaEventCreate(&stall_begin[i]), "cudaEventCreate");
      cuda_check(cudaEventCreate(&stall_end[i]), "cudaEventCreate");
    }
    if (opt.collective != nullptr && opt.strategy == Strategy::kDlo) {
      // A dead peer or a network fault must end the job with a message, not a hang: NCCL's
      // asynchronous errors are polled, and a gather that has not finished in
      // DLO_GATHER_TIMEOUT_S seconds (default 600) ends every rank.
      const char* env = std::getenv("DLO_GATHER_TIMEOUT_S");
      const std::int64_t timeout_ms = (env != nullptr ? std::atoll(env) : 600) * 1000;
      cuda_check(cudaSetDevice(opt.device.index()), "cudaSetDevice");
      watchdog = std::thread([this, timeout_ms] {
        cudaSetDevice(opt.device.index());
        while (!watchdog_stop.load()) {
          try {
            opt.collective->check_async_error();
            const int s = watch_slot.load();
            if (s >= 0 && cudaEventQuery(ready_event[s]) == cudaErrorNotReady &&
                now_ms() - watch_since_ms.load() > timeout_ms)
              throw Error(str("the gather of block ", watch_block.load(), " has not finished in ", timeout_ms / 1000,
                              " s (DLO_GATHER_TIMEOUT_S): a rank is gone or stuck"));
          } catch (const std::exception& e) {
            opt.collective->abort();
            MpiWorld::abort(std::string("weight gather: ") + e.what());
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      });
    }
#endif
  }

  ~Impl() {
    if (worker.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu);
        stopping = true;
      }
      cv.notify_all();
      worker.join();
    }
#ifdef DLO_HAVE_CUDA
    if (cuda && opt.strategy != Strategy::kResident) {
      cudaStreamSynchronize(comm_stream);
      cudaStreamSynchronize(copy_stream);
      watchdog_stop = true;
      if (watchdog.joinable()) watchdog.join();
      for (int s = 0; s < 2; ++s) {
        cudaEventDestroy(ready_event[s]);
        cudaEventDestroy(free_event[s]);
        cudaEventDestroy(copied_event[s]);
      }
      for (std::size_t i = 0; i < stall_begin.size(); ++i) {
        cudaEventDestroy(stall_begin[i]);
        cudaEventDestroy(stall_end[i]);
      }
      cudaStreamDestroy(copy_stream);
      cudaStreamDestroy(comm_stream);
    }
#endif
  }

  // ---- transfers
  // The bytes a transfer of block j moves into a slot, and from where.
  void transfer_cpu(std::int64_t j, int s) {
    if (j == opt.fail_at_block) throw Error(str("injected fault while transferring block ", j, " (fail_at_block)"));
    auto* dst = static_cast<std::byte*>(slot[s].data_ptr());
    if (opt.strategy == Strategy::kDlo) {
      const std::uint64_t shard = plan.shard_bytes(j);
      std::memcpy(dst + shard * static_cast<std::uint64_t>(rank), host.data() + host_offset[j], shard);
      if (opt.collective != nullptr) opt.collective->allgather_inplace(dst, shard);
    } else {
      std::memcpy(dst, host.data() + host_offset[j], plan.block(j).bytes);
    }
  }

  void worker_loop() {
    for (;;) {
      std::pair<std::int64_t, int> task;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;  // stopping, nothing pending
        task = queue.front();
      }
      try {
        if (!worker_error) transfer_cpu(task.first, task.second);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        worker_error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        queue.pop_front();
        slot_done[task.second] = task.first;
      }
      cv.notify_all();
    }
  }

  void request(std::int64_t j) {
    for (int s = 0; s < 2; ++s)
      if (slot_block[s] == j) return;  // already there or on its way (n <= 2): nothing to move
    const int s = next_slot;
    DLO_ASSERT(!in_use[s], "slot ", s, " is still in use by block ", slot_block[s], "; release it first");
    next_slot ^= 1;
    slot_block[s] = j;
    const std::uint64_t bytes = plan.block(j).bytes;
    stats.bytes_streamed += bytes;
    if (opt.strategy == Strategy::kDlo)
      stats.bytes_gathered += plan.shard_bytes(j) * static_cast<std::uint64_t>(ranks - 1);
    if (!cuda) {
      {
        std::lock_guard<std::mutex> lock(mu);
        slot_done[s] = -1;
        queue.emplace_back(j, s);
      }
      cv.notify_all();
      return;
    }
#ifdef DLO_HAVE_CUDA
    if (j == opt.fail_at_block) throw Error(str("injected fault while transferring block ", j, " (fail_at_block)"));
    // Write-after-read guard: the slot's previous block must be done on the compute stream.
    if (free_recorded[s]) cuda_check(cudaStreamWaitEvent(copy_stream, free_event[s], 0), "cudaStreamWaitEvent");
    auto* dst = static_cast<std::byte*>(slot[s].data_ptr());
    if (opt.strategy == Strategy::kDlo) {
      const std::uint64_t shard = plan.shard_bytes(j);
      cuda_check(cudaMemcpyAsync(dst + shard * static_cast<std::uint64_t>(rank), host.data() + host_offset[j], shard,
                                 cudaMemcpyHostToDevice, copy_stream),
                 "cudaMemcpyAsync");
      cuda_check(cudaEventRecord(copied_event[s], copy_stream), "cudaEventRecord");
      cuda_check(cudaStreamWaitEvent(comm_stream, copied_event[s], 0), "cudaStreamWaitEvent");
      if (opt.collective != nullptr) opt.collective->allgather_inplace(dst, shard, comm_stream);
      cuda_check(cudaEventRecord(ready_event[s], comm_stream), "cudaEventRecord");
      watch_since_ms = now_ms();
      watch_block = j;
      watch_slot = s;
    } else {
      cuda_check(cudaMemcpyAsync(dst, host.data() + host_offset[j], bytes, cudaMemcpyHostToDevice, copy_stream),
                 "cudaMemcpyAsync");
      cuda_check(cudaEventRecord(ready_event[s], copy_stream), "cudaEventRecord");
    }
#endif
  }

  int slot_of(std::int64_t i) const {
    for (int s = 0; s < 2; ++s)
      if (slot_block[s] == i) return s;
    return -1;
  }

  const std::vector<at::Tensor>& acquire(std::int64_t i) {
    DLO_ASSERT(i >= 0 && i < n, "block ", i, " out of range");
    ++stats.blocks_acquired;
    if (opt.strategy == Strategy::kResident) return resident[static_cast<std::size_t>(i)];
    if (slot_of(i) < 0) request(i);  // cold start (first block of the first pass)
    const int s = slot_of(i);
    in_use[s] = true;
    if (!cuda) {
      const auto t0 = Clock::now();
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return slot_done[s] == i; });
      stats.exposed_wait_s += seconds_since(t0);
      if (worker_error) std::rethrow_exception(worker_error);
    } else {
#ifdef DLO_HAVE_CUDA
      const cudaStream_t compute = compute_stream();
      harvest_stall(i);
      cuda_check(cudaEventRecord(stall_begin[i], compute), "cudaEventRecord");
      cuda_check(cudaStreamWaitEvent(compute, ready_event[s], 0), "cudaStreamWaitEvent");
      cuda_check(cudaEventRecord(stall_end[i], compute), "cudaEventRecord");
      stall_pending[i] = true;
#endif
    }
    if (n > 0) request((i + 1) % n);  // prefetch the next block into the other slot
    return views[s][static_cast<std::size_t>(i)];
  }

#ifdef DLO_HAVE_CUDA
  // Adds the compute stream's wait for block i's previous visit to the exposed time.
  void harvest_stall(std::int64_t i) {
    if (!stall_pending[i]) return;
    cudaEventSynchronize(stall_end[i]);
    float ms = 0;
    if (cudaEventElapsedTime(&ms, stall_begin[i], stall_end[i]) == cudaSuccess) stats.exposed_wait_s += ms / 1e3;
    stall_pending[i] = false;
  }
#endif

  void release(std::int64_t i) {
    if (opt.strategy == Strategy::kResident) return;
    const int s = slot_of(i);
    DLO_ASSERT(s >= 0 && in_use[s], "release of block ", i, " which is not acquired");
    in_use[s] = false;
#ifdef DLO_HAVE_CUDA
    if (cuda) {
      cuda_check(cudaEventRecord(free_event[s], compute_stream()), "cudaEventRecord");
      free_recorded[s] = true;
    }
#endif
  }
};

BlockEngine::BlockEngine(const StackPlan& plan, const EngineOptions& options)
    : impl_(std::make_unique<Impl>(plan, options)) {
  impl_->build();
}

BlockEngine::~BlockEngine() = default;
std::int64_t BlockEngine::num_blocks() const { return impl_->n; }
Strategy BlockEngine::strategy() const { return impl_->opt.strategy; }
const std::vector<at::Tensor>& BlockEngine::acquire(std::int64_t i) { return impl_->acquire(i); }
void BlockEngine::release(std::int64_t i) { impl_->release(i); }

void BlockEngine::traverse(const std::function<void(std::int64_t, const std::vector<at::Tensor>&)>& compute) {
  // A compute failure stays local: the rest of the pass joins the transfers without computing,
  // so the other ranks' gathers complete, and the failure is reported after the pass.
  std::string failure;
  std::int64_t failed_block = -1;
  for (std::int64_t i = 0; i < impl_->n; ++i) {
    const auto& w = acquire(i);
    if (compute && failed_block < 0) {
      try {
        compute(i, w);
      } catch (const std::exception& e) {
        failure = e.what();
        failed_block = i;
      }
    }
    release(i);
  }
  if (failed_block >= 0) throw BlockComputeError(str("block ", failed_block, ": ", failure));
}

EngineStats BlockEngine::stats() const {
#ifdef DLO_HAVE_CUDA
  if (impl_->cuda && impl_->opt.strategy != Strategy::kResident)
    for (std::int64_t i = 0; i < impl_->n; ++i) impl_->harvest_stall(i);
#endif
  return impl_->stats;
}

}  // namespace dlo
