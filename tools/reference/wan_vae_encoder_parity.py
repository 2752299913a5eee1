#!/usr/bin/env python3
"""Parity of dlo's Wan VAE encoder (Wan2.1's; Wan2.2's residual one with its 2x2 patchify) against
diffusers' AutoencoderKLWan.encode, as WanImageToVideoPipeline.prepare_latents uses it.

Writes a random-weight VAE with `dlo-checkpoint make --components vae` (or, with --diffusers-init,
diffusers' own AutoencoderKLWan(**JSON) written by save_pretrained), random videos in [-1, 1] (or,
with --i2v-condition, the pipeline's condition video: frame 0 random, the others zeros) of each
frame count of --frames, runs `dlo-forward --component vae_encoder` on each and, on the same
folder and video, the pipeline's steps in diffusers:

    video = video.to(vae.dtype)
    latents = retrieve_latents(vae.encode(video), sample_mode="argmax")   # latent_dist.mode() = mean
    normalized = (latents.to(float32) - mean) * (1.0 / std)              # mean, std: float32 [1, z, 1, 1, 1]

and compares both outputs (latents, latents_normalized). Exit 0 when both are within --tol
(||ours - ref|| / ||ref||; 0 demands bitwise equality) for every frame count, else 1.

  wan_vae_encoder_parity.py --bin build/bin --vae-preset wan-vae-test --frames 1,5,9 --height 16 --width 24 --tol 0
"""
import argparse
import os
import sys
import tempfile
import time

import torch
from safetensors.torch import save_file

from parity_common import DTYPES, add_common_args, add_vae_model_args, max_abs, rel_err, run_dlo_forward, vae_model


def main(argv=None):
    ap = argparse.ArgumentParser()
    add_common_args(ap, "--vae-base-dim 32")
    add_vae_model_args(ap)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--frames", default="1,5,9", help="video frame counts (1 + 4k), comma-separated: one run each")
    ap.add_argument("--height", type=int, default=16, help="video height in pixels")
    ap.add_argument("--width", type=int, default=16, help="video width in pixels")
    ap.add_argument("--i2v-condition", action="store_true",
                    help="the I2V pipeline's condition video: frame 0 random, the other frames zeros")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    frame_counts = [int(f) for f in args.frames.split(",")]

    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        from diffusers import AutoencoderKLWan
        from diffusers.pipelines.wan.pipeline_wan_i2v import retrieve_latents
        model = vae_model(args, tmp)
        vae = AutoencoderKLWan.from_pretrained(os.path.join(model, "vae"), torch_dtype=dtype).eval()
        cfg = vae.config
        g = torch.Generator("cpu").manual_seed(args.seed + 1)
        for frames in frame_counts:
            shape = (args.batch, 3, frames, args.height, args.width)
            video = torch.rand(shape, generator=g) * 2 - 1
            if args.i2v_condition:
                video[:, :, 1:] = 0
            inputs = os.path.join(tmp, "in.safetensors")
            out = os.path.join(tmp, "out.safetensors")
            save_file({"video": video.contiguous()}, inputs)
            ours, t_ours = run_dlo_forward(args, model, "vae_encoder", inputs, out)

            # WanImageToVideoPipeline.prepare_latents, verbatim (pipelines/wan/pipeline_wan_i2v.py).
            t0 = time.perf_counter()
            with torch.no_grad():
                condition = video.to(dtype=vae.dtype)
                mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to("cpu", torch.float32)
                std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to("cpu", torch.float32)
                latents = retrieve_latents(vae.encode(condition), sample_mode="argmax")
                normalized = (latents.to(device="cpu", dtype=torch.float32) - mean) * std
            t_ref = time.perf_counter() - t0

            spatial = cfg.scale_factor_spatial
            want_shape = (args.batch, cfg.z_dim, 1 + (frames - 1) // 4 * 4 // cfg.scale_factor_temporal,
                          args.height // spatial, args.width // spatial)
            for name, ref in (("latents", latents), ("latents_normalized", normalized)):
                got = ours[name]
                ok_shape = tuple(ref.shape) == want_shape and got.shape == ref.shape
                rel = rel_err(got, ref) if ok_shape else float("inf")
                verdict = "PASS" if ok_shape and rel <= args.tol else "FAIL"
                failed += verdict == "FAIL"
                print(f"{verdict}: vae encode {args.dtype} video {shape}{' (I2V condition)' if args.i2v_condition else ''}"
                      f" -> {name} {tuple(ref.shape)} (want {want_shape}) rel_err {rel:.3e} (tol {args.tol:.1e}) "
                      f"max_abs {max_abs(got, ref):.3e} bitwise {ok_shape and torch.equal(got, ref)}; "
                      f"ref std {ref.double().std().item() if ref.numel() > 1 else 0:.3f}; ours {got.dtype}; "
                      f"wall ours {t_ours:.2f}s (incl. process start) ref {t_ref:.2f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
