// Random-weight checkpoints for tests and benchmarks (the real weights cannot be downloaded here).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dlo/io/safetensors_writer.h"

namespace dlo {

// How one tensor is initialised: mean + std * N(0, 1).
struct RandomInit {
  double mean = 0.0;
  double std = 0.0;
};

// Chooses the init of each tensor from its spec (name, shape).
using InitRule = std::function<RandomInit(const TensorSpec&)>;

// A common rule: weights of Linear/Conv layers (2+ dims) ~ N(0, gain^2 / fan_in) so activations
// keep their scale through many layers; biases ~ N(0, 0.02^2); 1-D "norm" weights ~ 1 + N(0, 0.02^2).
RandomInit default_init(const TensorSpec& spec, double gain = 1.0);

// Writes `specs` into `dir` with random values. A tensor's values depend only on (seed, name),
// not on sharding or order. Memory stays bounded by the largest tensor (generated in fp32, then
// converted). Returns what the writer wrote.
WriteResult write_random_checkpoint(const std::string& dir, const std::vector<TensorSpec>& specs, const InitRule& init,
                                    std::uint64_t seed, const WriteOptions& options);

}  // namespace dlo
