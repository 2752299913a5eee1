#!/usr/bin/env python3
"""A random LoRA in the diffusers/PEFT layout on every block Linear of a Wan transformer, shapes from
its config.json, written with torch alone (no numpy, no safetensors package: the bare GPU machine
has only torch), for the LoRA benchmarks (tools/bench/bench_offload.py lora, gpu-run.sh MODE=lora).

  make_lora.py MODEL_DIR OUT.safetensors [--rank 32] [--dtype bf16] [--seed 1]
"""
import argparse
import json
import os
import struct

import torch

BLOCK_LINEARS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k",
                 "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2")
DTYPES = {"bf16": (torch.bfloat16, "BF16"), "fp16": (torch.float16, "F16"), "fp32": (torch.float32, "F32")}


def save(path, tensors):
    """tensors: {name: tensor} -> a .safetensors file (header padded to 8 bytes)."""
    header, off = {}, 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        header[name] = {"dtype": next(s for d, s in DTYPES.values() if d == t.dtype), "shape": list(t.shape),
                        "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    buf = bytearray(off)
    flat = torch.frombuffer(buf, dtype=torch.uint8) if off else None
    for name, t in tensors.items():
        a, b = header[name]["data_offsets"]
        flat[a:b].copy_(t.contiguous().view(-1).view(torch.uint8))
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + bytes(buf))


def write_peft_lora(path, model_dir, rank=32, dtype="bf16", seed=1):
    """Down ~ N(0, 0.01), up ~ N(0, 0.01) for every block Linear; returns the file's size."""
    cfg = json.load(open(os.path.join(model_dir, "transformer", "config.json")))
    d, f = cfg["num_attention_heads"] * cfg["attention_head_dim"], cfg["ffn_dim"]
    shapes = {m: (f, d) if m == "ffn.net.0.proj" else (d, f) if m == "ffn.net.2" else (d, d) for m in BLOCK_LINEARS}
    g = torch.Generator().manual_seed(seed)
    dt = DTYPES[dtype][0]
    t = {}
    for i in range(cfg["num_layers"]):
        for m, (out, inp) in shapes.items():
            t[f"transformer.blocks.{i}.{m}.lora_A.weight"] = (torch.randn(rank, inp, generator=g) * 0.01).to(dt)
            t[f"transformer.blocks.{i}.{m}.lora_B.weight"] = (torch.randn(out, rank, generator=g) * 0.01).to(dt)
    save(path, t)
    return os.path.getsize(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    size = write_peft_lora(a.out, a.model, a.rank, a.dtype, a.seed)
    print(f"{a.out}: rank {a.rank}, {a.dtype}, {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
