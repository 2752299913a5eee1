// LoRA files for the Wan transformer, read exactly as diffusers reads them
// (WanLoraLoaderMixin.lora_state_dict, diffusers 0.42.1, then PEFT 0.21.2's scaling rule), in the
// layouts users have:
//   diffusers/PEFT   `transformer.blocks.N.attn1.to_q.lora_A.weight`, `.lora_B.weight`, `.lora_B.bias`,
//                    with diffusers' `lora_adapter_metadata` (the LoraConfig) where diffusers wrote it;
//   ComfyUI/Kijai    `diffusion_model.blocks.N.self_attn.q.lora_down|lora_up|lora_A|lora_B.weight`, `.alpha`,
//                    `.diff_b`, `head.head.diff` (also lightx2v's and Wan2.2-Lightning's files), as diffusers'
//                    _convert_non_diffusers_wan_lora_to_diffusers reads them;
//   musubi-tuner     `lora_unet_blocks_N_self_attn_q.lora_down.weight`, `.lora_up.weight`, `.alpha`
//                    (_convert_musubi_wan_lora_to_diffusers).
// Where dlo differs from diffusers it refuses what diffusers would load wrongly or not at all, and
// reads two things diffusers fails on later: a diff_b on some modules only (the others get no bias;
// diffusers' PEFT leaves their bias on the meta device), and a musubi file with only some modules
// (diffusers wants every module of blocks 0..n-1).
// Module names map through the one name table (config/wan_tensor_names.h). Reading is separate
// from applying: the fused merge and the per-job adapters take a LoraFile.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/config/wan_transformer_config.h"

namespace dlo {

struct LoraModule {
  at::Tensor down;       // lora_A.weight [r, in]: the checkpoint's alpha baked in as diffusers does (in the file's dtype)
  at::Tensor up;         // lora_B.weight [out, r]
  at::Tensor bias;       // lora_B.bias [out] (a diff_b), or undefined
  double scaling = 1.0;  // PEFT's lora_alpha / r for this module (1 for converted files; a diffusers-format file's metadata may say otherwise)
};

struct LoraFile {
  std::string path;
  std::string layout;                          // "diffusers/PEFT", "ComfyUI/Kijai (diffusion_model.)", "musubi (lora_unet_)"
  std::map<std::string, LoraModule> modules;   // diffusers module name relative to the transformer: "blocks.0.attn1.to_q", "proj_out", ...
  std::vector<std::string> ignored;            // the file's keys diffusers ignores (full-weight .diff deltas, diff_m, norm diffs): the caller warns naming them
};

// Reads the LoRA .safetensors at `path` in any layout above. The tensors are diffusers'
// lora_state_dict's, bit for bit, in private memory (CPU, the file's dtypes): an `.alpha` is baked
// into down and up as diffusers does, scale = alpha / rank split into powers of two
// (lora_alpha_split), multiplied in the file's dtype; `head.head.diff` (with its `head.head.diff_b`)
// becomes proj_out with down = the diff and up = the identity. `scaling` is what PEFT's
// module.scaling[adapter] is after load_lora_weights: 1 unless a diffusers-format file's
// metadata says otherwise (its r / lora_alpha / rank_pattern / alpha_pattern / use_rslora).
// Keys diffusers drops (full-weight `.diff` deltas and `.diff_m`, diff keys of norms, AccVideo's
// time_projection biases without weights, diff_b of an image-embedder Linear without up, biases a
// metadata with lora_bias false does not load) are listed in `ignored`.
// Throws dlo::Error naming the file: a pickle (refuse_pickle); keys that match nothing (the first
// few listed, with the layout detected); a module with down but no up or the reverse (or a bias,
// or an alpha, without both); down/up of another rank or not 2-D; an alpha diffusers raises on
// (outside the blocks' Linears, or missing in a musubi file); a ComfyUI-layout file without block
// keys or a head.head.diff without head.head.diff_b (diffusers raises); DoRA (`dora_scale`,
// `lora_magnitude_vector`: dlo does not apply DoRA, and diffusers drops its magnitudes only in the
// diffusers layout and fails on the others, so no reading gives what the LoRA was trained as);
// a metadata rank that is not the tensors' (PEFT fails to load it). Thread-safe.
// kShapes reads the header (and the alphas) only: the same checks, the same modules and scalings,
// down/up/bias meta tensors of the shapes and dtypes kTensors gives (what the memory plan counts).
enum class LoraRead { kTensors, kShapes };
LoraFile read_wan_lora(const std::string& path, LoraRead what = LoraRead::kTensors);

// diffusers' split of `alpha` / `rank` into (down factor, up factor): powers of two apart, the up
// factor at most 1 ("scale_down, scale_up = scale, 1; while scale_down * 2 < scale_up: ..."), e.g.
// alpha 8, rank 64 -> (0.25, 0.5); alpha == rank -> (1, 1).
std::pair<double, double> lora_alpha_split(double alpha, std::int64_t rank);

// Checks `f` against a transformer of config `c`: every module is one of c's Linears (blocks
// within num_layers) and down's in-features / up's out-features (and bias) match that Linear's
// shape. Throws dlo::Error naming the file, the module and both shapes (e.g. a 14B LoRA on a 1.3B
// model).
void check_wan_lora(const LoraFile& f, const WanTransformerConfig& c);

// `f`'s tensors in the diffusers/PEFT layout, as lora_state_dict names them:
// "transformer.<module>.lora_A.weight", ".lora_B.weight" and ".lora_B.bias" (where there is one).
std::vector<std::pair<std::string, at::Tensor>> wan_lora_peft_tensors(const LoraFile& f);

}  // namespace dlo
