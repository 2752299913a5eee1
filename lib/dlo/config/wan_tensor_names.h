// One table of the Wan transformer's tensor names: the original Wan layout (Wan-AI's own
// repositories, ComfyUI's and Kijai's single files: `blocks.N.self_attn.q.weight`, `head.head`,
// ...) against diffusers' WanTransformer3DModel (`blocks.N.attn1.to_q.weight`, `proj_out`, ...),
// both directions, with ComfyUI's `model.diffusion_model.` (or `diffusion_model.`) prefix stripped.
// Everything above io/ sees diffusers' names; loading renames once (Checkpoint::rename_tensors, a
// name map: the tensor bytes stay where they are mapped).
//
// The table maps modules, not whole names: a name is a row's module plus any tail (".weight",
// ".bias", and later a scaled file's ".scale_weight" or a LoRA's ".lora_A.weight"), so fp8 files
// and LoRA keys reuse it. Rows as diffusers' convert_wan_transformer_to_diffusers
// (loaders/single_file_utils.py) maps them, written as a table (diffusers applies ordered string
// replaces). Torch-free; thread-safe.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlo/io/safetensors.h"

namespace dlo {

// How a file names the transformer's tensors.
struct WanKeyLayout {
  bool original = false;  // original Wan names (else diffusers')
  std::string prefix;     // "", "model.diffusion_model." (ComfyUI) or "diffusion_model."
  // "diffusers", "original Wan", "ComfyUI (original Wan with 'model.diffusion_model.')", ...
  std::string describe() const;
};

// A name of the original layout (no prefix) in diffusers' layout, and back; nullopt for a name no
// row maps (a tensor the Wan transformer does not have).
std::optional<std::string> wan_original_to_diffusers(std::string_view name);
std::optional<std::string> wan_diffusers_to_original(std::string_view name);

// Whether the diffusers module `module` (a name without a tail: "blocks.3.attn1.to_q", "proj_out")
// is one of the transformer's Linears: the modules a LoRA adapts (diffusers' LoRA conversions map
// exactly these rows: every block's attention projections and feed-forward, the text, time and
// image embedders, the time projection and the output head).
bool wan_is_linear(std::string_view module);

// musubi-tuner's LoRA module names ("blocks_3_self_attn_q", "blocks_3_cross_attn_k_img",
// "blocks_3_ffn_0": a block row's original name with '_' for '.') in diffusers' names and back;
// block Linears only (diffusers' _convert_musubi_wan_lora_to_diffusers reads no others), nullopt
// for anything else.
std::optional<std::string> wan_musubi_to_diffusers(std::string_view module);
std::optional<std::string> wan_diffusers_to_musubi(std::string_view module);

// Throws dlo::Error when `path` names a PyTorch pickle (.pth, .pt, .ckpt, .bin), with the command
// that converts it: dlo reads safetensors only (loading a pickle can run code). Every reader of
// weights (transformer, LoRA) calls this first.
void refuse_pickle(const std::string& path);

// The layout of a transformer's tensor `names`: the prefix shared by the patch embedding's weight
// ("model.diffusion_model.", "diffusion_model." or none), and original names when the original
// output head ("head.head.weight") is there, diffusers' when "proj_out.weight" is. Throws
// dlo::Error naming `label` and a few of its names when neither is found (not a Wan transformer).
WanKeyLayout detect_wan_key_layout(const std::vector<std::string>& names, const std::string& label);

// Every name of `names` in diffusers' layout (old name -> diffusers name) under the layout detected
// from them. Throws dlo::Error naming `label`, the layout and the first few names that are not
// the transformer's (a name without the prefix, or one no row maps).
std::map<std::string, std::string> wan_diffusers_names(const std::vector<std::string>& names,
                                                       const std::string& label);

// A transformer's weights with diffusers' names: `path` is a diffusers transformer/ folder, a
// single .safetensors file, a *.safetensors.index.json or a folder holding one index (the
// original repositories' shards, Wan2.2's high_noise_model/ and low_noise_model/), in any layout
// wan_diffusers_names knows. Maps the files (headers read, no tensor data touched) and renames.
// A PyTorch pickle (.pth, .pt, .ckpt, .bin) is refused with the command that converts it. Throws
// dlo::Error naming the file.
Checkpoint open_wan_transformer(const std::string& path);

// A ComfyUI "scaled fp8" file's own tensors beside the transformer's (diffusers' names): the
// marker `scaled_fp8` (its dtype the fp8 kind), and beside each fp8 Linear's weight its per-tensor
// `<module>.scale_weight` (float32; the weight is fp8 x scale) and optionally `<module>.scale_input`
// (used only by fp8 matmuls, which dlo does not do).
inline constexpr const char* kScaledFp8Marker = "scaled_fp8";
// The weight a scale tensor belongs to ("blocks.0.attn1.to_q.scale_weight" ->
// "blocks.0.attn1.to_q.weight"); nullopt for any other name.
std::optional<std::string> wan_scaled_weight_of(std::string_view name);

// Name -> shape of every tensor of `ck`, for config inference.
std::map<std::string, std::vector<std::int64_t>> tensor_shapes(const Checkpoint& ck);

}  // namespace dlo
