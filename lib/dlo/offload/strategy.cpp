#include "dlo/offload/strategy.h"

#include <algorithm>

#include "dlo/common/bytes.h"
#include "dlo/common/checked.h"
#include "dlo/common/error.h"
#include "dlo/common/memory.h"
#include "dlo/dist/device.h"
#include "dlo/mpi/mpi_world.h"
#include "dlo/offload/stack_plan.h"

namespace dlo {

std::uint64_t StackSize::total() const {
  std::uint64_t t = 0;
  for (auto b : block_bytes) t = sat_add(t, b);
  return t;
}

std::uint64_t StackSize::shards_total() const {
  std::uint64_t t = 0;
  for (auto s : shard_bytes) t = sat_add(t, s);
  return t;
}

std::uint64_t StackSize::slots_total() const {
  return sat_mul(sat_mul(2, static_cast<std::uint64_t>(stacks())), slot_bytes);
}

StackSize join_stacks(const std::vector<StackSize>& parts) {
  DLO_ASSERT(!parts.empty(), "no stacks to join");
  StackSize s;
  s.ranks = parts[0].ranks;
  for (const auto& p : parts) {
    DLO_ASSERT(p.ranks == s.ranks && p.stacks() == 1, "stacks planned for different ranks, or joined twice");
    s.block_bytes.insert(s.block_bytes.end(), p.block_bytes.begin(), p.block_bytes.end());
    s.shard_bytes.insert(s.shard_bytes.end(), p.shard_bytes.begin(), p.shard_bytes.end());
    s.slot_bytes = std::max(s.slot_bytes, p.slot_bytes);
    s.resident_bytes = sat_add(s.resident_bytes, p.resident_bytes);
    s.stack_blocks.push_back(static_cast<std::int64_t>(p.block_bytes.size()));
  }
  if (parts.size() == 1) s.stack_blocks.clear();
  return s;
}

std::vector<StrategyChoice> split_choice(const StrategyChoice& choice, const StackSize& joined) {
  if (joined.stacks() == 1) return {choice};
  std::vector<StrategyChoice> out;
  std::int64_t first = 0;
  for (const std::int64_t n : joined.stack_blocks) {
    StrategyChoice c = choice;
    if (choice.strategy == Strategy::kMixed) {
      const std::int64_t k = std::clamp<std::int64_t>(choice.device_blocks - first, 0, n);
      c.strategy = k == 0 ? Strategy::kDlo : k == n ? Strategy::kDeviceShards : Strategy::kMixed;
      c.device_blocks = k;
    } else if (choice.strategy == Strategy::kDeviceShards) {
      c.device_blocks = n;
    }
    out.push_back(c);
    first += n;
  }
  return out;
}

bool fits_budget(std::uint64_t need, std::uint64_t budget) { return budget == 0 || with_margin(need) <= budget; }

StackSize stack_size(const StackPlan& plan) {
  StackSize s;
  s.ranks = plan.ranks();
  s.slot_bytes = plan.slot_bytes();
  for (std::int64_t i = 0; i < plan.num_blocks(); ++i) {
    s.block_bytes.push_back(plan.block(i).bytes);
    s.shard_bytes.push_back(plan.shard_bytes(i));
  }
  return s;
}

MemoryBudget agree_memory_budget(const MpiWorld& world, c10::Device device, const DeviceSharing& sharing,
                                 std::optional<std::uint64_t> device_budget) {
  MemoryBudget b;
  b.ranks_per_node = static_cast<int>(world.allreduce_max(world.local_size(), "memory agreement"));
  const std::uint64_t host_avail = available_memory_bytes() / static_cast<std::uint64_t>(world.local_size());
  b.host = static_cast<std::uint64_t>(
      world.allreduce_min(static_cast<std::int64_t>(std::min<std::uint64_t>(host_avail, INT64_MAX)), "memory agreement"));
  b.host_why = str("available host memory / ", world.local_size(), " rank(s) on the node",
                   world.size() > 1 ? ", least over the ranks" : "");
  std::int64_t dev = -1;
  if (device_budget) {
    dev = static_cast<std::int64_t>(std::min<std::uint64_t>(*device_budget, INT64_MAX));
    b.device_why = "the device budget given";
  } else if (device.is_cuda()) {
    const DeviceMemory m = device_memory(device, /*release_cache=*/true);
    dev = std::max<std::int64_t>(m.free, 0) / sharing.ranks_on_device;
    b.device_why = str("free memory of ", device.str(), sharing.ranks_on_device > 1
                                                          ? str(" / ", sharing.ranks_on_device, " ranks sharing it")
                                                          : std::string(),
                       world.size() > 1 ? ", least over the ranks" : "");
  }
  // Every rank must agree whether there is a device figure at all (a budget given to some ranks
  // only, or a mix of CPU and GPU ranks, is decided by the most constrained rank).
  const std::int64_t least = world.allreduce_min(dev < 0 ? INT64_MAX : dev, "memory agreement");
  const std::int64_t any_device = world.allreduce_max(dev < 0 ? 0 : 1, "memory agreement");
  b.device_is_host = any_device == 0;
  b.device = b.device_is_host ? 0 : static_cast<std::uint64_t>(least);
  return b;
}

namespace {

const char* kNames = "auto, resident, device-shards, mixed, dlo or layerwise";

}  // namespace

StrategyRequest parse_strategy_request(const std::string& text, const std::string& field) {
  if (text == "auto") return {};
  const std::optional<Strategy> s = parse_strategy(text);
  DLO_CHECK(s, field, ": '", text, "' is not ", kNames);
  return *s;
}

StrategyChoice choose_strategy(const StrategyRequest& requested, const StackSize& stack, std::uint64_t working,
                               const MemoryBudget& budget) {
  const auto n = static_cast<std::int64_t>(stack.block_bytes.size());
  const std::uint64_t total = stack.total(), shards = stack.shards_total();
  const std::uint64_t slots = stack.slots_total();
  const std::optional<Strategy> asked = requested.strategy;
  const std::string dev = budget.device_is_host ? std::string("host") : str("device budget ", human_bytes(budget.device), " (", budget.device_why, ")");
  const std::string host = str("host budget ", budget.host == 0 ? std::string("unknown") : human_bytes(budget.host),
                               budget.host == 0 ? std::string() : str(" (", budget.host_why, ")"));
  // Blocks 0..k-1 whose shards fit on the device beside the slots and the working memory.
  const std::string slots_text = stack.stacks() == 1 ? std::string("2 slots") : str(2 * stack.stacks(), " slots (2 per expert)");
  std::int64_t k = 0;
  if (!budget.device_is_host) {
    std::uint64_t used = sat_add(slots, working);
    while (k < n && fits_budget(sat_add(used, stack.shard_bytes[static_cast<std::size_t>(k)]), budget.device))
      used = sat_add(used, stack.shard_bytes[static_cast<std::size_t>(k++)]);
  }
  std::uint64_t host_after_k = 0;  // host shard bytes of blocks k..n-1
  for (std::int64_t i = k; i < n; ++i) host_after_k = sat_add(host_after_k, stack.shard_bytes[static_cast<std::size_t>(i)]);

  if (asked) {
    const Strategy want = asked.value_or(Strategy::kResident);
    StrategyChoice c{want, 0, "requested"};
    switch (want) {
      case Strategy::kResident:
        break;
      case Strategy::kDeviceShards:
        c.device_blocks = n;
        break;
      case Strategy::kMixed:
        DLO_CHECK(n >= 2, "the mixed strategy needs at least 2 blocks; this stack has ", n);
        c.device_blocks = std::clamp<std::int64_t>(k, 1, n - 1);
        c.reason = str("requested; ", c.device_blocks, " of ", n, " blocks' shards on the device (", dev, ")");
        break;
      case Strategy::kDlo:
        DLO_CHECK(fits_budget(shards, budget.host), "the dlo strategy keeps ", human_bytes(shards),
                  " of shards per rank on the host, more than the ", host);
        break;
      case Strategy::kLayerwise:
        DLO_CHECK(fits_budget(total, budget.host), "the layerwise strategy keeps the whole stack (", human_bytes(total),
                  ") on every rank's host, more than the ", host);
        break;
    }
    return c;
  }

  if (budget.device_is_host) {
    // CPU: resident blocks are the page cache (one copy per node); each rank adds its activations.
    const std::uint64_t node_need = sat_add(total, sat_mul(working, static_cast<std::uint64_t>(budget.ranks_per_node)));
    const std::uint64_t node_avail = sat_mul(budget.host, static_cast<std::uint64_t>(budget.ranks_per_node));
    if (fits_budget(node_need, node_avail))
      return {Strategy::kResident, 0,
              str("weights ", human_bytes(total), " + working ", human_bytes(working), " x ", budget.ranks_per_node,
                  " rank(s) fit in the node's available memory", budget.host == 0 ? " (unknown)" : "",
                  " (mmap views, shared by the ranks of a node)")};
    if (stack.ranks > 1 && fits_budget(sat_add(sat_add(shards, slots), working), budget.host))
      return {Strategy::kDlo, 0,
              str("weights ", human_bytes(total), " do not fit the node's available memory; 1/", stack.ranks,
                  " per rank (", human_bytes(shards), ") does, within the ", host)};
    // (At one rank, layerwise would copy the same bytes the page cache already failed to hold.)
    throw Error(str("the blocks (", human_bytes(total), ") do not fit this node's memory in any strategy: ",
                    stack.ranks > 1 ? str("1/", stack.ranks, " shards need ", human_bytes(sat_add(sat_add(shards, slots), working)))
                                    : str("resident needs ", human_bytes(sat_add(total, working))),
                    " per rank, with the ", host,
                    "; use more ranks (on more nodes) or a smaller dtype (resident, asked for by name, runs from "
                    "the page cache anyway, slowly)"));
  }

  const std::string need_working = str(" + working ", human_bytes(working));
  if (fits_budget(sat_add(total, working), budget.device))
    return {Strategy::kResident, 0, str("weights ", human_bytes(total), need_working, " fit the ", dev)};
  const bool sharded = stack.ranks > 1;
  if (sharded && k == n)
    return {Strategy::kDeviceShards, n,
            str("weights ", human_bytes(total), " do not fit the ", dev, "; 1/", stack.ranks, " shards (",
                human_bytes(shards), ") + ", slots_text, " (", human_bytes(slots), ")", need_working, " do")};
  if (k >= 1 && k < n && fits_budget(host_after_k, budget.host))
    return {Strategy::kMixed, k,
            str("weights ", human_bytes(total), " do not fit the ", dev, "; the shards of ", k, " of ", n,
                " blocks do beside ", slots_text, need_working, "; the other ", n - k, " blocks stream from ",
                human_bytes(host_after_k), " of host shards")};
  DLO_CHECK(fits_budget(sat_add(slots, working), budget.device), "the ", dev, " cannot hold even ",
            stack.stacks() == 1 ? std::string("two block slots") : str(2 * stack.stacks(), " block slots (2 per expert)"),
            " (", human_bytes(slots), ")", need_working, ": use smaller latents, fewer frames or a smaller dtype");
  if (sharded && fits_budget(shards, budget.host))
    return {Strategy::kDlo, 0,
            str("weights ", human_bytes(total), " do not fit the ", dev, "; 1/", stack.ranks, " host shards (",
                human_bytes(shards), ") fit the ", host)};
  if (fits_budget(total, budget.host))
    return {Strategy::kLayerwise, 0,
            str("weights ", human_bytes(total), " do not fit the ", dev, sharded ? "; host shards do not fit either" : "",
                "; the whole stack fits the ", host)};
  DLO_CHECK(false, "the blocks (", human_bytes(total), ") fit neither the ", dev, " nor the ", host,
            sharded ? str(" (1/", stack.ranks, " shards: ", human_bytes(shards), ")") : std::string(),
            ": use more ranks (on more nodes) or a smaller dtype");
}

StrategyChoice agree_strategy(const MpiWorld& world, const StrategyRequest& requested, const StackPlan& plan,
                              std::uint64_t working, c10::Device device, const DeviceSharing& sharing,
                              std::optional<std::uint64_t> device_budget) {
  const MemoryBudget budget = agree_memory_budget(world, device, sharing, device_budget);
  StrategyChoice choice;
  std::string error;
  try {
    choice = choose_strategy(requested, stack_size(plan), working, budget);
  } catch (const Error& e) {
    error = e.what();
  }
  world.check_all(error, "offload strategy");
  return choice;
}

}  // namespace dlo
