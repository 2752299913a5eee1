// The engine's shared logic: which block's part is kept where, which block is in which slot, the
// ring order and the statistics. Moving bytes is the transport's job (transport.h).
#include "dlo/offload/engine.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <exception>
#include <random>
#include <string>
#include <thread>

#include <ATen/ATen.h>

#include "dlo/common/error.h"
#include "dlo/dist/collective.h"
#include "dlo/models/tensor_view.h"
#include "dlo/models/torch_errors.h"
#include "dlo/offload/transport.h"

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

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

// The one place that knows which transports this build has.
std::unique_ptr<Transport> make_transport(const TransportOptions& o) {
  if (!o.device.is_cuda()) return make_cpu_transport(o);
#ifdef DLO_HAVE_CUDA
  return make_cuda_transport(o);
#else
  DLO_CHECK(false, "this dlo was built without CUDA (device ", o.device.str(), ")");
#endif
}

}  // namespace

struct BlockEngine::Impl {
  // Where a streamed block's part (this rank's shard, or the whole block for layerwise) is kept,
  // and where it lands in a slot. (A member type, not in the anonymous namespace: Impl has
  // external linkage, and a member of an internal type in it is what -Wsubobject-linkage flags
  // once the layer's unity build includes this file.)
  struct Part {
    bool on_device = false;          // in the device arena (device shards), else in host memory
    bool direct = false;             // device-held at one rank: the arena's views are the block, no slot
    std::uint64_t offset = 0;        // in its arena
    std::uint64_t bytes = 0;         // copied into the slot
    std::uint64_t slot_offset = 0;   // rank * shard for sharded blocks
    std::uint64_t gather_shard = 0;  // sharded: the AllGather's shard bytes; 0: no gather
  };

  const StackPlan& plan;
  EngineOptions opt;
  int rank = 0, ranks = 1;
  bool cuda = false;
  std::int64_t n = 0;
  EngineStats stats;

  // resident: per-block views (and the device buffers behind them on CUDA)
  std::vector<std::vector<at::Tensor>> resident;
  std::vector<at::Tensor> resident_buffers;

  // streamed strategies: where each block's part is kept
  std::vector<Part> parts;
  std::unique_ptr<HostMemory> host;
  at::Tensor device_arena;                            // device shards, one allocation
  std::vector<std::vector<at::Tensor>> direct_views;  // [block]; empty unless parts[i].direct
  // two slots, their block views, and their state
  std::array<at::Tensor, 2> slot;
  std::array<std::vector<std::vector<at::Tensor>>, 2> views;  // [slot][block]
  std::array<std::int64_t, 2> slot_block{-1, -1};            // block requested into the slot
  std::array<bool, 2> in_use{false, false};
  int next_slot = 0;
  std::mt19937_64 jitter;  // EngineOptions::jitter_us (a test hook)

  // Declared last and reset first (~Impl): transfers in flight end before the memory goes.
  std::unique_ptr<Transport> transport;

  Impl(const StackPlan& p, const EngineOptions& o) : plan(p), opt(o), n(p.num_blocks()), jitter(o.jitter_seed) {
    cuda = opt.device.is_cuda();
    stats.strategy = strategy_name(opt.strategy);
    if (opt.collective != nullptr) {
      rank = opt.collective->rank();
      ranks = opt.collective->size();
    }
    DLO_CHECK(!is_sharded(opt.strategy) || ranks == plan.ranks(), "the stack was planned for ", plan.ranks(),
              " ranks but the collective has ", ranks);
    DLO_CHECK(opt.strategy != Strategy::kMixed || (opt.device_blocks > 0 && opt.device_blocks < n),
              "the mixed strategy keeps blocks 0..device_blocks-1 on the device and the rest on the host, so it "
              "needs 0 < device_blocks < ",
              n, " (the number of blocks); got device_blocks = ", opt.device_blocks,
              " (device-shards keeps every block on the device, dlo none)");
    DLO_CHECK(opt.gather_timeout_s > 0, "the gather timeout must be > 0 seconds, got ", opt.gather_timeout_s);
  }

  ~Impl() { transport.reset(); }

  // ---- set-up
  void build() {
    const auto t0 = Clock::now();
    transport = make_transport({opt.device, opt.collective, n, opt.gather_timeout_s});
    if (opt.strategy == Strategy::kResident) {
      build_resident();
    } else {
      build_parts();
      build_slots();
    }
    stats.pack_s = seconds_since(t0);
  }

  void build_resident() {
    if (!cuda) {
      // The checkpoint's own pages: shared by all ranks, no copy unless the dtype differs.
      for (std::int64_t i = 0; i < n; ++i) {
        std::vector<at::Tensor> v;
        for (const auto& t : plan.block(i).tensors)
          v.push_back(StackPlan::packed_values(t, tensor_view(plan.checkpoint(), *t.source)));
        resident.push_back(std::move(v));
      }
      return;
    }
    std::vector<Upload> uploads;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint64_t bytes = plan.block(i).bytes;
      at::Tensor buf = transport->device_memory(bytes);
      auto* base = static_cast<std::byte*>(buf.data_ptr());
      uploads.push_back({base, bytes, [this, i](std::byte* out, std::uint64_t b, std::uint64_t e) {
                           plan.pack(i, b, e, out, false);
                         }});
      resident.push_back(plan.views(i, base, opt.device));
      resident_buffers.push_back(buf);
      stats.device_bytes += bytes;
    }
    transport->upload(uploads);
  }

  // Plans every block's part, then packs the host-held parts into one host arena and uploads the
  // device-held ones into one device arena (this rank's bytes only, each read from the checkpoint
  // once).
  void build_parts() {
    const bool sharded = is_sharded(opt.strategy);
    const std::int64_t on_device = opt.strategy == Strategy::kDeviceShards ? n
                                   : opt.strategy == Strategy::kMixed     ? opt.device_blocks
                                                                          : 0;
    std::uint64_t host_total = 0, device_total = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint64_t shard = plan.shard_bytes(i), bytes = plan.block(i).bytes;
      Part p;
      p.on_device = i < on_device;
      p.direct = p.on_device && ranks == 1;
      p.bytes = sharded ? shard : bytes;
      p.slot_offset = sharded ? shard * static_cast<std::uint64_t>(rank) : 0;
      p.gather_shard = sharded ? shard : 0;
      std::uint64_t& total = p.on_device ? device_total : host_total;
      p.offset = total;
      total += sharded ? shard : align_up(bytes, kShardAlign);
      parts.push_back(p);
    }
    const bool release = !opt.keep_page_cache;

    host = transport->host_memory(host_total);
    stats.host_bytes = host_total;
    stats.pinned_bytes = host->pinned() ? host_total : 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const Part& p = parts[static_cast<std::size_t>(i)];
      if (!p.on_device) plan.pack(i, p.slot_offset, p.slot_offset + p.bytes, host->data() + p.offset, release);
    }

    direct_views.resize(static_cast<std::size_t>(n));
    stats.device_shard_bytes = device_total;
    if (device_total == 0) return;
    device_arena = transport->device_memory(device_total);
    auto* base = static_cast<std::byte*>(device_arena.data_ptr());
    std::vector<Upload> uploads;
    for (std::int64_t i = 0; i < n; ++i) {
      const Part& p = parts[static_cast<std::size_t>(i)];
      if (!p.on_device) continue;
      const std::uint64_t begin = p.slot_offset;
      uploads.push_back({base + p.offset, p.bytes, [this, i, begin, release](std::byte* out, std::uint64_t b,
                                                                             std::uint64_t e) {
                           plan.pack(i, begin + b, begin + e, out, release);
                         }});
      if (p.direct) direct_views[static_cast<std::size_t>(i)] = plan.views(i, base + p.offset, opt.device);
    }
    transport->upload(uploads);
  }

  // Two slots, each as large as the largest padded block that goes through them.
  void build_slots() {
    std::uint64_t largest = 0;
    for (std::int64_t i = 0; i < n; ++i)
      if (!parts[static_cast<std::size_t>(i)].direct) largest = std::max(largest, plan.padded_bytes(i));
    if (largest > 0) {
      const std::uint64_t bytes = std::max<std::uint64_t>(largest, kShardAlign);
      stats.slot_bytes = bytes;
      for (int s = 0; s < 2; ++s) {
        slot[s] = transport->device_memory(bytes);
        for (std::int64_t i = 0; i < n; ++i)
          views[s].push_back(parts[static_cast<std::size_t>(i)].direct
                                 ? std::vector<at::Tensor>{}
                                 : plan.views(i, static_cast<std::byte*>(slot[s].data_ptr()), opt.device));
      }
    }
    stats.device_bytes = 2 * stats.slot_bytes + stats.device_shard_bytes;
  }

  // ---- transfers
  // Starts bringing block j into the next slot, unless it is already there or on its way (n <= 2,
  // or at most two blocks go through the slots).
  void request(std::int64_t j) {
    for (int s = 0; s < 2; ++s)
      if (slot_block[s] == j) return;
    const Part& p = parts[static_cast<std::size_t>(j)];
    DLO_ASSERT(!p.direct, "block ", j, " is served in place");
    const int s = next_slot;
    DLO_ASSERT(!in_use[s], "slot ", s, " is still in use by block ", slot_block[s], "; release it first");
    next_slot ^= 1;
    slot_block[s] = j;
    stats.bytes_streamed += plan.block(j).bytes;
    if (!p.on_device) stats.h2d_bytes += p.bytes;
    stats.bytes_gathered += p.gather_shard * static_cast<std::uint64_t>(ranks - 1);
    Transfer t;
    t.block = j;
    t.slot = s;
    t.slot_base = static_cast<std::byte*>(slot[s].data_ptr());
    t.offset = p.slot_offset;
    t.src = (p.on_device ? static_cast<std::byte*>(device_arena.data_ptr()) : host->data()) + p.offset;
    t.src_on_device = p.on_device;
    t.bytes = p.bytes;
    t.gather_shard = p.gather_shard;
    t.fail = j == opt.fail_at_block;
    if (opt.jitter_us > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(
          std::uniform_int_distribution<std::int64_t>(0, opt.jitter_us)(jitter)));
    transport->request(t);
  }

  // Prefetch: the block after i goes into the other slot while i computes.
  void prefetch_after(std::int64_t i) {
    const std::int64_t j = (i + 1) % n;
    if (!parts[static_cast<std::size_t>(j)].direct) request(j);
  }

  int slot_of(std::int64_t i) const {
    for (int s = 0; s < 2; ++s)
      if (slot_block[s] == i) return s;
    return -1;
  }

  const std::vector<at::Tensor>& acquire(std::int64_t i) {
    DLO_ASSERT(i >= 0 && i < n, "block ", i, " out of range");
    ++stats.blocks_acquired;
    const auto k = static_cast<std::size_t>(i);
    if (opt.strategy == Strategy::kResident) return resident[k];
    if (parts[k].direct) {
      prefetch_after(i);
      return direct_views[k];
    }
    if (slot_of(i) < 0) request(i);  // cold start (first streamed block of the first pass)
    const int s = slot_of(i);
    in_use[s] = true;
    transport->wait_ready(i, s);
    prefetch_after(i);
    return views[s][k];
  }

  void release(std::int64_t i) {
    if (opt.strategy == Strategy::kResident || parts[static_cast<std::size_t>(i)].direct) return;
    const int s = slot_of(i);
    DLO_ASSERT(s >= 0 && in_use[s], "release of block ", i, " which is not acquired");
    in_use[s] = false;
    transport->release(s);
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

void BlockEngine::prefetch_entry() {
  Impl& m = *impl_;
  if (m.opt.strategy == Strategy::kResident || m.parts.empty() || m.parts[0].direct) return;
  DLO_ASSERT(!m.in_use[0] && !m.in_use[1], "prefetch_entry while a block is acquired");
  m.request(0);  // no-op when block 0 is in a slot or on its way
}

void BlockEngine::traverse(const std::function<void(std::int64_t, const std::vector<at::Tensor>&)>& compute) {
  traverse_together({this}, compute ? 0 : -1, compute);
}

void BlockEngine::traverse_together(const std::vector<BlockEngine*>& engines, int computing,
                                    const std::function<void(std::int64_t, const std::vector<at::Tensor>&)>& compute) {
  DLO_ASSERT(computing < static_cast<int>(engines.size()), "engine ", computing, " of ", engines.size());
  std::int64_t n = 0;
  for (const auto* e : engines) n = std::max(n, e->impl_->n);
  // A compute failure stays local: the rest of the pass joins the transfers without computing,
  // so the other ranks' gathers complete, and the failure is reported after the pass.
  std::string failure;
  std::int64_t failed_block = -1;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::vector<at::Tensor>* mine = nullptr;
    for (std::size_t k = 0; k < engines.size(); ++k) {
      if (i >= engines[k]->impl_->n) continue;
      const auto& w = engines[k]->acquire(i);
      if (static_cast<int>(k) == computing) mine = &w;
    }
    if (mine && compute && failed_block < 0) {
      try {
        compute(i, *mine);
      } catch (const Error& e) {
        // The compute's own exchange with other ranks (a sequence-parallel group) failed: like a
        // gather's failure, the ranks are out of step.
        if (e.kind() == ErrorKind::kTransfer) throw;
        failure = describe_exception(e);
        failed_block = i;
      } catch (const std::exception& e) {
        failure = describe_exception(e);
        failed_block = i;
      }
    }
    for (auto* e : engines)
      if (i < e->impl_->n) e->release(i);
  }
  if (failed_block >= 0) throw BlockComputeError(str("block ", failed_block, ": ", failure));
}

EngineStats BlockEngine::stats() const {
  EngineStats s = impl_->stats;
  TransferWaits w = impl_->transport->waits();
  s.exposed_wait_s = w.total_s;
  s.entry_wait_s = std::move(w.entry_s);
  return s;
}

}  // namespace dlo
