#include "dlo/models/wan_lora_fuse.h"

#include <cstdio>

#include <ATen/ATen.h>

#include "dlo/common/error.h"

namespace dlo {

FusedLoras::FusedLoras(std::vector<FusedLora> loras, const WanTransformerConfig& c) : loras_(std::move(loras)) {
  for (const auto& l : loras_) {
    check_wan_lora(l.file, c);
    for (const auto& [module, m] : l.file.modules) {
      by_tensor_[module + ".weight"].push_back({&m, l.strength * m.scaling, false});
      if (m.bias.defined()) by_tensor_[module + ".bias"].push_back({&m, l.strength * m.scaling, true});
    }
  }
}

void FusedLoras::apply(const std::string& name, at::Tensor& rows, std::int64_t first_row) const {
  const auto it = by_tensor_.find(name);
  if (it == by_tensor_.end()) return;
  const at::ScalarType base = rows.scalar_type();
  const bool in_fp32 = base == at::kBFloat16 || base == at::kHalf;  // PEFT's merge on the CPU
  const std::int64_t n = rows.size(0);
  for (const Part& p : it->second) {
    if (p.bias) {
      rows.view({-1}).add_(p.module->bias.narrow(0, first_row, n).to(base).mul(p.scaling));
      continue;
    }
    at::Tensor down = p.module->down.to(base), up = p.module->up.narrow(0, first_row, n).to(base);
    if (in_fp32) {
      down = down.to(at::kFloat);
      up = up.to(at::kFloat);
    }
    at::Tensor delta = at::mm(up, down).mul(p.scaling);
    rows.add_(in_fp32 ? delta.to(base) : delta);
  }
}

std::string FusedLoras::identity() const {
  std::string s;
  for (const auto& l : loras_) {
    char strength[32];
    std::snprintf(strength, sizeof strength, "%.17g", l.strength);
    s += str(s.empty() ? "" : "; ", l.file.path, ":", strength);
  }
  return s;
}

std::shared_ptr<const FusedLoras> fused_loras_for(const std::vector<LoraSpec>& specs, int expert,
                                                  const WanTransformerConfig& c) {
  std::vector<FusedLora> loras;
  for (const auto& s : specs) {
    if (s.expert >= 0 && s.expert != expert) continue;
    with_context(str("the fused LoRA '", lora_spec_text(s), "'"), [&] { loras.push_back({read_wan_lora(s.path), s.strength}); });
  }
  if (loras.empty()) return nullptr;
  return with_context("the fused LoRAs", [&] { return std::make_shared<const FusedLoras>(std::move(loras), c); });
}

std::shared_ptr<const WanAdapters> wan_job_adapters(const std::vector<LoraSpec>& specs, int expert,
                                                    const WanTransformerConfig& c, at::ScalarType compute,
                                                    at::Device device) {
  auto out = std::make_shared<WanAdapters>();
  for (const auto& s : specs) {
    if (s.expert >= 0 && s.expert != expert) continue;
    with_context(str("the LoRA '", lora_spec_text(s), "'"), [&] {
      const LoraFile f = read_wan_lora(s.path);
      check_wan_lora(f, c);
      for (const auto& [module, m] : f.modules) {
        const at::ScalarType base = wan_weight_dtype(module + ".weight", compute);
        LinearAdapter a;
        a.down = m.down.to(device, base);
        a.up = m.up.to(device, base);
        if (m.bias.defined()) a.bias = m.bias.to(device, base);
        a.scaling = s.strength * m.scaling;
        out->modules[module].push_back(std::move(a));
      }
    });
  }
  if (out->modules.empty()) return nullptr;
  return out;
}

std::uint64_t wan_job_adapter_bytes(const std::vector<LoraSpec>& specs, int expert, const WanTransformerConfig& c,
                                    at::ScalarType compute) {
  std::uint64_t bytes = 0;
  for (const auto& s : specs) {
    if (s.expert >= 0 && s.expert != expert) continue;
    with_context(str("the LoRA '", lora_spec_text(s), "'"), [&] {
      const LoraFile f = read_wan_lora(s.path, LoraRead::kShapes);
      check_wan_lora(f, c);
      for (const auto& [module, m] : f.modules) {
        const std::uint64_t size = c10::elementSize(wan_weight_dtype(module + ".weight", compute));
        const std::uint64_t numel = static_cast<std::uint64_t>(m.down.numel() + m.up.numel() +
                                                               (m.bias.defined() ? m.bias.numel() : 0));
        bytes += numel * size;
      }
    });
  }
  return bytes;
}

std::vector<std::string> lora_ignored_notes(const std::vector<LoraSpec>& specs) {
  std::vector<std::string> notes;
  for (const auto& s : specs) {
    const LoraFile f = read_wan_lora(s.path, LoraRead::kShapes);  // the keys are all it needs
    if (f.ignored.empty()) continue;
    std::string keys;
    for (std::size_t i = 0; i < f.ignored.size() && i < 5; ++i) keys += str(i ? ", " : "", f.ignored[i]);
    notes.push_back(str("the LoRA '", s.path, "' has ", f.ignored.size(), " key(s) diffusers ignores and dlo does too (",
                        keys, f.ignored.size() > 5 ? ", ..." : "", ")"));
  }
  return notes;
}

}  // namespace dlo
