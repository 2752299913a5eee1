// One table of the Wan VAE's tensor names: the original Wan layout (Wan-AI's Wan2.1_VAE.pth and
// Wan2.2_VAE.pth, ComfyUI's wan_2.1_vae / wan2.2_vae and Kijai's Wan2_1_VAE / Wan2_2_VAE files:
// `decoder.upsamples.4.residual.0.gamma`, `conv2`, ...) against diffusers' AutoencoderKLWan
// (`decoder.up_blocks.1.resnets.0.norm1.gamma`, `post_quant_conv`, ...), both directions, for the
// Wan2.1 VAE and the Wan2.2 VAE (TI2V-5B's: residual blocks, one nesting level deeper in the
// original). Everything above io/ sees diffusers' names; loading renames once
// (Checkpoint::rename_tensors: the tensor bytes stay where they are mapped).
//
// Rows as diffusers maps them: convert_wan_vae_to_diffusers (loaders/single_file_utils.py, the
// Wan2.1 VAE) and convert_vae_22 (scripts/convert_wan_to_diffusers.py, the Wan2.2 VAE), written
// as a table of modules plus any tail (".weight", ".bias", ".gamma"). The original decoder (and the
// Wan2.2 encoder's resamplers) number their modules in one flat list, so the mapping needs the
// number of residual blocks per stage; detect_wan_vae_layout reads it from the names. ComfyUI's
// and Kijai's VAE files carry no prefix. Torch-free; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlo/io/safetensors.h"

namespace dlo {

// How a file names the VAE's tensors.
struct WanVaeKeyLayout {
  bool original = false;            // original Wan names (else diffusers')
  bool wan22 = false;               // the Wan2.2 VAE's module tree (else the Wan2.1 VAE's)
  std::int64_t num_res_blocks = 2;  // residual blocks per encoder stage (the decoder's have one more)
  // "original Wan2.1 VAE layout", "diffusers layout (Wan2.2 VAE)", ...
  std::string describe() const;
};

// A name of the original layout `layout` describes in diffusers' layout, and back (`layout` then
// says which original tree to write: Wan2.1's or Wan2.2's, and its num_res_blocks); nullopt for a
// name no row maps (a tensor the VAE does not have, or a block index past the stage).
std::optional<std::string> wan_vae_original_to_diffusers(std::string_view name, const WanVaeKeyLayout& layout);
std::optional<std::string> wan_vae_diffusers_to_original(std::string_view name, const WanVaeKeyLayout& layout);

// The layout of a VAE's tensor `names`: original names when "decoder.conv1.weight" is there,
// diffusers' when "decoder.conv_in.weight" is; the Wan2.2 tree when the encoder's first stage has
// nested residual blocks ("encoder.downsamples.0.downsamples.0." / "encoder.down_blocks.0.resnets.0.");
// num_res_blocks from the decoder's first stage (which holds num_res_blocks + 1). Throws
// dlo::Error naming `label` and a few of its names when neither is found (not a Wan VAE).
WanVaeKeyLayout detect_wan_vae_layout(const std::vector<std::string>& names, const std::string& label);

// Every name of `names` in diffusers' layout (old name -> diffusers name) under the layout detected
// from them (stored in `*layout` when given). Throws dlo::Error naming `label`, the layout and the
// first few names that are not the VAE's.
std::map<std::string, std::string> wan_vae_diffusers_names(const std::vector<std::string>& names,
                                                           const std::string& label,
                                                           WanVaeKeyLayout* layout = nullptr);

// A VAE's weights with diffusers' names: `path` is a diffusers vae/ folder, a single .safetensors
// file or an index, in any layout wan_vae_diffusers_names knows. Maps the files (headers read, no
// tensor data touched) and renames. A PyTorch pickle (.pth, .pt, .ckpt, .bin) is refused with the
// command that converts it. Throws dlo::Error naming the file.
Checkpoint open_wan_vae(const std::string& path);

}  // namespace dlo
