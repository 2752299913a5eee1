#!/usr/bin/env python3
"""Parity: files Python `safetensors` writes load in dlo, and files dlo writes load in Python.

1. Python writes a checkpoint with every dtype both sides support (random values, a scalar, an
   empty tensor, metadata).
2. `dlo-checkpoint inspect --json` must report exactly the tensors, dtypes and byte counts Python
   computes (our reader on Python's file).
3. `dlo-checkpoint copy --shard-size` rewrites it as shards plus an index (our reader and writer);
   Python loads every shard and the tensors must be bit-identical to the originals, with the index
   naming the right shard for every tensor and the metadata kept.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8, "BOOL": torch.bool,
}


def make_tensors():
    g = torch.Generator().manual_seed(1234)
    out = {}
    for i, (name, dt) in enumerate(DTYPES.items()):
        shape = (3 + i % 4, 5 + i)
        if dt.is_floating_point:
            t = (torch.randn(shape, generator=g, dtype=torch.float64) * 4).to(dt)
        elif dt == torch.bool:
            t = torch.rand(shape, generator=g) > 0.5
        else:
            t = torch.randint(0, 120, shape, generator=g, dtype=torch.int64).to(dt)
        out[f"blocks.{i}.{name.lower()}"] = t
    out["scalar"] = torch.tensor(2.5, dtype=torch.float32)
    out["empty"] = torch.zeros((0, 4), dtype=torch.bfloat16)
    return out


def bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dlo-checkpoint", required=True)
    args = ap.parse_args()
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
            print("FAIL:", what)

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "py.safetensors")
        tensors = make_tensors()
        save_file(tensors, src, metadata={"format": "pt", "producer": "python"})

        # 2. Our reader on Python's file.
        rep = json.loads(subprocess.run([args.dlo_checkpoint, "inspect", "--json", src], check=True,
                                        capture_output=True, text=True).stdout)
        check(rep["tensors"] == len(tensors), f"tensor count {rep['tensors']} != {len(tensors)}")
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        check(rep["bytes"] == total, f"bytes {rep['bytes']} != {total}")
        check(rep["metadata"] == {"format": "pt", "producer": "python"}, f"metadata {rep['metadata']}")
        for name, dt in DTYPES.items():
            want = [t for t in tensors.values() if t.dtype == dt]
            got = rep["dtypes"].get(name, {})
            check(got.get("tensors") == len(want), f"{name}: {got} vs {len(want)} tensors")

        # 3. Our writer, read by Python.
        out = os.path.join(tmp, "resharded")
        subprocess.run([args.dlo_checkpoint, "copy", src, out, "--shard-size", "600",
                        "--base-name", "diffusion_pytorch_model"], check=True)
        index = json.load(open(os.path.join(out, "diffusion_pytorch_model.safetensors.index.json")))
        shards = sorted(set(index["weight_map"].values()))
        check(len(shards) > 2, f"expected several shards, got {shards}")
        check(index["metadata"]["total_size"] == total, f"index total_size {index['metadata']}")
        loaded = {}
        for shard in shards:
            path = os.path.join(out, shard)
            part = load_file(path)
            with safe_open(path, "pt") as f:
                check(f.metadata() == {"format": "pt", "producer": "python"}, f"{shard} metadata {f.metadata()}")
            for name in part:
                check(index["weight_map"].get(name) == shard, f"index puts {name} in {index['weight_map'].get(name)}, found in {shard}")
            loaded.update(part)
        check(set(loaded) == set(tensors), f"names differ: {set(loaded) ^ set(tensors)}")
        for name, t in tensors.items():
            if name not in loaded:
                continue
            u = loaded[name]
            check(u.dtype == t.dtype and u.shape == t.shape, f"{name}: {u.dtype}{tuple(u.shape)} vs {t.dtype}{tuple(t.shape)}")
            check(torch.equal(bits(u), bits(t)), f"{name}: values differ")

    n = len(DTYPES) + 2
    print(f"{n} tensors, {len(DTYPES)} dtypes: {'all equal' if not failures else f'{len(failures)} failures'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
