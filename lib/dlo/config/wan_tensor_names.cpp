#include "dlo/config/wan_tensor_names.h"

#include <cctype>
#include <utility>

#include "dlo/common/error.h"

namespace dlo {
namespace {

struct Row {
  const char* original;
  const char* diffusers;
  bool linear = false;  // one of the transformer's Linears (a LoRA adapts these)
};

// Modules outside the blocks (the image rows are Wan2.1 I2V's and FLF2V's; dlo does not run them
// yet, but a file holding them is named for what it is).
constexpr Row kGlobalRows[] = {
    {"patch_embedding", "patch_embedding"},
    {"text_embedding.0", "condition_embedder.text_embedder.linear_1", true},
    {"text_embedding.2", "condition_embedder.text_embedder.linear_2", true},
    {"time_embedding.0", "condition_embedder.time_embedder.linear_1", true},
    {"time_embedding.2", "condition_embedder.time_embedder.linear_2", true},
    {"time_projection.1", "condition_embedder.time_proj", true},
    {"head.head", "proj_out", true},
    {"head.modulation", "scale_shift_table"},
    {"img_emb.proj.0", "condition_embedder.image_embedder.norm1"},
    {"img_emb.proj.1", "condition_embedder.image_embedder.ff.net.0.proj", true},
    {"img_emb.proj.3", "condition_embedder.image_embedder.ff.net.2", true},
    {"img_emb.proj.4", "condition_embedder.image_embedder.norm2"},
    {"img_emb.emb_pos", "condition_embedder.image_embedder.pos_embed"},
};

// Modules of block N, relative to "blocks.N.". The original norm3 (the affine pre-norm of the
// cross-attention) is diffusers' norm2; the original norm1 and norm2 have no parameters.
constexpr Row kBlockRows[] = {
    {"self_attn.q", "attn1.to_q", true},
    {"self_attn.k", "attn1.to_k", true},
    {"self_attn.v", "attn1.to_v", true},
    {"self_attn.o", "attn1.to_out.0", true},
    {"self_attn.norm_q", "attn1.norm_q"},
    {"self_attn.norm_k", "attn1.norm_k"},
    {"cross_attn.q", "attn2.to_q", true},
    {"cross_attn.k", "attn2.to_k", true},
    {"cross_attn.v", "attn2.to_v", true},
    {"cross_attn.o", "attn2.to_out.0", true},
    {"cross_attn.norm_q", "attn2.norm_q"},
    {"cross_attn.norm_k", "attn2.norm_k"},
    {"cross_attn.k_img", "attn2.add_k_proj", true},
    {"cross_attn.v_img", "attn2.add_v_proj", true},
    {"cross_attn.norm_k_img", "attn2.norm_added_k"},
    {"norm3", "norm2"},
    {"ffn.0", "ffn.net.0.proj", true},
    {"ffn.2", "ffn.net.2", true},
    {"modulation", "scale_shift_table"},
};

// ComfyUI's prefixes, longest first.
constexpr const char* kPrefixes[] = {"model.diffusion_model.", "diffusion_model."};

// `name` is `module` itself or `module` followed by a '.' tail: the tail ("" or ".weight", ...).
std::optional<std::string_view> tail_after(std::string_view name, std::string_view module) {
  if (module.empty() || name.substr(0, module.size()) != module) return std::nullopt;
  const std::string_view tail = name.substr(module.size());
  if (!tail.empty() && tail[0] != '.') return std::nullopt;
  return tail;
}

// A name split at its row: "blocks.N." (empty outside the blocks), the row, and the tail.
struct Match {
  std::string_view head;
  const Row* row;
  std::string_view tail;
};

// The row whose original (or diffusers) module `name` starts with.
std::optional<Match> find_row(std::string_view name, bool original) {
  const auto from = [&](const Row& r) { return std::string_view(original ? r.original : r.diffusers); };
  constexpr std::string_view kBlocks = "blocks.";
  if (name.substr(0, kBlocks.size()) == kBlocks) {
    // "blocks.<digits>." then a block row.
    std::size_t i = kBlocks.size();
    while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
    if (i == kBlocks.size() || i >= name.size() || name[i] != '.' || (name[kBlocks.size()] == '0' && i > kBlocks.size() + 1))
      return std::nullopt;
    const std::string_view head = name.substr(0, i + 1), rest = name.substr(i + 1);
    for (const Row& r : kBlockRows)
      if (const auto tail = tail_after(rest, from(r))) return Match{head, &r, *tail};
    return std::nullopt;
  }
  for (const Row& r : kGlobalRows)
    if (const auto tail = tail_after(name, from(r))) return Match{{}, &r, *tail};
  return std::nullopt;
}

std::optional<std::string> map_name(std::string_view name, bool to_diffusers) {
  const auto m = find_row(name, to_diffusers);
  if (!m) return std::nullopt;
  return std::string(m->head) + (to_diffusers ? m->row->diffusers : m->row->original) + std::string(m->tail);
}

// musubi-tuner writes a block row's original module with '_' for '.'.
std::string underscored(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c == '.') c = '_';
  return out;
}

bool holds_name(const std::vector<std::string>& names, const std::string& name) {
  for (const auto& n : names)
    if (n == name) return true;
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

std::string WanKeyLayout::describe() const {
  const std::string names = original ? "original Wan names" : "diffusers names";
  if (prefix == "model.diffusion_model.") return "ComfyUI layout (" + names + " under 'model.diffusion_model.')";
  if (!prefix.empty()) return names + " under '" + prefix + "'";
  return original ? "original Wan layout" : "diffusers layout";
}

std::optional<std::string> wan_original_to_diffusers(std::string_view name) { return map_name(name, true); }

std::optional<std::string> wan_scaled_weight_of(std::string_view name) {
  for (std::string_view tail : {".scale_weight", ".scale_input"})
    if (name.size() > tail.size() && name.substr(name.size() - tail.size()) == tail)
      return std::string(name.substr(0, name.size() - tail.size())) + ".weight";
  return std::nullopt;
}
std::optional<std::string> wan_diffusers_to_original(std::string_view name) { return map_name(name, false); }

bool wan_is_linear(std::string_view module) {
  const auto m = find_row(module, false);
  return m && m->tail.empty() && m->row->linear;
}

std::optional<std::string> wan_musubi_to_diffusers(std::string_view module) {
  constexpr std::string_view kBlocks = "blocks_";
  if (module.substr(0, kBlocks.size()) != kBlocks) return std::nullopt;
  std::size_t i = kBlocks.size();
  while (i < module.size() && std::isdigit(static_cast<unsigned char>(module[i]))) ++i;
  if (i == kBlocks.size() || i >= module.size() || module[i] != '_' || (module[kBlocks.size()] == '0' && i > kBlocks.size() + 1))
    return std::nullopt;
  const std::string_view index = module.substr(kBlocks.size(), i - kBlocks.size()), rest = module.substr(i + 1);
  for (const Row& r : kBlockRows)
    if (r.linear && underscored(r.original) == rest) return "blocks." + std::string(index) + "." + r.diffusers;
  return std::nullopt;
}

std::optional<std::string> wan_diffusers_to_musubi(std::string_view module) {
  const auto m = find_row(module, false);
  if (!m || m->head.empty() || !m->tail.empty() || !m->row->linear) return std::nullopt;
  return underscored(m->head) + underscored(m->row->original);
}

void refuse_pickle(const std::string& path) {
  for (const char* pickle : {".pth", ".pt", ".ckpt", ".bin"})
    DLO_CHECK(!has_suffix(path, pickle), "'", path, "' is a PyTorch pickle; dlo reads safetensors only (a pickle ",
              "can run code when loaded). Convert it once with the venv's torch: python tools/pickle_to_safetensors.py '",
              path, "' OUT.safetensors");
}

WanKeyLayout detect_wan_key_layout(const std::vector<std::string>& names, const std::string& label) {
  WanKeyLayout l;
  for (const char* p : kPrefixes)
    if (holds_name(names, std::string(p) + "patch_embedding.weight")) {
      l.prefix = p;
      break;
    }
  const bool original = holds_name(names, l.prefix + "head.head.weight"), diffusers = holds_name(names, l.prefix + "proj_out.weight");
  DLO_CHECK(holds_name(names, l.prefix + "patch_embedding.weight") && original != diffusers, label,
            ": not a Wan transformer in a layout dlo knows (diffusers', original Wan, ComfyUI's): it has ",
            names.empty() ? std::string("no tensors")
                          : str(names.size(), " tensor(s), e.g. ", some_names(names, 4)),
            ", but not 'patch_embedding.weight' with either 'proj_out.weight' (diffusers) or 'head.head.weight' "
            "(original Wan), also under 'model.diffusion_model.'");
  l.original = original;
  return l;
}

std::map<std::string, std::string> wan_diffusers_names(const std::vector<std::string>& names, const std::string& label) {
  const WanKeyLayout l = detect_wan_key_layout(names, label);
  std::map<std::string, std::string> out;
  std::vector<std::string> unknown;
  for (const auto& n : names) {
    std::optional<std::string> mapped;
    if (n == kScaledFp8Marker) {  // ComfyUI writes it under its prefix; accepted without too
      mapped = n;
    } else if (n.compare(0, l.prefix.size(), l.prefix) == 0) {
      const std::string_view bare = std::string_view(n).substr(l.prefix.size());
      // diffusers' own names are kept as they are, but only those the table knows.
      if (bare == kScaledFp8Marker)
        mapped = std::string(bare);
      else
        mapped = l.original ? wan_original_to_diffusers(bare)
                            : (wan_diffusers_to_original(bare) ? std::optional<std::string>(std::string(bare)) : std::nullopt);
    }
    if (mapped)
      out[n] = *mapped;
    else
      unknown.push_back(n);
  }
  DLO_CHECK(unknown.empty(), label, ": ", unknown.size(), " tensor(s) are not the Wan transformer's in the ",
            l.describe(), " detected: ", some_names(unknown));
  return out;
}

Checkpoint open_wan_transformer(const std::string& path) {
  refuse_pickle(path);
  Checkpoint ck = Checkpoint::open(path);
  std::vector<std::string> names;
  for (const TensorInfo* t : ck.tensors()) names.push_back(t->name);
  const auto renamed = wan_diffusers_names(names, ck.source());
  ck.rename_tensors([&](const std::string& n) { return renamed.at(n); });
  return ck;
}

std::map<std::string, std::vector<std::int64_t>> tensor_shapes(const Checkpoint& ck) {
  std::map<std::string, std::vector<std::int64_t>> out;
  for (const TensorInfo* t : ck.tensors()) out[t->name] = t->shape;
  return out;
}

}  // namespace dlo
