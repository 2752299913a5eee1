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
written by WanPipeline.save_pretrained in 30 KB shards (--save-dtype: the transformers' file dtype). --fuse-lora [high=|low=]KIND[:STRENGTH] (repeatable,
in order) writes a LoRA file of KIND for the folder's transformer (wan_lora_parity.py's: peft_meta,
peft_plain, comfy, comfy_ab, musubi) and fuses it on both sides: diffusers' load_lora_weights (into
transformer_2 for low=), set_adapters(names, strengths), fuse_lora(), before any layerwise casting;
dlo-generate --fuse-lora FILE:STRENGTH. --lora likewise, unfused: diffusers' adapters loaded and
set, not fused (PEFT's unfused forward); dlo's job field `loras` (--lora "A:S, B:T"). A case then
also checks that the LoRAs change the frames.
--schedule lightx2v (euler cases) gives WanPipeline's FlowMatchEulerDiscreteScheduler the sigmas of
lightx2v's distilled models, set_timesteps(sigmas=float32(1 - i/steps)) (diffusers shifts them), and
dlo-generate --schedule lightx2v; the script first checks those timesteps against Wan2.2-Lightning's
EulerScheduler and, at 4 steps, LightX2V's WanStepDistillScheduler (lightx2v_schedules below), and a
case also checks that the schedule changes the frames.

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


def lightx2v_schedules(steps, shift):
    """The timesteps of lightx2v's samplers, written from their sources (no lightx2v package here):
    {"lightning": [...], "lightx2v": [...] (4 steps only)}, float32 tensors.

    Wan2.2-Lightning (github.com/ModelTC/Wan2.2-Lightning 92efeb4, wan/utils/fm_solvers_euler.py,
    EulerScheduler.set_timesteps + set_shift): t = np.linspace(1000, 0, steps + 1, float32); sigmas =
    t / 1000 shifted by shift * s / (1 + (shift - 1) * s); timesteps = sigmas * 1000, the last (0) dropped
    (wan/text2video.py: sample_scheduler.timesteps[:-1]).
    LightX2V (github.com/ModelTC/LightX2V f8aee98, lightx2v/models/schedulers/wan/step_distill/
    scheduler.py, WanStepDistillScheduler.set_denoising_timesteps): sigmas = torch.linspace(1, 0, 1001)[:-1],
    shifted alike, timesteps = sigmas * 1000, taken at 1000 - t for t in denoising_step_list [1000, 750, 500,
    250] (configs/distill/wan21/wan_t2v_distill_lora_4step_cfg.json)."""
    t = torch.from_numpy(np.linspace(1000, 0, steps + 1, dtype=np.float32))
    sg = t / 1000
    sg = shift * sg / (1 + (shift - 1) * sg)
    out = {"lightning": (sg * 1000)[:-1]}
    if steps == 4:
        sg = torch.linspace(1.0, 0.0, 1001)[:-1]
        sg = shift * sg / (1 + (shift - 1) * sg)
        out["lightx2v"] = (sg * 1000)[[1000 - x for x in [1000, 750, 500, 250]]]
    return out


def lightx2v_sigmas(steps):
    """The unshifted sigmas diffusers' set_timesteps(sigmas=...) takes for the lightx2v schedule."""
    return (np.linspace(1000, 0, steps + 1, dtype=np.float32)[:-1] / np.float32(1000)).tolist()


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


def diffusers_frames(model, dtype, scheduler, flow_shift, guidance, args, storage=True, schedule=None):
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler, WanPipeline

    torch.set_num_threads(args.threads)
    vae = AutoencoderKLWan.from_pretrained(os.path.join(model, "vae"), torch_dtype=torch.float32)
    pipe = WanPipeline.from_pretrained(model, vae=vae, torch_dtype=DTYPES[dtype])
    if scheduler == "euler":
        pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=flow_shift)
    else:
        pipe.scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config, flow_shift=flow_shift)
    if (args.schedule if schedule is None else schedule) == "lightx2v":
        # WanPipeline calls set_timesteps(steps, device=...) and passes no sigmas: give it them.
        assert scheduler == "euler", "the lightx2v schedule samples with euler"
        plain_set = pipe.scheduler.set_timesteps
        pipe.scheduler.set_timesteps = lambda n=None, device=None, **kw: plain_set(
            device=device, sigmas=lightx2v_sigmas(n))
    pipe.set_progress_bar_config(disable=True)
    if args.lora_files and storage:
        names, strengths = [], []
        for i, (expert, path, strength) in enumerate(args.lora_files):
            pipe.load_lora_weights(path, adapter_name=f"l{i}", load_into_transformer_2=expert == "low")
            names.append(f"l{i}")
            strengths.append(strength)
        pipe.set_adapters(names, adapter_weights=strengths)
        if args.fuse_lora:
            parts = ["transformer"] + (["transformer_2"] if getattr(pipe, "transformer_2", None) is not None else [])
            pipe.fuse_lora(components=parts)
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


def write_loras(model, tmp, specs, seed):
    """[(expert or "", path, strength)] for --fuse-lora's specs: each KIND written once per expert
    by wan_lora_parity.py's writers for that expert's transformer (seeded)."""
    import wan_lora_parity as wl
    from diffusers import WanTransformer3DModel

    out, written = [], {}
    for spec in specs:
        expert, rest = (spec.split("=", 1) if "=" in spec else ("", spec))
        kind, _, strength = rest.partition(":")
        key = (expert, kind)
        if key not in written:
            part = "transformer_2" if expert == "low" else "transformer"
            t = WanTransformer3DModel.from_pretrained(os.path.join(model, part), torch_dtype=torch.float32)
            folder = os.path.join(tmp, f"lora-{expert or 'one'}-{kind}")
            os.makedirs(folder, exist_ok=True)
            g = torch.Generator().manual_seed(seed + len(written))
            shapes, layers = wl.linear_shapes(t), t.config.num_layers
            if kind.startswith("peft"):
                assert part == "transformer", "the peft kinds are written for transformer/ (write_peft)"
                wl.write_peft(model, folder, shapes, g)
            elif kind.startswith("comfy"):
                wl.write_comfy(folder, shapes, layers, g)
            else:
                wl.write_musubi(folder, shapes, layers, g)
            written[key] = os.path.join(folder, f"{kind}.safetensors")
        out.append((expert, written[key], float(strength) if strength else 1.0))
    return out


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
    if args.schedule != "default":
        cmd += ["--schedule", args.schedule]
    if args.storage_dtype:
        cmd += ["--storage-dtype", args.storage_dtype]
    specs = [f"{expert + '=' if expert else ''}{path}:{strength!r}" for expert, path, strength in args.lora_files]
    if args.fuse_lora:
        for spec in specs:
            cmd += ["--fuse-lora", spec]
    elif specs:
        cmd += ["--lora", ", ".join(specs)]
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
    ap.add_argument("--fuse-lora", action="append", default=[],
                    help="[high=|low=]KIND[:STRENGTH]: a LoRA written for the folder (KIND as wan_lora_parity.py "
                         "writes them), fused on both sides")
    ap.add_argument("--lora", action="append", default=[],
                    help="as --fuse-lora, unfused: diffusers' adapters loaded and set, not fused; dlo's job field loras")
    ap.add_argument("--schedule", default="default", choices=["default", "lightx2v"],
                    help="the steps' sigmas (euler cases): lightx2v passes set_timesteps(sigmas=...) to diffusers")
    ap.add_argument("--bf16-max-diff", type=int, default=255, help="largest allowed byte difference in bf16 cases")
    ap.add_argument("--json", help="write the per-case results here")
    args = ap.parse_args(argv)

    failed = False
    results = []
    if args.schedule == "lightx2v":
        # The sigmas given to diffusers make the timesteps of lightx2v's own samplers, bit for bit.
        from diffusers import FlowMatchEulerDiscreteScheduler
        d = FlowMatchEulerDiscreteScheduler(shift=args.flow_shift)
        d.set_timesteps(sigmas=lightx2v_sigmas(args.steps))
        for name, ts in lightx2v_schedules(args.steps, args.flow_shift).items():
            same = torch.equal(d.timesteps, ts)
            print(f"lightx2v schedule: diffusers' timesteps {d.timesteps.tolist()} {'equal' if same else 'DIFFER from'} "
                  f"{name}'s {ts.tolist()}")
            failed |= not same
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
        assert not (args.fuse_lora and args.lora), "--fuse-lora or --lora, not both"
        args.lora_files = write_loras(model, tmp, args.fuse_lora or args.lora, args.seed)
        for case in args.cases.split(","):
            dtype, scheduler, cfg = case.split("-")
            guidance = args.guidance if cfg == "cfg" else 1.0
            ref, ref_s = diffusers_frames(model, dtype, scheduler, args.flow_shift, guidance, args)
            ours, ours_s = dlo_frames(model, dtype, scheduler, args.flow_shift, guidance, args, tmp)
            if ours.shape != ref.shape:
                print(f"{case}: FAIL shapes differ: dlo {ours.shape} vs diffusers {ref.shape}")
                failed = True
                continue
            if args.lora_files:
                # Equality means something only if the LoRAs change the frames.
                plain, _ = diffusers_frames(model, dtype, scheduler, args.flow_shift, guidance, args, storage=False)
                changed = float((plain != ref).mean())
                print(f"{case}: the LoRAs change {changed:.4f} of diffusers' frame bytes")
                if changed == 0:
                    print(f"{case}: FAIL the LoRAs change nothing here")
                    failed = True
                    continue
            if args.schedule != "default":
                # Equality means something only if the schedule changes the frames.
                plain, _ = diffusers_frames(model, dtype, scheduler, args.flow_shift, guidance, args, schedule="default")
                changed = float((plain != ref).mean())
                print(f"{case}: the {args.schedule} schedule changes {changed:.4f} of diffusers' frame bytes")
                if changed == 0:
                    print(f"{case}: FAIL the schedule changes nothing here")
                    failed = True
                    continue
            if args.storage_dtype and not args.fp8_file and not args.lora_files:
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
