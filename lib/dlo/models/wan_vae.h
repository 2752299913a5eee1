// The Wan VAE (Wan2.1's, and Wan2.2's residual one with its pixel patchify): the decoder, equal to
// diffusers' AutoencoderKLWan.decode, and the encoder, equal to AutoencoderKLWan.encode's posterior
// mean (diffusers 0.42.1).
//
// Weights are data, layers are functions: WanVaeDecoderWeights is a plain struct of tensors (views
// into the mmap'ed checkpoint when dtypes agree); the layer functions below take weights and
// activations and own nothing.
//
// Decoding is causal in time and runs one latent frame at a time, exactly as diffusers' _decode:
// every cached causal convolution keeps the last (up to) 2 frames of its input in a WanCausalCache,
// and the two temporal upsamplers skip their time_conv on latent frame 0 (diffusers' "Rep" rule),
// so F latent frames give 1 + 4 (F - 1) video frames (real config). Working memory is one chunk's
// activations plus the caches; only the output grows with the number of frames, and
// decode_frames() streams it so not even that has to be held.
//
// De-normalisation: the transformer produces *normalised* latents; WanPipeline turns them into the
// VAE's latent space with `latents / (1 / latents_std) + latents_mean` before vae.decode().
// denormalize() is that step, decode() is vae.decode(); dlo-forward's "vae" component runs both.
//
// Encoding (image to video's condition) is causal too, in chunks exactly as diffusers' _encode:
// frame 0 alone, then 4 frames at a time, every cached conv's cache and every temporal
// downsampler's last frame carried from chunk to chunk; F = 1 + 4k video frames give
// 1 + k 4 / scale_factor_temporal latent frames (1 + k for the real configs). encode() returns the
// posterior mean (`retrieve_latents(vae.encode(x), sample_mode="argmax")`, i.e.
// latent_dist.mode()); normalize() is WanImageToVideoPipeline's `(latents - latents_mean) *
// (1 / latents_std)` on it. The encoder is loaded only when asked for (WanVaeParts): text to video
// needs the decoder alone.
//
// dtype policy follows diffusers: everything runs in the VAE's dtype (normally fp32), except that
// RMS norms normalise in fp32 and the nearest upsampling runs in fp32 for fp16/bf16;
// normalize() computes in fp32, as the pipeline does.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlo/config/wan_vae_config.h"
#include "dlo/io/dtype.h"
#include "dlo/models/weights.h"

namespace dlo {

// ---------------------------------------------------------------------------------------------
// Weights

struct WanVaeConv {
  at::Tensor w, b;
};
struct WanVaeResBlockWeights {
  at::Tensor norm1, norm2;  // gamma [C, 1, 1, 1]
  WanVaeConv conv1, conv2;
  WanVaeConv shortcut;  // undefined when in == out channels
};
struct WanVaeAttnWeights {
  at::Tensor norm;  // gamma [C, 1, 1]
  WanVaeConv to_qkv, proj;
};
enum class WanVaeUpsample { kNone, kSpatial, kTemporal };  // diffusers: None, upsample2d, upsample3d
struct WanVaeUpBlockWeights {
  std::vector<WanVaeResBlockWeights> resnets;
  WanVaeUpsample mode = WanVaeUpsample::kNone;
  WanVaeConv resample;   // Conv2d after the 2x nearest upsampling (unless kNone)
  WanVaeConv time_conv;  // kTemporal only: causal (3,1,1) conv to 2x channels
  // Wan2.2 (WanResidualUpBlock): the block's input, repeated `shortcut_repeats` times per channel
  // and unpacked into 2x2 pixels (x2 frames for kTemporal), is added to its output (DupUp3D).
  bool shortcut = false;
  std::int64_t shortcut_out = 0, shortcut_repeats = 0;
};
struct WanVaeDecoderWeights {
  WanVaeConv post_quant_conv, conv_in;
  WanVaeResBlockWeights mid_res0, mid_res1;
  WanVaeAttnWeights mid_attn;
  std::vector<WanVaeUpBlockWeights> up_blocks;
  at::Tensor norm_out;
  WanVaeConv conv_out;
};

enum class WanVaeDownsample { kNone, kSpatial, kTemporal };  // diffusers: None, downsample2d, downsample3d
// One stage of the encoder: Wan2.1's down_blocks entries of that stage (its residual blocks, then
// its WanResample), or Wan2.2's WanResidualDownBlock.
struct WanVaeDownBlockWeights {
  std::vector<WanVaeResBlockWeights> resnets;
  WanVaeDownsample mode = WanVaeDownsample::kNone;
  WanVaeConv resample;   // Conv2d of stride 2 after zero-padding right and bottom by 1 (unless kNone)
  WanVaeConv time_conv;  // kTemporal only: causal (3,1,1) conv of stride 2 in time, after `resample`
  // Wan2.2 (WanResidualDownBlock): the stage's input, averaged over groups of channels x
  // factor_t frames x factor_s^2 pixels into shortcut_out channels, is added to its output (AvgDown3D).
  bool shortcut = false;
  std::int64_t shortcut_out = 0, factor_t = 1, factor_s = 1;
};
struct WanVaeEncoderWeights {
  WanVaeConv conv_in;
  std::vector<WanVaeDownBlockWeights> down_blocks;  // one per stage (dim_mult entry)
  WanVaeResBlockWeights mid_res0, mid_res1;
  WanVaeAttnWeights mid_attn;
  at::Tensor norm_out;
  WanVaeConv conv_out;    // to 2 z_dim channels: mean | logvar
  WanVaeConv quant_conv;  // 1x1x1, after the chunks are joined
};

// Which parts of the VAE WanVae::load builds (the others' tensors are checked, not read).
enum class WanVaeParts { kDecoder, kEncoder, kEncoderAndDecoder };

// ---------------------------------------------------------------------------------------------
// Layers (diffusers' module names in brackets). All take and return [B, C, T, H, W].

// One cached causal convolution's history (an entry of diffusers' feat_cache).
struct WanCausalCache {
  at::Tensor frames;  // the last (up to) 2 frames of the conv's input; undefined before chunk 0
  bool rep = false;   // a temporal upsampler that has seen chunk 0 ("Rep")
};

// [WanCausalConv3d] Conv3d with zero padding (pw, pw, ph, ph, 2 pt, 0): `pad` = {pt, ph, pw}. With
// a defined `history` (T_h frames, only used if pt > 0) it runs on cat(history, x) and pads
// 2 pt - T_h zero frames in front instead. Pass `x` by std::move to let its memory go before the
// convolution runs.
at::Tensor wan_causal_conv3d(at::Tensor x, const WanVaeConv& conv, std::array<std::int64_t, 3> pad,
                             const at::Tensor& history = {});
// The cached call of a causal conv (conv_in, resnet convs, conv_out): runs it with the cache's
// frames as history and updates the cache to the last 2 frames of the stream seen so far.
at::Tensor wan_cached_causal_conv3d(at::Tensor x, const WanVaeConv& conv, std::array<std::int64_t, 3> pad,
                                    WanCausalCache& cache);
// [WanRMS_norm] F.normalize over channels * sqrt(C) * gamma (fp32 normalisation for fp16/bf16).
at::Tensor wan_vae_rms_norm(const at::Tensor& x, const at::Tensor& gamma);

// Per-decode (or per-encode) state: one cache per cached conv (and temporal resampler), in
// diffusers' call order.
struct WanVaeDecodeState {
  std::vector<WanCausalCache> caches;
  std::size_t next = 0;    // index of the next cache during a chunk
  std::int64_t chunks = 0;  // chunks decoded so far (chunk 0 is diffusers' first_chunk)
  WanCausalCache& take();
};
using WanVaeEncodeState = WanVaeDecodeState;

// [WanDecoder3d.forward with feat_cache] One chunk (normally 1 latent frame, after
// post_quant_conv) through the decoder, updating `state`. Thread-compatible.
at::Tensor wan_vae_decoder_chunk(const WanVaeDecoderWeights& w, const at::Tensor& x, WanVaeDecodeState& state);
// [WanEncoder3d.forward with feat_cache] One chunk of (patchified) video frames through the
// encoder, before quant_conv: [B, 2 z_dim, T', H / 2^(stages-1), W / 2^(stages-1)], updating
// `state`. diffusers' chunks are frame 0, then 4 frames at a time. Thread-compatible.
at::Tensor wan_vae_encoder_chunk(const WanVaeEncoderWeights& w, const at::Tensor& x, WanVaeEncodeState& state);
// [patchify] [B, C, T, H p, W p] -> [B, C p p, T, H, W], channel c p p + pw p + ph (the pixel's
// column offset before its row offset, as diffusers packs them).
at::Tensor wan_vae_patchify(const at::Tensor& x, std::int64_t p);

// ---------------------------------------------------------------------------------------------
// Model

class WanVae {
 public:
  // Loads `dir` (a diffusers vae/ folder: config.json + safetensors). The weights are views
  // into the mapping when the checkpoint's dtype is `compute`, else converted copies. Throws
  // dlo::Error naming the folder and the field or tensor.
  // `parts`: what is built (the decoder by default; text to video needs nothing else); every
  // tensor of the checkpoint is checked either way.
  static WanVae load(const std::string& dir, at::ScalarType compute, WanVaeParts parts = WanVaeParts::kDecoder);
  // The same for weights of `config` at `weights`: anything open_wan_vae opens (a vae/ folder, a
  // single file, an index; diffusers' or the original Wan2.1 / Wan2.2 VAE names, read as diffusers').
  static WanVae load(const std::string& weights, const WanVaeConfig& config, at::ScalarType compute,
                     WanVaeParts parts = WanVaeParts::kDecoder);
  // The checks load() makes of the folder (its config, every tensor's name and shape), reading
  // the checkpoint's header only: for the start of a batch, before any work. Throws as load().
  static void check_checkpoint(const std::string& dir);
  static void check_checkpoint(const std::string& weights, const WanVaeConfig& config);

  const WanVaeConfig& config() const { return config_; }
  at::ScalarType compute_dtype() const { return compute_; }
  const WeightStore& weights() const { return store_; }
  const WanVaeDecoderWeights& decoder() const { return w_; }
  const WanVaeEncoderWeights& encoder() const { return enc_; }
  bool has_decoder() const { return parts_ != WanVaeParts::kEncoder; }
  bool has_encoder() const { return parts_ != WanVaeParts::kDecoder; }
  // Moves the loaded weights to `device`: decode, decode_frames and encode then run there (inputs
  // on any device are moved first); what they hand out is on `device`.
  void to_device(at::Device device);
  at::Device device() const { return device_; }

  // WanPipeline's de-normalisation: latents.to(dtype) / (1 / latents_std) + latents_mean, in the
  // VAE's dtype. latents: [B, z_dim, F, H, W] as the transformer outputs them.
  at::Tensor denormalize(const at::Tensor& latents) const;
  // diffusers' vae.decode(z).sample: [B, video_channels, output_frames(F), H * s, W * s] in [-1, 1],
  // in the VAE's dtype (s = scale_factor_spatial). z: [B, z_dim, F, H, W], de-normalised.
  // Throws dlo::Error naming `latents` for a bad shape. Thread-safe (no shared mutable state).
  at::Tensor decode(const at::Tensor& z) const;
  // The same, streamed: `sink(first_frame, frames)` receives each chunk's clamped frames
  // [B, video_channels, n, H * s, W * s] in order (n = 1 for latent frame 0, else 2^(#temporal ups)),
  // unpatchified when the config has a patch_size.
  // The tensor is only valid during the call. decode() is this plus one preallocated output.
  void decode_frames(const at::Tensor& z,
                     const std::function<void(std::int64_t first_frame, const at::Tensor& frames)>& sink) const;

  // diffusers' `vae.encode(video).latent_dist.mode()` (the posterior mean, what the I2V pipeline's
  // retrieve_latents(..., sample_mode="argmax") gives): [B, z_dim, 1 + (F - 1) 4 /
  // scale_factor_temporal, H / s, W / s] in the VAE's dtype (s = scale_factor_spatial). video:
  // [B, video_channels, F, H, W] in [-1, 1], F = 1 + 4k (diffusers would drop the frames past the
  // last such count; refused here), H and W at least 2^(stages-1) patches (and multiples of it for
  // the residual VAE, whose AvgDown3D regroups pixels), in patches of patch_size. Throws
  // dlo::Error naming `video` for a bad shape, and when the encoder was not loaded (WanVaeParts).
  // Thread-safe.
  at::Tensor encode(const at::Tensor& video) const;
  // WanImageToVideoPipeline's normalisation of the encoded condition: latents.to(fp32), then
  // (latents - latents_mean) * (1 / latents_std), in fp32 (whatever the VAE's dtype).
  at::Tensor normalize(const at::Tensor& latents) const;

 private:
  WanVae(WanVaeConfig c, WeightStore store, at::ScalarType compute, WanVaeParts parts)
      : config_(std::move(c)), store_(std::move(store)), compute_(compute), parts_(parts) {}
  void check_latents(const at::Tensor& z) const;
  void check_video(const at::Tensor& video) const;
  WanVaeConfig config_;
  WeightStore store_;
  at::ScalarType compute_;
  WanVaeParts parts_;
  at::Device device_ = at::kCPU;
  WanVaeDecoderWeights w_;
  WanVaeEncoderWeights enc_;
};

}  // namespace dlo
