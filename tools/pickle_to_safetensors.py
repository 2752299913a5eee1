#!/usr/bin/env python3
"""Converts a PyTorch pickle checkpoint (.pth, .pt, .ckpt, .bin) to safetensors, once, at setup
time, with the venv's torch and safetensors (dlo reads safetensors only: loading a pickle can run
code). Loads with weights_only=True (tensors and plain containers, no arbitrary objects), takes the
state dict (a top-level "state_dict", "model" or "module" mapping when the file nests it), keeps
names and dtypes as stored, and writes one file.

  .venv/bin/python tools/pickle_to_safetensors.py wan2.1_t2v_1.3B.pth wan2.1_t2v_1.3B.safetensors
"""
import argparse
import os
import sys

import torch
from safetensors.torch import save_file


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("dst")
    args = ap.parse_args()
    if os.path.exists(args.dst):
        sys.exit(f"{args.dst}: exists; not overwritten")
    sd = torch.load(args.src, map_location="cpu", weights_only=True, mmap=True)
    for key in ("state_dict", "model", "module"):
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        sys.exit(f"{args.src}: not a mapping of names to tensors")
    # Tied or strided views become their own contiguous tensors (safetensors stores no sharing).
    save_file({k: v.contiguous().clone() if v.storage_offset() or not v.is_contiguous() else v for k, v in sd.items()},
              args.dst + ".tmp")
    os.replace(args.dst + ".tmp", args.dst)
    print(f"{args.dst}: {len(sd)} tensors")


if __name__ == "__main__":
    main()
