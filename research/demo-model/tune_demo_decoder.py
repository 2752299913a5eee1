#!/usr/bin/env python3
"""An experiment on the demo model: fine-tune its VAE's decoder on latents its transformer wrote.

Probe 14 (research/demo-model/probe_demo_model.py --window-code) finds squares written into the transformer's
samples that the decoder draws as circles. This fine-tunes the decoder (and post_quant_conv; the
encoder, and so the latent space and the transformer, stay as they are) on pairs of a latent the
transformer wrote and the frame it should show, each latent frame against the clip's frame 4k that
the encoder keeps for it, half of every batch fresh single frames through the recipe's latent
noise (0.3 x each channel's spread) so the reconstructions are kept:

  --pairs clips    clips of the world, encoded, noised to a sigma of the 20-step shift-3 grid
                   (steps 8-18 of 20: sigma 0.80-0.20) and sampled back from there (Euler,
                   guidance 4, their canonical prompt): the target is the clip itself.
  --pairs samples  the 60 prompts sampled from noise (Euler, 20 steps, shift 3, guidance 4), each
                   latent frame decoded, the object found (the judge's half-max mask): the
                   target is the prompt's colour and shape drawn by demo_world at the centre of
                   the mask's bounding box, as wide as the box (clipped to the world's sizes).

Writes a copy of --model with the tuned VAE (bf16). Judge the result with probe 14 (the same
samples, decoded by the new VAE) or research/demo-model/bench_demo_quality.py. Not part of the recipe: in probe
14's samples the shape went from 50.8% to 50.8% (clips) and 51.7-53.8% (samples: squares gained
corners, triangles were drawn as circles), and the reconstructions of real frames got worse
(diary.md, "the transformer writes the square").
  .venv/bin/python research/demo-model/tune_demo_decoder.py --model configs/demo-model --out out/demo-ft --pairs clips
"""
import argparse
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))  # the recipe
import demo_world as world  # noqa: E402
import train_demo_model as train  # noqa: E402

@torch.no_grad()
def clip_pairs(model, proc, vae, ctx, bias, mean, std, rng, n):
    zs, xs, ws = [], [], []
    sig = train.shifted_sigmas()
    for _ in range(n // 8):
        x, w, parts = train.clips(rng, 8, train.FRAMES)
        z = (vae.encode(x).latent_dist.mode() - mean) / std
        start = int(rng.integers(8, 19))
        xt = (1 - sig[start]) * z + sig[start] * torch.randn_like(z)
        rows = [1 + world.all_prompts().index(world.prompt(*p)) for p in parts]
        xt = train.euler(model, proc, xt, torch.cat([ctx[rows], ctx[[0] * 8]]),
                         torch.cat([bias[rows], bias[[0] * 8]])[:, None, None, :], sig, start)
        zs.append(xt * std + mean)
        xs.append(x[:, :, ::4])
        ws.append(w[:, :, ::4])
    frames = [torch.cat(t).transpose(1, 2).flatten(0, 1)[:, :, None] for t in (zs, xs, ws)]  # [N * T, C, 1, h, w]
    return tuple(frames)


@torch.no_grad()
def sample_pairs(model, proc, vae, ctx, bias, mean, std, seeds):
    parts = [world.parse_prompt(p) for p in world.all_prompts()]
    g = torch.Generator().manual_seed(456)
    h, w = train.HEIGHT, train.WIDTH
    lo, hi = (min(h, w) / 6.0 * k for k in world.SIZE)  # render_clip's sizes
    zs, targets, weights = [], [], []
    for _ in range(seeds):
        x = torch.randn((60, vae.config.z_dim, 5, h // 4, w // 4), generator=g)
        z = train.euler(model, proc, x, torch.cat([ctx[1:61], ctx[[0] * 60]]),
                        torch.cat([bias[1:61], bias[[0] * 60]])[:, None, None, :], train.shifted_sigmas()) * std + mean
        for j, (colour, shape, _) in enumerate(parts):
            for k in range(z.shape[2]):
                y = vae.decode(z[j:j + 1, :, k:k + 1]).sample[0, :, 0].clamp(-1, 1)
                m = world.object_mask(((y.permute(1, 2, 0) + 1) * 127.5).round().to(torch.uint8).numpy(), half_max=True)
                if m.sum() < 4:
                    continue
                yy, xx = np.nonzero(m)
                size = float(np.clip(((xx.max() - xx.min() + 1) + (yy.max() - yy.min() + 1)) / 2, lo, hi))
                cx, cy = (xx.max() + xx.min() + 1) / 2, (yy.max() + yy.min() + 1) / 2
                frame = world.draw_frame(colour, shape, cx, cy, size, h, w)
                zs.append(z[j, :, k:k + 1])
                targets.append((torch.from_numpy(frame).permute(2, 0, 1).float() / 127.5 - 1.0)[:, None])
                weights.append(train.object_weights(frame[None]))
    return torch.stack(zs), torch.stack(targets), torch.stack(weights)


def main():
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="configs/demo-model")
    ap.add_argument("--out", required=True, help="the tuned model folder to write (replaced)")
    ap.add_argument("--pairs", choices=("clips", "samples"), required=True)
    ap.add_argument("--clips", type=int, default=1200, help="--pairs clips: clips drawn")
    ap.add_argument("--seeds", type=int, default=8, help="--pairs samples: samples of each of the 60 prompts")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(7)
    model = WanTransformer3DModel.from_pretrained(os.path.join(args.model, "transformer")).float().eval()
    vae = AutoencoderKLWan.from_pretrained(os.path.join(args.model, "vae")).float().eval()
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    emb, lens = train.text_embeddings(args.model, [""] + world.all_prompts(), torch.float32)
    ctx, bias = train.compact_text(emb, lens)
    proc = train.use_compact_text(model)
    rng = np.random.default_rng(99)
    t0 = time.time()
    if args.pairs == "clips":
        z, x, w = clip_pairs(model, proc, vae, ctx, bias, mean, std, rng, args.clips)
    else:
        z, x, w = sample_pairs(model, proc, vae, ctx, bias, mean, std, args.seeds)
    train.log(f"{z.shape[0]} pairs of a latent frame and its frame in {time.time() - t0:.0f} s")

    params = list(vae.decoder.parameters()) + list(vae.post_quant_conv.parameters())
    for p in vae.encoder.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    losses, t1 = [], time.time()
    for step in range(args.steps):
        for group in opt.param_groups:  # warm-up, then cosine down to a tenth
            group["lr"] = args.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / args.steps)))
        idx = torch.randint(0, z.shape[0], (8,))
        fresh, fresh_w, _ = train.clips(rng, 8, 1)
        with torch.no_grad():
            mu = vae.encode(fresh).latent_dist.mode()
            spread = mu.std(dim=(0, 2, 3, 4), keepdim=True)
        y = vae.decode(torch.cat([z[idx], mu + 0.3 * spread * torch.randn_like(mu)])).sample
        err = torch.cat([w[idx], fresh_w]) * (y - torch.cat([x[idx], fresh])) ** 2
        opt.zero_grad(set_to_none=True)
        err.mean().backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append((err[:8].mean().item(), err[8:].mean().item()))
        if step % 100 == 0 or step == args.steps - 1:
            a = np.mean(losses[-50:], axis=0)
            train.log(f"step {step}: weighted mse on the pairs {a[0]:.5f}, on fresh frames {a[1]:.5f} "
                      f"({time.time() - t1:.0f} s)")
    vae.eval()
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    shutil.copytree(args.model, args.out)
    shutil.rmtree(os.path.join(args.out, "vae"))
    vae.to(torch.bfloat16).save_pretrained(os.path.join(args.out, "vae"))
    cfg_path = os.path.join(args.out, "vae", "config.json")
    cfg = json.load(open(cfg_path))
    cfg.pop("_name_or_path", None)
    with open(cfg_path, "w") as f:
        f.write(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    train.log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
