// One memory model for a batch: the figures `auto` chooses a strategy from, the check each job
// passes before anything is prepared for it, and what --dry-run prints, all counted the same way
// from the model's configs and the jobs' shapes, before any weight is read.
//
// Checked arithmetic throughout (common/checked.h): a figure too large for 64 bits is UINT64_MAX
// ("more than 16 EiB") and never fits, instead of wrapping around to a small number that does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/config/job.h"
#include "dlo/config/umt5_config.h"
#include "dlo/config/wan_vae_config.h"
#include "dlo/models/wan_transformer.h"
#include "dlo/offload/strategy.h"

namespace dlo {

// What one job needs beyond the weights.
struct JobMemory {
  std::uint64_t working = 0;  // one denoising step on the compute device (wan_forward_working_bytes)
  std::uint64_t decode = 0;   // the VAE decode on the host (the decoder's largest stage; rough)
  // What a job keeps on the compute device between its steps: its latents (fp32), the
  // scheduler's history (UniPC's: up to 3 more latent-sized fp32 tensors) and its prompt contexts
  // (a branch each: 512 tokens x text_dim). `working` counts the running job's latents and
  // contexts for its step (not the history); a rank also holds other jobs': the next one being
  // prepared, and parked ones (plan_batch_memory's jobs_held).
  std::uint64_t held = 0;
  // Of working and of held: the job's unfused LoRA adapters (the job field `loras`), on the device
  // from its preparation to its end, every expert's (JobAdapters::bytes).
  std::uint64_t adapters = 0;
};
// Counted from the configs; `dtype` is the transformer's compute dtype; `adapters` the job's
// adapter bytes (JobAdapters::bytes).
JobMemory job_memory(const ModelInfo& model, const JobSpec& job, at::ScalarType dtype, std::uint64_t adapters = 0);

// A job's unfused LoRAs as the plan counts them: the bytes of their adapters on the device (every
// expert's: wan_job_adapter_bytes), or why they cannot be applied (a file missing or unreadable,
// a module that does not fit the model): such a job is refused alone, before any work.
struct JobAdapters {
  std::uint64_t bytes = 0;
  std::string problem;
};
// Per job of `jobs`, in order; reads the headers of the jobs' LoRA files (not their tensors). A
// job without `loras`: {0, ""}.
std::vector<JobAdapters> jobs_adapters(const ModelInfo& model, const std::vector<JobSpec>& jobs, at::ScalarType dtype);

// The transformer's block stack as the engine will plan it for `ranks` ranks (packed in the dtypes
// the blocks are kept in, WanDtypes::stored: fp8 Linears count 1 byte an element; tensors aligned,
// shards rounded up): equal to stack_size(StackPlan) of a checkpoint with this config, from the
// config alone. resident_bytes: the weights outside the blocks (wan_non_block_bytes).
StackSize config_stack_size(const WanTransformerConfig& c, const WanDtypes& dtypes, int ranks);
// The transformer's weights outside its blocks (patch and text embeddings, time embedding and
// projection, output head) in the dtypes it computes them in: what every rank keeps on its device.
std::uint64_t wan_non_block_bytes(const WanTransformerConfig& c, at::ScalarType dtype);

// Where the text encoder and the VAE run when the transformer runs on a CUDA device.
enum class AuxPlacement {
  kHost,    // the CPU: their weights the checkpoints' mmap pages, the decode in host memory
  kDevice,  // the job's device: their weights and the largest decode counted in its budget
  kAuto,    // the device when that leaves the transformer's strategy as it is, else the host
};
// "auto", "cpu", "cuda" -> placement; dlo::Error naming `what` otherwise.
AuxPlacement parse_aux_placement(const std::string& name, const std::string& what);
// What the text encoder takes on a device in `dtype` (every weight, the embedding table counted
// in `dtype` too), and the VAE's decoder in `vae_dtype`: from the configs.
std::uint64_t text_encoder_device_bytes(const Umt5Config& c, at::ScalarType dtype);
std::uint64_t vae_decoder_device_bytes(const WanVaeConfig& c, at::ScalarType vae_dtype);

// Whether one job can run next to the weights with a strategy already chosen; "" when it fits,
// else why not, with the figures. The same rule choose_strategy applies when it chooses.
std::string job_memory_problem(const StrategyChoice& choice, const StackSize& stack, const JobMemory& job,
                               const MemoryBudget& budget);

struct BatchMemoryPlan {
  StrategyChoice choice;
  std::uint64_t working = 0;  // the largest working memory of the jobs the choice was made for, held jobs' included
  std::uint64_t held = 0;     // of which the other jobs a rank holds (jobs_held x the largest JobMemory::held)
  int jobs_held = 0;
  std::uint64_t adapters = 0;  // the largest JobMemory::adapters of the jobs that run (in working and held)
  // Jobs that fit no strategy beside the others, or whose LoRAs cannot be applied (JobAdapters::
  // problem) (indices into the jobs given), and why ("does not fit in memory: ...", "its LoRAs:
  // ..."): each fails alone, recorded, before anything is prepared for it.
  std::vector<std::int64_t> refused;
  std::vector<std::string> refused_why;
  // The figures, per rank unless said otherwise.
  std::uint64_t blocks_bytes = 0, largest_block = 0;  // of every expert
  int experts = 1;                    // stacks (Wan2.2 A14B: 2, each with its own two slots)
  std::uint64_t kept_per_rank = 0;    // host shards (dlo, mixed), the whole stack (layerwise)
  std::uint64_t device_shards = 0;    // shards kept in device memory (device-shards, mixed)
  std::uint64_t slots = 0;            // two slots of the largest block (streamed strategies)
  std::uint64_t resident = 0;         // the weights outside the blocks (every expert's), on the device
  std::uint64_t decode = 0;           // the largest VAE decode
  std::uint64_t text_encoder = 0;     // its checkpoint (mmap pages, shared by a node's ranks)
  std::uint64_t vae = 0;              // its checkpoint
  // The text encoder and the VAE on the job's device (AuxPlacement) and why; their weights there
  // (text_encoder_device, vae_device; 0 when on the host). The largest decode is then on the
  // device too (decode).
  bool aux_on_device = false;
  std::string aux_why;
  std::uint64_t text_encoder_device = 0, vae_device = 0;
  std::uint64_t host_per_rank = 0;    // private host memory of one rank (CPU: working included)
  std::uint64_t shared_per_node = 0;  // page cache the node's ranks share (checkpoints read)
  std::string describe() const;       // one line per figure, human units
};

// Pure (every rank computes the same from the same arguments): the strategy for the batch
// (choose_strategy, with the largest working memory among the jobs that can fit; a job that
// cannot fit beside the choice made for the others is refused), the per-job check for every job,
// and the figures. `model` gives the checkpoint sizes of the text encoder and the VAE (file
// sizes only). `jobs_held`: how many jobs a rank keeps on its device beside the one it computes
// (the next one, prepared; with two experts and expert alignment also the parked ones; at most
// the batch's other jobs), each counted as the batch's largest JobMemory::held in every job's
// working memory. Throws
// dlo::Error when no job fits at all, or when a requested strategy cannot fit its weights, with
// the figures.
// `aux`, `vae_dtype`: where the text encoder (in `dtype`) and the VAE (in `vae_dtype`) run;
// anything but kHost needs a device (not budget.device_is_host). kDevice that cannot fit beside
// the transformer's weights and the jobs throws dlo::Error with the figures; kAuto then keeps
// them on the host, and so it does when the device would take them only with a more offloaded
// strategy for the transformer (its placement comes first).
// `adapters`: per job, its LoRA adapters (jobs_adapters), counted in its working and held memory;
// a job with a problem is refused with it and counts for nothing. Empty: no job has any.
BatchMemoryPlan plan_batch_memory(const ModelInfo& model, const std::vector<JobSpec>& jobs,
                                  const StrategyRequest& requested, const StackSize& stack, const MemoryBudget& budget,
                                  at::ScalarType dtype, int jobs_held, AuxPlacement aux = AuxPlacement::kHost,
                                  at::ScalarType vae_dtype = at::kFloat, const std::vector<JobAdapters>& adapters = {});

}  // namespace dlo
