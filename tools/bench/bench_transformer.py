#!/usr/bin/env python3
"""Benchmarks of the Wan transformer on the CPU (issue: transformer). Not a test: prints numbers.

1. Speed: our forward vs diffusers' forward, same weights, inputs, dtype and threads, on the 1.3B
   shape cut to --layers blocks with a small latent. --runs runs, alternating ours and diffusers,
   each the median of --repeat forwards (the first excluded); reports the median ratio
   ours/diffusers over the runs and its range (the machine is shared: single runs vary by 2x).
2. Memory: RSS growth from building the model out of a generated full 1.3B-shape bf16 checkpoint
   (~2.8 GB) to just before the first forward (the weights are mmap views, so this stays small).

  .venv/bin/python tools/bench/bench_transformer.py --bin build/bin [--threads 2] [--layers 4] [--runs 5] [--work DIR]
"""
import json
import os
import statistics
import tempfile
import time

import torch
from safetensors.torch import save_file

import benchlib


def run(cmd):
    benchlib.run(cmd, environ=os.environ)


def main():
    ap = benchlib.parser(__doc__, json_out=False)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--frames", type=int, default=3)
    ap.add_argument("--size", type=int, default=16, help="latent height = width")
    ap.add_argument("--repeat", type=int, default=3, help="forwards per run (the first warms up)")
    ap.add_argument("--runs", type=int, default=5, help="runs; the median ratio and its range are reported")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--skip-memory", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    ck = os.path.join(args.bin, "dlo-checkpoint")
    fw = os.path.join(args.bin, "dlo-forward")

    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        # --- speed
        model = os.path.join(tmp, "m4")
        run([ck, "make", model, "--preset", "wan2.1-t2v-1.3b", "--layers", str(args.layers), "--dtype", args.dtype,
             "--components", "transformer", "--shard-size", "0"])
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1, 16, args.frames, args.size, args.size, generator=g).to(dt)
        ctx = torch.randn(1, 512, 4096, generator=g).to(dt)
        t = torch.tensor([500])
        inp = os.path.join(tmp, "in.safetensors")
        save_file({"hidden_states": x, "timestep": t, "encoder_hidden_states": ctx}, inp)
        rep = os.path.join(tmp, "report.json")
        from diffusers import WanTransformer3DModel
        ref = WanTransformer3DModel.from_pretrained(os.path.join(model, "transformer"), torch_dtype=dt).eval()
        ratios, ours_s, theirs_s = [], [], []
        for _ in range(args.runs):
            run([fw, "--model", model, "--component", "transformer", "--inputs", inp, "--out",
                 os.path.join(tmp, "o.safetensors"), "--dtype", args.dtype, "--threads", str(args.threads), "--passes",
                 str(args.repeat), "--offload", "resident", "--report", rep])
            ours = [p["wall_s"] for p in json.load(open(rep))["ranks"][0]["per_pass"]][1:]  # first pass warms up
            theirs = []
            with torch.no_grad():
                for i in range(args.repeat):
                    t0 = time.perf_counter()
                    ref(hidden_states=x, timestep=t, encoder_hidden_states=ctx, return_dict=False)
                    if i > 0:
                        theirs.append(time.perf_counter() - t0)
            mo, mt = statistics.median(ours), statistics.median(theirs)
            ours_s.append(mo)
            theirs_s.append(mt)
            ratios.append(mo / mt)
        del ref
        L = args.frames * args.size * args.size // 4
        print(f"speed: 1.3B shape, {args.layers} layers, {args.dtype}, latent 16x{args.frames}x{args.size}x{args.size} "
              f"({L} tokens), text 512, {args.threads} threads, {args.runs} runs of {args.repeat - 1} timed forwards: "
              f"ratio ours/diffusers median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}); "
              f"ours median {statistics.median(ours_s):.3f}s, diffusers {statistics.median(theirs_s):.3f}s; "
              f"per run: {', '.join(f'{r:.2f}' for r in ratios)}")

        if args.skip_memory:
            return
        # --- memory
        full = os.path.join(tmp, "m30")
        run([ck, "make", full, "--preset", "wan2.1-t2v-1.3b", "--dtype", "bf16", "--components", "transformer"])
        size = sum(os.path.getsize(os.path.join(full, "transformer", f)) for f in os.listdir(os.path.join(full, "transformer")))
        small = os.path.join(tmp, "in_small.safetensors")
        save_file({"hidden_states": torch.randn(1, 16, 1, 4, 4).bfloat16(), "timestep": torch.tensor([10]),
                   "encoder_hidden_states": torch.randn(1, 16, 4096).bfloat16()}, small)
        run([fw, "--model", full, "--component", "transformer", "--inputs", small, "--out", os.path.join(tmp, "o2.safetensors"),
             "--dtype", "bf16", "--threads", str(args.threads), "--offload", "resident", "--report", rep])
        r = json.load(open(rep))["ranks"][0]
        growth = (r["rss_kb_after_model_load"] - r["rss_kb_at_start"]) / 1024
        engine = (r["rss_kb_after_engine"] - r["rss_kb_at_start"]) / 1024
        print(f"memory: 1.3B bf16 checkpoint {size / 2**30:.2f} GiB; RSS before loading {r['rss_kb_at_start'] / 1024:.1f} MiB, "
              f"after building the model {r['rss_kb_after_model_load'] / 1024:.1f} MiB: growth {growth:.1f} MiB (bar: < 64 MiB); "
              f"after also validating the inputs (embeddings computed, their weight pages touched) and binding the "
              f"resident blocks: {engine:.1f} MiB")


if __name__ == "__main__":
    main()
