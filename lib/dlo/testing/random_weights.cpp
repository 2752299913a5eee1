#include "dlo/testing/random_weights.h"

#include <cmath>
#include <cstring>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "dlo/models/tensor_view.h"

namespace dlo {
namespace {

// FNV-1a of the name mixed with the seed: each tensor gets its own stream.
std::uint64_t tensor_seed(std::uint64_t seed, const std::string& name) {
  std::uint64_t h = 1469598103934665603ull ^ (seed * 0x9E3779B97F4A7C15ull);
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

bool ends_with(const std::string& s, const char* suffix) {
  const std::size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

RandomInit default_init(const TensorSpec& spec, double gain) {
  if (spec.shape.size() >= 2) {
    std::int64_t fan_in = 1;
    for (std::size_t i = 1; i < spec.shape.size(); ++i) fan_in *= spec.shape[i];
    return {0.0, gain / std::sqrt(static_cast<double>(std::max<std::int64_t>(fan_in, 1)))};
  }
  if (spec.name.find("norm") != std::string::npos && ends_with(spec.name, ".weight")) return {1.0, 0.02};
  return {0.0, 0.02};
}

WriteResult write_random_checkpoint(const std::string& dir, const std::vector<TensorSpec>& specs, const InitRule& init,
                                    std::uint64_t seed, const WriteOptions& options) {
  return write_safetensors_dir(
      dir, specs,
      [&](std::size_t, const TensorSpec& spec, std::byte* out) {
        const RandomInit r = init(spec);
        auto gen = at::make_generator<at::CPUGeneratorImpl>(tensor_seed(seed, spec.name));
        at::Tensor t = at::empty(spec.shape, at::kFloat);
        t.normal_(r.mean, r.std, gen);
        t = t.to(to_scalar_type(spec.dtype));
        std::memcpy(out, t.data_ptr(), spec.nbytes());
      },
      options);
}

}  // namespace dlo
