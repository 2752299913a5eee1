// The offload engine: hands a model its blocks' weights, one block at a time, on the compute
// device, from wherever they are kept.
//
//   resident   all blocks on the device once (on the CPU: the checkpoint's mmap views, shared by
//              every rank through the page cache).
//   layerwise  every rank keeps the whole stack in (pinned) host memory and copies each block
//              into one of two device slots just before it runs; no collective.
//   device-shards  every rank keeps 1/N of each block in device memory (one arena); the block is
//              rebuilt in a device slot by a device-to-device copy of its own shard and an in-place
//              AllGather (no host-to-device copy per step). At one rank the "shard" is the whole
//              block and is used in place (no slot): the same as resident, in one allocation.
//   mixed      the first `device_blocks` blocks' shards live on the device (as device-shards), the
//              rest on the host (as dlo).
//   dlo        every rank keeps 1/N of each block in (pinned) host memory; the block is rebuilt in a
//              device slot by an in-place AllGather (each rank's shard lands at its own offset: no
//              staging copy).
//
// The streamed strategies double-buffer: while block i computes from one slot, block i+1 is copied
// and gathered into the other (CUDA: copy and communication streams with events; CPU: a transfer
// thread; see transport.h). On the CPU, "device memory" (slots, device shards) is host memory of
// its own, so every strategy runs there. A slot is never overwritten while compute may still read it. The last block prefetches
// block 0, so passes, guidance branches and jobs follow each other without a bubble. Nothing is
// allocated per block; block views into each slot are made once.
//
// Collective: with a sharded strategy, every rank must call acquire/release (or traverse) for the same blocks
// in the same order; ranks without work call traverse(nullptr) (a "ghost" pass). Not thread-safe:
// one thread drives an engine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/common/error.h"
#include "dlo/common/settings.h"
#include "dlo/offload/stack_plan.h"

namespace dlo {

class Collective;

// In the order "auto" prefers them (most device memory first).
enum class Strategy { kResident, kDeviceShards, kMixed, kDlo, kLayerwise };
// "resident", "device-shards", "mixed", "dlo", "layerwise".
const char* strategy_name(Strategy s);
// The strategy named `name` (as strategy_name writes it); nullopt for anything else.
std::optional<Strategy> parse_strategy(const std::string& name);
// Strategies whose blocks are sharded 1/N over the ranks and rebuilt by the collective.
inline bool is_sharded(Strategy s) { return s == Strategy::kDeviceShards || s == Strategy::kMixed || s == Strategy::kDlo; }

struct EngineOptions {
  Strategy strategy = Strategy::kResident;
  at::Device device = at::kCPU;
  Collective* collective = nullptr;  // sharded strategies with several ranks; must outlive the engine (its last prefetch uses it)
  bool keep_page_cache = false;      // layerwise/sharded: keep the checkpoint pages after packing
  // mixed: how many blocks, from block 0, keep this rank's shard in device memory (the rest stay
  // on the host); 0 < device_blocks < num_blocks. device-shards: all of them; dlo: none (ignored).
  std::int64_t device_blocks = 0;
  // A gather that has not completed after this many seconds ends every rank (NCCL watchdog); > 0.
  double gather_timeout_s = kDefaultGatherTimeoutS;
  // Test hook (the fault-injection test): throw while transferring this block. -1: never.
  std::int64_t fail_at_block = -1;
  // Test hook (the GPU soak of gathers interleaved with sequence parallelism's exchanges): before
  // a transfer is requested, pause a random 0..jitter_us microseconds (a generator seeded with
  // jitter_seed), so the ranks issue gathers at shifting times relative to their exchanges. 0: never.
  std::int64_t jitter_us = 0;
  std::uint64_t jitter_seed = 0;
};

// What the engine did, as data (memory in bytes, time in seconds).
struct EngineStats {
  std::string strategy;
  std::uint64_t host_bytes = 0;          // host-held shard or block bytes this rank keeps
  std::uint64_t pinned_bytes = 0;        // of which page-locked (CUDA)
  std::uint64_t device_shard_bytes = 0;  // this rank's shard bytes kept in device memory (device-shards, mixed)
  std::uint64_t slot_bytes = 0;          // one device slot (0: no block goes through slots)
  // Device memory the engine holds: resident blocks, or two slots plus the device shards. (On the
  // CPU resident blocks are the checkpoint's page cache and count 0.)
  std::uint64_t device_bytes = 0;
  std::uint64_t blocks_acquired = 0;
  std::uint64_t bytes_streamed = 0;  // block bytes rebuilt in a slot (0 when resident or used in place)
  std::uint64_t h2d_bytes = 0;       // bytes copied from host memory into slots (0 for device-held blocks)
  std::uint64_t bytes_gathered = 0;  // bytes received through the collective
  double exposed_wait_s = 0;         // time compute waited for a block's transfer
  // Of which at each acquire of block 0, in order: a pass's entry, where a switch between
  // experts lands (one engine's; empty in sum_engine_stats).
  std::vector<double> entry_wait_s;
  double pack_s = 0;                 // building the shards at start
};

// A model's computation failed inside BlockEngine::traverse; the engine and the collective are
// fine (the pass was completed without computing), so only the work it belonged to has failed.
// Failures of the transfers are dlo::Error of kind transfer (the collective is out of step).
class BlockComputeError : public Error {
 public:
  explicit BlockComputeError(const std::string& what) : Error(what, ErrorKind::kInternal) {}
};

// `stats` as a JSON object ({"strategy", "host_bytes", ..., "pack_s"}), for the tools' reports.
std::string engine_stats_json(const EngineStats& stats);
// Several engines of one rank (the experts') as its totals: bytes and waits summed, slot_bytes the
// largest, strategy names joined with '+' where they differ. `all` not empty.
EngineStats sum_engine_stats(const std::vector<EngineStats>& all);

class BlockEngine {
 public:
  // Builds the host and device copies (packing this rank's shard of every block for the sharded
  // strategies, every block for layerwise, reading only those checkpoint bytes, then releasing
  // those pages) and allocates the two slots. Throws dlo::Error for mixed without
  // 0 < device_blocks < num_blocks, and when sharded ranks do not match the plan. Not collective itself; callers check first that all ranks planned the same layout
  // (StackPlan::fingerprint), see offload/runner.h.
  BlockEngine(const StackPlan& plan, const EngineOptions& options);
  ~BlockEngine();
  BlockEngine(const BlockEngine&) = delete;
  BlockEngine& operator=(const BlockEngine&) = delete;

  std::int64_t num_blocks() const;
  Strategy strategy() const;

  // Block i's tensors (StackPlan::block(i) order) on the device, ready for work enqueued on the
  // current compute stream. Starts the transfer of block i+1 (mod n). Blocks must be visited in
  // ring order 0, 1, ..., n-1, 0, ... with release(i) before acquire(i+1).
  const std::vector<at::Tensor>& acquire(std::int64_t i);
  // Work reading block i has been enqueued; its slot may be refilled once that work is done.
  void release(std::int64_t i);
  // Starts bringing block 0 into a slot unless it is there or on its way (no-op when resident or
  // used in place), so that a later pass enters without waiting: for an engine that sits out a
  // pass while another streams (Wan2.2's second expert before its first step). Collective like
  // acquire: every rank calls it at the same point of the same pass. Not while a block of this
  // engine is acquired.
  void prefetch_entry();
  // One pass over all blocks: acquire(i), compute(i, weights) unless compute is null, release(i).
  // If compute throws, the pass goes on without computing (the collective stays in step) and
  // BlockComputeError is thrown at its end; a failure of a transfer propagates as it happens, and
  // so does a dlo::Error of kind transfer from compute itself (its exchange with other ranks, a
  // sequence-parallel group's, failed: the ranks are out of step, the pass's blocks stay
  // acquired, and the process must end).
  void traverse(const std::function<void(std::int64_t, const std::vector<at::Tensor>&)>& compute);

  EngineStats stats() const;

  // Several engines in one pass, block by block together (Wan2.2's two experts when ranks are on
  // different experts): for i = 0, 1, ...: block i of every engine that has one is acquired, in
  // the order given, then engines[computing]'s compute(i, weights) runs (computing -1: none), then
  // all are released. So a rank computing in one engine joins the others' gathers, which proceed
  // behind its compute instead of after it. Collective: every rank passes the same engines in the
  // same order. Failures as traverse(): a compute failure finishes the pass as a ghost and throws
  // BlockComputeError at its end.
  static void traverse_together(const std::vector<BlockEngine*>& engines, int computing,
                                const std::function<void(std::int64_t, const std::vector<at::Tensor>&)>& compute);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlo
