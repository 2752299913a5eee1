#include "dlo/models/wan_lora.h"

#include <cmath>
#include <optional>
#include <regex>
#include <string_view>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/config/wan_tensor_names.h"
#include "dlo/io/safetensors.h"
#include "dlo/models/tensor_view.h"

namespace dlo {
namespace {
// Its own namespace: the models layer compiles as one unit (DLO_UNITY_BUILD).
namespace lora_impl {

bool has(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }
bool starts(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends(std::string_view s, std::string_view t) { return s.size() >= t.size() && s.substr(s.size() - t.size()) == t; }
bool any_key(const std::vector<std::string>& keys, std::string_view part) {
  for (const auto& k : keys)
    if (has(k, part)) return true;
  return false;
}

std::string some(const std::vector<std::string>& names, std::size_t shown = 5) {
  std::string list;
  for (std::size_t i = 0; i < names.size() && i < shown; ++i) list += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > shown) list += str(" and ", names.size() - shown, " more");
  return list;
}

std::string shape(const at::Tensor& t) {
  std::string s = "[";
  for (std::int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

// One module's tensors as the file holds them (views of the mapping), by the keys they came from.
struct Found {
  std::string down, up, bias, alpha;  // keys ("" where absent)
};

// What a layout's rules leave: the modules (diffusers names), the keys no rule took.
struct Parsed {
  std::map<std::string, Found> modules;
  std::vector<std::string> left;
};

// Files the keys of `keys` with one of `suffixes` (suffix -> slot of Found) under the diffusers
// module `to_module(key without prefix and suffix)` gives; the rest go to `left`.
template <typename ToModule>
Parsed parse(const std::vector<std::string>& keys, std::string_view prefix,
             const std::vector<std::pair<std::string, std::string Found::*>>& suffixes, ToModule to_module) {
  Parsed p;
  for (const auto& k : keys) {
    bool taken = false;
    if (starts(k, prefix)) {
      const std::string_view bare = std::string_view(k).substr(prefix.size());
      for (const auto& [suffix, slot] : suffixes) {
        if (!ends(bare, suffix)) continue;
        if (const std::optional<std::string> m = to_module(bare.substr(0, bare.size() - suffix.size()))) {
          p.modules[*m].*slot = k;
          taken = true;
        }
        break;
      }
    }
    if (!taken) p.left.push_back(k);
  }
  return p;
}

bool image_projection(const std::string& module) { return ends(module, "add_k_proj") || ends(module, "add_v_proj"); }

// PEFT's per-module r and lora_alpha (peft/tuners/lora/model.py _create_and_replace with
// utils/other.py get_pattern_key): the first pattern key k (in the file's order) for which
// `(.*\.)?(k)$` matches the whole module name, else the config's value.
double pattern_value(const nlohmann::ordered_json& patterns, const std::string& module, double fallback) {
  if (!patterns.is_object()) return fallback;
  for (const auto& [key, value] : patterns.items()) {
    bool match = false;
    try {
      match = std::regex_match(module, std::regex("(.*\\.)?(" + key + ")$"));
    } catch (const std::regex_error&) {
      DLO_CHECK(false, "lora_adapter_metadata: pattern '", key, "' is not a regular expression dlo reads");
    }
    if (match) {
      DLO_CHECK(value.is_number(), "lora_adapter_metadata: pattern '", key, "' maps to ", value.dump(), ", not a number");
      return value.get<double>();
    }
  }
  return fallback;
}

}  // namespace lora_impl
}  // namespace

std::pair<double, double> lora_alpha_split(double alpha, std::int64_t rank) {
  double down = alpha / static_cast<double>(rank), up = 1.0;
  while (down * 2 < up) {
    down *= 2;
    up /= 2;
  }
  return {down, up};
}

LoraFile read_wan_lora(const std::string& path, LoraRead what) {
  using namespace lora_impl;
  const bool shapes_only = what == LoraRead::kShapes;
  // A factor's tensor: a view of the mapping, or (kShapes) a meta tensor of its shape and dtype.
  const auto factor = [&](const Checkpoint& ck, const std::string& key) {
    const at::Tensor v = tensor_view(ck, key);
    return shapes_only ? at::empty(v.sizes(), v.options().device(at::kMeta)) : v;
  };
  refuse_pickle(path);
  const Checkpoint ck = Checkpoint::open(path);
  return with_context("LoRA '" + path + "'", [&] {
    LoraFile f;
    f.path = path;
    std::vector<std::string> keys;
    for (const TensorInfo* t : ck.tensors()) keys.push_back(t->name);
    DLO_CHECK(!keys.empty(), "no tensors");
    for (const auto& k : keys)
      DLO_CHECK(!has(k, "dora_scale") && !has(k, "lora_magnitude_vector"), "'", k,
                "' is a DoRA magnitude: dlo does not apply DoRA, and diffusers reads no DoRA LoRA of Wan as trained "
                "(it drops the magnitudes of a diffusers-layout file with a warning and fails on the other layouts)");

    // The layout, as lora_state_dict picks it.
    const bool comfy = std::any_of(keys.begin(), keys.end(), [](const auto& k) { return starts(k, "diffusion_model."); });
    const bool musubi = !comfy && std::any_of(keys.begin(), keys.end(), [](const auto& k) { return starts(k, "lora_unet_"); });
    const bool i2v = any_key(keys, "k_img") && any_key(keys, "v_img");
    Parsed p;
    std::string head_diff;  // ComfyUI's head.head.diff
    if (comfy) {
      f.layout = "ComfyUI/Kijai (diffusion_model.)";
      const std::string prefix = "diffusion_model.";
      const std::string down = any_key(keys, "lora_A") ? "lora_A" : "lora_down";
      const std::string up = any_key(keys, "lora_B") ? "lora_B" : "lora_up";
      bool blocks = false, time_projection_weight = false;
      std::vector<std::string> rest;
      for (const auto& k : keys) {
        const std::string_view bare = starts(k, prefix) ? std::string_view(k).substr(prefix.size()) : std::string_view();
        blocks = blocks || starts(bare, "blocks.");
        time_projection_weight = time_projection_weight || (starts(bare, "time_projection") && ends(bare, ".weight"));
      }
      DLO_CHECK(blocks, "no 'diffusion_model.blocks.' keys: diffusers reads a LoRA in this layout only with block keys "
                "(its conversion takes the lowest and highest block index)");
      for (const auto& k : keys) {
        // diffusers drops the norms' diff keys, and time_projection keys without a time_projection weight (AccVideo).
        if (((ends(k, ".diff") || ends(k, ".diff_b")) && has(k, "norm")) ||
            (has(k, "time_projection") && !time_projection_weight))
          f.ignored.push_back(k);
        else if (k == prefix + "head.head.diff")
          head_diff = k;
        else
          rest.push_back(k);
      }
      p = parse(rest, prefix,
                {{"." + down + ".weight", &Found::down}, {"." + up + ".weight", &Found::up}, {".alpha", &Found::alpha},
                 {".diff_b", &Found::bias}},
                [&](std::string_view m) -> std::optional<std::string> {
                  auto d = wan_original_to_diffusers(m);
                  if (!d || !wan_is_linear(*d) || (image_projection(*d) && !i2v)) return std::nullopt;
                  return d;
                });
      for (auto& [m, x] : p.modules) {
        const bool block = starts(m, "blocks.");
        DLO_CHECK(block || x.alpha.empty(), "'", x.alpha, "': diffusers reads an alpha only on the blocks' Linears "
                  "(it raises on this one)");
        // An image embedder's diff_b is taken only beside its up; alone diffusers leaves it (ignored below).
        if (starts(m, "condition_embedder.image_embedder.") && x.up.empty() && !x.bias.empty()) {
          p.left.push_back(x.bias);
          x.bias.clear();
        }
      }
      std::erase_if(p.modules, [](const auto& mx) {
        const Found& x = mx.second;
        return x.down.empty() && x.up.empty() && x.bias.empty() && x.alpha.empty();
      });
      // The text and time embedders: any key of theirs makes diffusers take both down and up (it raises without).
      for (const char* e : {"text_embedding.0", "text_embedding.2", "time_embedding.0", "time_embedding.2"}) {
        const auto m = p.modules.find(*wan_original_to_diffusers(e));
        DLO_CHECK(!any_key(rest, e) || (m != p.modules.end() && !m->second.down.empty() && !m->second.up.empty()),
                  "keys of '", e, "' without both its lora down and up: diffusers raises on them");
      }
      if (!head_diff.empty()) {
        Found& h = p.modules["proj_out"];
        DLO_CHECK(!h.bias.empty(), "'", head_diff, "' without 'diffusion_model.head.head.diff_b': diffusers needs the "
                  "bias to shape the identity it pairs the diff with (it raises)");
        for (std::string* k : {&h.down, &h.up})
          if (!k->empty()) f.ignored.push_back(*k);  // replaced by the diff, as diffusers does
        h.down = head_diff;
        h.up.clear();
      }
      // What is left diffusers ignores when every key is a diff key (full-weight deltas, diff_m),
      // and raises on otherwise.
      if (!p.left.empty()) {
        std::vector<std::string> bad;
        for (const auto& k : p.left)
          if (!has(k, ".diff") || (ends(k, ".diff") && has(k, "lora"))) bad.push_back(k);
        DLO_CHECK(bad.empty(), bad.size(), " key(s) match nothing of the Wan transformer in the ", f.layout,
                  " layout detected (", down, "/", up, " naming", i2v ? ", with image projections" : "", "): ", some(bad));
        f.ignored.insert(f.ignored.end(), p.left.begin(), p.left.end());
        p.left.clear();
      }
    } else if (musubi) {
      f.layout = "musubi (lora_unet_)";
      p = parse(keys, "lora_unet_",
                {{".lora_down.weight", &Found::down}, {".lora_up.weight", &Found::up}, {".alpha", &Found::alpha}},
                [&](std::string_view m) -> std::optional<std::string> {
                  auto d = wan_musubi_to_diffusers(m);
                  if (!d || (image_projection(*d) && !i2v)) return std::nullopt;
                  return d;
                });
      for (const auto& [m, x] : p.modules)
        DLO_CHECK(!x.alpha.empty(), "module '", m, "' (", x.down.empty() ? x.up : x.down,
                  ") has no .alpha: diffusers reads a musubi LoRA only with an alpha for every module (it raises)");
    } else {
      f.layout = "diffusers/PEFT";
      std::vector<std::string> no_lora;
      for (const auto& k : keys)
        if (!has(k, "lora")) no_lora.push_back(k);
      DLO_CHECK(no_lora.empty(), no_lora.size(), " key(s) without 'lora' in their name, which diffusers refuses in "
                "the diffusers/PEFT layout detected (no key starts with 'diffusion_model.' or 'lora_unet_'): ", some(no_lora));
      p = parse(keys, "transformer.",
                {{".lora_A.weight", &Found::down}, {".lora_B.weight", &Found::up}, {".lora_B.bias", &Found::bias}},
                [](std::string_view m) -> std::optional<std::string> {
                  if (!wan_is_linear(m)) return std::nullopt;
                  return std::string(m);
                });
    }
    DLO_CHECK(p.left.empty(), p.left.size(), " key(s) match nothing of the Wan transformer in the ", f.layout,
              " layout detected: ", some(p.left));
    DLO_CHECK(!p.modules.empty(), "no LoRA modules in the ", f.layout, " layout detected");

    // The modules: down and up both there, of one rank; an alpha baked in as diffusers does.
    for (const auto& [m, x] : p.modules) {
      DLO_CHECK(!x.down.empty() && (!x.up.empty() || x.down == head_diff), "module '", m, "' has ",
                x.down.empty() ? "no lora down" : "no lora up", " (its keys: ",
                [&] {
                  std::vector<std::string> ks;
                  for (const std::string* k : {&x.down, &x.up, &x.bias, &x.alpha})
                    if (!k->empty()) ks.push_back(*k);
                  return some(ks);
                }(),
                ")");
      LoraModule mod;
      const at::Tensor down = factor(ck, x.down);
      at::Tensor up;
      if (x.down == head_diff) {
        const at::Tensor b = factor(ck, x.bias);
        DLO_CHECK(down.dim() == 2 && b.dim() == 1, "'", x.down, "' ", shape(down), " and '", x.bias, "' ", shape(b),
                  " are not a weight's and a bias's shapes");
        up = shapes_only ? at::empty({b.size(0), down.size(0)}, down.options())
                         : at::eye(down.size(0), b.size(0), down.options()).t().contiguous();
      } else {
        up = factor(ck, x.up);
      }
      DLO_CHECK(down.dim() == 2 && up.dim() == 2 && down.size(0) == up.size(1), "module '", m, "': down ", shape(down),
                " and up ", shape(up), " are not LoRA factors of one rank (down [r, in], up [out, r])");
      if (!x.alpha.empty()) {
        const at::Tensor a = tensor_view(ck, x.alpha);
        DLO_CHECK(a.numel() == 1, "'", x.alpha, "' has ", a.numel(), " values, not one");
        const auto [sd, su] = lora_alpha_split(a.item<double>(), down.size(0));
        mod.down = down * sd;  // in the file's dtype, as diffusers multiplies
        mod.up = up * su;
      } else {
        mod.down = down.clone();
        mod.up = up.clone();
      }
      if (!x.bias.empty()) {
        mod.bias = factor(ck, x.bias).clone();
        DLO_CHECK(mod.bias.dim() == 1 && mod.bias.size(0) == up.size(0), "'", x.bias, "' ", shape(mod.bias),
                  " is not a bias of the module's ", up.size(0), " outputs");
      }
      f.modules.emplace(m, std::move(mod));
    }

    // PEFT's scaling: lora_alpha / r per module from diffusers' metadata (prefix "transformer."),
    // where the file has it (in any layout: load_lora_weights passes it on); without, diffusers
    // makes lora_alpha = r for every module.
    const auto md = ck.metadata().find("lora_adapter_metadata");
    if (md != ck.metadata().end()) {
      nlohmann::ordered_json all;
      try {
        all = nlohmann::ordered_json::parse(md->second);
      } catch (const nlohmann::json::exception& e) {
        DLO_CHECK(false, "lora_adapter_metadata is not JSON: ", e.what());
      }
      DLO_CHECK(all.is_object(), "lora_adapter_metadata is not a JSON object");
      nlohmann::ordered_json cfg = nlohmann::ordered_json::object();
      for (const auto& [k, v] : all.items())
        if (starts(k, "transformer.")) cfg[k.substr(12)] = v;
      const auto number = [&](const char* key, double def) {
        if (!cfg.contains(key) || cfg[key].is_null()) return def;
        DLO_CHECK(cfg[key].is_number(), "lora_adapter_metadata: transformer.", key, " is ", cfg[key].dump(), ", not a number");
        return cfg[key].get<double>();
      };
      const auto flag = [&](const char* key) { return cfg.contains(key) && cfg[key].is_boolean() && cfg[key].get<bool>(); };
      DLO_CHECK(!flag("use_dora"), "lora_adapter_metadata says use_dora: dlo does not apply DoRA");
      const double r = number("r", 8), alpha = number("lora_alpha", 8);  // LoraConfig's defaults
      const bool rslora = flag("use_rslora");
      const auto patterns = [&](const char* key) { return cfg.contains(key) ? cfg[key] : nlohmann::ordered_json(); };
      for (auto& [m, mod] : f.modules) {
        const double rm = pattern_value(patterns("rank_pattern"), m, r), am = pattern_value(patterns("alpha_pattern"), m, alpha);
        DLO_CHECK(rm == static_cast<double>(mod.down.size(0)), "module '", m, "': lora_adapter_metadata gives rank ", rm,
                  " but its tensors have rank ", mod.down.size(0), " (PEFT fails to load it)");
        mod.scaling = rslora ? am / std::sqrt(rm) : am / rm;
      }
      // PEFT's lora_B has no bias unless the config says lora_bias: the file's biases are then left unloaded.
      if (!flag("lora_bias"))
        for (auto& [m, mod] : f.modules)
          if (mod.bias.defined()) {
            f.ignored.push_back("transformer." + m + ".lora_B.bias");
            mod.bias = at::Tensor();
          }
    }
    return f;
  });
}

void check_wan_lora(const LoraFile& f, const WanTransformerConfig& c) {
  using lora_impl::shape;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const TensorSpec& s : wan_transformer_specs(c, DType::BF16)) shapes[s.name] = s.shape;
  for (const auto& [m, mod] : f.modules) {
    const auto w = shapes.find(m + ".weight");
    DLO_CHECK(w != shapes.end() && wan_is_linear(m), "LoRA '", f.path, "': module '", m, "' is not one of the model's "
              "Linears (", c.num_layers, " blocks of width ", c.dim(), ", no image projections)");
    const std::int64_t out = w->second[0], in = w->second[1];
    DLO_CHECK(mod.down.size(1) == in && mod.up.size(0) == out && (!mod.bias.defined() || mod.bias.size(0) == out),
              "LoRA '", f.path, "': module '", m, "': down ", shape(mod.down), " and up ", shape(mod.up),
              mod.bias.defined() ? " and bias " + shape(mod.bias) : std::string(), " do not fit the model's Linear of weight [",
              out, ", ", in, "] (a LoRA for another model size?)");
  }
}

std::vector<std::pair<std::string, at::Tensor>> wan_lora_peft_tensors(const LoraFile& f) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [m, mod] : f.modules) {
    out.emplace_back("transformer." + m + ".lora_A.weight", mod.down);
    out.emplace_back("transformer." + m + ".lora_B.weight", mod.up);
    if (mod.bias.defined()) out.emplace_back("transformer." + m + ".lora_B.bias", mod.bias);
  }
  return out;
}

}  // namespace dlo
