#include "dlo/config/wan_transformer_config.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "dlo/common/error.h"
#include "dlo/config/wan_tensor_names.h"

namespace dlo {

// ---------------------------------------------------------------------------------------------
// Config

WanTransformerConfig WanTransformerConfig::from_json(const JsonConfig& j) {
  const std::string& f = j.path();
  if (j.has("_class_name")) {
    const std::string cls = j.get_string("_class_name");
    DLO_CHECK(cls == "WanTransformer3DModel", f, ": _class_name is '", cls, "', expected 'WanTransformer3DModel'");
  }
  DLO_CHECK(!j.has("image_dim") && !j.has("added_kv_proj_dim"), f,
            ": image_dim/added_kv_proj_dim are set (an image-to-video model); I2V not supported yet");
  DLO_CHECK(!j.has("pos_embed_seq_len"), f, ": pos_embed_seq_len is set (FLF2V); not supported yet");
  WanTransformerConfig c;
  auto patch = j.get_int_list("patch_size", std::vector<std::int64_t>{1, 2, 2});
  DLO_CHECK(patch.size() == 3, f, ": field 'patch_size' must have 3 entries, got ", j.dump("patch_size"));
  c.patch_size = {patch[0], patch[1], patch[2]};
  c.num_attention_heads = j.get_int("num_attention_heads", 40);
  c.attention_head_dim = j.get_int("attention_head_dim", 128);
  c.in_channels = j.get_int("in_channels", 16);
  c.out_channels = j.get_int("out_channels", 16);
  c.text_dim = j.get_int("text_dim", 4096);
  c.freq_dim = j.get_int("freq_dim", 256);
  c.ffn_dim = j.get_int("ffn_dim", 13824);
  c.num_layers = j.get_int("num_layers", 40);
  c.cross_attn_norm = j.get_bool("cross_attn_norm", true);
  c.eps = j.get_double("eps", 1e-6);
  c.rope_max_seq_len = j.get_int("rope_max_seq_len", 1024);
  const std::string qk = j.get_string("qk_norm", std::string("rms_norm_across_heads"));
  DLO_CHECK(qk == "rms_norm_across_heads", f, ": field 'qk_norm' is '", qk,
            "'; only 'rms_norm_across_heads' (every Wan2.1 model) is supported");
  c.validate(f);
  return c;
}

void WanTransformerConfig::validate(const std::string& where) const {
  auto positive = [&](std::int64_t v, const char* name) {
    DLO_CHECK(v > 0 && v < (1ll << 31), where, ": field '", name, "' must be a positive integer, got ", v);
  };
  for (int i = 0; i < 3; ++i) positive(patch_size[i], "patch_size");
  positive(num_attention_heads, "num_attention_heads");
  positive(attention_head_dim, "attention_head_dim");
  positive(in_channels, "in_channels");
  positive(out_channels, "out_channels");
  positive(text_dim, "text_dim");
  positive(freq_dim, "freq_dim");
  positive(ffn_dim, "ffn_dim");
  positive(num_layers, "num_layers");
  positive(rope_max_seq_len, "rope_max_seq_len");
  DLO_CHECK(freq_dim % 2 == 0, where, ": field 'freq_dim' must be even, got ", freq_dim);
  // RoPE splits the head dim into (t, h, w) parts of interleaved pairs: all must be even, > 0.
  const std::int64_t d = attention_head_dim, hw = 2 * (d / 6), t = d - 2 * hw;
  DLO_CHECK(d % 2 == 0 && hw > 0 && t > 0, where, ": field 'attention_head_dim' must be even and >= 6, got ", d);
  DLO_CHECK(std::isfinite(eps) && eps > 0 && eps < 1, where, ": field 'eps' must be in (0, 1), got ", eps);
}

WanTransformerConfig WanTransformerConfig::preset(const std::string& name) {
  WanTransformerConfig c;
  if (name == "wan-test") {
    c.num_attention_heads = 2;
    c.attention_head_dim = 12;
    c.in_channels = c.out_channels = 4;
    c.text_dim = 16;
    c.ffn_dim = 32;
    c.num_layers = 2;
    c.rope_max_seq_len = 32;
  } else if (name == "wan2.1-t2v-1.3b") {
    c.num_attention_heads = 12;
    c.ffn_dim = 8960;
    c.num_layers = 30;
  } else if (name == "wan2.1-t2v-14b" || name == "wan2.2-t2v-a14b") {
    // Wan2.2 T2V-A14B: each of its two experts has Wan2.1 14B's shape.
    c.num_attention_heads = 40;
    c.ffn_dim = 13824;
    c.num_layers = 40;
  } else if (name == "wan2.2-ti2v-5b") {
    // Wan2.2 TI2V-5B's transformer, on the 48 channels of the Wan2.2 VAE.
    c.num_attention_heads = 24;
    c.in_channels = c.out_channels = 48;
    c.ffn_dim = 14336;
    c.num_layers = 30;
  } else if (name == "wan2.2-a14b-test") {
    c = preset("wan-test");  // a tiny two-expert test model: each expert wan-test's shape
  } else if (name == "wan2.2-ti2v-test") {
    c = preset("wan-test");  // a tiny TI2V-style model: wan-test's shape on wan2.2-vae-test's latents
    c.in_channels = c.out_channels = 12;
  } else {
    DLO_CHECK(false, "unknown transformer preset '", name,
              "' (wan-test, wan2.1-t2v-1.3b, wan2.1-t2v-14b, wan2.2-t2v-a14b, wan2.2-ti2v-5b, wan2.2-a14b-test, "
              "wan2.2-ti2v-test)");
  }
  return c;
}

std::string WanTransformerConfig::preset_vae(const std::string& name) {
  if (name == "wan2.2-ti2v-5b") return "wan2.2-vae";
  if (name == "wan2.2-ti2v-test") return "wan2.2-vae-test";
  return "wan2.1-vae-small";
}

bool WanTransformerConfig::preset_expands_timesteps(const std::string& name) {
  return name == "wan2.2-ti2v-5b" || name == "wan2.2-ti2v-test";
}

bool WanTransformerConfig::preset_has_two_experts(const std::string& name) {
  return name == "wan2.2-t2v-a14b" || name == "wan2.2-a14b-test";
}

std::vector<std::string> WanTransformerConfig::preset_names() {
  return {"wan-test",       "wan2.1-t2v-1.3b",  "wan2.1-t2v-14b",  "wan2.2-t2v-a14b",
          "wan2.2-ti2v-5b", "wan2.2-a14b-test", "wan2.2-ti2v-test"};
}

std::string WanTransformerConfig::to_json() const {
  nlohmann::ordered_json j;
  j["_class_name"] = "WanTransformer3DModel";
  j["_diffusers_version"] = "0.42.1";
  j["added_kv_proj_dim"] = nullptr;
  j["attention_head_dim"] = attention_head_dim;
  j["cross_attn_norm"] = cross_attn_norm;
  j["eps"] = eps;
  j["ffn_dim"] = ffn_dim;
  j["freq_dim"] = freq_dim;
  j["image_dim"] = nullptr;
  j["in_channels"] = in_channels;
  j["num_attention_heads"] = num_attention_heads;
  j["num_layers"] = num_layers;
  j["out_channels"] = out_channels;
  j["patch_size"] = {patch_size[0], patch_size[1], patch_size[2]};
  j["pos_embed_seq_len"] = nullptr;
  j["qk_norm"] = "rms_norm_across_heads";
  j["rope_max_seq_len"] = rope_max_seq_len;
  j["text_dim"] = text_dim;
  return j.dump(2) + "\n";
}

// ---------------------------------------------------------------------------------------------
// Tensor names and shapes

std::vector<std::string> wan_block_tensor_names(const WanTransformerConfig& c) {
  std::vector<std::string> n;
  for (const char* a : {"attn1", "attn2"}) {
    for (const char* p : {"to_q", "to_k", "to_v", "to_out.0"}) {
      n.push_back(std::string(a) + "." + p + ".weight");
      n.push_back(std::string(a) + "." + p + ".bias");
    }
    n.push_back(std::string(a) + ".norm_q.weight");
    n.push_back(std::string(a) + ".norm_k.weight");
  }
  if (c.cross_attn_norm) {
    n.push_back("norm2.weight");
    n.push_back("norm2.bias");
  }
  for (const char* s : {"ffn.net.0.proj.weight", "ffn.net.0.proj.bias", "ffn.net.2.weight", "ffn.net.2.bias",
                        "scale_shift_table"})
    n.push_back(s);
  return n;
}

namespace {

std::vector<std::int64_t> block_shape(const std::string& name, const WanTransformerConfig& c) {
  const std::int64_t D = c.dim(), F = c.ffn_dim;
  if (name == "scale_shift_table") return {1, 6, D};
  if (name == "ffn.net.0.proj.weight") return {F, D};
  if (name == "ffn.net.0.proj.bias") return {F};
  if (name == "ffn.net.2.weight") return {D, F};
  if (name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 && name.find("norm") == std::string::npos)
    return {D, D};
  return {D};
}

std::vector<std::pair<std::string, std::vector<std::int64_t>>> global_shapes(const WanTransformerConfig& c) {
  const std::int64_t D = c.dim();
  const auto& p = c.patch_size;
  return {
      {"patch_embedding.weight", {D, c.in_channels, p[0], p[1], p[2]}},
      {"patch_embedding.bias", {D}},
      {"condition_embedder.time_embedder.linear_1.weight", {D, c.freq_dim}},
      {"condition_embedder.time_embedder.linear_1.bias", {D}},
      {"condition_embedder.time_embedder.linear_2.weight", {D, D}},
      {"condition_embedder.time_embedder.linear_2.bias", {D}},
      {"condition_embedder.time_proj.weight", {6 * D, D}},
      {"condition_embedder.time_proj.bias", {6 * D}},
      {"condition_embedder.text_embedder.linear_1.weight", {D, c.text_dim}},
      {"condition_embedder.text_embedder.linear_1.bias", {D}},
      {"condition_embedder.text_embedder.linear_2.weight", {D, D}},
      {"condition_embedder.text_embedder.linear_2.bias", {D}},
      {"proj_out.weight", {c.out_channels * p[0] * p[1] * p[2], D}},
      {"proj_out.bias", {c.out_channels * p[0] * p[1] * p[2]}},
      {"scale_shift_table", {1, 2, D}},
  };
}

}  // namespace

std::vector<TensorSpec> wan_block_specs(const WanTransformerConfig& c, DType dtype) {
  std::vector<TensorSpec> out;
  for (const auto& n : wan_block_tensor_names(c)) out.push_back({n, dtype, block_shape(n, c)});
  return out;
}

std::vector<TensorSpec> wan_transformer_specs(const WanTransformerConfig& c, DType dtype) {
  std::vector<TensorSpec> out;
  for (auto& [n, s] : global_shapes(c)) out.push_back({n, dtype, s});
  for (std::int64_t i = 0; i < c.num_layers; ++i)
    for (auto spec : wan_block_specs(c, dtype)) {
      spec.name = "blocks." + std::to_string(i) + "." + spec.name;
      out.push_back(std::move(spec));
    }
  return out;
}

namespace {

std::string wan_shape_text(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string first_names(const std::vector<std::string>& names) {
  std::string list;
  for (std::size_t i = 0; i < names.size() && i < 5; ++i) list += (i ? ", " : "") + names[i];
  if (names.size() > 5) list += str(" and ", names.size() - 5, " more");
  return list;
}

// The fields tensor shapes show, as (name, value) text pairs in config.json's terms; `width` is
// num_attention_heads x attention_head_dim (the shapes show the product only).
std::vector<std::pair<std::string, std::string>> shown_fields(const WanTransformerConfig& c, std::int64_t width) {
  const auto& p = c.patch_size;
  return {{"in_channels", std::to_string(c.in_channels)},
          {"out_channels", std::to_string(c.out_channels)},
          {"width (num_attention_heads x attention_head_dim)", std::to_string(width)},
          {"ffn_dim", std::to_string(c.ffn_dim)},
          {"num_layers", std::to_string(c.num_layers)},
          {"text_dim", std::to_string(c.text_dim)},
          {"freq_dim", std::to_string(c.freq_dim)},
          {"patch_size", wan_shape_text({p[0], p[1], p[2]})},
          {"cross_attn_norm", c.cross_attn_norm ? "true" : "false"}};
}

}  // namespace

WanTransformerConfig infer_wan_transformer_config(const TensorShapeMap& shapes, const WanTransformerConfig* folder,
                                                  const std::string& label, std::string* matched) {
  return with_context(label, [&] {
    const auto shape = [&](const std::string& name, std::size_t rank) -> const std::vector<std::int64_t>& {
      const auto it = shapes.find(name);
      DLO_CHECK(it != shapes.end(), "no tensor '", name, "' (diffusers' name), which every Wan transformer has");
      DLO_CHECK(it->second.size() == rank, "tensor '", name, "' has shape ", wan_shape_text(it->second), ", not ", rank,
                " dimensions");
      return it->second;
    };
    const auto& patch = shape("patch_embedding.weight", 5);
    WanTransformerConfig c;
    const std::int64_t dim = patch[0];
    c.in_channels = patch[1];
    c.patch_size = {patch[2], patch[3], patch[4]};
    const std::int64_t per_token = patch[2] * patch[3] * patch[4];
    const std::int64_t out = shape("proj_out.weight", 2)[0];
    DLO_CHECK(per_token > 0 && out % per_token == 0, "proj_out.weight's ", out, " rows are not a multiple of the patch's ",
              per_token, " positions");
    c.out_channels = out / per_token;
    c.text_dim = shape("condition_embedder.text_embedder.linear_1.weight", 2)[1];
    c.freq_dim = shape("condition_embedder.time_embedder.linear_1.weight", 2)[1];
    c.ffn_dim = shape("blocks.0.ffn.net.0.proj.weight", 2)[0];
    c.cross_attn_norm = shapes.count("blocks.0.norm2.weight") > 0;
    c.num_layers = 0;
    for (const auto& [name, s] : shapes)
      if (name.compare(0, 7, "blocks.") == 0) c.num_layers = std::max<std::int64_t>(c.num_layers, std::atoll(name.c_str() + 7) + 1);
    // What the shapes cannot show: the folder's config, else the known config the shapes match.
    const auto shown = shown_fields(c, dim);
    if (folder != nullptr) {
      const auto theirs = shown_fields(*folder, folder->dim());
      for (std::size_t k = 0; k < shown.size(); ++k)
        DLO_CHECK(shown[k].second == theirs[k].second, "its tensors give ", shown[k].first, " ", shown[k].second,
                  ", the model folder's transformer config has ", theirs[k].second,
                  " (a file of another model, or of another expert?)");
      c = *folder;
    } else {
      std::string known, found;
      for (const auto& name : WanTransformerConfig::preset_names()) {
        const WanTransformerConfig k = WanTransformerConfig::preset(name);
        known += (known.empty() ? "" : ", ") + name;
        if (found.empty() && shown_fields(k, k.dim()) == shown) {
          found = name;
          c = k;
        }
      }
      std::string given;
      for (const auto& [field, value] : shown) given += (given.empty() ? "" : ", ") + field + " " + value;
      DLO_CHECK(!found.empty(), "its tensors give a transformer no known config has (", given, "); known: ", known,
                ". Beside a model folder's transformer config of this shape it is read with that config");
      if (matched != nullptr) *matched = found;
    }
    // Every tensor the config implies, with its shape, and nothing else.
    std::vector<std::string> missing, misshapen, unexpected;
    std::set<std::string> expected;
    for (const auto& spec : wan_transformer_specs(c, DType::F32)) {
      expected.insert(spec.name);
      const auto it = shapes.find(spec.name);
      if (it == shapes.end())
        missing.push_back(spec.name);
      else if (it->second != spec.shape)
        misshapen.push_back(str(spec.name, " ", wan_shape_text(it->second), " (expected ", wan_shape_text(spec.shape), ")"));
    }
    for (const auto& [name, s] : shapes) {
      // A scaled fp8 file's marker and scales beside the weights they scale (checked when loaded).
      const auto scaled = wan_scaled_weight_of(name);
      if (!expected.count(name) && name != kScaledFp8Marker && !(scaled && expected.count(*scaled))) unexpected.push_back(name);
    }
    DLO_CHECK(missing.empty(), "lacks ", missing.size(), " tensor(s) of the transformer (diffusers' names): ", first_names(missing));
    DLO_CHECK(misshapen.empty(), misshapen.size(), " tensor(s) have another shape than the config's: ", first_names(misshapen));
    DLO_CHECK(unexpected.empty(), "holds ", unexpected.size(), " tensor(s) a Wan text-to-video transformer does not have ",
              "(diffusers' names): ", first_names(unexpected));
    return c;
  });
}

std::int64_t wan_tokens(const WanTransformerConfig& c, std::int64_t frames, std::int64_t height, std::int64_t width) {
  const auto& p = c.patch_size;
  return (frames / p[0]) * (height / p[1]) * (width / p[2]);
}

std::uint64_t wan_forward_working_bytes(const WanTransformerConfig& c, std::int64_t frames, std::int64_t height,
                                        std::int64_t width, std::int64_t text_len, std::int64_t branches,
                                        DType dtype) {
  const double L = static_cast<double>(wan_tokens(c, frames, height, width));
  const double D = static_cast<double>(c.dim()), F = static_cast<double>(c.ffn_dim);
  const double T = static_cast<double>(text_len), es = static_cast<double>(dtype_size(dtype));
  const double latent = static_cast<double>(frames) * static_cast<double>(height) * static_cast<double>(width);
  const double kept = 2 * L * D * es + T * D * es + T * static_cast<double>(c.text_dim) * es +
                      latent * static_cast<double>(c.in_channels) * es + latent * static_cast<double>(c.out_channels) * 4;
  const double attn = L * D * (12 + 8 * es);
  const double ffn = L * D * (8 + 2 * es) + 2 * L * F * es;
  // A fixed 256 MiB: embeddings, RoPE tables and library workspaces (the CPU measurement at small
  // latents, docs/benchmarks.md, found 276 MiB where the terms above give 170).
  const double total = 1.25 * (static_cast<double>(branches) * kept + std::max(attn, ffn)) + 268435456.0;
  return total >= 1.8e19 ? UINT64_MAX : static_cast<std::uint64_t>(total);
}

}  // namespace dlo
