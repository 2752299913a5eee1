#!/usr/bin/env python3
"""dlo-generate --transformer FILE against diffusers on the same file: the single files users have
render WanPipeline's frames, byte for byte.

Makes a tiny Wan2.1-shaped folder (dlo-checkpoint make), re-initialised by diffusers / transformers
and written by WanPipeline.save_pretrained in 30 KB shards (pipeline_parity.py --diffusers-init).
Its transformer's tensors are rewritten under the original Wan names: the names are this script's
own inverse of diffusers' table, and diffusers' convert_wan_transformer_to_diffusers
(loaders/single_file_utils.py), the function from_single_file loads such files with, must turn the
file back into exactly the folder's state dict (every name, every tensor equal). Written as:

  original.safetensors   the original Wan layout, one file
  comfyui.safetensors    the same names under ComfyUI's 'model.diffusion_model.' prefix
  sharded/               the original layout in 3 shards + index (the Wan-AI repositories' form)

One prompt is rendered (fp32, guided, PNG frames) by dlo-generate --transformer FILE and by
WanPipeline with WanTransformer3DModel.from_single_file(FILE, config=the folder's transformer);
the uint8 frames must be equal (the sharded folder, which diffusers does not read, goes in as its
shards' state dict). Also the folder's own frames against WanPipeline's. Whether a file's frames
equal the folder's is printed, not required: dlo, like diffusers, computes on views of the file's
mapping, and a CPU kernel may round by the data's alignment (MKL's fp32 GEMV of the time
embedding does, at 16 bytes), which another file's header length changes. Exit 1 on a difference.

  single_file_parity.py --bin build/bin
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from pipeline_parity import PROMPT, diffusers_init_folder, make_model

# Original Wan module -> diffusers module (T2V), inverted below: written here from the Wan
# repository's module names, checked against diffusers' own conversion at run time.
ORIGINAL_TO_DIFFUSERS_BLOCK = {
    "self_attn.q": "attn1.to_q", "self_attn.k": "attn1.to_k", "self_attn.v": "attn1.to_v",
    "self_attn.o": "attn1.to_out.0", "self_attn.norm_q": "attn1.norm_q", "self_attn.norm_k": "attn1.norm_k",
    "cross_attn.q": "attn2.to_q", "cross_attn.k": "attn2.to_k", "cross_attn.v": "attn2.to_v",
    "cross_attn.o": "attn2.to_out.0", "cross_attn.norm_q": "attn2.norm_q", "cross_attn.norm_k": "attn2.norm_k",
    "norm3": "norm2", "ffn.0": "ffn.net.0.proj", "ffn.2": "ffn.net.2", "modulation": "scale_shift_table",
}
ORIGINAL_TO_DIFFUSERS_GLOBAL = {
    "patch_embedding": "patch_embedding",
    "text_embedding.0": "condition_embedder.text_embedder.linear_1",
    "text_embedding.2": "condition_embedder.text_embedder.linear_2",
    "time_embedding.0": "condition_embedder.time_embedder.linear_1",
    "time_embedding.2": "condition_embedder.time_embedder.linear_2",
    "time_projection.1": "condition_embedder.time_proj",
    "head.head": "proj_out", "head.modulation": "scale_shift_table",
}


def to_original(name):
    def swap(rest, table):
        for orig, diff in table.items():
            if rest == diff or rest.startswith(diff + "."):
                return orig + rest[len(diff):]
        raise KeyError(name)
    if name.startswith("blocks."):
        n, rest = name[len("blocks."):].split(".", 1)
        return f"blocks.{n}." + swap(rest, ORIGINAL_TO_DIFFUSERS_BLOCK)
    return swap(name, ORIGINAL_TO_DIFFUSERS_GLOBAL)


def folder_state_dict(folder):
    sd = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            sd.update(load_file(os.path.join(folder, f)))
    return sd


def write_files(transformer_dir, out):
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    sd = folder_state_dict(transformer_dir)
    original = {to_original(k): v.contiguous() for k, v in sd.items()}
    assert len(original) == len(sd), "two diffusers names gave one original name"
    for prefix in ("", "model.diffusion_model."):
        back = convert_wan_transformer_to_diffusers({prefix + k: v for k, v in original.items()})
        assert sorted(back) == sorted(sd), f"diffusers reads other names back: {sorted(set(back) ^ set(sd))[:5]}"
        assert all(torch.equal(back[k], sd[k]) for k in sd), "diffusers reads other tensors back"
    print(f"{len(sd)} tensors; diffusers' convert_wan_transformer_to_diffusers reads the original names back exactly")
    files = {"original": os.path.join(out, "original.safetensors"), "comfyui": os.path.join(out, "comfyui.safetensors")}
    save_file(original, files["original"])
    save_file({"model.diffusion_model." + k: v for k, v in original.items()}, files["comfyui"])
    sharded = os.path.join(out, "sharded")
    os.makedirs(sharded)
    names = sorted(original)
    parts = [names[i::3] for i in range(3)]
    weight_map = {}
    for i, part in enumerate(parts):
        shard = f"diffusion_pytorch_model-{i + 1:05d}-of-00003.safetensors"
        save_file({k: original[k] for k in part}, os.path.join(sharded, shard))
        weight_map.update({k: shard for k in part})
    with open(os.path.join(sharded, "diffusion_pytorch_model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    files["sharded"] = sharded
    return files


def dlo_frames(args, model, out, transformer=None):
    cmd = [os.path.join(args.bin, "dlo-generate"), "--model", model, "--prompt", PROMPT, "--seed", "7", "--steps", "2",
           "--guidance", "4", "--height", "32", "--width", "48", "--frames", "5", "--dtype", "fp32", "--threads", "1",
           "--format", "png", "--out", out, "--quiet"]
    if transformer:
        cmd += ["--transformer", transformer]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    names = sorted(n for n in os.listdir(out) if n.endswith(".png"))
    return np.stack([np.asarray(Image.open(os.path.join(out, n)).convert("RGB")) for n in names])


def diffusers_frames(model, transformer=None):
    """WanPipeline on the folder; with `transformer` (a file, or a state dict of one) that transformer
    as diffusers' from_single_file loads it (the folder's transformer config)."""
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

    extra = {"vae": AutoencoderKLWan.from_pretrained(os.path.join(model, "vae"), torch_dtype=torch.float32)}
    if transformer is not None:
        extra["transformer"] = WanTransformer3DModel.from_single_file(transformer, config=model, subfolder="transformer",
                                                                      torch_dtype=torch.float32)
    pipe = WanPipeline.from_pretrained(model, torch_dtype=torch.float32, **extra)
    pipe.set_progress_bar_config(disable=True)
    video = pipe(prompt=PROMPT, negative_prompt="", height=32, width=48, num_frames=5, num_inference_steps=2,
                 guidance_scale=4.0, generator=torch.Generator("cpu").manual_seed(7), output_type="np").frames[0]
    return np.stack([(frame * 255).astype(np.uint8) for frame in video])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        made, model = os.path.join(tmp, "made"), os.path.join(tmp, "model")
        make_model(args.bin, made, args.seed, "")
        diffusers_init_folder(made, model, args.seed, "fp32")
        files = write_files(os.path.join(model, "transformer"), tmp)
        folder = dlo_frames(args, model, os.path.join(tmp, "f-folder"))
        same = np.array_equal(folder, diffusers_frames(model))
        failed |= not same
        print(f"the folder's own transformer: dlo {'equals' if same else 'DIFFERS FROM'} WanPipeline")
        for name, path in files.items():
            # diffusers reads no sharded original folder: its shards' tensors as one state dict (views, as load_file gives).
            ref = path if name != "sharded" else {k: v for f in sorted(os.listdir(path)) if f.endswith(".safetensors")
                                                  for k, v in load_file(os.path.join(path, f)).items()}
            got = dlo_frames(args, model, os.path.join(tmp, "f-" + name), path)
            same = np.array_equal(got, diffusers_frames(model, ref))
            failed |= not same
            print(f"--transformer {name}: dlo {'equals' if same else 'DIFFERS FROM'} WanPipeline with "
                  f"from_single_file; equal to the folder's frames: {np.array_equal(got, folder)} (not required: "
                  f"both compute on views of the files, and CPU kernels may round by the data's alignment)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
