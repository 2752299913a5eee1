// Golden tensors from diffusers / transformers (tests/data/goldens/, made by
// tools/reference/make_goldens.py): inputs, reference outputs, and in the metadata the config
// and seed with which dlo's deterministic random writers reproduce the weights they were made with.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>  // at::set_num_threads: the goldens are compared at 1 thread
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "dlo/io/dtype.h"
#include "dlo/io/safetensors.h"
#include "dlo/models/tensor_view.h"

#ifndef DLO_GOLDEN_DIR
#error "DLO_GOLDEN_DIR must name tests/data/goldens"
#endif

namespace dlo::test {

class Golden {
 public:
  explicit Golden(const std::string& name)
      : name_(name), ck_(Checkpoint::open(std::string(DLO_GOLDEN_DIR) + "/" + name + ".safetensors")) {}

  const std::string& name() const { return name_; }
  at::Tensor get(const std::string& tensor) const { return tensor_view(ck_, tensor).clone(); }
  const std::string& meta(const std::string& key) const { return ck_.metadata().at(key); }
  std::uint64_t seed() const { return std::stoull(meta("seed")); }
  DType weights_dtype() const { return meta("weights_dtype") == "bf16" ? DType::BF16 : DType::F32; }
  at::ScalarType compute_dtype() const { return meta("compute_dtype") == "bf16" ? at::kBFloat16 : at::kFloat; }

  // The weights just written to `dir` must be those the golden was made with (their float64 sum
  // matches); otherwise the random writers changed and the goldens must be regenerated.
  void check_weights(const std::string& dir) const {
    const Checkpoint ck = Checkpoint::open(dir);
    double sum = 0;
    for (const TensorInfo* t : ck.tensors()) sum += tensor_view(ck, *t).to(at::kDouble).sum().item<double>();
    const double want = std::strtod(meta("weights_sum").c_str(), nullptr);
    CHECK_MESSAGE(std::abs(sum - want) <= 1e-9 * std::max(1.0, std::abs(want)),
                  name_ << ": the random weights differ from those the golden was made with (sum " << sum
                        << " vs " << want << "); if the random writers changed on purpose, regenerate with "
                        << "tools/reference/make_goldens.py");
  }

 private:
  std::string name_;
  Checkpoint ck_;
};

// ||a - b|| / ||b|| in float64.
inline double golden_rel_err(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor bd = b.to(at::kDouble);
  return ((a.to(at::kDouble) - bd).norm() / bd.norm()).item<double>();
}

}  // namespace dlo::test
