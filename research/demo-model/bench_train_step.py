#!/usr/bin/env python3
"""What one training step of the demo model's transformer costs, and where the time goes.

Builds the recipe's transformer (tools/train_demo_model.py's flags and defaults: any of its shape
flags after ours, e.g. --layers 4) and runs its step as the recipe does (flow-matching loss on
random latents of the recipe's shape, cross-attention over the world's prompts as the recipe
encodes them with --text's tokenizer and text encoder, AdamW, gradient clipping, the EMA update), for each --batch in one run, so their ratio is this machine's, with
the share of each phase (forward, backward, clipping and AdamW, EMA). Then profiles a few steps at
the first batch and sorts the CPU time by kind of op: GEMMs, attention, everything else
(element-wise ops, norms, copies, the optimizer's arithmetic).
  .venv/bin/python research/demo-model/bench_train_step.py [--batch 32,16] [--steps 30] [--threads 2] [--layers 4 ...]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))  # the recipe
import train_demo_model as recipe  # noqa: E402

GEMM = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="32,16", help="comma-separated batch sizes; the first is profiled")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per batch size, after 5 untimed")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                   "configs", "demo-model"),
                    help="a folder with the tokenizer/ and text_encoder/ to condition on (the shipped model's)")
    args, rest = ap.parse_known_args()
    shape = recipe.parser().parse_args(["--out", "unused", *rest])
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    frames = (recipe.FRAMES - 1) // 4 + 1
    side = recipe.HEIGHT // shape.vae_factor
    model = recipe.demo_transformer(shape, shape.z_dim)
    proc = recipe.use_compact_text(model)
    opt = torch.optim.AdamW(model.parameters(), lr=shape.dit_lr, weight_decay=0.01)
    ema = {k: v.detach().clone() for k, v in model.state_dict().items()}
    params = sum(p.numel() for p in model.parameters())
    emb, lengths = recipe.text_embeddings(args.text, recipe.world_texts(), torch.float32)
    emb, bias = recipe.compact_text(emb, lengths)

    phases = {"forward": 0.0, "backward": 0.0, "clipping and AdamW": 0.0, "EMA": 0.0}

    def step(batch):
        x0 = torch.randn(batch, shape.z_dim, frames, side, side)
        sigma = torch.rand(batch)
        noise = torch.randn_like(x0)
        xt = (1 - sigma.view(-1, 1, 1, 1, 1)) * x0 + sigma.view(-1, 1, 1, 1, 1) * noise
        ids = torch.randint(0, len(emb), (batch,))
        proc.bias = bias[ids][:, None, None, :]
        t = [time.perf_counter()]
        pred = model(xt, sigma * 1000.0, emb[ids], return_dict=False)[0]
        loss = ((pred - (noise - x0)) ** 2).mean()
        t.append(time.perf_counter())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t.append(time.perf_counter())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        t.append(time.perf_counter())
        with torch.no_grad():
            for k, v in model.state_dict().items():
                ema[k].mul_(shape.ema).add_(v.detach(), alpha=1 - shape.ema)
        t.append(time.perf_counter())
        for name, a, b in zip(phases, t, t[1:]):
            phases[name] += b - a

    batches = [int(b) for b in args.batch.split(",")]
    tokens = frames * side * side // (shape.patch_t * shape.patch * shape.patch)
    print(f"transformer: {shape.layers} layers, width {shape.dim}, ffn {shape.ffn}, {tokens} tokens a clip, "
          f"{params / 1e6:.2f} M parameters; prompts of up to {emb.shape[1]} text slots; {args.threads} threads")
    rates = {}
    for b in batches:
        for _ in range(5):
            step(b)
        for k in phases:
            phases[k] = 0.0
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step(b)
        wall = time.perf_counter() - t0
        rates[b] = args.steps / wall
        split = ", ".join(f"{k} {v / wall:.0%}" for k, v in phases.items())
        print(f"batch {b}: {rates[b]:.2f} steps/s, {rates[b] * b:.0f} clips/s "
              f"({rates[b] / rates[batches[0]]:.2f} x the steps/s of batch {batches[0]}); {split}")

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step(batches[0])
    kinds = {"GEMMs (mm, addmm, bmm)": 0.0, "attention (SDPA)": 0.0, "everything else": 0.0}
    total = 0.0
    for e in prof.key_averages():
        total += e.self_cpu_time_total
        kind = ("GEMMs (mm, addmm, bmm)" if e.key in GEMM else
                "attention (SDPA)" if "scaled_dot_product" in e.key else "everything else")
        kinds[kind] += e.self_cpu_time_total
    print(f"batch {batches[0]}, 5 steps profiled, self CPU time by kind of op: " +
          ", ".join(f"{k} {t / total:.0%}" for k, t in kinds.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
