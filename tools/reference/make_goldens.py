#!/usr/bin/env python3
"""Golden tensors from diffusers / transformers for the C++ `cpu` tests (tests/data/goldens/).

The `cpu` label alone must catch a wrong RoPE, block, bucket or VAE cache: these files hold small
inputs and the reference outputs that diffusers' WanTransformer3DModel, transformers'
UMT5EncoderModel (+ WanPipeline's trim and pad) and diffusers' AutoencoderKLWan (+ WanPipeline's
de-normalisation) compute for them. No weights are stored: each golden's weights are written by
`dlo-checkpoint make` with the flags below, whose values depend only on (seed, tensor name), and
the C++ tests write the same tensors with write_random_wan_transformer / write_random_umt5_encoder
/ write_random_wan_vae from the config and seed kept in the file's metadata. The metadata also
holds the sum of all weights in float64 ("weights_sum"), so a changed random writer is reported as
such rather than as a wrong model.

Every golden file: the inputs, "output" (and, for UMT5, "last_hidden_state"), and metadata
{"component", "cpu", "config" (config.json text), "seed", "weights_dtype", "compute_dtype",
"weights_sum", "made_by"}. Fixed seeds, 1 thread: rerunning on the same CPU gives the same tensors
and metadata (the header's key order may differ: the safetensors writer does not sort metadata
keys). "cpu" is parity_common.cpu_fingerprint(): fp32 outputs are bit-exact only on the CPU type
that made them (the C++ tests hold other CPUs to a tolerance, tests/models/golden.h).

Regenerate (after a deliberate change to the random writers or to the reference versions):
  tools/setup.sh && .venv/bin/python tools/reference/make_goldens.py --bin build/bin --out tests/data/goldens
then `ctest --test-dir build -L cpu`. Versions used: torch 2.11.0, diffusers 0.42.1,
transformers 5.23.0 (tools/requirements.txt).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity_common import cpu_fingerprint  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# Transformer: 3 heads x 16 (RoPE: 8 frame, 4 height, 4 width dims per head, as diffusers splits 16), 3 layers,
# in 5 / out 6 channels, text_dim 24 (the odd config of the parity tests).
T_FLAGS = ["--components", "transformer", "--heads", "3", "--head-dim", "16", "--layers", "3", "--ffn-dim", "40",
           "--text-dim", "24", "--in-channels", "5", "--out-channels", "6"]
# UMT5: 3 heads x 10 (inner 30 != d_model 24), 16 buckets, max distance 20 (< L: log buckets used).
U_FLAGS = ["--components", "text_encoder", "--te-layers", "3", "--te-heads", "3", "--te-d-kv", "10", "--te-d-ff",
           "40", "--te-d-model", "24", "--te-buckets", "16", "--te-max-distance", "20"]
# VAE: the real Wan2.1 structure (dim_mult [1,2,4,4], 2 temporal upsamplings) at base_dim 16.
V_FLAGS = ["--components", "vae", "--vae-preset", "wan2.1-vae-small"]

GOLDENS = [
    # name, component, make flags, weights dtype, compute dtype, seed, input sizes
    ("wan_transformer_fp32", "transformer", T_FLAGS, "fp32", "fp32", 5, dict(batch=2, frames=3, height=6, width=10,
                                                                             text_len=7)),
    ("wan_transformer_bf16", "transformer", T_FLAGS, "bf16", "bf16", 6, dict(batch=2, frames=2, height=4, width=8,
                                                                             text_len=7)),
    ("umt5_fp32", "text_encoder", U_FLAGS, "fp32", "fp32", 7, dict(batch=3, text_len=60)),
    ("umt5_bf16", "text_encoder", U_FLAGS, "bf16", "bf16", 8, dict(batch=3, text_len=60)),
    # 4 latent frames: every chunk/cache combination the decoder meets (1-frame chunks with an
    # empty, 1-frame and 2-frame cache; 2- and 4-frame chunks after the temporal upsamplers).
    ("wan_vae_fp32", "vae", V_FLAGS, "fp32", "fp32", 9, dict(batch=1, frames=4, height=3, width=5)),
    ("wan_vae_bf16", "vae", V_FLAGS, "bf16", "bf16", 10, dict(batch=1, frames=3, height=2, width=3)),
]


def weights_sum(folder):
    total = 0.0
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            for _, t in sorted(load_file(os.path.join(folder, f)).items()):
                total += t.double().sum().item()
    return total


def make(bin_dir, tmp, flags, weights_dtype, seed):
    model = os.path.join(tmp, "model")
    dt = ["--dtype", weights_dtype, "--vae-dtype", weights_dtype]
    subprocess.run([os.path.join(bin_dir, "dlo-checkpoint"), "make", model, *flags, *dt, "--seed", str(seed)],
                   check=True, stdout=subprocess.DEVNULL)
    return model


def transformer(folder, dtype, seed, s):
    from diffusers import WanTransformer3DModel
    m = WanTransformer3DModel.from_pretrained(folder, torch_dtype=dtype).eval()
    g = torch.Generator("cpu").manual_seed(seed + 1)
    x = torch.randn((s["batch"], m.config.in_channels, s["frames"], s["height"], s["width"]), generator=g)
    ctx = torch.randn((s["batch"], s["text_len"], m.config.text_dim), generator=g)
    t = torch.randint(0, 1000, (s["batch"],), generator=g)  # a different timestep per sample
    x, ctx = x.to(dtype).contiguous(), ctx.to(dtype).contiguous()
    with torch.no_grad():
        out = m(hidden_states=x, timestep=t, encoder_hidden_states=ctx, return_dict=False)[0]
    return {"hidden_states": x, "timestep": t, "encoder_hidden_states": ctx, "output": out.contiguous()}


def text_encoder(folder, dtype, seed, s):
    from transformers import UMT5EncoderModel
    m = UMT5EncoderModel.from_pretrained(folder, dtype=dtype).eval()
    g = torch.Generator("cpu").manual_seed(seed + 1)
    B, L = s["batch"], s["text_len"]
    ids = torch.randint(0, m.config.vocab_size, (B, L), generator=g)
    lens = [L, 3, 41][:B]  # one unpadded row, one short, one past max_distance
    mask = torch.zeros(B, L, dtype=torch.int64)
    for b, n in enumerate(lens):
        mask[b, :n] = 1
        ids[b, n:] = 0  # the pad id, as the tokenizer pads
    with torch.no_grad():
        last = m(input_ids=ids, attention_mask=mask).last_hidden_state
    # WanPipeline._get_t5_prompt_embeds' trim + zero-pad.
    out = torch.stack([torch.cat([u[:v], u.new_zeros(L - v, u.size(1))]) for u, v in zip(last, lens)])
    return {"input_ids": ids, "attention_mask": mask, "last_hidden_state": last.contiguous(),
            "output": out.contiguous()}


def vae(folder, dtype, seed, s):
    from diffusers import AutoencoderKLWan
    m = AutoencoderKLWan.from_pretrained(folder, torch_dtype=dtype).eval()
    cfg = m.config
    g = torch.Generator("cpu").manual_seed(seed + 1)
    latents = torch.randn((s["batch"], cfg.z_dim, s["frames"], s["height"], s["width"]), generator=g)
    # WanPipeline.__call__'s decode step (pipelines/wan/pipeline_wan.py).
    with torch.no_grad():
        lat = latents.to(m.dtype)
        mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(lat.device, lat.dtype)
        std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(lat.device, lat.dtype)
        out = m.decode(lat / std + mean, return_dict=False)[0]
    return {"latents": latents.contiguous(), "output": out.contiguous()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="folder holding dlo-checkpoint")
    ap.add_argument("--out", required=True, help="tests/data/goldens")
    ap.add_argument("--only", help="comma-separated golden names")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    run = {"transformer": transformer, "text_encoder": text_encoder, "vae": vae}
    import diffusers
    import transformers
    for name, comp, flags, wdt, cdt, seed, sizes in GOLDENS:
        if args.only and name not in args.only.split(","):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(make(args.bin, tmp, flags, wdt, seed), comp)
            tensors = run[comp](folder, DTYPES[cdt], seed, sizes)
            meta = {"component": comp, "cpu": cpu_fingerprint(), "config": open(os.path.join(folder, "config.json")).read(), "seed": str(seed),
                    "weights_dtype": wdt, "compute_dtype": cdt, "weights_sum": repr(weights_sum(folder)),
                    "made_by": f"tools/reference/make_goldens.py: dlo-checkpoint make {' '.join(flags)} --seed {seed}"
                               f" (--dtype {wdt}); torch {torch.__version__}, diffusers {diffusers.__version__}, "
                               f"transformers {transformers.__version__}"}
        path = os.path.join(args.out, name + ".safetensors")
        save_file(tensors, path, metadata=meta)
        print(f"{path}: {os.path.getsize(path)} bytes, output {tuple(tensors['output'].shape)} "
              f"{tensors['output'].dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
