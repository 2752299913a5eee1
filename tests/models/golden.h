// Golden tensors from diffusers / transformers (tests/data/goldens/, made by
// tools/reference/make_goldens.py): inputs, reference outputs, and in the metadata the config
// and seed with which dlo's deterministic random writers reproduce the weights they were made with.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>  // at::set_num_threads: the goldens are compared at 1 thread
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/source_tree.h"
#include "dlo/common/sha256.h"

#include "dlo/io/dtype.h"
#include "dlo/io/safetensors.h"
#include "dlo/models/tensor_view.h"

namespace dlo::test {

inline std::string golden_dir() { return source_dir() + "/tests/data/goldens"; }

// ||a - b|| / ||b|| in float64.
inline double golden_rel_err(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor bd = b.to(at::kDouble);
  return ((a.to(at::kDouble) - bd).norm() / bd.norm()).item<double>();
}

// The CPU a golden was computed on, as tools/reference/parity_common.py's cpu_fingerprint()
// writes it: "<vendor_id> | <model name> | <first 16 hex of sha256(flags)>" from /proc/cpuinfo.
// fp32 GEMMs and convolutions take different code paths, and round differently, on different x86
// microarchitectures (measured 2026-12-02: goldens made on one machine type differ from the same
// diffusers run on another by rel 2e-7..2e-6 in fp32, bf16 still equal), so bit-for-bit equality
// with a stored golden is only defined on the CPU that made it.
inline std::string cpu_fingerprint() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, vendor, model, flags;
  while (std::getline(in, line) && !line.empty()) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "vendor_id" || (key == "CPU implementer" && vendor.empty())) vendor = value;  // x86, else arm64
    if (key == "model name" || (key == "CPU part" && model.empty())) model = value;
    if (key == "flags" || (key == "Features" && flags.empty())) flags = value;
  }
  return vendor + " | " + model + " | " + dlo::sha256_hex(flags.data(), flags.size()).substr(0, 16);
}

class Golden {
 public:
  explicit Golden(const std::string& name)
      : name_(name), ck_(Checkpoint::open(golden_dir() + "/" + name + ".safetensors")) {}

  const std::string& name() const { return name_; }
  at::Tensor get(const std::string& tensor) const { return tensor_view(ck_, tensor).clone(); }
  const std::string& meta(const std::string& key) const { return ck_.metadata().at(key); }
  std::uint64_t seed() const { return std::stoull(meta("seed")); }
  DType weights_dtype() const { return meta("weights_dtype") == "bf16" ? DType::BF16 : DType::F32; }
  at::ScalarType compute_dtype() const { return meta("compute_dtype") == "bf16" ? at::kBFloat16 : at::kFloat; }

  // The CPU it was made on ("" for goldens made before this was recorded).
  std::string made_on() const {
    const auto& m = ck_.metadata();
    auto it = m.find("cpu");
    return it == m.end() ? std::string() : it->second;
  }

  // `got` must equal the golden's `want` bit for bit on the CPU that made it; on another CPU, a
  // relative error within 1e-5 in fp32 (measured up to 1.7e-6) or 2e-2 in bf16 (a few bf16
  // roundings; measured 0 so far). The bitwise check against diffusers is then the parity label's,
  // which recomputes the reference on this machine.
  void check_output(const at::Tensor& got, const at::Tensor& want) const {
    const double other_cpu_tol = want.scalar_type() == at::kFloat ? 1e-5 : 2e-2;
    const double err = golden_rel_err(got, want);
    if (made_on() == cpu_fingerprint()) {
      CHECK_MESSAGE(at::equal(got, want), name_ << ": rel err " << err << " on the CPU that made the golden");
    } else {
      MESSAGE(name_ << ": made on another CPU ('" << (made_on().empty() ? "unrecorded" : made_on()) << "', this is '"
                    << cpu_fingerprint() << "'): rel err " << err << ", bar " << other_cpu_tol);
      CHECK(err <= other_cpu_tol);
    }
  }

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


}  // namespace dlo::test
