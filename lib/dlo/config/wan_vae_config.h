// The Wan VAE's config (diffusers' AutoencoderKLWan config.json) and its checkpoint's tensor names
// and shapes. Torch-free; models/wan_vae.h decodes with it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dlo/io/dtype.h"
#include "dlo/io/json_config.h"
#include "dlo/io/tensor_spec.h"

namespace dlo {

struct WanVaeConfig {
  std::int64_t base_dim = 96;
  std::optional<std::int64_t> decoder_base_dim;  // null: base_dim
  std::int64_t z_dim = 16;
  std::vector<std::int64_t> dim_mult{1, 2, 4, 4};
  std::int64_t num_res_blocks = 2;
  std::vector<double> attn_scales;  // encoder only (the decoder has no attention outside its mid block)
  std::vector<bool> temperal_downsample{false, true, true};  // diffusers' spelling
  double dropout = 0.0;                                      // inference: no effect
  std::vector<double> latents_mean;                          // z_dim entries (defaults: the Wan2.1 VAE's)
  std::vector<double> latents_std;
  // Wan2.2's VAE: residual down/up blocks (AvgDown3D / DupUp3D shortcuts, upsamplers that keep
  // the channels) and a pixel patchify of patch_size x patch_size around the encoder/decoder.
  bool is_residual = false;
  std::optional<std::int64_t> patch_size;  // null: none (Wan2.1)
  std::int64_t in_channels = 3;            // the (patchified) encoder input: 3 * patch^2
  std::int64_t out_channels = 3;           // the decoder output before unpatchify: 3 * patch^2
  std::int64_t scale_factor_temporal = 4;  // agrees with temperal_downsample (from_json follows that)
  std::int64_t scale_factor_spatial = 8;   // agrees with dim_mult and patch_size (from_json follows that)
  // What from_json() accepted but a user should hear about, one sentence each (the library does
  // not print; apps do): e.g. a scale_factor_temporal that disagrees with temperal_downsample.
  std::vector<std::string> warnings;

  WanVaeConfig();

  std::int64_t decoder_dim() const { return decoder_base_dim.value_or(base_dim); }
  std::int64_t patch() const { return patch_size.value_or(1); }
  // Channels of a decoded video: out_channels / patch^2 (3 for RGB).
  std::int64_t video_channels() const { return out_channels / (patch() * patch()); }
  // Channels of the decoder stages: [dim * dim_mult[-1]] + [dim * m for m in reversed(dim_mult)].
  std::vector<std::int64_t> decoder_dims() const;
  // Input channels of decoder up block i: decoder_dims()[i], halved for i > 0 in the Wan2.1 VAE
  // (whose upsamplers output dim // 2; the residual VAE's keep dim).
  std::int64_t up_block_in_dim(std::size_t i) const;
  // temperal_downsample reversed: up block i doubles the frames iff it is true (and i < last).
  std::vector<bool> temperal_upsample() const;
  // Video frames decoded from `latent_frames` (>= 1): 1 + (latent_frames - 1) * 2^(#temporal ups).
  std::int64_t output_frames(std::int64_t latent_frames) const;

  // Reads a diffusers vae/config.json. Throws dlo::Error naming the file and field for missing,
  // mistyped, unknown, unsupported or inconsistent values.
  static WanVaeConfig from_json(const JsonConfig& json);
  // "wan-vae-test" (diffusers' VAE unit-test config: base_dim 3, dim_mult [1,1,1,1], 1 res block),
  // "wan2.1-vae-small" (the real structure with base_dim 16), "wan2.1-vae" (the real Wan2.1 VAE),
  // "wan2.2-vae" (the real Wan2.2 VAE of TI2V-5B: residual, patch 2, z_dim 48, 16x spatial) and
  // "wan2.2-vae-test" (its structure with base_dim 8, decoder_base_dim 16, z_dim 12).
  static WanVaeConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  // Checks consistency. Throws dlo::Error naming `where` and the field.
  void validate(const std::string& where) const;
  // config.json text as diffusers writes it (keys sorted).
  std::string to_json() const;
};

// Every tensor of a diffusers AutoencoderKLWan checkpoint (encoder, quant_conv, post_quant_conv,
// decoder), with the given dtype. With include_encoder=false, only post_quant_conv and decoder.
std::vector<TensorSpec> wan_vae_specs(const WanVaeConfig& c, DType dtype, bool include_encoder = true);

// What one WanVae::encode of a [1, video channels, frames, height, width] video holds at its peak,
// in bytes, beyond the video itself and the weights, with elements of `element_bytes` (the VAE's
// dtype: 4 for fp32, 2 for bf16); B videos take B times as much. Counted from the tensors encode
// allocates (models/wan_vae.cpp) at its largest moment: a cached conv of a 4-frame chunk in the
// first stage at full resolution (for the real VAEs: the second conv of a residual block, or
// conv_in of the 12 patchified channels), with every cache carried between chunks alive. Checked
// against the CPU allocator's measured peak (tests/models/test_wan_vae.cpp: within 0.3 %, the bar 3 %).
// Torch-free.
struct WanVaeEncodeMemory {
  // Every cached conv's last 2 frames of input (1 while the second chunk runs) and every temporal
  // downsampler's last frame, carried from chunk to chunk.
  std::uint64_t caches = 0;
  // At the largest moment: the conv's input zero-padded (2 frames in front, a pixel around), its
  // output, its new cache, and what the residual block holds meanwhile (its input, its shortcut,
  // the residual stage's input).
  std::uint64_t working = 0;
  // At that moment, the CPU's conv3d column buffer (libtorch's slow_conv3d: in channels x 27 x
  // frames x height x width, the largest term for the real VAEs); CUDA's convolutions do not make it.
  std::uint64_t columns = 0;
  // The patchified copy of the video (a patch_size VAE; a video in another dtype than the VAE's
  // adds its converted copy, not counted), and the latents.
  std::uint64_t video = 0;
  std::uint64_t host() const { return caches + working + columns + video; }   // encode on the CPU
  std::uint64_t device() const { return caches + working + video; }            // on a CUDA device
};
WanVaeEncodeMemory wan_vae_encode_memory(const WanVaeConfig& c, std::int64_t frames, std::int64_t height,
                                         std::int64_t width, std::int64_t element_bytes);

// The config of the VAE whose tensors are `shapes` (diffusers name -> shape; named `label` in
// errors). The shapes show z_dim (post_quant_conv), base_dim and in_channels (encoder.conv_in),
// the decoder's width (decoder.conv_in), out_channels (decoder.conv_out), the stages (decoder up
// blocks), num_res_blocks (the decoder's first stage's blocks - 1) and is_residual (the Wan2.2
// VAE's nested encoder blocks). The statistics (latents_mean/std) they cannot show come from
// `folder` (the model folder's vae config) when there is one, whose every field the shapes show
// must agree: a difference is an error naming the field. Without one, the tensors must be exactly
// a known config's (`preset_names`: the Wan2.1 VAE, the Wan2.2 VAE, and the test shapes):
// `matched` gets its name, and any other is refused naming what the shapes show. Then every
// tensor the config implies (encoder included) must be there with its shape, and no other (the
// first few missing, unexpected or misshapen named). Throws dlo::Error.
WanVaeConfig infer_wan_vae_config(const std::map<std::string, std::vector<std::int64_t>>& shapes,
                                  const WanVaeConfig* folder, const std::string& label, std::string* matched = nullptr);

}  // namespace dlo
