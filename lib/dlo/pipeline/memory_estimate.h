// What a batch will need, per rank, before anything is loaded: from the model's configs and file
// sizes and the jobs' shapes. Estimates (activations are bounded roughly), for --dry-run and for
// refusing a plan that cannot fit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dlo/offload/engine.h"
#include "dlo/pipeline/job.h"

namespace dlo {

struct MemoryEstimate {
  std::uint64_t blocks_bytes = 0;       // the transformer's blocks, in the compute dtype
  std::uint64_t largest_block = 0;
  std::uint64_t kept_per_rank = 0;      // shards (dlo), the whole stack (layerwise), 0 (resident: page cache)
  std::uint64_t slots = 0;              // two slots of the largest block (layerwise, dlo)
  std::uint64_t text_encoder = 0;       // its checkpoint (mmap pages, shared by a node's ranks)
  std::uint64_t vae = 0;                // its checkpoint
  std::uint64_t activations = 0;        // the largest job's transformer working memory (rough)
  std::uint64_t decode_working = 0;     // the largest job's VAE decode working memory (rough)
  std::uint64_t host_per_rank = 0;      // private host memory of one rank
  std::uint64_t shared_per_node = 0;    // page cache the node's ranks share (checkpoints read)
  std::string describe() const;         // one line per item, human units
};

// The estimate for `jobs` on `ranks` ranks with `strategy`, computing in `dtype`. Reads only
// configs and file sizes. Throws dlo::Error naming a folder it cannot read.
MemoryEstimate estimate_memory(const ModelInfo& model, const std::vector<JobSpec>& jobs, int ranks,
                               Strategy strategy, at::ScalarType dtype);

}  // namespace dlo
