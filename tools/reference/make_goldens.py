#!/usr/bin/env python3
"""Golden tensors from diffusers / transformers for the C++ `cpu` tests (tests/data/goldens/).

The `cpu` label alone must catch a wrong RoPE, block, bucket or VAE cache: these files hold small
inputs and the reference outputs that diffusers' WanTransformer3DModel, transformers'
UMT5EncoderModel (+ WanPipeline's trim and pad) and diffusers' AutoencoderKLWan (+ WanPipeline's
de-normalisation; its encoder + WanImageToVideoPipeline's normalisation) compute for them. No weights are stored: each golden's weights are written by
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

"wan_vae22_fp32" is the Wan2.2 (TI2V-5B) VAE's decoder structure: residual up blocks whose
DupUp3D shortcuts regroup channels into pixels and frames, the 2x2 unpatchify and z_dim 48, at
base_dim 8 / decoder_base_dim 16. `dlo-checkpoint make` has no flag for z_dim, so its folder is
written here from VAE22_CONFIG by write_random_vae(), this file's copy of dlo's random writer
(lib/dlo/testing/random_weights.cpp + write_random_wan_vae's init rules: values from torch's CPU
generator seeded with FNV-1a(seed, tensor name)); check_random_writer() proves the copy equal,
tensor for tensor, to what `dlo-checkpoint make --vae-preset wan2.2-vae-test` writes, and the C++
test writes the same weights with write_random_wan_vae from the config in the metadata (their sum
is checked there too).

Regenerate (after a deliberate change to the random writers or to the reference versions):
  tools/setup.sh && .venv/bin/python tools/reference/make_goldens.py --bin build/bin --out tests/data/goldens
then `ctest --test-dir build -L cpu`. --check recomputes the goldens (or --only those) and compares
them with the files in --out (the `parity` label does): bitwise on the CPU type that made them,
elsewhere within the C++ tests' bars (tests/models/golden.h). Versions used: torch 2.11.0,
diffusers 0.42.1, transformers 5.23.0 (tools/requirements.txt).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open
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

# The Wan2.2 VAE's structure (residual, patch 2, z_dim 48; 16x spatial, 4x temporal) at base_dim 8,
# decoder_base_dim 16 (decoder stages of 64, 64, 64, 32, 16 channels). Its 48 de-normalisation
# constants are drawn (seeded) at about the real ones' scale: they only have to differ by channel.
_g = torch.Generator().manual_seed(22)
VAE22_CONFIG = {"_class_name": "AutoencoderKLWan", "attn_scales": [], "base_dim": 8, "decoder_base_dim": 16,
                "dim_mult": [1, 2, 4, 4], "dropout": 0.0, "in_channels": 12, "is_residual": True,
                "latents_mean": [round(v, 4) for v in (torch.randn(48, generator=_g) * 0.6).tolist()],
                "latents_std": [round(v, 4) for v in (0.4 + 1.6 * torch.rand(48, generator=_g)).tolist()],
                "num_res_blocks": 2, "out_channels": 12, "patch_size": 2, "scale_factor_spatial": 16,
                "scale_factor_temporal": 4, "temperal_downsample": [False, True, True], "z_dim": 48}
del _g

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
    # 2 latent frames (the first chunk, whose DupUp3D drops its leading frame, and one after it) of
    # 1x2 (not square: a swapped height/width in a pixel regrouping shows): 5 frames of 16x32, 30 KB.
    ("wan_vae22_fp32", "vae", VAE22_CONFIG, "fp32", "fp32", 12, dict(batch=1, frames=2, height=1, width=2)),
    # The encoders (WanImageToVideoPipeline's retrieve_latents(vae.encode(video), "argmax") and its
    # normalisation): 9 frames (frame 0 alone, then two 4-frame chunks, the second with full
    # caches) of 16x24 (Wan2.1: not square) and 16x32 (Wan2.2: its 2x2 patchify, AvgDown3D shortcuts).
    ("wan_vae_encode_fp32", "vae_encoder", V_FLAGS, "fp32", "fp32", 13, dict(batch=1, frames=9, height=16, width=24)),
    ("wan_vae22_encode_fp32", "vae_encoder", VAE22_CONFIG, "fp32", "fp32", 14,
     dict(batch=1, frames=9, height=16, width=32)),
]


def weights_sum(folder):
    total = 0.0
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            for _, t in sorted(load_file(os.path.join(folder, f)).items()):
                total += t.double().sum().item()
    return total


def tensor_seed(seed, name):
    """lib/dlo/testing/random_weights.cpp's tensor_seed: FNV-1a of the name mixed with the seed."""
    m = (1 << 64) - 1
    h = 1469598103934665603 ^ ((seed * 0x9E3779B97F4A7C15) & m)
    for ch in name.encode():
        h = ((h ^ ch) * 1099511628211) & m
    return h


def vae_init(name, shape):
    """write_random_wan_vae's rule (lib/dlo/testing/make_model.cpp) over default_init: (mean, std)."""
    if name.endswith(".gamma"):
        return 1.0, 0.1
    if len(shape) >= 2:
        fan_in = max(math.prod(shape[1:]), 1)
        return 0.0, (0.5 if name.endswith("conv_out.weight") else 1.0) / math.sqrt(fan_in)
    return (1.0, 0.02) if "norm" in name and name.endswith(".weight") else (0.0, 0.02)


def write_random_vae(folder, config, seed):
    """An fp32 AutoencoderKLWan folder of `config` with dlo's random weights for `seed` (the values
    write_random_wan_vae writes: each tensor mean + std * N(0, 1) from its own CPU generator)."""
    from diffusers import AutoencoderKLWan
    cfg = {k: v for k, v in config.items() if not k.startswith("_")}
    shapes = {k: tuple(v.shape) for k, v in AutoencoderKLWan(**cfg).state_dict().items()}
    tensors = {}
    for name, shape in shapes.items():
        mean, std = vae_init(name, shape)
        g = torch.Generator("cpu").manual_seed(tensor_seed(seed, name))
        tensors[name] = torch.empty(shape, dtype=torch.float32).normal_(mean, std, generator=g)
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    return folder


def check_random_writer(bin_dir, tmp, seed):
    """write_random_vae must write what dlo does: compared, tensor for tensor, with the Wan2.2-structured
    VAE `dlo-checkpoint make --vae-preset wan2.2-vae-test` writes (its own config: z_dim 12)."""
    made = os.path.join(make(bin_dir, os.path.join(tmp, "writer_check"), ["--components", "vae", "--vae-preset",
                                                                         "wan2.2-vae-test"], "fp32", seed), "vae")
    ours = write_random_vae(os.path.join(tmp, "writer_check_py"), json.load(open(os.path.join(made, "config.json"))),
                            seed)
    a = load_file(os.path.join(made, "diffusion_pytorch_model.safetensors"))
    b = load_file(os.path.join(ours, "diffusion_pytorch_model.safetensors"))
    bad = sorted(set(a) ^ set(b)) + sorted(k for k in set(a) & set(b) if not torch.equal(a[k], b[k]))
    if bad:
        sys.exit(f"make_goldens.py's random writer differs from dlo-checkpoint make's on {len(bad)} tensors "
                 f"(first: {bad[:3]}): update write_random_vae to lib/dlo/testing/")
    print(f"random writer: {len(a)} tensors equal to dlo-checkpoint make's (wan2.2-vae-test, seed {seed})")


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


def vae_encoder(folder, dtype, seed, s):
    from diffusers import AutoencoderKLWan
    from diffusers.pipelines.wan.pipeline_wan_i2v import retrieve_latents
    m = AutoencoderKLWan.from_pretrained(folder, torch_dtype=dtype).eval()
    cfg = m.config
    g = torch.Generator("cpu").manual_seed(seed + 1)
    video = torch.rand((s["batch"], 3, s["frames"], s["height"], s["width"]), generator=g) * 2 - 1
    # WanImageToVideoPipeline.prepare_latents (pipelines/wan/pipeline_wan_i2v.py).
    with torch.no_grad():
        latents = retrieve_latents(m.encode(video.to(m.dtype)), sample_mode="argmax")
        mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to("cpu", torch.float32)
        std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to("cpu", torch.float32)
        normalized = (latents.to(torch.float32) - mean) * std
    return {"video": video.contiguous(), "output": latents.contiguous(), "latents_normalized": normalized.contiguous()}


def compare(path, tensors, meta):
    """Names of the tensors / metadata of `path` that differ from the recomputed ones: bitwise on the CPU
    that made the file, elsewhere within golden.h's bars (rel 1e-5 fp32, 2e-2 bf16; integers equal)."""
    committed = load_file(path)
    with safe_open(path, "pt") as f:
        old = f.metadata() or {}
    here = old.get("cpu") == meta["cpu"]
    bad = sorted(set(committed) ^ set(tensors))
    worst = 0.0
    for k in sorted(set(committed) & set(tensors)):
        a, b = committed[k], tensors[k]
        if a.dtype != b.dtype or a.shape != b.shape:
            bad.append(k)
        elif not torch.equal(a, b):
            err = ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()
            worst = max(worst, err)
            if here or not a.is_floating_point() or err > (1e-5 if a.dtype == torch.float32 else 2e-2):
                bad.append(k)
    for k in ("config", "seed", "weights_dtype", "compute_dtype"):
        if old.get(k) != meta[k]:
            bad.append("metadata " + k)
    if abs(float(old.get("weights_sum", "nan")) - float(meta["weights_sum"])) > 1e-9 * max(1.0, abs(float(meta["weights_sum"]))):
        bad.append("metadata weights_sum")
    where = "bitwise (made on this CPU type)" if here else f"within the bars (made on '{old.get('cpu', 'unrecorded')}')"
    print(f"{path}: {len(tensors)} tensors recomputed, compared {where}, largest rel err {worst:.2e}, "
          f"{len(bad)} differ{': ' + ', '.join(bad) if bad else ''}")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="folder holding dlo-checkpoint")
    ap.add_argument("--out", required=True, help="tests/data/goldens")
    ap.add_argument("--only", help="comma-separated golden names")
    ap.add_argument("--check", action="store_true", help="recompute the goldens and compare them with the files in "
                                                         "--out instead of writing them (exit 1 on a difference)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not args.check:
        os.makedirs(args.out, exist_ok=True)
    run = {"transformer": transformer, "text_encoder": text_encoder, "vae": vae, "vae_encoder": vae_encoder}
    import diffusers
    import transformers
    differ = []
    for name, comp, flags, wdt, cdt, seed, sizes in GOLDENS:
        if args.only and name not in args.only.split(","):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            if isinstance(flags, dict):  # a VAE config dlo-checkpoint make cannot express (fp32 weights)
                assert comp.startswith("vae") and wdt == "fp32"
                check_random_writer(args.bin, tmp, seed)
                folder = write_random_vae(os.path.join(tmp, "vae"), flags, seed)
                how = f"write_random_vae(VAE22_CONFIG, seed {seed})"
            else:
                folder = os.path.join(make(args.bin, tmp, flags, wdt, seed), "vae" if comp == "vae_encoder" else comp)
                how = f"dlo-checkpoint make {' '.join(flags)} --seed {seed} (--dtype {wdt})"
            tensors = run[comp](folder, DTYPES[cdt], seed, sizes)
            meta = {"component": comp, "cpu": cpu_fingerprint(), "config": open(os.path.join(folder, "config.json")).read(), "seed": str(seed),
                    "weights_dtype": wdt, "compute_dtype": cdt, "weights_sum": repr(weights_sum(folder)),
                    "made_by": f"tools/reference/make_goldens.py: {how}; torch {torch.__version__}, "
                               f"diffusers {diffusers.__version__}, transformers {transformers.__version__}"}
        path = os.path.join(args.out, name + ".safetensors")
        if args.check:
            differ += compare(path, tensors, meta)
            continue
        save_file(tensors, path, metadata=meta)
        print(f"{path}: {os.path.getsize(path)} bytes, output {tuple(tensors['output'].shape)} "
              f"{tensors['output'].dtype}")
    if differ:
        print("The installed diffusers / transformers no longer give the committed goldens: check what changed, "
              "then regenerate without --check.")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
