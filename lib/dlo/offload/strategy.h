// Which offload strategy a run uses: what "auto" picks from the memory there is, and why.
//
// "auto" prefers, in order (engine.h): resident (every block on the device), device-shards (each
// rank's 1/N of every block on the device, gathered from there), mixed (as many blocks' shards on
// the device as fit, the rest streamed from host shards), dlo (host shards, pinned on CUDA) and
// layerwise (the whole stack on every rank's host; one rank). It decides from budgets every rank
// agreed on (the minimum over ranks), so every rank makes the same choice.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "dlo/offload/engine.h"

namespace dlo {

class MpiWorld;
struct DeviceSharing;

// The sizes that matter for the choice, from a StackPlan (stack_size) or by hand (tests). Several
// stacks (the two experts of Wan2.2 A14B) are joined into one (join_stacks): their blocks in
// order, one strategy for all, each stack with its own engine and so its own two slots.
struct StackSize {
  std::vector<std::uint64_t> block_bytes;  // per block, packed
  std::vector<std::uint64_t> shard_bytes;  // per block, one rank's shard (the block at one rank)
  std::uint64_t slot_bytes = 0;            // one device slot (the largest of the stacks')
  int ranks = 1;
  std::vector<std::int64_t> stack_blocks;  // blocks of each joined stack (empty: one stack)
  // Weights outside the blocks that stay on the compute device whatever the strategy (a Wan
  // transformer's embeddings and output head, every expert's: ~0.47 GB each for A14B in bf16).
  // Counted beside the working memory; 0 when not known (tests by hand).
  std::uint64_t resident_bytes = 0;
  std::uint64_t total() const;
  std::uint64_t shards_total() const;
  int stacks() const { return stack_blocks.empty() ? 1 : static_cast<int>(stack_blocks.size()); }
  // Device memory of every slot: two per stack.
  std::uint64_t slots_total() const;
};
StackSize stack_size(const StackPlan& plan);
// `parts` (planned for the same ranks) as one: blocks in order, slot_bytes the largest, one entry
// of stack_blocks per part, resident_bytes summed.
StackSize join_stacks(const std::vector<StackSize>& parts);

// The one rule of every memory check (auto's choice and the per-job check): `need` fits `budget`
// with a 10% margin (saturated: an overflowed need fits nothing); an unknown budget (0) fits
// everything.
bool fits_budget(std::uint64_t need, std::uint64_t budget);

// What one rank may use, agreed by all ranks (the minimum over them).
struct MemoryBudget {
  // The device is the host (CPU run without a device budget): resident blocks are the checkpoint's
  // page cache, one copy shared by a node's ranks, and there is no separate device memory to
  // keep shards in.
  bool device_is_host = true;
  std::uint64_t device = 0;     // bytes one rank may use on its device; 0 with device_is_host
  std::string device_why;       // where `device` comes from, for the reason line
  std::uint64_t host = 0;       // host bytes one rank may keep (shards or stack; pinned on CUDA); 0: unknown
  std::string host_why;
  int ranks_per_node = 1;       // the most ranks sharing one host (CPU resident: working memory each)
};

// Collective. CUDA: the device's free memory after the caching allocator gave back its unused
// blocks, divided by the ranks sharing that device; host: available memory divided by the ranks
// on the node; each the minimum over all ranks. `device_budget` (bytes per rank) replaces the
// device figure, also on the CPU (which then behaves as a device of that size, so every strategy
// can be exercised without a GPU).
MemoryBudget agree_memory_budget(const MpiWorld& world, c10::Device device, const DeviceSharing& sharing,
                                 std::optional<std::uint64_t> device_budget);

struct StrategyChoice {
  Strategy strategy = Strategy::kResident;
  std::int64_t device_blocks = 0;  // EngineOptions::device_blocks (mixed: blocks kept on the device)
  std::string reason;
};

// The choice for each stack of `joined` (join_stacks): the same strategy for every stack, except
// mixed, whose device blocks count from the first stack's block 0 over the joined order: a stack
// wholly on the device gets device-shards, one with none there dlo, one in between mixed.
std::vector<StrategyChoice> split_choice(const StrategyChoice& choice, const StackSize& joined);

// What a run asks for: one strategy, or auto (choose_strategy decides). Text becomes a request
// once, where it enters (a flag, a manifest key): parse_strategy_request.
struct StrategyRequest {
  std::optional<Strategy> strategy;  // nullopt: auto
  StrategyRequest() = default;
  StrategyRequest(Strategy s) : strategy(s) {}  // NOLINT(google-explicit-constructor): a strategy asks for itself
  bool is_auto() const { return !strategy; }
};
// "auto" or a strategy name (strategy_name); a dlo::Error (input) naming `field` for anything else:
// "<field>: 'fast' is not auto, resident, device-shards, mixed, dlo or layerwise".
StrategyRequest parse_strategy_request(const std::string& text, const std::string& field);

// `working`: the largest forward's bytes
// beyond the weights (wan_forward_working_bytes). Pure: the same arguments give the same choice.
// Throws dlo::Error when nothing fits (auto) or the requested strategy cannot fit its host or
// device part, with the figures.
StrategyChoice choose_strategy(const StrategyRequest& requested, const StackSize& stack, std::uint64_t working,
                               const MemoryBudget& budget);

// Collective: agree_memory_budget, then choose_strategy on every rank (the same choice, as the
// budget is agreed); a refusal is the same dlo::Error on every rank (MpiWorld::check_all).
StrategyChoice agree_strategy(const MpiWorld& world, const StrategyRequest& requested, const StackPlan& plan,
                              std::uint64_t working, c10::Device device, const DeviceSharing& sharing,
                              std::optional<std::uint64_t> device_budget);

}  // namespace dlo
