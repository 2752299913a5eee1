// The CPU transport (see transport.h): a transfer thread per engine copies a block's part into its
// slot and runs the MPI in-place AllGather, while the engine's thread computes from the other slot.
#include <algorithm>
#include <array>
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
#include "dlo/offload/transport.h"

namespace dlo {
namespace {

using Clock = std::chrono::steady_clock;

std::byte* aligned_alloc_4k(std::uint64_t bytes) {
  void* p = nullptr;
  DLO_CHECK(posix_memalign(&p, 4096, bytes) == 0, "cannot allocate ", bytes, " bytes of host memory");
  return static_cast<std::byte*>(p);
}

class AlignedHostMemory final : public HostMemory {
 public:
  explicit AlignedHostMemory(std::uint64_t bytes) : bytes_(bytes) {
    if (bytes > 0) data_ = aligned_alloc_4k(bytes);
  }
  ~AlignedHostMemory() override { std::free(data_); }
  AlignedHostMemory(const AlignedHostMemory&) = delete;
  AlignedHostMemory& operator=(const AlignedHostMemory&) = delete;
  std::byte* data() const override { return data_; }
  std::uint64_t bytes() const override { return bytes_; }
  bool pinned() const override { return false; }

 private:
  std::byte* data_ = nullptr;
  std::uint64_t bytes_ = 0;
};

class CpuTransport final : public Transport {
 public:
  explicit CpuTransport(const TransportOptions& o) : opt_(o) {}

  ~CpuTransport() override {
    if (!worker_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  std::unique_ptr<HostMemory> host_memory(std::uint64_t bytes) override {
    return std::make_unique<AlignedHostMemory>(bytes);
  }

  at::Tensor device_memory(std::uint64_t bytes) override {
    bytes = std::max<std::uint64_t>(bytes, 1);
    std::byte* p = aligned_alloc_4k(bytes);
    std::memset(p, 0, bytes);
    return at::from_blob(p, {static_cast<std::int64_t>(bytes)}, [](void* q) { std::free(q); },
                         at::TensorOptions().dtype(at::kByte));
  }

  void upload(const std::vector<Upload>& items) override {
    for (const auto& u : items) u.fill(u.dst, 0, u.bytes);  // "device" memory is host memory here
  }

  void request(const Transfer& t) override {
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
    {
      std::lock_guard<std::mutex> lock(mu_);
      slot_done_[t.slot] = -1;
      queue_.push_back(t);
    }
    cv_.notify_all();
  }

  void wait_ready(std::int64_t block, int slot) override {
    const auto t0 = Clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return slot_done_[slot] == block; });
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    waits_.total_s += waited;
    if (block == 0) waits_.entry_s.push_back(waited);
    if (error_) std::rethrow_exception(error_);
  }

  void release(int) override {}  // the compute that read the slot has already run

  TransferWaits waits() override { return waits_; }

 private:
  void transfer(const Transfer& t) {
    if (t.fail) throw Error(str("injected fault while transferring block ", t.block, " (fail_at_block)"), ErrorKind::kTransfer);
    std::memcpy(t.slot_base + t.offset, t.src, t.bytes);
    if (t.gather_shard > 0 && opt_.collective != nullptr) opt_.collective->allgather_inplace(t.slot_base, t.gather_shard);
  }

  void worker_loop() {
    for (;;) {
      Transfer t;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing pending
        t = queue_.front();
      }
      // After a failure, later transfers are skipped (their waits rethrow it).
      std::exception_ptr failed;
      {
        std::lock_guard<std::mutex> lock(mu_);
        failed = error_;
      }
      try {
        if (!failed) transfer(t);
      } catch (const std::exception& e) {
        // Whatever failed, the collective is now out of step: a transfer error for every wait.
        const auto* d = dynamic_cast<const Error*>(&e);
        std::lock_guard<std::mutex> lock(mu_);
        error_ = d != nullptr && d->kind() == ErrorKind::kTransfer
                     ? std::current_exception()
                     : std::make_exception_ptr(Error(str("transferring block ", t.block, ": ", e.what()), ErrorKind::kTransfer));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.pop_front();
        slot_done_[t.slot] = t.block;
      }
      cv_.notify_all();
    }
  }

  TransportOptions opt_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Transfer> queue_;
  std::array<std::int64_t, 2> slot_done_{-1, -1};  // block whose transfer into the slot finished
  bool stopping_ = false;
  std::exception_ptr error_;
  TransferWaits waits_;
};

}  // namespace

std::unique_ptr<Transport> make_cpu_transport(const TransportOptions& options) {
  return std::make_unique<CpuTransport>(options);
}

}  // namespace dlo
