#include "dlo/offload/memory_model.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <set>

#include "dlo/common/bytes.h"
#include "dlo/common/checked.h"
#include "dlo/common/error.h"
#include "dlo/models/tensor_view.h"
#include "dlo/models/umt5.h"
#include "dlo/models/wan_lora_fuse.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/offload/stack_plan.h"

namespace dlo {
namespace {

// The bytes of the .safetensors files of folder `dir`, or of the file `dir` itself (a part given
// as its own file: --vae FILE).
std::uint64_t safetensors_bytes_in(const std::string& dir) {
  struct stat self;
  if (::stat(dir.c_str(), &self) == 0 && S_ISREG(self.st_mode)) return static_cast<std::uint64_t>(self.st_size);
  DIR* d = ::opendir(dir.c_str());
  DLO_CHECK(d != nullptr, "cannot read the folder '", dir, "'");
  std::uint64_t total = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() < 12 || name.compare(name.size() - 12, 12, ".safetensors") != 0) continue;
    struct stat st;
    if (::stat((dir + "/" + name).c_str(), &st) == 0) total = sat_add(total, static_cast<std::uint64_t>(st.st_size));
  }
  ::closedir(d);
  return total;
}

DType packed(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::F32;
    case at::kBFloat16: return DType::BF16;
    case at::kHalf: return DType::F16;
    default: break;
  }
  DLO_CHECK(false, "unsupported compute dtype ", c10::toString(t));
}

// Bytes of the stack a strategy keeps on the host per rank, and in device memory.
struct Kept {
  std::uint64_t host = 0, device = 0, slots = 0;
};

Kept kept_by(const StrategyChoice& c, const StackSize& s) {
  Kept k;
  const auto n = static_cast<std::int64_t>(s.shard_bytes.size());
  switch (c.strategy) {
    case Strategy::kResident:
      k.device = s.total();
      break;
    case Strategy::kDeviceShards:
      k.device = s.shards_total();
      k.slots = s.slots_total();
      break;
    case Strategy::kMixed:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint64_t& where = i < c.device_blocks ? k.device : k.host;
        where = sat_add(where, s.shard_bytes[static_cast<std::size_t>(i)]);
      }
      k.slots = s.slots_total();
      break;
    case Strategy::kDlo:
      k.host = s.shards_total();
      k.slots = s.slots_total();
      break;
    case Strategy::kLayerwise:
      k.host = s.total();
      k.slots = s.slots_total();
      break;
  }
  return k;
}

// What choose_strategy is given as the working memory: the weights outside the blocks, which stay
// on the device, and one step's activations; on the CPU the host also holds the decode.
std::uint64_t working_for_choice(const JobMemory& m, const MemoryBudget& b, const StackSize& s) {
  return sat_add(s.resident_bytes, b.device_is_host ? sat_add(m.working, m.decode) : m.working);
}

// A tensor's bytes in the dtype the transformer keeps it in (WanDtypes::stored).
std::uint64_t kept_bytes(const TensorSpec& spec, const WanDtypes& dtypes) {
  std::uint64_t numel = 1;
  for (auto dim : spec.shape) numel = sat_mul(numel, static_cast<std::uint64_t>(dim));
  return sat_mul(numel, c10::elementSize(dtypes.stored(spec.name)));
}

}  // namespace

JobMemory job_memory(const ModelInfo& model, const JobSpec& job, at::ScalarType dtype, std::uint64_t adapters) {
  JobMemory m;
  const auto s = model.latent_shape(job.frames, job.height, job.width);
  for (const auto& c : model.expert_configs())  // one expert computes at a time: the larger one's
    m.working = std::max(m.working, wan_forward_working_bytes(c, s[2], s[3], s[4], /*text tokens, as PromptEncoder pads*/ 512,
                                                              job.guided() ? 2 : 1, packed(dtype)));
  // The decoder's largest stage at full resolution: a few tensors of 4 frames plus the causal
  // caches (2 frames) of its convolutions, fp32; and the uint8 frames of one chunk.
  const auto dims = model.vae.decoder_dims();
  const std::uint64_t top = static_cast<std::uint64_t>(*std::max_element(dims.begin(), dims.end()) / 2);
  const std::uint64_t pixels = sat_product({job.height, job.width});
  m.decode = sat_add(sat_mul(sat_mul(top, pixels), 4 * (4 * 4 + 2 * 6)), sat_mul(sat_mul(pixels, 3), 4));
  const std::uint64_t latent = sat_mul(sat_product({s[1], s[2], s[3], s[4]}), 4);
  const std::uint64_t context = sat_mul(sat_product({512, model.transformer.text_dim}), dtype_size(packed(dtype)));
  m.held = sat_add(sat_mul(latent, 4), sat_mul(context, job.guided() ? 2 : 1));
  m.adapters = adapters;
  m.working = sat_add(m.working, adapters);
  m.held = sat_add(m.held, adapters);
  return m;
}

std::vector<JobAdapters> jobs_adapters(const ModelInfo& model, const std::vector<JobSpec>& jobs, at::ScalarType dtype) {
  std::vector<JobAdapters> out(jobs.size());
  const std::vector<WanTransformerConfig> configs = model.expert_configs();
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].loras.empty()) continue;
    try {
      const std::vector<LoraSpec> loras = parse_lora_list(jobs[i].loras, "loras");
      for (std::size_t e = 0; e < configs.size(); ++e)
        out[i].bytes = sat_add(out[i].bytes, wan_job_adapter_bytes(loras, static_cast<int>(e), configs[e], dtype));
    } catch (const std::exception& err) {  // dlo::Error, or a torch error on a malformed file
      out[i] = {0, str("its LoRAs: ", err.what())};
    }
  }
  return out;
}

AuxPlacement parse_aux_placement(const std::string& name, const std::string& what) {
  if (name == "auto") return AuxPlacement::kAuto;
  if (name == "cpu") return AuxPlacement::kHost;
  if (name == "cuda") return AuxPlacement::kDevice;
  DLO_CHECK(false, what, ": '", name, "' is not auto, cpu or cuda");
}

std::uint64_t text_encoder_device_bytes(const Umt5Config& c, at::ScalarType dtype) {
  std::uint64_t total = 0;
  for (const auto& spec : umt5_encoder_specs(c, DType::F32)) {
    std::uint64_t numel = 1;
    for (auto dim : spec.shape) numel = sat_mul(numel, static_cast<std::uint64_t>(dim));
    total = sat_add(total, sat_mul(numel, dtype_size(packed(umt5_weight_dtype(spec.name, dtype)))));
  }
  return total;
}

std::uint64_t vae_decoder_device_bytes(const WanVaeConfig& c, at::ScalarType vae_dtype) {
  std::uint64_t total = 0;
  for (const auto& spec : wan_vae_specs(c, DType::F32, /*include_encoder=*/false)) {
    std::uint64_t numel = 1;
    for (auto dim : spec.shape) numel = sat_mul(numel, static_cast<std::uint64_t>(dim));
    total = sat_add(total, sat_mul(numel, dtype_size(packed(vae_dtype))));
  }
  return total;
}

std::uint64_t wan_non_block_bytes(const WanTransformerConfig& c, at::ScalarType dtype) {
  std::uint64_t total = 0;
  for (const auto& spec : wan_transformer_specs(c, DType::F32))
    if (spec.name.rfind("blocks.", 0) != 0) total = sat_add(total, kept_bytes(spec, WanDtypes::same(dtype)));
  return total;
}

StackSize config_stack_size(const WanTransformerConfig& c, const WanDtypes& dtypes, int ranks) {
  StackSize s;
  s.resident_bytes = wan_non_block_bytes(c, dtypes.compute);
  s.ranks = std::max(1, ranks);
  const auto n = static_cast<std::uint64_t>(s.ranks);
  std::uint64_t block = 0;
  for (const auto& spec : wan_block_specs(c, DType::F32))
    block = sat_add(sat_round_up(block, kTensorAlign), kept_bytes(spec, dtypes));
  if (dtypes.scaled)  // a scaled fp8 file's scales, one float32 per Linear (wan_block_names)
    for (std::size_t k = wan_block_tensor_names(c).size(); k < wan_block_names(c, dtypes).size(); ++k)
      block = sat_add(sat_round_up(block, kTensorAlign), 4);
  const std::uint64_t shard = sat_round_up(sat_add(block, n - 1) / n, kShardAlign);
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    s.block_bytes.push_back(block);
    s.shard_bytes.push_back(shard);
  }
  s.slot_bytes = c.num_layers > 0 ? sat_mul(shard, n) : 0;
  return s;
}

std::string job_memory_problem(const StrategyChoice& choice, const StackSize& stack, const JobMemory& job,
                               const MemoryBudget& b) {
  const Kept k = kept_by(choice, stack);
  const char* name = strategy_name(choice.strategy);
  if (b.device_is_host) {
    const std::uint64_t per_rank = sat_add(sat_add(job.working, job.decode), stack.resident_bytes);
    if (choice.strategy == Strategy::kResident) {
      // The blocks are the page cache, one copy for the node; every rank adds its own work.
      const auto rpn = static_cast<std::uint64_t>(std::max(1, b.ranks_per_node));
      const std::uint64_t need = sat_add(stack.total(), sat_mul(per_rank, rpn));
      if (fits_budget(need, sat_mul(b.host, rpn))) return "";
      return str("it needs about ", human_bytes(per_rank), " of working memory per rank (denoising ",
                 human_bytes(job.working), ", decoding ", human_bytes(job.decode), "), beside the ",
                 human_bytes(stack.total()), " of weights that ", rpn, " rank(s) share (", name, "): more than the ",
                 human_bytes(sat_mul(b.host, rpn)), " available on the node");
    }
    const std::uint64_t need = sat_add(sat_add(sat_add(k.host, k.device), k.slots), per_rank);
    if (fits_budget(need, b.host)) return "";
    return str("it needs about ", human_bytes(per_rank), " of working memory (denoising ", human_bytes(job.working),
               ", decoding ", human_bytes(job.decode), ") beside the ", human_bytes(sat_add(sat_add(k.host, k.device), k.slots)),
               " each rank keeps for the weights (", name, "): more than the ", human_bytes(b.host), " per rank (",
               b.host_why, ")");
  }
  const std::uint64_t device_need = sat_add(sat_add(sat_add(k.device, k.slots), job.working), stack.resident_bytes);
  if (!fits_budget(device_need, b.device))
    return str("one step needs about ", human_bytes(job.working), " of working memory on the device beside ",
               human_bytes(sat_add(k.device, k.slots)), " of weights there (", name, "): more than the device budget ",
               human_bytes(b.device), " (", b.device_why, ")");
  const std::uint64_t host_need = sat_add(k.host, job.decode);
  if (!fits_budget(host_need, b.host))
    return str("its VAE decode needs about ", human_bytes(job.decode), " on the host beside ", human_bytes(k.host),
               " of host shards (", name, "): more than the ", human_bytes(b.host), " per rank (", b.host_why, ")");
  return "";
}

namespace {

// The strategy for the largest job that leaves one (a job too large for every strategy must not
// take the others down with it), and the jobs that cannot run beside it: p.choice, p.working,
// p.refused and p.refused_why. Throws dlo::Error when no job fits.
// `problems`: per job, why it cannot run whatever the memory ("" or none: it can); such a job is
// refused with it and counts for nothing.
void choose_for_jobs(const std::vector<JobSpec>& jobs, const std::vector<JobMemory>& mem, const StrategyRequest& requested,
                     const StackSize& stack, const MemoryBudget& budget, const std::vector<std::string>& problems,
                     BatchMemoryPlan& p) {
  const auto problem = [&](std::size_t i) { return i < problems.size() ? problems[i] : std::string(); };
  std::set<std::uint64_t, std::greater<>> candidates;
  for (std::size_t i = 0; i < jobs.size(); ++i)
    if (problem(i).empty()) candidates.insert(working_for_choice(mem[i], budget, stack));
  if (candidates.empty()) candidates.insert(0);  // nothing to render: the weights alone decide
  std::string last_error;
  bool chosen = false;
  for (const std::uint64_t w : candidates) {
    try {
      p.choice = choose_strategy(requested, stack, w, budget);
      p.working = w;
      chosen = true;
      break;
    } catch (const Error& e) {
      last_error = e.what();  // the smallest job's, at the end
    }
  }
  if (!chosen) {
    std::size_t smallest = 0;
    while (smallest + 1 < jobs.size() && !problem(smallest).empty()) ++smallest;
    for (std::size_t i = smallest + 1; i < jobs.size(); ++i)
      if (problem(i).empty() && working_for_choice(mem[i], budget, stack) < working_for_choice(mem[smallest], budget, stack))
        smallest = i;
    throw Error(jobs.empty() ? last_error
                             : str("no job of the batch fits in memory; the smallest, job ", smallest, " ('",
                                   jobs[smallest].id, "'), needs about ", human_bytes(mem[smallest].working),
                                   " per denoising step: ", last_error));
  }
  p.refused.clear();
  p.refused_why.clear();
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    std::string why = problem(i);
    if (why.empty()) {
      why = job_memory_problem(p.choice, stack, mem[i], budget);
      if (!why.empty()) why = "does not fit in memory: " + why;
    }
    if (!why.empty()) {
      p.refused.push_back(static_cast<std::int64_t>(i));
      p.refused_why.push_back(std::move(why));
    }
  }
  DLO_CHECK(jobs.empty() || p.refused.size() < jobs.size(), "no job can run; job 0 ('", jobs[0].id, "'): ",
            p.refused_why.empty() ? "" : p.refused_why[0]);
}

}  // namespace

BatchMemoryPlan plan_batch_memory(const ModelInfo& model, const std::vector<JobSpec>& jobs,
                                  const StrategyRequest& requested, const StackSize& stack, const MemoryBudget& budget,
                                  at::ScalarType dtype, int jobs_held, AuxPlacement aux, at::ScalarType vae_dtype,
                                  const std::vector<JobAdapters>& adapters) {
  DLO_ASSERT(adapters.empty() || adapters.size() == jobs.size(), "adapters for ", adapters.size(), " of ", jobs.size(), " jobs");
  BatchMemoryPlan p;
  std::vector<JobMemory> mem;
  std::vector<std::string> problems(jobs.size());
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    mem.push_back(job_memory(model, jobs[i], dtype, adapters.empty() ? 0 : adapters[i].bytes));
    if (!adapters.empty()) problems[i] = adapters[i].problem;
  }
  // First without the held jobs, so that a job too large to run at all (refused) does not count
  // as held beside the others; then every job that can run holds the largest of those that can,
  // at most the batch's other runnable jobs, and the choice is made again with them.
  choose_for_jobs(jobs, mem, requested, stack, budget, problems, p);
  std::uint64_t largest_held = 0;
  std::int64_t runnable = 0;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (std::find(p.refused.begin(), p.refused.end(), static_cast<std::int64_t>(i)) != p.refused.end()) continue;
    largest_held = std::max(largest_held, mem[i].held);
    ++runnable;
  }
  p.jobs_held = static_cast<int>(std::min<std::int64_t>(std::max(0, jobs_held), std::max<std::int64_t>(0, runnable - 1)));
  p.held = sat_mul(largest_held, static_cast<std::uint64_t>(p.jobs_held));
  if (p.held > 0) {
    for (auto& m : mem) m.working = sat_add(m.working, p.held);
    choose_for_jobs(jobs, mem, requested, stack, budget, problems, p);
  }

  // The text encoder and the VAE: on the device if asked, or (auto) if the transformer's choice
  // stays the same with the device budget less their weights and the largest decode.
  if (aux != AuxPlacement::kHost) {
    DLO_ASSERT(!budget.device_is_host, "the text encoder and the VAE on a device, but the budget has none");
    std::uint64_t decode = 0;
    for (std::size_t i = 0; i < jobs.size(); ++i)
      if (std::find(p.refused.begin(), p.refused.end(), static_cast<std::int64_t>(i)) == p.refused.end())
        decode = std::max(decode, mem[i].decode);
    const std::uint64_t te = text_encoder_device_bytes(model.text_encoder, dtype);
    const std::uint64_t vae = vae_decoder_device_bytes(model.vae, vae_dtype);
    const std::uint64_t need = sat_add(sat_add(te, vae), decode);
    const std::string what = str("the text encoder (", human_bytes(te), ") and the VAE (", human_bytes(vae),
                                 ", its largest decode ", human_bytes(decode), ")");
    MemoryBudget less = budget;
    less.device = budget.device > need ? budget.device - need : 1;  // (0 would read as "not known")
    less.device_why = str(budget.device_why, ", less ", human_bytes(need), " for the text encoder and the VAE");
    BatchMemoryPlan q = p;
    std::string error;
    try {
      choose_for_jobs(jobs, mem, requested, stack, less, problems, q);
    } catch (const Error& e) {
      error = e.what();
    }
    const bool same = error.empty() && q.choice.strategy == p.choice.strategy &&
                      q.choice.device_blocks == p.choice.device_blocks && q.refused == p.refused;
    if (aux == AuxPlacement::kDevice) {
      DLO_CHECK(error.empty(), "--text-vae-device cuda: ", what, " do not fit on the device beside the transformer: ", error);
      p.choice = q.choice;
      p.working = q.working;
      p.refused = q.refused;
      p.refused_why = q.refused_why;
      p.aux_why = str(what, " on the device (requested)");
    } else if (same) {
      p.aux_why = str(what, " on the device: they fit beside the transformer's ", strategy_name(p.choice.strategy));
    } else {
      p.aux_why = str(what, " on the host: on the device they would leave the transformer ",
                      error.empty() ? str(strategy_name(q.choice.strategy), " instead of ", strategy_name(p.choice.strategy))
                                    : str("no room (", error, ")"));
    }
    if (aux == AuxPlacement::kDevice || same) {
      p.aux_on_device = true;
      p.text_encoder_device = te;
      p.vae_device = vae;
    }
  }

  const Kept k = kept_by(p.choice, stack);
  p.blocks_bytes = stack.total();
  p.experts = stack.stacks();
  for (auto b : stack.block_bytes) p.largest_block = std::max(p.largest_block, b);
  p.kept_per_rank = k.host;
  p.device_shards = p.choice.strategy == Strategy::kResident ? 0 : k.device;
  p.slots = k.slots;
  p.resident = stack.resident_bytes;
  std::uint64_t working = 0;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (std::find(p.refused.begin(), p.refused.end(), static_cast<std::int64_t>(i)) != p.refused.end()) continue;
    working = std::max(working, mem[i].working);
    p.decode = std::max(p.decode, mem[i].decode);
    p.adapters = std::max(p.adapters, mem[i].adapters);
  }
  p.working = working;
  p.text_encoder = safetensors_bytes_in(model.parts.text_encoder());
  p.vae = safetensors_bytes_in(model.parts.vae_weights());
  p.host_per_rank = sat_add(sat_add(p.kept_per_rank, p.aux_on_device ? 0 : p.decode),
                            budget.device_is_host ? sat_add(sat_add(sat_add(p.device_shards, p.slots), working), p.resident)
                                                  : 0);
  p.shared_per_node = sat_add(sat_add(p.text_encoder, p.vae),
                              budget.device_is_host && p.choice.strategy == Strategy::kResident ? p.blocks_bytes : 0);
  return p;
}

std::string BatchMemoryPlan::describe() const {
  std::string s = str("  strategy             ", strategy_name(choice.strategy), " (", choice.reason, ")\n",
                      "  transformer blocks   ", human_bytes(blocks_bytes), " (",
                      experts > 1 ? str(experts, " experts, both kept; ") : std::string(), "largest ",
                      human_bytes(largest_block), ")\n",
                      "  kept per rank        ", human_bytes(kept_per_rank), " on the host",
                      device_shards ? str(", ", human_bytes(device_shards), " on the device") : std::string(), "\n",
                      "  slots per rank       ", human_bytes(slots), experts > 1 && slots > 0 ? str(" (", 2 * experts, " slots: 2 per expert)") : std::string(), "\n",
                      "  outside the blocks   ", human_bytes(resident), " (embeddings and head",
                      experts > 1 ? ", every expert's" : "", ", on the device)\n",
                      "  working (largest)    ", human_bytes(working), " per denoising step",
                      held > 0 ? str(" (", human_bytes(held), " of it the ", jobs_held, " other job(s) a rank holds: latents, prompts",
                                     adapters > 0 ? ", LoRA adapters" : "", ")")
                               : std::string(), "\n",
                      adapters > 0 ? str("  LoRA adapters        ", human_bytes(adapters),
                                         " (the largest job's, on the device; in working)\n")
                                   : std::string(),
                      "  VAE decode (est.)    ", human_bytes(decode), aux_on_device ? " on the device" : " on the host", "\n",
                      "  text encoder         ", human_bytes(text_encoder),
                      aux_on_device ? str(" checkpoint; ", human_bytes(text_encoder_device), " on the device")
                                    : std::string(" (mmap, shared by a node's ranks)"), "\n",
                      "  VAE weights          ", human_bytes(vae),
                      aux_on_device ? str(" checkpoint; ", human_bytes(vae_device), " on the device") : std::string(), "\n",
                      aux_why.empty() ? std::string() : str("  text encoder, VAE    ", aux_why, "\n"),
                      "  private per rank     ", human_bytes(host_per_rank), "; shared per node ",
                      human_bytes(shared_per_node));
  for (std::size_t i = 0; i < refused.size(); ++i) s += str("\n  job ", refused[i], " refused: ", refused_why[i]);
  return s;
}

}  // namespace dlo
