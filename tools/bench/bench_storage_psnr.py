#!/usr/bin/env python3
"""How far fp8 storage moves a real-shaped job's frames (issue 47): one dlo-generate job rendered
with the transformer blocks' Linears stored in bf16 and in fp8 (bf16 compute both times), the
frames (PNG) and the final latents compared: PSNR of the fp8 frames against the bf16 frames, the
largest byte difference, the share of bytes that differ, and the latents' largest and RMS
difference relative to their RMS. The model is a random-weight folder of
`dlo-checkpoint make --preset wan2.1-t2v-1.3b --dtype bf16` (its small test text encoder at the
1.3B's text width, the small Wan2.1 VAE), made in --work unless --model is given.

  bench_storage_psnr.py --bin build/bin [--layers 30] [--height 480 --width 832 --frames 5 --steps 2]
      [--ranks 1] [--work /var/tmp] [--json out.json]
"""
import math
import os
import sys
import tempfile

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file

import benchlib


def frames(folder):
    return np.stack([np.asarray(Image.open(os.path.join(folder, n)).convert("RGB"))
                     for n in sorted(os.listdir(folder)) if n.endswith(".png")])


def main():
    ap = benchlib.parser(__doc__)
    ap.add_argument("--model", help="an existing model folder (default: make one in --work)")
    ap.add_argument("--work", default=None, help="where the model and the outputs go (default: the temp folder)")
    ap.add_argument("--layers", type=int, default=30, help="blocks of the made model (30: all of the 1.3B's)")
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--width", type=int, default=832)
    ap.add_argument("--frames", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=1, help="1: resident; more: --offload dlo")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads per rank")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.work) as tmp:
        model = a.model or benchlib.make_model(a.bin, os.path.join(tmp, "m"), "--preset", "wan2.1-t2v-1.3b",
                                               "--layers", str(a.layers), "--dtype", "bf16")
        out, wall = {}, {}
        for k in ("bf16", "fp8"):
            cmd = [os.path.join(a.bin, "dlo-generate"), "--model", model, "--prompt", "a red fox in the snow",
                   "--seed", "1", "--steps", str(a.steps), "--guidance", "1", "--height", str(a.height), "--width",
                   str(a.width), "--frames", str(a.frames), "--dtype", "bf16", "--storage-dtype", k, "--threads",
                   str(a.threads), "--format", "png", "--out", os.path.join(tmp, k),
                   "--save-latents", os.path.join(tmp, f"{k}.safetensors"), "--quiet"]
            wall[k], _ = benchlib.run(cmd + (["--offload", "dlo"] if a.ranks > 1 else []),
                                      a.ranks if a.ranks > 1 else None)
            print(f"{k}: {wall[k]:.0f} s", file=sys.stderr, flush=True)
            out[k] = (frames(os.path.join(tmp, k)), next(iter(load_file(os.path.join(tmp, f"{k}.safetensors")).values())))
        (fa, la), (fb, lb) = out["bf16"], out["fp8"]
        d = np.abs(fa.astype(np.int16) - fb.astype(np.int16))
        mse = float(np.mean(d.astype(np.float64) ** 2))
        dl = (lb.double() - la.double())
        rms = la.double().pow(2).mean().sqrt().item()
        benchlib.emit({"layers": a.layers if not a.model else None, "model": a.model, "ranks": a.ranks,
                       "shape": [a.frames, a.height, a.width], "steps": a.steps, "frames_compared": int(fa.shape[0]),
                       "psnr_db": round(10 * math.log10(255 ** 2 / mse), 2) if mse else None,
                       "per_frame_psnr_db": [round(10 * math.log10(255 ** 2 / m), 2) if m else None
                                             for m in (d.astype(np.float64) ** 2).mean(axis=(1, 2, 3))],
                       "max_abs_diff": int(d.max()), "bytes_differ": round(float(np.count_nonzero(d)) / d.size, 4),
                       "latent_max_abs_diff_rel": round(dl.abs().max().item() / rms, 4),
                       "latent_rms_diff_rel": round(dl.pow(2).mean().sqrt().item() / rms, 4),
                       "wall_s": {k: round(v, 1) for k, v in wall.items()}}, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
