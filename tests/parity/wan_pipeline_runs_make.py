#!/usr/bin/env python3
"""Parity: diffusers' WanPipeline loads and runs the model folder `dlo-checkpoint make` writes.

Issue 8: `make --preset wan-test` wrote a transformer with 4 latent channels next to a VAE with
z_dim 16, which WanPipeline cannot run. The parts must fit: this writes the default model (every
component: transformer, scheduler, vae, text_encoder, tokenizer, model_index.json), loads it with
WanPipeline.from_pretrained and renders 5 frames of 16x16 in 2 steps. Checked against diffusers
itself: the latents it returns have the shape the VAE's z_dim and scale factors imply, the decoded
frames the requested size, and every value is finite. Exit 0 on success.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dlo-checkpoint", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from diffusers import WanPipeline

    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        subprocess.run([args.dlo_checkpoint, "make", model, "--preset", "wan-test", "--dtype", "fp32"], check=True,
                       stdout=subprocess.DEVNULL)
        pipe = WanPipeline.from_pretrained(model, dtype=torch.float32)
        z = pipe.vae.config.z_dim
        assert pipe.transformer.config.in_channels == z, (pipe.transformer.config.in_channels, z)
        common = dict(prompt="a red fox in the snow", negative_prompt="blurry", height=16, width=16, num_frames=5,
                      num_inference_steps=2, guidance_scale=5.0, generator=torch.Generator().manual_seed(0))
        latents = pipe(output_type="latent", **common).frames
        # 5 frames -> 1 + (5 - 1) / 4 = 2 latent frames; 16 px / 8 = 2 latent rows and columns.
        want = (1, z, 2, 2, 2)
        assert tuple(latents.shape) == want, (tuple(latents.shape), want)
        assert torch.isfinite(latents).all()
        video = pipe(output_type="np", **common).frames
        assert video.shape == (1, 5, 16, 16, 3), video.shape
        assert np.isfinite(video).all()
    print(f"PASS: WanPipeline ran dlo-checkpoint make's model: latents {want}, video {video.shape}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
