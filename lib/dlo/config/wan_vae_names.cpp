#include "dlo/config/wan_vae_names.h"

#include <cctype>
#include <span>

#include "dlo/common/error.h"

namespace dlo {
// (Named: the config layer compiles as one unit, beside wan_tensor_names.cpp's helpers.)
namespace vae_names {
namespace {

struct Row {
  const char* original;
  const char* diffusers;
};
using Rows = std::span<const Row>;

// A residual block (the original's `residual` Sequential: RMS_norm, SiLU, conv, RMS_norm, SiLU,
// dropout, conv), an attention block, a resampler (the original's `resample` Sequential: a
// padding or an upsampling, then the Conv2d).
constexpr Row kResnet[] = {{"residual.0", "norm1"}, {"residual.2", "conv1"}, {"residual.3", "norm2"},
                           {"residual.6", "conv2"}, {"shortcut", "conv_shortcut"}};
constexpr Row kAttention[] = {{"norm", "norm"}, {"to_qkv", "to_qkv"}, {"proj", "proj"}};
constexpr Row kResample[] = {{"resample.1", "resample.1"}, {"time_conv", "time_conv"}};
// The Wan2.1 encoder's flat list holds all three kinds, at the same index in both layouts.
constexpr Row kEncoderModule[] = {{"residual.0", "norm1"},  {"residual.2", "conv1"},      {"residual.3", "norm2"},
                                  {"residual.6", "conv2"},  {"shortcut", "conv_shortcut"}, {"norm", "norm"},
                                  {"to_qkv", "to_qkv"},     {"proj", "proj"},             {"resample.1", "resample.1"},
                                  {"time_conv", "time_conv"}};

// Modules outside the stages: a row's module itself (`sub` empty) or the rows of `sub` below it.
struct Module {
  const char* original;
  const char* diffusers;
  Rows sub;
};
const Module kModules[] = {
    {"conv1", "quant_conv", {}},
    {"conv2", "post_quant_conv", {}},
    {"encoder.conv1", "encoder.conv_in", {}},
    {"encoder.middle.0", "encoder.mid_block.resnets.0", kResnet},
    {"encoder.middle.1", "encoder.mid_block.attentions.0", kAttention},
    {"encoder.middle.2", "encoder.mid_block.resnets.1", kResnet},
    {"encoder.head.0", "encoder.norm_out", {}},
    {"encoder.head.2", "encoder.conv_out", {}},
    {"decoder.conv1", "decoder.conv_in", {}},
    {"decoder.middle.0", "decoder.mid_block.resnets.0", kResnet},
    {"decoder.middle.1", "decoder.mid_block.attentions.0", kAttention},
    {"decoder.middle.2", "decoder.mid_block.resnets.1", kResnet},
    {"decoder.head.0", "decoder.norm_out", {}},
    {"decoder.head.2", "decoder.conv_out", {}},
};

// `name` is `module` itself or `module` followed by a '.' tail: the tail ("" or ".weight", ...).
std::optional<std::string_view> tail_after(std::string_view name, std::string_view module) {
  if (module.empty() || name.substr(0, module.size()) != module) return std::nullopt;
  const std::string_view tail = name.substr(module.size());
  if (!tail.empty() && tail[0] != '.') return std::nullopt;
  return tail;
}

// What follows `head` in `name`, or nullopt.
std::optional<std::string_view> after(std::string_view name, std::string_view head) {
  if (name.substr(0, head.size()) != head) return std::nullopt;
  return name.substr(head.size());
}

// "<index>." at the start of `s` (no leading zeros): the index, `s` advanced past the dot.
std::optional<std::int64_t> take_index(std::string_view& s) {
  std::size_t i = 0;
  while (i < s.size() && i < 9 && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == 0 || i >= s.size() || s[i] != '.' || (s[0] == '0' && i > 1)) return std::nullopt;
  const std::int64_t n = std::stoll(std::string(s.substr(0, i)));
  s.remove_prefix(i + 1);
  return n;
}

// `rest` (a module of `rows` plus a tail) in the other layout.
std::optional<std::string> swap_rows(std::string_view rest, Rows rows, bool to_diffusers) {
  for (const Row& r : rows)
    if (const auto tail = tail_after(rest, to_diffusers ? r.original : r.diffusers))
      return std::string(to_diffusers ? r.diffusers : r.original) + std::string(*tail);
  return std::nullopt;
}

std::optional<std::string> joined(const std::string& head, const std::optional<std::string>& rest) {
  if (!rest) return std::nullopt;
  return head + *rest;
}

std::optional<std::string> swap_modules(std::string_view name, bool to_diffusers) {
  for (const Module& m : kModules) {
    const std::string_view from = to_diffusers ? m.original : m.diffusers, to = to_diffusers ? m.diffusers : m.original;
    if (m.sub.empty()) {
      if (const auto tail = tail_after(name, from)) return std::string(to) + std::string(*tail);
    } else if (const auto rest = after(name, std::string(from) + ".")) {
      return joined(std::string(to) + ".", swap_rows(*rest, m.sub, to_diffusers));
    }
  }
  return std::nullopt;
}

std::string num(std::int64_t n) { return std::to_string(n); }

std::optional<std::string> to_diffusers(std::string_view name, const WanVaeKeyLayout& l) {
  const std::int64_t nrb = l.num_res_blocks;
  if (auto rest = after(name, "encoder.downsamples.")) {
    const auto i = take_index(*rest);
    if (!i) return std::nullopt;
    const std::string stage = "encoder.down_blocks." + num(*i) + ".";
    if (!l.wan22) return joined(stage, swap_rows(*rest, kEncoderModule, true));
    // Wan2.2: stage i's residual blocks, then (but for the last stage) its resampler.
    auto r = after(*rest, "downsamples.");
    const auto j = r ? take_index(*r) : std::nullopt;
    if (!j) return std::nullopt;
    if (*j < nrb) return joined(stage + "resnets." + num(*j) + ".", swap_rows(*r, kResnet, true));
    if (*j == nrb) return joined(stage + "downsampler.", swap_rows(*r, kResample, true));
    return std::nullopt;
  }
  if (auto rest = after(name, "decoder.upsamples.")) {
    // Stage i: num_res_blocks + 1 residual blocks, then (but for the last stage) its upsampler;
    // Wan2.1 numbers them in one list of num_res_blocks + 2 per stage, Wan2.2 per stage.
    auto i = take_index(*rest);
    if (!i) return std::nullopt;
    std::optional<std::int64_t> j;
    if (!l.wan22) {
      j = *i % (nrb + 2);
      i = *i / (nrb + 2);
    } else if (const auto r = after(*rest, "upsamples.")) {
      rest = r;
      j = take_index(*rest);
    }
    if (!j) return std::nullopt;
    const std::string stage = "decoder.up_blocks." + num(*i) + ".";
    if (*j <= nrb) return joined(stage + "resnets." + num(*j) + ".", swap_rows(*rest, kResnet, true));
    if (*j == nrb + 1) return joined(stage + (l.wan22 ? "upsampler." : "upsamplers.0."), swap_rows(*rest, kResample, true));
    return std::nullopt;
  }
  return swap_modules(name, true);
}

std::optional<std::string> to_original(std::string_view name, const WanVaeKeyLayout& l) {
  const std::int64_t nrb = l.num_res_blocks;
  if (auto rest = after(name, "encoder.down_blocks.")) {
    const auto i = take_index(*rest);
    if (!i) return std::nullopt;
    const std::string stage = "encoder.downsamples." + num(*i) + ".";
    if (!l.wan22) return joined(stage, swap_rows(*rest, kEncoderModule, false));
    if (auto r = after(*rest, "resnets.")) {
      const auto j = take_index(*r);
      if (!j || *j >= nrb) return std::nullopt;
      return joined(stage + "downsamples." + num(*j) + ".", swap_rows(*r, kResnet, false));
    }
    if (auto r = after(*rest, "downsampler."))
      return joined(stage + "downsamples." + num(nrb) + ".", swap_rows(*r, kResample, false));
    return std::nullopt;
  }
  if (auto rest = after(name, "decoder.up_blocks.")) {
    const auto i = take_index(*rest);
    if (!i) return std::nullopt;
    std::optional<std::int64_t> j;
    std::optional<std::string> module;
    if (auto r = after(*rest, "resnets.")) {
      j = take_index(*r);
      if (!j || *j > nrb) return std::nullopt;
      module = swap_rows(*r, kResnet, false);
    } else if (auto u = after(*rest, l.wan22 ? "upsampler." : "upsamplers.0.")) {
      j = nrb + 1;
      module = swap_rows(*u, kResample, false);
    }
    if (!j) return std::nullopt;
    return joined(l.wan22 ? "decoder.upsamples." + num(*i) + ".upsamples." + num(*j) + "."
                          : "decoder.upsamples." + num(*i * (nrb + 2) + *j) + ".",
                  module);
  }
  return swap_modules(name, false);
}

bool holds_name(const std::vector<std::string>& names, const std::string& name) {
  for (const auto& n : names)
    if (n == name) return true;
  return false;
}

bool holds_prefix(const std::vector<std::string>& names, const std::string& prefix) {
  for (const auto& n : names)
    if (n.compare(0, prefix.size(), prefix) == 0) return true;
  return false;
}

std::string some_names(const std::vector<std::string>& names, std::size_t shown = 5) {
  std::string list;
  for (std::size_t i = 0; i < names.size() && i < shown; ++i) list += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > shown) list += str(" and ", names.size() - shown, " more");
  return list;
}

bool has_suffix(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && std::string_view(s).substr(s.size() - tail.size()) == tail;
}

}  // namespace
}  // namespace vae_names

std::string WanVaeKeyLayout::describe() const {
  const std::string vae = wan22 ? "Wan2.2 VAE" : "Wan2.1 VAE";
  return original ? "original " + vae + " layout" : "diffusers layout (" + vae + ")";
}

std::optional<std::string> wan_vae_original_to_diffusers(std::string_view name, const WanVaeKeyLayout& layout) {
  return vae_names::to_diffusers(name, layout);
}
std::optional<std::string> wan_vae_diffusers_to_original(std::string_view name, const WanVaeKeyLayout& layout) {
  return vae_names::to_original(name, layout);
}

WanVaeKeyLayout detect_wan_vae_layout(const std::vector<std::string>& names, const std::string& label) {
  WanVaeKeyLayout l;
  const bool original = vae_names::holds_name(names, "decoder.conv1.weight"), diffusers = vae_names::holds_name(names, "decoder.conv_in.weight");
  DLO_CHECK(original != diffusers, label, ": not a Wan VAE in a layout dlo knows (diffusers', the original Wan2.1 ",
            "or Wan2.2 VAE's): it has ",
            names.empty() ? std::string("no tensors") : str(names.size(), " tensor(s), e.g. ", vae_names::some_names(names, 4)),
            ", but not one of 'decoder.conv_in.weight' (diffusers) and 'decoder.conv1.weight' (original Wan)");
  l.original = original;
  l.wan22 = original ? vae_names::holds_prefix(names, "encoder.downsamples.0.downsamples.0.")
                     : vae_names::holds_prefix(names, "encoder.down_blocks.0.resnets.0.");
  // The decoder's first stage: its residual blocks are numbered 0..num_res_blocks.
  const auto resnet = [&](std::int64_t j) {
    return original ? (l.wan22 ? str("decoder.upsamples.0.upsamples.", j, ".residual.0.gamma")
                               : str("decoder.upsamples.", j, ".residual.0.gamma"))
                    : str("decoder.up_blocks.0.resnets.", j, ".norm1.gamma");
  };
  std::int64_t n = 0;
  while (vae_names::holds_name(names, resnet(n))) ++n;
  DLO_CHECK(n > 0, label, ": no '", resnet(0), "' (the decoder's first residual block, which every Wan VAE has) in the ",
            l.describe(), " its names show");
  l.num_res_blocks = n - 1;
  return l;
}

std::map<std::string, std::string> wan_vae_diffusers_names(const std::vector<std::string>& names, const std::string& label,
                                                           WanVaeKeyLayout* layout) {
  const WanVaeKeyLayout l = detect_wan_vae_layout(names, label);
  if (layout != nullptr) *layout = l;
  std::map<std::string, std::string> out;
  std::vector<std::string> unknown;
  for (const auto& n : names) {
    // diffusers' own names are kept as they are, but only those the table knows.
    const std::optional<std::string> mapped =
        l.original ? vae_names::to_diffusers(n, l) : (vae_names::to_original(n, l) ? std::optional<std::string>(n) : std::nullopt);
    if (mapped)
      out[n] = *mapped;
    else
      unknown.push_back(n);
  }
  DLO_CHECK(unknown.empty(), label, ": ", unknown.size(), " tensor(s) are not the Wan VAE's in the ", l.describe(),
            " detected (", l.num_res_blocks, " residual blocks per stage): ", vae_names::some_names(unknown));
  return out;
}

Checkpoint open_wan_vae(const std::string& path) {
  for (const char* pickle : {".pth", ".pt", ".ckpt", ".bin"})
    DLO_CHECK(!vae_names::has_suffix(path, pickle), "'", path, "' is a PyTorch pickle; dlo reads safetensors only (a pickle ",
              "can run code when loaded). Convert it once with the venv's torch: python tools/pickle_to_safetensors.py '",
              path, "' OUT.safetensors");
  Checkpoint ck = Checkpoint::open(path);
  std::vector<std::string> names;
  for (const TensorInfo* t : ck.tensors()) names.push_back(t->name);
  const auto renamed = wan_vae_diffusers_names(names, ck.source());
  ck.rename_tensors([&](const std::string& n) { return renamed.at(n); });
  return ck;
}

}  // namespace dlo
