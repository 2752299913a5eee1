#!/usr/bin/env python3
"""Benchmark of the UMT5 text encoder on the CPU: ours vs transformers. Not a test: prints numbers.

One run: a random-weight mid-size UMT5 (by default umt5-base's shape: d_model 768, 12 heads x 64,
d_ff 2048, 12 layers, gated-gelu; vocabulary of the tiny tokenizer) is written with
`dlo-checkpoint make`; the same input (a batch of 1, 512 tokens as the pipeline pads them, --tokens
real ones) goes through `dlo-forward --component text_encoder` and transformers' UMT5EncoderModel,
same dtype and thread count, in --rounds interleaved rounds (each side warmed up first; ours:
`--repeat 2`, the second pass timed). Reported: the ratio ours / transformers of the best rounds
(other load only adds time, so the minimum is the stable estimate on a shared machine) and of the
medians.

  .venv/bin/python tools/bench/bench_text_encoder.py --bin build/bin [--threads 2] [--dtype fp32|bf16]
"""
import json
import os
import statistics
import tempfile
import time

import torch
from safetensors.torch import load_file, save_file

import benchlib


def main():
    ap = benchlib.parser(__doc__, json_out=False)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--d-kv", type=int, default=64)
    ap.add_argument("--d-ff", type=int, default=2048)
    ap.add_argument("--length", type=int, default=512, help="padded sequence length (the pipeline's 512)")
    ap.add_argument("--tokens", type=int, default=60, help="real tokens of the prompt (the rest is padding)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]

    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        model = os.path.join(tmp, "model")
        benchlib.make_model(args.bin, model, "--components", "text_encoder", "--dtype", args.dtype, "--shard-size", "0",
                            "--te-layers", str(args.layers), "--te-d-model", str(args.d_model), "--te-heads",
                            str(args.heads), "--te-d-kv", str(args.d_kv), "--te-d-ff", str(args.d_ff))
        g = torch.Generator().manual_seed(0)
        ids = torch.zeros(1, args.length, dtype=torch.int64)
        ids[0, :args.tokens] = torch.randint(3, 600, (args.tokens,), generator=g)
        ids[0, args.tokens - 1] = 1  # </s>
        mask = (ids != 0).to(torch.int64)
        inp = os.path.join(tmp, "in.safetensors")
        out = os.path.join(tmp, "out.safetensors")
        rep = os.path.join(tmp, "report.json")
        save_file({"input_ids": ids, "attention_mask": mask}, inp)
        inp_compact = os.path.join(tmp, "in_compact.safetensors")
        save_file({"input_ids": ids, "attention_mask": mask, "compact": torch.tensor(1)}, inp_compact)
        from transformers import UMT5EncoderModel

        ref = UMT5EncoderModel.from_pretrained(os.path.join(model, "text_encoder"), dtype=dt).eval()
        ours, theirs, compact = [], [], []
        with torch.no_grad():
            ref(input_ids=ids, attention_mask=mask)  # warm-up
            # Interleaved rounds, so that load from other processes hits both sides alike.
            for _ in range(args.rounds):
                benchlib.run([os.path.join(args.bin, "dlo-forward"), "--model", model, "--component", "text_encoder",
                              "--inputs", inp, "--out", out, "--dtype", args.dtype, "--threads", str(args.threads),
                              "--repeat", "2", "--report", rep], environ=os.environ)
                ours.append(json.load(open(rep))["forward_seconds"][1])  # the first pass warms up
                ours_out = load_file(out)["output"]
                benchlib.run([os.path.join(args.bin, "dlo-forward"), "--model", model, "--component", "text_encoder",
                              "--inputs", inp_compact, "--out", out, "--dtype", args.dtype, "--threads",
                              str(args.threads), "--repeat", "2", "--report", rep], environ=os.environ)
                compact.append(json.load(open(rep))["forward_seconds"][1])
                t0 = time.perf_counter()
                last = ref(input_ids=ids, attention_mask=mask).last_hidden_state
                theirs.append(time.perf_counter() - t0)
        compact_out = load_file(out)["output"]
        ref_out = torch.cat([last[0, :args.tokens], last.new_zeros(args.length - args.tokens, last.shape[-1])])[None]
        equal = torch.equal(ours_out, ref_out)
        compact_err = ((compact_out.double() - ref_out.double()).norm() / ref_out.double().norm()).item()

    mo, mt = statistics.median(ours), statistics.median(theirs)
    bo, bt = min(ours), min(theirs)
    # Per interleaved round: ours / transformers; the median and range are the figures to quote
    # (best-of-N flatters whichever side had the quietest moment).
    ratios = sorted(o / t for o, t in zip(ours, theirs))
    cratios = sorted(c / t for c, t in zip(compact, theirs))
    print(f"text encoder, ratio ours/transformers per round: median {statistics.median(ratios):.3f} "
          f"(range {ratios[0]:.3f}-{ratios[-1]:.3f}, {len(ratios)} rounds); compact mode median "
          f"{statistics.median(cratios):.3f} (range {cratios[0]:.3f}-{cratios[-1]:.3f})")
    print(f"text encoder speed: UMT5 d_model {args.d_model}, {args.heads}x{args.d_kv} heads, d_ff {args.d_ff}, "
          f"{args.layers} layers, {args.dtype}, 1 x {args.length} tokens ({args.tokens} real), {args.threads} threads, "
          f"{args.rounds} interleaved rounds: best ours {bo:.3f}s, transformers {bt:.3f}s, ratio ours/transformers "
          f"{bo / bt:.3f} (medians {mo:.3f}s / {mt:.3f}s = {mo / mt:.3f}); outputs bitwise equal: {equal}\n"
          f"  compact mode (blocks see the {args.tokens} real tokens only): best {min(compact):.3f}s, ratio to "
          f"transformers {min(compact) / bt:.3f} (medians {statistics.median(compact) / mt:.3f}); rel_err {compact_err:.1e}\n"
          f"  rounds: ours {[round(x, 3) for x in ours]}, transformers {[round(x, 3) for x in theirs]}, "
          f"compact {[round(x, 3) for x in compact]}")

if __name__ == "__main__":
    main()
