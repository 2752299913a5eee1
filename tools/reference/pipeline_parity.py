#!/usr/bin/env python3
"""dlo-generate against diffusers' WanPipeline, frame for frame.

Writes a random-weight model folder with `dlo-checkpoint make` (unless --model is given), renders
one prompt with diffusers' WanPipeline.from_pretrained on that folder (CPU generator seeded with
--seed, output_type="np", then export_to_video's `(frame * 255).astype(uint8)`), renders the same
job with `dlo-generate --format png` (lossless), and compares the uint8 frames byte for byte, for
every case of --cases:

    fp32-unipc-cfg  fp32-unipc-nocfg  fp32-euler-cfg  fp32-euler-nocfg  bf16-unipc-cfg ...

fp32 cases must be identical (exit 1 otherwise); bf16 cases report the share of equal bytes and
the largest difference and fail only above --bf16-max-diff. --storage-dtype fp8 keeps the blocks'
Linears in fp8 on both sides (diffusers' enable_layerwise_casting; dlo's --storage-dtype), compared
as the case's dtype says. --ranks N runs dlo-generate under
`mpirun -np N` (the video must not depend on it). --two-experts makes a Wan2.2 A14B-shaped folder
(transformer/ and transformer_2/, boundary_ratio in model_index.json) and passes --guidance-2 /
--boundary-ratio to both sides (guidance_scale_2; the pipeline's boundary_ratio). --ti2v makes a
Wan2.2 TI2V-shaped folder (the residual Wan2.2 VAE with patch 2, expand_timesteps: a timestep per
token). --diffusers-init keeps only the made folder's configs and tokenizer: every model is
initialised by diffusers / transformers themselves (their own random init, seeded) and the folder is
written by WanPipeline.save_pretrained in 30 KB shards (--save-dtype: the transformers' file dtype).

  pipeline_parity.py --bin build/bin --cases fp32-unipc-cfg,fp32-euler-nocfg
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from PIL import Image

from parity_common import DTYPES

PROMPT = "A fox walks through fresh snow at dawn, cinematic, 4k"
NEGATIVE = "blurry, low quality, static"
STORAGE = {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16, "fp16": torch.float16}


def make_model(bin_dir, out, seed, make_args, two_experts=False, ti2v=False):
    preset = "wan2.2-a14b-test" if two_experts else "wan2.2-ti2v-test" if ti2v else "wan-test"
    cmd = [os.path.join(bin_dir, "dlo-checkpoint"), "make", out, "--preset", preset, "--layers", "2",
           "--dtype", "fp32", "--seed", str(seed)]
    if not ti2v:
        cmd += ["--in-channels", "16", "--out-channels", "16"]
    subprocess.run(cmd + make_args.split(), check=True, stdout=subprocess.DEVNULL)


def diffusers_init_folder(made, out, seed, save_dtype):
    """The folder `made`'s configs, every model initialised by diffusers / transformers, saved by
    WanPipeline.save_pretrained (sharded)."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import AutoTokenizer, UMT5Config, UMT5EncoderModel

    index = json.load(open(os.path.join(made, "model_index.json")))
    torch.manual_seed(seed)
    parts = {}
    for name in ("transformer", "transformer_2"):
        if os.path.isdir(os.path.join(made, name)):
            cfg = WanTransformer3DModel.load_config(os.path.join(made, name))
            parts[name] = WanTransformer3DModel.from_config(cfg).to(DTYPES[save_dtype])
    parts["vae"] = AutoencoderKLWan.from_config(AutoencoderKLWan.load_config(os.path.join(made, "vae")))
    parts["text_encoder"] = UMT5EncoderModel(UMT5Config.from_pretrained(os.path.join(made, "text_encoder")))
    parts["tokenizer"] = AutoTokenizer.from_pretrained(os.path.join(made, "tokenizer"))
    parts["scheduler"] = UniPCMultistepScheduler.from_pretrained(os.path.join(made, "scheduler"))
    pipe = WanPipeline(**parts, boundary_ratio=index.get("boundary_ratio"),
                       expand_timesteps=index.get("expand_timesteps", False))
    pipe.save_pretrained(out, max_shard_size="30KB")
    shards = {n: len([f for f in os.listdir(os.path.join(out, n)) if f.endswith(".safetensors")])
              for n in parts if os.path.isdir(os.path.join(out, n)) and n not in ("tokenizer", "scheduler")}
    print(f"initialised by diffusers/transformers, written by WanPipeline.save_pretrained: shards {shards}")


def diffusers_frames(model, dtype, scheduler, flow_shift, guidance, args, storage=True):
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler, WanPipeline

    torch.set_num_threads(args.threads)
    vae = AutoencoderKLWan.from_pretrained(os.path.join(model, "vae"), torch_dtype=torch.float32)
    pipe = WanPipeline.from_pretrained(model, vae=vae, torch_dtype=DTYPES[dtype])
    if scheduler == "euler":
        pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=flow_shift)
    else:
        pipe.scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config, flow_shift=flow_shift)
    pipe.set_progress_bar_config(disable=True)
    if args.storage_dtype and storage:
        # diffusers' layerwise casting: the blocks' Linears kept in the storage dtype, cast to the
        # compute dtype just before each forward (loaded in the compute dtype first, as its docs do).
        for t in (pipe.transformer, getattr(pipe, "transformer_2", None)):
            if t is not None:
                t.enable_layerwise_casting(storage_dtype=STORAGE[args.storage_dtype], compute_dtype=DTYPES[dtype])
    extra = {}
    if pipe.config.boundary_ratio is not None:
        assert pipe.transformer_2 is not None, "boundary_ratio without transformer_2"
        if args.boundary_ratio is not None:
            pipe.register_to_config(boundary_ratio=args.boundary_ratio)
        if args.guidance_2 is not None and guidance > 1:
            extra["guidance_scale_2"] = args.guidance_2
        pipe.scheduler.set_timesteps(args.steps)
        boundary = pipe.config.boundary_ratio * pipe.scheduler.config.num_train_timesteps
        experts = ["transformer" if t >= boundary else "transformer_2" for t in pipe.scheduler.timesteps]
        print(f"  diffusers: timesteps {[round(float(t), 1) for t in pipe.scheduler.timesteps]}, boundary {boundary}: "
              f"{experts.count('transformer')} step(s) with transformer, {experts.count('transformer_2')} with transformer_2")
        # A two-expert case means something only if both experts run.
        assert 0 < experts.count("transformer") < len(experts), f"the steps do not span both experts: {experts}"
    t0 = time.perf_counter()
    video = pipe(prompt=args.prompt, negative_prompt=NEGATIVE, height=args.height, width=args.width,
                 num_frames=args.frames, num_inference_steps=args.steps, guidance_scale=guidance,
                 generator=torch.Generator("cpu").manual_seed(args.seed), output_type="np", **extra).frames[0]
    seconds = time.perf_counter() - t0
    return np.stack([(frame * 255).astype(np.uint8) for frame in video]), seconds


def dlo_frames(model, dtype, scheduler, flow_shift, guidance, args, tmp):
    out = os.path.join(tmp, "frames")
    cmd = [os.path.join(args.bin, "dlo-generate"), "--model", model, "--prompt", args.prompt, "--negative-prompt",
           NEGATIVE, "--seed", str(args.seed), "--steps", str(args.steps), "--guidance", str(guidance),
           "--height", str(args.height), "--width", str(args.width), "--frames", str(args.frames),
           "--scheduler", scheduler, "--flow-shift", str(flow_shift), "--dtype", dtype, "--threads",
           str(args.threads), "--format", "png", "--out", out, "--offload", args.offload, "--quiet"]
    if args.guidance_2 is not None and guidance > 1:  # dlo refuses a guidance_2 that would do nothing
        cmd += ["--guidance-2", str(args.guidance_2)]
    if args.boundary_ratio is not None:
        cmd += ["--boundary-ratio", str(args.boundary_ratio)]
    if args.storage_dtype:
        cmd += ["--storage-dtype", args.storage_dtype]
    if args.ranks > 1:
        cmd = ["mpirun", "-np", str(args.ranks)] + cmd
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    names = sorted(n for n in os.listdir(out) if n.endswith(".png"))
    return np.stack([np.asarray(Image.open(os.path.join(out, n)).convert("RGB")) for n in names]), seconds


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", help="existing model folder (else a random one is made)")
    ap.add_argument("--make-args", default="", help="extra dlo-checkpoint make flags")
    ap.add_argument("--resave", action="store_true",
                    help="compare on the folder WanPipeline.save_pretrained writes from the model (the diffusers "
                         "0.42 model_index.json, the tokenizer as tokenizer.json alone, sharded weights)")
    ap.add_argument("--cases", default="fp32-unipc-cfg,fp32-unipc-nocfg,fp32-euler-cfg,fp32-euler-nocfg")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--prompt", default=PROMPT, help="the prompt both render (a trained model's own world draws more than flat frames)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--height", type=int, default=32)
    ap.add_argument("--width", type=int, default=48)
    ap.add_argument("--frames", type=int, default=5)
    ap.add_argument("--flow-shift", type=float, default=3.0)
    ap.add_argument("--guidance", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--two-experts", action="store_true", help="make a two-expert (Wan2.2 A14B-shaped) folder")
    ap.add_argument("--ti2v", action="store_true",
                    help="make a TI2V-shaped folder (Wan2.2 VAE, patch 2, z_dim 12; expand_timesteps)")
    ap.add_argument("--diffusers-init", action="store_true",
                    help="re-initialise every model with diffusers' / transformers' own init; save_pretrained")
    ap.add_argument("--save-dtype", default="fp32", choices=DTYPES, help="--diffusers-init: the transformers' files")
    ap.add_argument("--guidance-2", type=float, help="the low-noise expert's guidance (two experts)")
    ap.add_argument("--boundary-ratio", type=float, help="the experts' boundary (two experts; default the folder's)")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--storage-dtype", choices=STORAGE,
                    help="the blocks' Linears kept in this dtype: diffusers' enable_layerwise_casting, dlo's --storage-dtype")
    ap.add_argument("--fp8-file", action="store_true",
                    help="render the model with its transformer(s) rewritten in fp8 by dlo-checkpoint convert (with "
                         "--storage-dtype fp8: diffusers' layerwise casting of that folder against dlo streaming it as written)")
    ap.add_argument("--offload", default="auto", help="dlo-generate --offload")
    ap.add_argument("--bf16-max-diff", type=int, default=255, help="largest allowed byte difference in bf16 cases")
    ap.add_argument("--json", help="write the per-case results here")
    args = ap.parse_args(argv)

    failed = False
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            model = os.path.join(tmp, "model")
            make_model(args.bin, model, args.seed, args.make_args, args.two_experts, args.ti2v)
        if args.diffusers_init:
            saved = os.path.join(tmp, "diffusers-init")
            diffusers_init_folder(model, saved, args.seed, args.save_dtype)
            model = saved
        if args.resave:
            from diffusers import WanPipeline
            saved = os.path.join(tmp, "saved")
            WanPipeline.from_pretrained(model, torch_dtype=torch.float32).save_pretrained(saved, max_shard_size="2MB")
            index = json.load(open(os.path.join(saved, "model_index.json")))
            tokenizer = sorted(os.listdir(os.path.join(saved, "tokenizer")))
            shards = sorted(n for n in os.listdir(os.path.join(saved, "transformer")) if n.endswith(".safetensors"))
            print(f"re-saved by WanPipeline.save_pretrained: model_index.json keys {sorted(index)}, tokenizer/ "
                  f"{tokenizer}, transformer/ {len(shards)} shards")
            assert "spiece.model" not in tokenizer and "tokenizer.json" in tokenizer, tokenizer
            model = saved
        if args.fp8_file:
            # The transformer(s) as dlo-checkpoint convert writes them (the Linears fp8, rounded
            # through bf16): diffusers reads the folder as usual, its fp8 tensors upcast exactly.
            conv = os.path.join(tmp, "fp8-file")
            shutil.copytree(model, conv)
            for part in ("transformer", "transformer_2"):
                if os.path.isdir(os.path.join(model, part)):
                    shutil.rmtree(os.path.join(conv, part))
                    subprocess.run([os.path.join(args.bin, "dlo-checkpoint"), "convert", os.path.join(model, part),
                                    os.path.join(conv, part), "--storage-dtype", "fp8", "--dtype", "bf16",
                                    "--shard-size", "40KB"], check=True, stdout=subprocess.DEVNULL)
            print(f"transformer(s) converted to fp8 files by dlo-checkpoint convert: {sorted(os.listdir(os.path.join(conv, 'transformer')))[:3]} ...")
            model = conv
        for case in args.cases.split(","):
            dtype, scheduler, cfg = case.split("-")
            guidance = args.guidance if cfg == "cfg" else 1.0
            ref, ref_s = diffusers_frames(model, dtype, scheduler, args.flow_shift, guidance, args)
            ours, ours_s = dlo_frames(model, dtype, scheduler, args.flow_shift, guidance, args, tmp)
            if ours.shape != ref.shape:
                print(f"{case}: FAIL shapes differ: dlo {ours.shape} vs diffusers {ref.shape}")
                failed = True
                continue
            if args.storage_dtype and not args.fp8_file:
                # Equality means something only if the storage dtype changes the frames.
                plain, _ = diffusers_frames(model, dtype, scheduler, args.flow_shift, guidance, args, storage=False)
                changed = float((plain != ref).mean())
                print(f"{case}: the {args.storage_dtype} storage changes {changed:.4f} of diffusers' frame bytes")
                if changed == 0:
                    print(f"{case}: FAIL the storage dtype changes nothing here")
                    failed = True
                    continue
            # Equality means something only if the frames are not flat or saturated.
            distinct = len(np.unique(ref))
            if distinct < 32:
                print(f"{case}: FAIL the reference frames have only {distinct} distinct byte values")
                failed = True
                continue
            diff = np.abs(ours.astype(np.int16) - ref.astype(np.int16))
            equal = float((diff == 0).mean())
            r = {"case": case, "shape": list(ref.shape), "distinct_values": distinct, "equal_bytes": equal, "max_diff": int(diff.max()),
                 "dlo_s": ours_s, "diffusers_s": ref_s}
            results.append(r)
            ok = (diff.max() == 0) if dtype == "fp32" else (diff.max() <= args.bf16_max_diff)
            failed |= not ok
            print(f"{case}: {'ok' if ok else 'FAIL'}  frames {tuple(ref.shape)}  equal bytes {equal:.6f}  "
                  f"max diff {int(diff.max())}  distinct values {distinct}  (dlo {ours_s:.2f} s, diffusers {ref_s:.2f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
