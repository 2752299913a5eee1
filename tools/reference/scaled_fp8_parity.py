#!/usr/bin/env python3
"""A ComfyUI "scaled fp8" transformer file, rendered by dlo, against its numerics written in Python.

diffusers cannot read scaled fp8 files (it renames scale_weight into unexpected keys and never
multiplies by it), so the reference is the dequantisation itself, a few lines below, fed to
diffusers' WanPipeline: every Linear ComfyUI's scaled files quantise (Kijai's rule: all but
patch_embedding, modulation, norms and biases) is stored as q = fp8_e4m3fn(w / s), s = amax(|w|) /
448 (float32, one per tensor), with the marker tensor `scaled_fp8`; it computes with
w' = q.to(d) * s.to(d) in the dtype d the module computes in (bf16; the fp32 time embedding in
fp32), as ComfyUI's scaled fp8 ops dequantise (the weight times its scale in the compute dtype).
The script writes the scaled file from a random model (original Wan names under ComfyUI's prefix),
a diffusers folder holding w', renders both (dlo-generate --transformer FILE, WanPipeline on the
folder, bf16) and compares the frames byte for byte. Also: the frames differ from the unscaled
model's (the scales are used); --storage-dtype bf16 on the file, and the file with a scale
removed, are refused (exit 2).

  scaled_fp8_parity.py --bin build/bin [--ranks 2]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

PROMPT = "A fox walks through fresh snow at dawn"
KEEP = ("patch_embedding", "modulation", "norm", "bias")  # Kijai's scaled mode keeps these wide
FP32_MODULES = ("time_embedding",)  # diffusers' time_embedder: computed in fp32


def frames(folder):
    names = sorted(n for n in os.listdir(folder) if n.endswith(".png"))
    return np.stack([np.asarray(Image.open(os.path.join(folder, n)).convert("RGB")) for n in names])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "m")
        subprocess.run([os.path.join(args.bin, "dlo-checkpoint"), "make", model, "--preset", "wan-test", "--layers", "2",
                        "--in-channels", "16", "--out-channels", "16", "--dtype", "bf16", "--seed", "7"],
                       check=True, stdout=subprocess.DEVNULL)
        comfy = os.path.join(tmp, "comfy")
        subprocess.run([os.path.join(args.bin, "dlo-checkpoint"), "copy", os.path.join(model, "transformer"), comfy,
                        "--shard-size", "0", "--wan-names", "comfyui", "--base-name", "wan"],
                       check=True, stdout=subprocess.DEVNULL)
        original = load_file(os.path.join(comfy, "wan.safetensors"))
        scaled, dequantised, count = {}, {}, 0
        for name, w in original.items():
            bare = name[len("model.diffusion_model."):]
            if w.dim() == 2 and not any(k in bare for k in KEEP):
                s = (w.float().abs().amax() / 448.0).to(torch.float32)
                q = (w.float() / s).to(torch.float8_e4m3fn)
                d = torch.float32 if bare.startswith(FP32_MODULES) else torch.bfloat16
                scaled[name] = q
                scaled[name[: -len(".weight")] + ".scale_weight"] = s.reshape([])
                dequantised[bare] = (q.to(d) * s.to(d)).to(torch.bfloat16 if d == torch.bfloat16 else torch.float32)
                count += 1
            else:
                scaled[name] = w
        scaled["model.diffusion_model.scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)  # ComfyUI's key
        scaled_file = os.path.join(tmp, "wan_fp8_scaled.safetensors")
        save_file(scaled, scaled_file)
        print(f"scaled file: {count} Linears in fp8 e4m3fn with a scale each, marker scaled_fp8")

        # The reference folder: the model with w' in place of each quantised weight (diffusers' names).
        ref_model = os.path.join(tmp, "ref")
        shutil.copytree(model, ref_model)
        tdir = os.path.join(ref_model, "transformer")
        sd = {}
        for f in os.listdir(tdir):
            if f.endswith(".safetensors"):
                sd.update(load_file(os.path.join(tdir, f)))
                os.remove(os.path.join(tdir, f))
        for f in os.listdir(tdir):
            if f.endswith(".index.json"):
                os.remove(os.path.join(tdir, f))
        # Original names to diffusers': diffusers' own conversion (it keeps the order of the keys).
        mapping = json.loads(subprocess.run(
            [sys.executable, "-c", "import json,sys; from diffusers.loaders.single_file_utils import "
             "convert_wan_transformer_to_diffusers as c; import torch; keys=json.load(sys.stdin); "
             "sd={k: torch.zeros(1) for k in keys}; out=c(sd); print(json.dumps(list(out.keys())))"],
            input=json.dumps(list(k for k in original)), capture_output=True, text=True, check=True).stdout)
        assert len(mapping) == len(original), (len(mapping), len(original))
        bare_names = [k[len("model.diffusion_model."):] for k in original]
        for bare, diff in zip(bare_names, mapping):
            if bare in dequantised:
                assert sd[diff].shape == dequantised[bare].shape, (bare, diff)
                sd[diff] = dequantised[bare]
        save_file(sd, os.path.join(tdir, "diffusion_pytorch_model.safetensors"))

        from diffusers import AutoencoderKLWan, WanPipeline
        torch.set_num_threads(1)
        vae = AutoencoderKLWan.from_pretrained(os.path.join(ref_model, "vae"), torch_dtype=torch.float32)
        pipe = WanPipeline.from_pretrained(ref_model, vae=vae, torch_dtype=torch.bfloat16)
        pipe.set_progress_bar_config(disable=True)
        video = pipe(prompt=PROMPT, height=32, width=48, num_frames=5, num_inference_steps=args.steps, guidance_scale=4.0,
                     generator=torch.Generator("cpu").manual_seed(3), output_type="np").frames[0]
        ref = np.stack([(f * 255).astype(np.uint8) for f in video])

        def dlo(out, *extra, check=True):
            cmd = [os.path.join(args.bin, "dlo-generate"), "--model", model, "--prompt", PROMPT, "--seed", "3", "--steps",
                   str(args.steps), "--guidance", "4", "--height", "32", "--width", "48", "--frames", "5", "--threads", "1",
                   "--format", "png", "--out", os.path.join(tmp, out), "--quiet", *extra]
            if args.ranks > 1:
                cmd = ["mpirun", "-np", str(args.ranks)] + cmd + ["--offload", "dlo"]
            r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if check and r.returncode:
                sys.exit(f"{cmd}: exit {r.returncode}: {r.stderr}")
            return r

        dlo("scaled", "--transformer", scaled_file)
        ours = frames(os.path.join(tmp, "scaled"))
        dlo("plain")
        plain = frames(os.path.join(tmp, "plain"))
        diff = np.abs(ours.astype(np.int16) - ref.astype(np.int16))
        ok = diff.max() == 0 and len(np.unique(ref)) >= 32
        changed = float((plain != ours).mean())
        print(f"scaled fp8, {args.ranks} rank(s): {'ok' if ok else 'FAIL'}  frames {ref.shape}  max diff {int(diff.max())}  "
              f"distinct values {len(np.unique(ref))}; the scaled file changes {changed:.3f} of the unscaled model's bytes")
        refused = dlo("refused", "--transformer", scaled_file, "--storage-dtype", "bf16", check=False)
        refused_ok = refused.returncode == 2 and "scaled fp8 file" in refused.stderr and \
            not os.path.exists(os.path.join(tmp, "refused"))
        print(f"--storage-dtype bf16 on the scaled file: exit {refused.returncode} ({'ok' if refused_ok else 'FAIL'}): "
              f"{refused.stderr.strip().splitlines()[0] if refused.stderr.strip() else ''}")
        # A scale missing: refused by name before any work.
        del scaled["model.diffusion_model.blocks.1.ffn.2.scale_weight"]
        save_file(scaled, scaled_file)
        missing = dlo("missing", "--transformer", scaled_file, check=False)
        missing_ok = missing.returncode == 2 and "blocks.1.ffn.net.2.weight" in missing.stderr and \
            not os.path.exists(os.path.join(tmp, "missing"))
        print(f"a scale missing: exit {missing.returncode} ({'ok' if missing_ok else 'FAIL'}): "
              f"{missing.stderr.strip().splitlines()[0] if missing.stderr.strip() else ''}")
        return 0 if ok and changed > 0 and refused_ok and missing_ok else 1


if __name__ == "__main__":
    sys.exit(main())
