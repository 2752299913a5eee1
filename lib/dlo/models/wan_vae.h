// The Wan VAE decoder (Wan2.1's, and Wan2.2's residual one with its pixel patchify), equal to
// diffusers' AutoencoderKLWan.decode (diffusers 0.42.1).
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
// dtype policy follows diffusers: everything runs in the VAE's dtype (normally fp32), except that
// RMS norms normalise in fp32 and the nearest upsampling runs in fp32 for fp16/bf16.
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

// Per-decode state: one cache per cached conv, in diffusers' call order.
struct WanVaeDecodeState {
  std::vector<WanCausalCache> caches;
  std::size_t next = 0;    // index of the next cache during a chunk
  std::int64_t chunks = 0;  // chunks decoded so far (chunk 0 is diffusers' first_chunk)
  WanCausalCache& take();
};

// [WanDecoder3d.forward with feat_cache] One chunk (normally 1 latent frame, after
// post_quant_conv) through the decoder, updating `state`. Thread-compatible.
at::Tensor wan_vae_decoder_chunk(const WanVaeDecoderWeights& w, const at::Tensor& x, WanVaeDecodeState& state);

// ---------------------------------------------------------------------------------------------
// Model

class WanVae {
 public:
  // Loads `dir` (a diffusers vae/ folder: config.json + safetensors). Decoder weights are views
  // into the mapping when the checkpoint's dtype is `compute`, else converted copies. Throws
  // dlo::Error naming the folder and the field or tensor.
  static WanVae load(const std::string& dir, at::ScalarType compute);
  // The same for weights of `config` at `weights`: anything open_wan_vae opens (a vae/ folder, a
  // single file, an index; diffusers' or the original Wan2.1 / Wan2.2 VAE names, read as diffusers').
  static WanVae load(const std::string& weights, const WanVaeConfig& config, at::ScalarType compute);
  // The checks load() makes of the folder (its config, every tensor's name and shape), reading
  // the checkpoint's header only: for the start of a batch, before any work. Throws as load().
  static void check_checkpoint(const std::string& dir);
  static void check_checkpoint(const std::string& weights, const WanVaeConfig& config);

  const WanVaeConfig& config() const { return config_; }
  at::ScalarType compute_dtype() const { return compute_; }
  const WeightStore& weights() const { return store_; }
  const WanVaeDecoderWeights& decoder() const { return w_; }
  // Moves the decoder's weights to `device`: decode and decode_frames then run there (latents on
  // any device are moved first); the frames they hand out are on `device`.
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

 private:
  WanVae(WanVaeConfig c, WeightStore store, at::ScalarType compute)
      : config_(std::move(c)), store_(std::move(store)), compute_(compute) {}
  void check_latents(const at::Tensor& z) const;
  WanVaeConfig config_;
  WeightStore store_;
  at::ScalarType compute_;
  at::Device device_ = at::kCPU;
  WanVaeDecoderWeights w_;
};

}  // namespace dlo
