#!/usr/bin/env python3
"""Probes behind docs/benchmarks.md's "why more transformer steps do not fix direction".

  1. latents: share of latent pixels that are the object (max |normalised value| > 2), their RMS
     against the background's, after the VAE config's per-channel normalisation (times --scale);
  2. prompts: how far the text encoder's embeddings of "red" vs "blue" and "left" vs "up" lie apart
     (relative L2 per token position);
  3. time: the transformer's flow-matching loss on 128 clips in order and with latent frames
     permuted (0, 3, 1, 4, 2), at several sigmas: the ratio says how much it uses frame order.
Reads a latents file written by tools/train_demo_model.py (out/train-demo/latents.pt) and a model
folder (the transformer, VAE config and text encoder it uses). CPU, 2 threads, about a minute.
  .venv/bin/python tools/probe_demo_model.py --model configs/demo-model --latents out/train-demo/latents.pt
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_world as world  # noqa: E402
import train_demo_model as train  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="configs/demo-model")
    ap.add_argument("--transformer", help="a transformer folder (default: the model's)")
    ap.add_argument("--latents", default="out/train-demo/latents.pt")
    ap.add_argument("--scale", type=float, default=1.0, help="the --latent-scale the transformer was trained with")
    args = ap.parse_args()
    torch.set_num_threads(2)
    from diffusers import WanTransformer3DModel

    d = torch.load(args.latents, weights_only=False)  # written by train_demo_model.py
    std = d["std"].view(1, -1, 1, 1, 1) * args.scale
    z = (d["z"] - d["mean"].view(1, -1, 1, 1, 1)) / std
    tok = z.permute(0, 2, 3, 4, 1).reshape(-1, z.shape[1])
    obj = tok.abs().amax(1) > 2 / args.scale
    print(f"1. latents: object share {obj.float().mean():.3f}, object RMS {tok[obj].pow(2).mean().sqrt():.2f}, "
          f"background RMS {tok[~obj].pow(2).mean().sqrt():.2f}, max |value| {tok.abs().max():.1f}")

    pairs = [("a red circle moving left", "a blue circle moving left"), ("a red circle moving left", "a red circle moving up")]
    texts = sorted({t for p in pairs for t in p})
    emb, lens = train.text_embeddings(args.model, texts, torch.float32)
    for a, b in pairs:
        ea, eb = emb[texts.index(a)], emb[texts.index(b)]
        n = int(min(lens[texts.index(a)], lens[texts.index(b)]))
        rel = ((ea[:n] - eb[:n]).norm(dim=-1) / ea[:n].norm(dim=-1)).max().item()
        print(f"2. prompts: {a!r} vs {b!r}: largest per-token relative difference {rel:.2f}")

    model = WanTransformer3DModel.from_pretrained(args.transformer or os.path.join(args.model, "transformer"))
    model = model.float().eval()
    parts = d["parts"][:128]
    emb, lens = train.text_embeddings(args.model, [world.prompt(*p) for p in parts], torch.float32)
    ctx, bias = train.compact_text(emb, lens)
    proc = train.use_compact_text(model)
    proc.bias = bias[:, None, None, :]
    x0 = z[:128]
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    perm = torch.tensor([0, 3, 1, 4, 2])
    with torch.no_grad():
        for s in (0.95, 0.9, 0.8, 0.6, 0.4):
            loss = []
            for xx in (x0, x0[:, :, perm]):
                v = model((1 - s) * xx + s * noise, torch.full((128,), s * 1000.0), ctx, return_dict=False)[0]
                loss.append(((v - (noise - xx)) ** 2).mean().item())
            print(f"3. time: sigma {s}: loss in order {loss[0]:.4f}, frames permuted {loss[1]:.4f} "
                  f"(+{100 * (loss[1] / loss[0] - 1):.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
