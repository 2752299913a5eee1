// Summaries of a checkpoint for `dlo-checkpoint inspect`.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dlo/io/safetensors.h"

namespace dlo {

struct CheckpointSummary {
  struct Group {
    std::string prefix;  // "blocks.7", "patch_embedding", ...
    std::uint64_t tensors = 0;
    std::uint64_t bytes = 0;
  };
  std::string source;
  std::uint64_t files = 0;
  std::uint64_t tensors = 0;
  std::uint64_t bytes = 0;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> by_dtype;  // name -> (tensors, bytes)
  std::vector<Group> groups;  // in natural order (blocks.2 before blocks.10)
  std::map<std::string, std::string> metadata;
};

// The group a tensor name belongs to: the name up to and including its first all-digit
// component ("blocks.7.attn1.to_q.weight" -> "blocks.7"), else its first component
// ("patch_embedding.weight" -> "patch_embedding").
std::string group_prefix(const std::string& tensor_name);

CheckpointSummary summarize(const Checkpoint& ck);

// Human-readable text, and the same facts as one JSON object.
std::string format_text(const CheckpointSummary& s);
std::string format_json(const CheckpointSummary& s);

}  // namespace dlo
