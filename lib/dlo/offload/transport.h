// The offload engine's transfer paths (internal to lib/dlo/offload): the memory blocks are kept in,
// and how one block's bytes get into a device slot. engine.cpp decides what lives where and which
// block goes into which slot; a transport only allocates and moves bytes. One per device kind:
//
//   transport_cpu.cpp   a transfer thread per engine: memcpy, then the MPI in-place AllGather.
//   transport_cuda.cpp  copy and communication streams with events (cudaMemcpyAsync, NCCL
//                       AllGather), a watchdog on the gather, compute-stream stall timing.
//                       Compiled only with DLO_HAVE_CUDA.
//
// A transport is driven by one thread (the engine's). For each slot, calls alternate
// request(t) -> wait_ready(t.block, t.slot) -> release(t.slot); the engine never requests into a
// slot it has not released.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/common/settings.h"

namespace dlo {

class Collective;

// Host memory the engine keeps blocks or shards in: 4 KiB-aligned pageable memory (CPU) or
// page-locked memory of the exact size (CUDA). Frees itself.
class HostMemory {
 public:
  virtual ~HostMemory() = default;
  virtual std::byte* data() const = 0;
  virtual std::uint64_t bytes() const = 0;
  virtual bool pinned() const = 0;
};

// Bytes placed into device memory once, at start (resident blocks, device shards): `fill(out,
// begin, end)` writes bytes [begin, end) of the item into host memory at `out`.
struct Upload {
  std::byte* dst = nullptr;  // device memory (from Transport::device_memory)
  std::uint64_t bytes = 0;
  std::function<void(std::byte* out, std::uint64_t begin, std::uint64_t end)> fill;
};

// One block into one slot: this rank's part is copied from `src` to slot + `offset`, then (for a
// sharded block) the slot is rebuilt by the collective's in-place AllGather of `gather_shard`-byte
// shards. Without a collective (one rank) the copy alone fills the slot.
struct Transfer {
  std::int64_t block = -1;
  int slot = 0;
  std::byte* slot_base = nullptr;
  std::uint64_t offset = 0;
  const std::byte* src = nullptr;  // host memory, or device memory when src_on_device
  bool src_on_device = false;
  std::uint64_t bytes = 0;
  std::uint64_t gather_shard = 0;  // 0: not sharded, no gather
  bool fail = false;               // test hook (EngineOptions::fail_at_block): throw while transferring
};

struct TransportOptions {
  at::Device device = at::kCPU;
  Collective* collective = nullptr;  // gathers and, on CUDA, its watchdog; null: one rank
  std::int64_t blocks = 0;           // blocks in the ring (per-block stall timing)
  double gather_timeout_s = kDefaultGatherTimeoutS;     // CUDA watchdog: a gather not finished by then ends every rank
};

// How long compute waited for transfers, in seconds.
struct TransferWaits {
  double total_s = 0;
  std::vector<double> entry_s;  // at each visit of block 0, in order
};

class Transport {
 public:
  // Waits for transfers in flight and stops any threads of its own. The memory it handed out
  // stays valid (its owners free it).
  virtual ~Transport() = default;

  virtual std::unique_ptr<HostMemory> host_memory(std::uint64_t bytes) = 0;
  // `bytes` (at least 1) of device memory; on the CPU a separate 4 KiB-aligned, zeroed host
  // allocation, so the device code paths run in the CPU tests.
  virtual at::Tensor device_memory(std::uint64_t bytes) = 0;
  // Fills device memory from host bytes made by each item's `fill`; returns once all is in place.
  virtual void upload(const std::vector<Upload>& items) = 0;

  // Starts moving `t.block` into `t.slot` (CPU: queued for the transfer thread; CUDA: enqueued on
  // the copy and communication streams, ordered after the slot's last release). Returns at once.
  // A transfer's failure is thrown here or by the wait_ready of that block.
  virtual void request(const Transfer& t) = 0;
  // Block `block` is in `slot` for the compute that follows: the CPU waits for it; CUDA makes the
  // current compute stream wait for it. Rethrows a failure of the transfer.
  virtual void wait_ready(std::int64_t block, int slot) = 0;
  // The compute reading `slot` has been issued (CUDA: enqueued on the current compute stream).
  virtual void release(int slot) = 0;
  // Time compute has waited for transfers so far, in seconds (CUDA: measured on the compute
  // stream with events; this waits for the timed waits to have happened): in all, and at each
  // visit of block 0 in order (a pass's entry, where a switch between experts lands).
  virtual TransferWaits waits() = 0;
};

std::unique_ptr<Transport> make_cpu_transport(const TransportOptions& options);
// Defined in transport_cuda.cpp, which is built only with DLO_HAVE_CUDA.
std::unique_ptr<Transport> make_cuda_transport(const TransportOptions& options);

}  // namespace dlo
