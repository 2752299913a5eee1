#!/usr/bin/env python3
"""The VAE files dlo writes in the original Wan layouts (dlo-checkpoint copy --wan-names original,
the same table dlo-generate --vae reads them with) hold the folder's VAE under the names diffusers
reads such files by.

Tiny Wan2.1- and TI2V-shaped folders (dlo-checkpoint make), every model re-initialised by diffusers
/ transformers and written by WanPipeline.save_pretrained in 30 KB shards (pipeline_parity.py
--diffusers-init). Each folder's vae/ is rewritten by dlo in the original layout, one file:

  Wan2.1 VAE  AutoencoderKLWan.from_single_file(FILE, config=the folder, subfolder="vae"), which
              converts with diffusers' convert_wan_vae_to_diffusers (loaders/single_file_utils.py),
              must give exactly the state dict of AutoencoderKLWan.from_pretrained(the folder's vae/):
              every name, every tensor equal.
  Wan2.2 VAE  diffusers 0.42.1 has no single-file reader for it (from_single_file detects it as the
              Wan2.1 VAE and convert_wan_vae_to_diffusers knows the Wan2.1 tree only; its rules are
              in scripts/convert_wan_to_diffusers.py convert_vae_22, not in the wheel). The file's
              names are read back with this script's own reading of convert_vae_22's rules (written
              here from them, not from dlo's table) and must give the folder's state dict; whether
              from_single_file reads it is printed, not required.

Then dlo-generate --vae FILE renders the folder's own frames (fp32, PNG), byte for byte, for both.
Exit 1 on a difference.

  single_file_vae_parity.py --bin build/bin
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file

from pipeline_parity import PROMPT, diffusers_init_folder, make_model

RESNET = {"residual.0": "norm1", "residual.2": "conv1", "residual.3": "norm2", "residual.6": "conv2",
          "shortcut": "conv_shortcut"}


def resnet_part(rest):
    for orig, diff in RESNET.items():
        if rest.startswith(orig + "."):
            return diff + rest[len(orig):]
    raise KeyError(rest)


def wan22_to_diffusers(key):
    """An original Wan2.2 VAE name as convert_vae_22 renames it."""
    fixed = {"conv1": "quant_conv", "conv2": "post_quant_conv", "encoder.conv1": "encoder.conv_in",
             "decoder.conv1": "decoder.conv_in", "encoder.head.0": "encoder.norm_out", "encoder.head.2": "encoder.conv_out",
             "decoder.head.0": "decoder.norm_out", "decoder.head.2": "decoder.conv_out"}
    module, _, tail = key.rpartition(".")
    if module in fixed:
        return fixed[module] + "." + tail
    m = re.fullmatch(r"(encoder|decoder)\.middle\.(\d)\.(.*)", key)
    if m:
        coder, i, rest = m.groups()
        if i == "1":
            return f"{coder}.mid_block.attentions.0.{rest}"
        return f"{coder}.mid_block.resnets.{0 if i == '0' else 1}.{resnet_part(rest)}"
    m = re.fullmatch(r"encoder\.downsamples\.(\d+)\.downsamples\.(\d+)\.(.*)", key) or \
        re.fullmatch(r"decoder\.upsamples\.(\d+)\.upsamples\.(\d+)\.(.*)", key)
    if m:
        i, j, rest = m.groups()
        stage = ("encoder.down_blocks." if key.startswith("encoder") else "decoder.up_blocks.") + i
        if rest.startswith(("resample.", "time_conv.")):
            return f"{stage}.{'downsampler' if key.startswith('encoder') else 'upsampler'}.{rest}"
        return f"{stage}.resnets.{j}.{resnet_part(rest)}"
    raise KeyError(key)


def state_dict_of(folder):
    sd = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            sd.update(load_file(os.path.join(folder, f)))
    return sd


def same(a, b):
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def dlo_frames(args, model, out, width, vae=None):
    cmd = [os.path.join(args.bin, "dlo-generate"), "--model", model, "--prompt", PROMPT, "--seed", "7", "--steps", "2",
           "--guidance", "4", "--height", "32", "--width", str(width), "--frames", "5", "--dtype", "fp32", "--threads", "1",
           "--format", "png", "--out", out, "--quiet"]
    if vae:
        cmd += ["--vae", vae]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    names = sorted(n for n in os.listdir(out) if n.endswith(".png"))
    return np.stack([np.asarray(Image.open(os.path.join(out, n)).convert("RGB")) for n in names])


def main(argv=None):
    from diffusers import AutoencoderKLWan

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for kind, ti2v, width in (("Wan2.1", False, 48), ("Wan2.2", True, 64)):
            made, model = os.path.join(tmp, kind + "-made"), os.path.join(tmp, kind)
            make_model(args.bin, made, args.seed, "", ti2v=ti2v)
            diffusers_init_folder(made, model, args.seed, "fp32")
            out = os.path.join(tmp, kind + "-original")
            subprocess.run([os.path.join(args.bin, "dlo-checkpoint"), "copy", os.path.join(model, "vae"), out,
                            "--shard-size", "0", "--wan-names", "original", "--base-name", "vae"],
                           check=True, stdout=subprocess.DEVNULL)
            file = os.path.join(out, "vae.safetensors")
            folder = AutoencoderKLWan.from_pretrained(os.path.join(model, "vae"), torch_dtype=torch.float32).state_dict()
            try:
                single = AutoencoderKLWan.from_single_file(file, config=model, subfolder="vae",
                                                           torch_dtype=torch.float32).state_dict()
                read = same(single, folder)
            except Exception as e:  # diffusers' Wan2.1 reader on a Wan2.2 file
                read = False
                print(f"{kind}: from_single_file fails: {type(e).__name__}: {str(e)[:120]}")
            if kind == "Wan2.1":
                failed |= not read
                print(f"{kind}: {len(folder)} tensors; from_single_file on dlo's original-layout file "
                      f"{'gives' if read else 'DOES NOT GIVE'} the folder's state dict")
            else:
                ours = {wan22_to_diffusers(k): v for k, v in load_file(file).items()}
                ok = same(ours, folder)
                failed |= not ok
                print(f"{kind}: {len(folder)} tensors; convert_vae_22's rules on dlo's original-layout file "
                      f"{'give' if ok else 'DO NOT GIVE'} the folder's state dict (from_single_file reads it: {read}, "
                      f"not required)")
            want = dlo_frames(args, model, os.path.join(tmp, kind + "-f-folder"), width)
            got = dlo_frames(args, model, os.path.join(tmp, kind + "-f-file"), width, file)
            equal = np.array_equal(got, want)
            failed |= not equal
            print(f"{kind}: dlo-generate --vae FILE {'renders' if equal else 'DOES NOT RENDER'} the folder's frames")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
