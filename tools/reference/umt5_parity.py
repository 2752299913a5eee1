#!/usr/bin/env python3
"""Parity of dlo's UMT5 text encoder against transformers' UMT5EncoderModel (and diffusers' prompt path).

Writes a random-weight text_encoder/ (+ tokenizer/) with `dlo-checkpoint make` (unless --model is
given), runs `dlo-forward --component text_encoder` and transformers on the same directory, and
compares the pipeline's prompt embedding (last_hidden_state trimmed to each prompt's tokens and
zero-padded). Exit 0 when ||ours - ref|| / ||ref|| <= --tol for every output compared, else 1.

Two input modes:
  * default: random input_ids [B, L] with right padding of a different length per row (one row
    unpadded); the reference is UMT5EncoderModel(input_ids, attention_mask).last_hidden_state, trimmed
    and zero-padded as WanPipeline._get_t5_prompt_embeds does. last_hidden_state is compared too.
  * --prompts: end to end from text. Ours: dlo-forward tokenizes (prompt_clean + T5 tokenizer) and
    encodes; the reference is diffusers' WanPipeline._get_t5_prompt_embeds itself, run with
    transformers' T5TokenizerFast and UMT5EncoderModel loaded from the same folders. Token ids and
    attention masks must be equal.

  umt5_parity.py --bin build/bin --tol 1e-6
  umt5_parity.py --bin build/bin --prompts --dtype bf16 --tol 1e-3
"""
import argparse
import os
import sys
import tempfile
import time
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from parity_common import DTYPES, add_common_args, make_model, rel_err, run_dlo_forward

PROMPTS = [
    "A red fox runs through a snowy forest at dawn, its breath rising in small white clouds.",
    "",
    "Two dogs play tug-of-war on a sunny beach; waves crash &amp; seagulls call!",
    "Café scene in Paris — “croissants” and ‘espresso’… 23°C, €12.50 東京 😀",
    "   lots \t of\n\nwhitespace   ",
]




def main(argv=None):
    ap = argparse.ArgumentParser()
    add_common_args(ap, "--te-layers 3")
    ap.add_argument("--prompts", action="store_true", help="end to end from prompts (see above)")
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--text-len", type=int, default=40, help="L of the random input_ids / max_sequence_length")
    ap.add_argument("--compact", action="store_true",
                    help="ours in compact mode (the blocks see only the real tokens; equal up to rounding)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]

    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(args, tmp, "--dtype", args.weights_dtype, "--components", "text_encoder,tokenizer")
        from transformers import UMT5EncoderModel

        ref_model = UMT5EncoderModel.from_pretrained(os.path.join(model, "text_encoder"), dtype=dtype).eval()
        cfg = ref_model.config
        inputs = os.path.join(tmp, "in.safetensors")
        out = os.path.join(tmp, "out.safetensors")

        if args.prompts:
            prompts = PROMPTS + ([] if args.compact else ["a very long prompt, " * 200])  # truncated
            data = [p.encode("utf-8") for p in prompts]
            save_file({"text": torch.frombuffer(bytearray(b"".join(data)), dtype=torch.uint8),
                       "text_lengths": torch.tensor([len(d) for d in data], dtype=torch.int64),
                       "max_sequence_length": torch.tensor(args.text_len, dtype=torch.int64),
                       "compact": torch.tensor(int(args.compact))}, inputs)
        else:
            g = torch.Generator("cpu").manual_seed(args.seed + 1)
            B, L = args.batch, args.text_len
            ids = torch.randint(0, cfg.vocab_size, (B, L), generator=g)
            lens = [L] + [int(x) for x in torch.randint(1, L, (B - 1,), generator=g)]
            if args.compact:  # every row padded, so that compact mode really cuts
                lens = [int(x) for x in torch.randint(1, L, (B,), generator=g)]
            mask = torch.zeros(B, L, dtype=torch.int64)
            for b, n in enumerate(lens):
                mask[b, :n] = 1
                ids[b, n:] = 0  # pad id, as the tokenizer pads
            save_file({"input_ids": ids, "attention_mask": mask, "compact": torch.tensor(int(args.compact))}, inputs)

        ours, t_ours = run_dlo_forward(args, model, "text_encoder", inputs, out)

        checks = []
        t0 = time.perf_counter()
        with torch.no_grad():
            if args.prompts:
                from diffusers import WanPipeline
                from diffusers.pipelines.wan.pipeline_wan import prompt_clean
                from transformers import T5TokenizerFast

                tok = T5TokenizerFast.from_pretrained(os.path.join(model, "tokenizer"))
                pipe = SimpleNamespace(tokenizer=tok, text_encoder=ref_model)
                ref = WanPipeline._get_t5_prompt_embeds(pipe, prompt=prompts, num_videos_per_prompt=1,
                                                        max_sequence_length=args.text_len,
                                                        device=torch.device("cpu"), dtype=None)
                t = tok([prompt_clean(p) for p in prompts], padding="max_length", max_length=args.text_len,
                        truncation=True, add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
                ids_ok = torch.equal(ours["input_ids"], t.input_ids) and torch.equal(ours["attention_mask"],
                                                                                    t.attention_mask)
                checks.append(("token ids and masks", 0.0 if ids_ok else float("inf")))
            else:
                last = ref_model(input_ids=ids, attention_mask=mask).last_hidden_state
                # WanPipeline._get_t5_prompt_embeds' trim + zero-pad.
                ref = torch.stack([torch.cat([u[:v], u.new_zeros(L - v, u.size(1))]) for u, v in zip(last, lens)])
                if not args.compact:  # compact: last_hidden_state has only max(seq_lens) rows
                    checks.append(("last_hidden_state", rel_err(ours["last_hidden_state"], last)))
        t_ref = time.perf_counter() - t0
        checks.insert(0, ("output", rel_err(ours["output"], ref)))

    zeros_ok = all(ours["output"][b, int(n):].abs().max().item() == 0 if int(n) < ours["output"].shape[1] else True
                   for b, n in enumerate(ours["attention_mask"].sum(1) if "attention_mask" in ours else lens))
    ok = zeros_ok and all(e <= args.tol for _, e in checks)
    bitwise = torch.equal(ours["output"], ref)
    print(f"{'PASS' if ok else 'FAIL'}: text encoder {args.dtype} {'prompts' if args.prompts else 'input_ids'}"
          f"{' compact' if args.compact else ''} "
          f"shape {tuple(ref.shape)} " + ", ".join(f"{n} rel_err {e:.3e}" for n, e in checks) +
          f" (tol {args.tol:.1e}); bitwise equal: {bitwise}; padded rows exactly zero: {zeros_ok}; "
          f"ours {ours['output'].dtype} ref {ref.dtype}; wall ours {t_ours:.2f}s (incl. process start) ref {t_ref:.2f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
