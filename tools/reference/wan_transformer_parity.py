#!/usr/bin/env python3
"""Parity of dlo's Wan transformer against diffusers' WanTransformer3DModel.

Writes a random-weight checkpoint with `dlo-checkpoint make` (unless --model is given), random
inputs, runs `dlo-forward` and diffusers on the same checkpoint directory and inputs, and compares.
Exit 0 when ||ours - ref|| / ||ref|| <= --tol, else 1.

  wan_transformer_parity.py --bin build/bin --preset wan-test --dtype fp32 --tol 1e-5
  wan_transformer_parity.py --bin build/bin --heads 3 --head-dim 16 --layers 3 --frames 3 --height 6 --width 10
"""
import argparse
import os
import sys
import tempfile
import time

import torch
from safetensors.torch import save_file

from parity_common import DTYPES, add_common_args, make_model, max_abs, rel_err, run_dlo_forward


def main(argv=None):
    ap = argparse.ArgumentParser()
    add_common_args(ap, "--layers 3 --heads 3")
    ap.add_argument("--preset", default="wan-test")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--frames", type=int, default=2)
    ap.add_argument("--height", type=int, default=16)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--text-len", type=int, default=12)
    ap.add_argument("--per-token-timesteps", action="store_true",
                    help="timestep [B, L], one per token (Wan2.2 TI2V's expand_timesteps), else [B]")
    ap.add_argument("--diffusers-test-inputs", action="store_true",
                    help="inputs drawn exactly as diffusers' transformer unit test draws them")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]

    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(args, tmp, "--preset", args.preset, "--dtype", args.weights_dtype, "--components",
                           "transformer")
        from diffusers import WanTransformer3DModel
        ref_model = WanTransformer3DModel.from_pretrained(os.path.join(model, "transformer"), torch_dtype=dtype).eval()
        cfg = ref_model.config

        if args.diffusers_test_inputs:
            gen = lambda: torch.Generator("cpu").manual_seed(0)  # a fresh generator per draw, as the test does
            x = torch.randn((1, cfg.in_channels, 2, 16, 16), generator=gen())
            ctx = torch.randn((1, 12, cfg.text_dim), generator=gen())
            t = torch.randint(0, 1000, (1,), generator=gen())
        else:
            g = torch.Generator("cpu").manual_seed(args.seed + 1)
            x = torch.randn((args.batch, cfg.in_channels, args.frames, args.height, args.width), generator=g)
            ctx = torch.randn((args.batch, args.text_len, cfg.text_dim), generator=g)
            t = torch.randint(0, 1000, (args.batch,), generator=g)  # a different timestep per sample
            if args.per_token_timesteps:
                pt, ph, pw = cfg.patch_size
                tokens = (args.frames // pt) * (args.height // ph) * (args.width // pw)
                # As WanPipeline's expand_timesteps draws them (0 where the first frame is given,
                # t elsewhere), and here a different value per token to catch any mix-up.
                t = torch.randint(0, 1000, (args.batch, tokens), generator=g)
        x, ctx = x.to(dtype), ctx.to(dtype)

        inputs = os.path.join(tmp, "in.safetensors")
        out = os.path.join(tmp, "out.safetensors")
        save_file({"hidden_states": x.contiguous(), "timestep": t, "encoder_hidden_states": ctx.contiguous()}, inputs)
        ours, t_ours = run_dlo_forward(args, model, "transformer", inputs, out)
        ours = ours["output"]

        t0 = time.perf_counter()
        with torch.no_grad():
            ref = ref_model(hidden_states=x, timestep=t, encoder_hidden_states=ctx, return_dict=False)[0]
        t_ref = time.perf_counter() - t0

    rel, maxabs = rel_err(ours, ref), max_abs(ours, ref)
    verdict = "PASS" if rel <= args.tol else "FAIL"
    print(f"{verdict}: transformer {args.dtype} shape {tuple(ref.shape)} rel_err {rel:.3e} (tol {args.tol:.1e}) "
          f"max_abs {maxabs:.3e} ref_norm {ref.double().norm().item():.3e}; "
          f"ours {ours.dtype}{tuple(ours.shape)}; wall ours {t_ours:.2f}s (incl. process start) ref {t_ref:.2f}s")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
