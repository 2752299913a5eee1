#!/usr/bin/env python3
"""dlo-generate --transformer FILE: a folder's transformer rewritten as the single files users have
renders the folder's own frames, byte for byte.

Makes a tiny Wan2.1-shaped folder (dlo-checkpoint make), re-initialised by diffusers / transformers
and written by WanPipeline.save_pretrained in 30 KB shards (pipeline_parity.py --diffusers-init).
Its transformer's tensors are rewritten under the original Wan names: the names are this script's
own inverse of diffusers' table, and diffusers' convert_wan_transformer_to_diffusers
(loaders/single_file_utils.py), the function diffusers' from_single_file loads such files with,
must turn the file back into exactly the folder's state dict (every name, every tensor equal), so
the files are what diffusers reads as this model. Written as:

  original.safetensors   the original Wan layout, one file
  comfyui.safetensors    the same names under ComfyUI's 'model.diffusion_model.' prefix
  sharded/               the original layout in 3 shards + index (the Wan-AI repositories' form)

Then one job is rendered (fp32, a --jobs batch of one prompt, PNG frames) from the folder alone and
with --transformer naming each file; results.jsonl's frames_sha256 must be equal in every run, and
the job's fingerprint must differ from the folder's own (another transformer file is another
model identity). Exit 1 on any difference.

  single_file_parity.py --bin build/bin
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

from pipeline_parity import diffusers_init_folder, make_model

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


def render(args, model, out, transformer=None):
    prompts = os.path.join(out + ".txt")
    with open(prompts, "w") as f:
        f.write("A fox walks through fresh snow at dawn\n")
    cmd = [os.path.join(args.bin, "dlo-generate"), "--model", model, "--jobs", prompts, "--output-dir", out,
           "--seed", "7", "--steps", "2", "--guidance", "4", "--height", "32", "--width", "48", "--frames", "5",
           "--dtype", "fp32", "--threads", "1", "--format", "png", "--quiet"]
    if transformer:
        cmd += ["--transformer", transformer]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "results.jsonl")) as f:
        line = json.loads(f.read().splitlines()[-1])
    assert line["status"] == "ok", line
    return line["frames_sha256"], line["fingerprint"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        made, model = os.path.join(tmp, "made"), os.path.join(tmp, "model")
        make_model(args.bin, made, args.seed, "")
        diffusers_init_folder(made, model, args.seed, "fp32")
        files = write_files(os.path.join(model, "transformer"), tmp)
        want, folder_fp = render(args, model, os.path.join(tmp, "out-folder"))
        print(f"folder's own transformer: frames {want}")
        failed = False
        for name, path in files.items():
            got, fp = render(args, model, os.path.join(tmp, "out-" + name), path)
            same = got == want
            failed |= not same or fp == folder_fp
            print(f"--transformer {name}: frames {got} {'equal' if same else 'DIFFER'}; fingerprint "
                  f"{'differs from the folder' if fp != folder_fp else 'SAME AS THE FOLDER (identity misses the file)'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
