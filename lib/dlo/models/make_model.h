// Writes random-weight model directories in the diffusers layout (dlo-checkpoint make).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dlo/io/dtype.h"
#include "dlo/models/wan_transformer.h"

namespace dlo {

struct MakeModelOptions {
  DType dtype = DType::BF16;
  std::uint64_t seed = 0;
  std::uint64_t shard_bytes = kDiffusersShardBytes;  // per component; 0: one file
  WanTransformerConfig transformer = WanTransformerConfig::preset("wan-test");
  // Components to write; the known ones: "transformer", "scheduler" (plus model_index.json).
  std::vector<std::string> components{"transformer", "scheduler"};
};

struct MakeModelResult {
  std::vector<std::string> written;  // component folders
  std::uint64_t bytes = 0;           // tensor bytes written
};

// Writes `<dir>/<component>/...` for each requested component and `<dir>/model_index.json`.
// Memory stays bounded by the largest tensor. Throws dlo::Error on bad options or I/O failure.
MakeModelResult make_model(const std::string& dir, const MakeModelOptions& options);

// Only the transformer: `dir` gets config.json + safetensors (+ index when sharded).
WriteResult write_random_wan_transformer(const std::string& dir, const WanTransformerConfig& c, DType dtype,
                                         std::uint64_t seed, std::uint64_t shard_bytes);

}  // namespace dlo
