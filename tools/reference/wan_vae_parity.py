#!/usr/bin/env python3
"""Parity of dlo's Wan VAE decoder (Wan2.1's; Wan2.2's residual one) against diffusers' AutoencoderKLWan.

Writes a random-weight VAE with `dlo-checkpoint make --components vae` (unless --model is given),
random normalised latents (as the transformer outputs them), runs `dlo-forward --component vae`
and, on the same directory and latents, WanPipeline's decode step in diffusers:

    latents = latents.to(vae.dtype)
    latents = latents / (1.0 / std) + mean      # the pipeline's de-normalisation
    video = vae.decode(latents).sample          # [B, 3, 1 + 4 (F - 1), s H, s W], clamped to [-1, 1]
                                                # (s = 8; 16 for Wan2.2's VAE, patch_size 2)

and compares. Also checks that the checkpoint holds exactly the tensors (names, shapes) of
diffusers' model for that config. Exit 0 when ||ours - ref|| / ||ref|| <= --tol, else 1.

  wan_vae_parity.py --bin build/bin --vae-preset wan-vae-test --frames 2 --height 4 --width 6 --tol 1e-5
  wan_vae_parity.py --bin build/bin --vae-preset wan2.1-vae --make-args='--vae-base-dim 32' --frames 3 --tol 1e-5
"""
import argparse
import os
import sys
import tempfile
import time

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from parity_common import DTYPES, add_common_args, add_vae_model_args, max_abs, rel_err, run_dlo_forward, vae_model


def checkpoint_shapes(vae_dir):
    shapes = {}
    for name in sorted(os.listdir(vae_dir)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(vae_dir, name), "pt") as f:
                for k in f.keys():
                    shapes[k] = tuple(f.get_slice(k).get_shape())
    return shapes


def main(argv=None):
    ap = argparse.ArgumentParser()
    add_common_args(ap, "--vae-base-dim 32")
    add_vae_model_args(ap)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--frames", type=int, default=2, help="latent frames")
    ap.add_argument("--height", type=int, default=4, help="latent height")
    ap.add_argument("--width", type=int, default=4, help="latent width")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]

    with tempfile.TemporaryDirectory() as tmp:
        from diffusers import AutoencoderKLWan
        model = vae_model(args, tmp)
        vae_dir = os.path.join(model, "vae")
        vae = AutoencoderKLWan.from_pretrained(vae_dir, torch_dtype=dtype).eval()
        cfg = vae.config

        # The checkpoint must be exactly diffusers' parameter set (no missing, no extra tensors).
        want = {k: tuple(v.shape) for k, v in vae.state_dict().items()}
        have = checkpoint_shapes(vae_dir)
        if want != have:
            missing = sorted(set(want) - set(have))[:5]
            extra = sorted(set(have) - set(want))[:5]
            wrong = sorted(k for k in set(want) & set(have) if want[k] != have[k])[:5]
            print(f"FAIL: checkpoint tensors differ from diffusers': missing {missing} extra {extra} shape {wrong}")
            return 1

        g = torch.Generator("cpu").manual_seed(args.seed + 1)
        latents = torch.randn((args.batch, cfg.z_dim, args.frames, args.height, args.width), generator=g)
        inputs = os.path.join(tmp, "in.safetensors")
        out = os.path.join(tmp, "out.safetensors")
        save_file({"latents": latents.contiguous()}, inputs)
        ours, t_ours = run_dlo_forward(args, model, "vae", inputs, out)
        ours = ours["output"]

        # WanPipeline.__call__'s decode step, verbatim (pipelines/wan/pipeline_wan.py).
        t0 = time.perf_counter()
        with torch.no_grad():
            lat = latents.to(vae.dtype)
            latents_mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1).to(
                lat.device, lat.dtype)
            latents_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1).to(
                lat.device, lat.dtype)
            lat = lat / latents_std + latents_mean
            ref = vae.decode(lat, return_dict=False)[0]
        t_ref = time.perf_counter() - t0

    patch = cfg.patch_size or 1  # Wan2.2: the decoder's channels unpatchified into patch x patch pixels
    spatial = 2 ** (len(cfg.dim_mult) - 1) * patch
    temporal = 2 ** sum(cfg.temperal_downsample)
    want_shape = (args.batch, cfg.out_channels // (patch * patch), 1 + temporal * (args.frames - 1),
                  args.height * spatial, args.width * spatial)
    ok_shape = tuple(ref.shape) == want_shape
    rel = rel_err(ours, ref) if ok_shape else float("inf")
    maxabs = max_abs(ours, ref)
    bitwise = ok_shape and torch.equal(ours, ref)
    clamped = (ref.abs() >= 1).double().mean().item()
    verdict = "PASS" if ok_shape and rel <= args.tol else "FAIL"
    print(f"{verdict}: vae {args.dtype} latents {tuple(latents.shape)} -> {tuple(ref.shape)} (want {want_shape}) "
          f"rel_err {rel:.3e} (tol {args.tol:.1e}) max_abs {maxabs:.3e} bitwise {bitwise}; "
          f"ref std {ref.double().std().item():.3f}, {100 * clamped:.1f}% at the clamp; "
          f"ours {ours.dtype}{tuple(ours.shape)}; wall ours {t_ours:.2f}s (incl. process start) ref {t_ref:.2f}s")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
