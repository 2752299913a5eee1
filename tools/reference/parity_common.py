"""What the parity scripts share: their common flags, making a random model with
`dlo-checkpoint make`, running `dlo-forward` on it, the relative error, and the CPU fingerprint
stored goldens record."""
import hashlib
import os
import subprocess
import time

import torch
from safetensors.torch import load_file

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cpu_fingerprint():
    """"<vendor_id> | <model name> | <16 hex of sha256(flags)>" of the first CPU in /proc/cpuinfo,
    as tests/models/golden.h computes it: fp32 GEMMs and convolutions round differently on different
    x86 microarchitectures, so a stored golden is bit-exact only on the CPU that made it."""
    fields = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields.setdefault(key.rstrip(" \t"), value[1:].rstrip("\n"))
    vendor = fields.get("vendor_id", fields.get("CPU implementer", ""))  # x86, else arm64's fields
    model = fields.get("model name", fields.get("CPU part", ""))
    flags = fields.get("flags", fields.get("Features", ""))
    return f"{vendor} | {model} | {hashlib.sha256(flags.encode()).hexdigest()[:16]}"


def add_common_args(ap, make_example):
    ap.add_argument("--bin", required=True, help="folder holding dlo-checkpoint and dlo-forward")
    ap.add_argument("--model", help="existing model directory (else one is generated)")
    ap.add_argument("--make-args", default="", help=f"extra dlo-checkpoint make flags, e.g. '{make_example}'")
    ap.add_argument("--weights-dtype", default="fp32", help="dtype the checkpoint is stored in")
    ap.add_argument("--dtype", default="fp32", choices=DTYPES, help="compute dtype of both runs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, required=True,
                    help="bar on ||ours - ref|| / ||ref||; 0 demands bitwise equality")


def make_model(args, tmp, *flags):
    """args.model, or a random model written into tmp by `dlo-checkpoint make FLAGS --seed S MAKE_ARGS`."""
    if args.model is not None:
        return args.model
    model = os.path.join(tmp, "model")
    cmd = [os.path.join(args.bin, "dlo-checkpoint"), "make", model, *flags, "--seed", str(args.seed)]
    subprocess.run(cmd + args.make_args.split(), check=True, stdout=subprocess.DEVNULL)
    return model


def add_vae_model_args(ap):
    """The VAE parity scripts' model flags (vae_model)."""
    ap.add_argument("--vae-preset", default="wan-vae-test")
    ap.add_argument("--diffusers-init", metavar="JSON",
                    help="instead of dlo-checkpoint make: AutoencoderKLWan(**JSON) with diffusers' own random init, "
                         "written by save_pretrained (tests configs the make flags cannot express)")


def vae_model(args, tmp):
    """args.model; or a folder whose vae/ diffusers' save_pretrained wrote from AutoencoderKLWan(**--diffusers-init)
    (seeded, cast to --weights-dtype); or `dlo-checkpoint make --components vae --vae-preset P`."""
    if args.model is None and args.diffusers_init:
        import json

        import torch
        from diffusers import AutoencoderKLWan

        model = os.path.join(tmp, "model")
        torch.manual_seed(args.seed)
        ref_init = AutoencoderKLWan(**json.loads(args.diffusers_init))
        if args.weights_dtype != "fp32":
            ref_init = ref_init.to(DTYPES[args.weights_dtype])
        ref_init.save_pretrained(os.path.join(model, "vae"))
        return model
    return make_model(args, tmp, "--components", "vae", "--vae-preset", args.vae_preset, "--vae-dtype",
                      args.weights_dtype)


def run_dlo_forward(args, model, component, inputs, out):
    """Runs dlo-forward once; returns (its output tensors, wall seconds including process start)."""
    t0 = time.perf_counter()
    subprocess.run([os.path.join(args.bin, "dlo-forward"), "--model", model, "--component", component, "--inputs",
                    inputs, "--out", out, "--dtype", args.dtype, "--threads", str(args.threads)], check=True)
    return load_file(out), time.perf_counter() - t0


def rel_err(a, b):
    """||a - b|| / ||b|| in float64; inf when shape or dtype differ."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return float("inf")
    ref = b.double().norm().item()
    diff = (a.double() - b.double()).norm().item()
    return diff / ref if ref > 0 else diff


def max_abs(a, b):
    return (a.double() - b.double()).abs().max().item() if a.shape == b.shape else float("inf")
