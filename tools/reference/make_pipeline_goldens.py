#!/usr/bin/env python3
"""Per-step goldens of diffusers' WanPipeline for the C++ `cpu` tests (tests/data/goldens/).

pipeline_parity.py compares only the final frames; this file lets a test say *which* part of the
pipeline went wrong: the prompt / negative-prompt context, the timestep handed to the transformer,
the guidance combination, or a scheduler step. For a tiny random model (no weights are stored: the
C++ test writes the identical folder with make_model() from the "make_args" in the metadata) and
three fp32 jobs, WanPipeline.from_pretrained(DIR, torch_dtype=torch.float32) is run on the CPU (1
thread, CPU generator seeded per case, output_type="np") with hooks that record what it computes:

  * a forward pre-hook + forward hook on pipe.transformer: the context, timestep and output of every
    transformer call (diffusers 0.42.1 calls it once per branch per step, cond first, then uncond;
    the script checks that order: the captured noise_pred must equal uncond + g * (cond - uncond)
    bit for bit with the calls taken in that order);
  * a wrapper around pipe.scheduler.step: the noise_pred the scheduler received (the guided one);
  * callback_on_step_end: the latents after each step.

Cases (CASES below): "unipc_cfg" (the folder's UniPC, guidance 5), "euler_nocfg"
(FlowMatchEulerDiscreteScheduler(shift=folder's flow shift), guidance 1: one transformer call per
step, no negative context) and "unipc_cfg_shift" (UniPC with flow_shift 5 through from_config,
guidance 3.5, negative prompt "").

Tensors, all float32 except frames (uint8), named "<case>.<what>":
  prompt_embeds [1, 512, text_dim], negative_prompt_embeds (CFG cases only): what the transformer got
  latents_init [1, C, T, H/8, W/8]: the initial noise
  timestep_<i> [1] (as float32), noise_cond_<i>, noise_uncond_<i> (CFG only), noise_pred_<i>
  (guided), latents_<i> (after scheduler.step of step i), i = 0 .. steps-1
  frames [F, H, W, 3] uint8: (frame * 255).astype(uint8) of output_type="np", as pipeline_parity.py
Metadata (strings): "<case>" (JSON: prompt, negative_prompt, guidance, steps, height, width, frames,
seed, scheduler "unipc"/"euler", flow_shift (the effective one), timesteps, timestep_dtype (what
the transformer got: int64 for UniPC, float32 for Euler), frames_sha256), "make_args"
(JSON list of the dlo-checkpoint make arguments after OUT_DIR), "weights_sum" (float64 sum of all
transformer weights, as make_goldens.py; "weights_sums": the same for every component), "made_by",
"layout", "cases" (JSON list of the case names, in order).

With --cross-check it also renders every case with dlo-generate (fp32, 1 thread, PNG; "unipc_cfg" on
the folder's scheduler with no --scheduler/--flow-shift, the others with them) and compares the
report's frames_sha256 with the sha256 of the golden frames (they must be equal; exit 1 otherwise).

Two sets of goldens, chosen by the file's name (SETS below):
  wan_pipeline_steps.safetensors: the cases above on a wan-test folder (MAKE_ARGS);
  wan_pipeline_two_experts.safetensors: Wan2.2 A14B's two experts (preset wan2.2-a14b-test:
    transformer/ for timesteps >= boundary_ratio x 1000, transformer_2/ below), a guided job with
    guidance_scale_2 unset: WanPipeline then guides the low-noise expert with guidance_scale (the
    README's "guidance_2 ... default --guidance"). Hooks on both experts; the metadata's case
    JSON adds "experts" (0/1 per step, the one WanPipeline called) and "guidance_2" (null). To keep
    the file small (tens of KB) it holds only latents_init, timestep_<i>, latents_<i> and frames
    (the first set holds the contexts and the noise predictions; here the script asserts them).

Regenerate (after a deliberate change to the random writers or to the reference versions):
  tools/setup.sh && for f in wan_pipeline_steps wan_pipeline_two_experts; do .venv/bin/python \\
      tools/reference/make_pipeline_goldens.py --bin build/bin --out tests/data/goldens/$f.safetensors \\
      --cross-check; done
then `ctest --test-dir build -L cpu`. Fixed seeds, 1 thread: rerunning gives the same tensors.
--check FILE... recomputes them and compares with the committed files (the `parity` test does).
Versions used: torch 2.11.0, diffusers 0.42.1, transformers 5.23.0 (tools/requirements.txt).
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity_common import cpu_fingerprint  # noqa: E402

MAKE_ARGS = ["--preset", "wan-test", "--layers", "2", "--dtype", "fp32", "--seed", "3"]

CASES = [
    dict(name="unipc_cfg", scheduler="unipc", flow_shift=None, prompt="a red fox trotting in fresh snow",
         negative_prompt="blurry, static", guidance=5.0, steps=3, height=32, width=32, frames=5, seed=42),
    dict(name="euler_nocfg", scheduler="euler", flow_shift=None, prompt="an owl turning its head",
         negative_prompt="", guidance=1.0, steps=2, height=32, width=48, frames=9, seed=7),
    dict(name="unipc_cfg_shift", scheduler="unipc", flow_shift=5.0, prompt="waves on a beach",
         negative_prompt="", guidance=3.5, steps=4, height=48, width=32, frames=5, seed=11),
]

# Wan2.2 A14B-shaped: two experts of wan-test's shape (transformer_2's weights from seed + 0x2e2),
# boundary_ratio 0.875 (model_index.json), the Wan2.1-small VAE, flow shift 3.
MAKE_ARGS_TWO_EXPERTS = ["--preset", "wan2.2-a14b-test", "--dtype", "fp32", "--seed", "5"]

# guidance_2 unset: WanPipeline's guidance_scale_2 = guidance_scale. 6 UniPC steps with shift 3:
# timesteps 999 and 937 on transformer/, 857, 750, 600 and 376 on transformer_2/ (both asserted used).
CASES_TWO_EXPERTS = [
    dict(name="two_experts_g2_unset", scheduler="unipc", flow_shift=None, prompt="a paper boat on a river",
         negative_prompt="blurry", guidance=4.0, guidance_2=None, steps=6, height=32, width=32, frames=5, seed=13),
]

# file stem -> (dlo-checkpoint make arguments, cases, compact: only latents_init, timestep_<i>, latents_<i>
# and frames stored)
SETS = {"wan_pipeline_steps": (MAKE_ARGS, CASES, False),
        "wan_pipeline_two_experts": (MAKE_ARGS_TWO_EXPERTS, CASES_TWO_EXPERTS, True)}

LAYOUT = ("<case>.prompt_embeds, <case>.negative_prompt_embeds (CFG only): the transformer's encoder_hidden_states; "
          "<case>.latents_init: initial latents; per step i: <case>.timestep_<i> (float32 [1]), <case>.noise_cond_<i>, "
          "<case>.noise_uncond_<i> (CFG only), <case>.noise_pred_<i> (uncond + g * (cond - uncond); cond without CFG), "
          "<case>.latents_<i> (after scheduler.step); <case>.frames: uint8 [F, H, W, 3]. Metadata <case>: JSON job.")


def weights_sum(folder):
    total = 0.0
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            for _, t in sorted(load_file(os.path.join(folder, f)).items()):
                total += t.double().sum().item()
    return total


def make_model(bin_dir, out, make_args):
    subprocess.run([os.path.join(bin_dir, "dlo-checkpoint"), "make", out, *make_args], check=True,
                   stdout=subprocess.DEVNULL)


def load_pipe(model, case):
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler, WanPipeline

    pipe = WanPipeline.from_pretrained(model, torch_dtype=torch.float32)
    folder_shift = pipe.scheduler.config.flow_shift
    if case["scheduler"] == "euler":
        shift = folder_shift if case["flow_shift"] is None else case["flow_shift"]
        pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
        effective = pipe.scheduler.config.shift
    else:
        assert isinstance(pipe.scheduler, UniPCMultistepScheduler), type(pipe.scheduler)
        if case["flow_shift"] is not None:
            pipe.scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config, flow_shift=case["flow_shift"])
        effective = pipe.scheduler.config.flow_shift
    pipe.set_progress_bar_config(disable=True)
    return pipe, float(effective)


def run_case(model, case, compact=False):
    pipe, flow_shift = load_pipe(model, case)
    name, cfg = case["name"], case["guidance"] > 1.0
    experts = [pipe.transformer] + ([pipe.transformer_2] if pipe.transformer_2 is not None else [])
    calls = []  # one dict per transformer call (of either expert), in call order
    steps = []  # one dict per scheduler.step call
    after = []  # latents from callback_on_step_end

    def pre_hook(module, args, kwargs):
        assert not args, "WanPipeline passes the transformer's inputs as keywords"
        calls.append({"expert": next(i for i, e in enumerate(experts) if e is module),
                      "hidden_states": kwargs["hidden_states"].detach().clone(),
                      "timestep": kwargs["timestep"].detach().clone(),
                      "encoder_hidden_states": kwargs["encoder_hidden_states"].detach().clone()})

    def hook(module, args, kwargs, output):
        out = output[0] if isinstance(output, (tuple, list)) else output.sample
        calls[-1]["output"] = out.detach().clone()

    hooks = [h for e in experts for h in (e.register_forward_pre_hook(pre_hook, with_kwargs=True),
                                          e.register_forward_hook(hook, with_kwargs=True))]
    step = pipe.scheduler.step

    def step_wrapper(model_output, timestep, sample, *a, **kw):
        out = step(model_output, timestep, sample, *a, **kw)
        steps.append({"model_output": model_output.detach().clone(), "timestep": timestep,
                      "sample": sample.detach().clone(), "prev_sample": out[0].detach().clone()})
        return out

    pipe.scheduler.step = step_wrapper

    def callback(p, i, t, kw):
        after.append(kw["latents"].detach().clone())
        return {}

    extra = {} if case.get("guidance_2") is None else {"guidance_scale_2": case["guidance_2"]}
    with torch.no_grad():
        video = pipe(prompt=case["prompt"], negative_prompt=case["negative_prompt"], height=case["height"],
                     width=case["width"], num_frames=case["frames"], num_inference_steps=case["steps"],
                     guidance_scale=case["guidance"], generator=torch.Generator("cpu").manual_seed(case["seed"]),
                     output_type="np", callback_on_step_end=callback,
                     callback_on_step_end_tensor_inputs=["latents"], **extra).frames[0]
    for h in hooks:
        h.remove()
    timesteps = pipe.scheduler.timesteps.clone()
    frames = np.stack([(frame * 255).astype(np.uint8) for frame in video])

    # --- what was captured must be what the pipeline used, in the order assumed ---
    n, branches = case["steps"], 2 if cfg else 1
    assert len(calls) == n * branches, f"{name}: {len(calls)} transformer calls, expected {n * branches}"
    assert len(steps) == n and len(after) == n, f"{name}: {len(steps)} scheduler steps, {len(after)} callbacks"
    assert len(timesteps) == n
    # The contexts, independently: encode_prompt as WanPipeline.__call__ calls it.
    with torch.no_grad():
        pe, ne = pipe.encode_prompt(prompt=case["prompt"], negative_prompt=case["negative_prompt"],
                                    do_classifier_free_guidance=cfg, num_videos_per_prompt=1, max_sequence_length=512,
                                    device=torch.device("cpu"))
    prompt_embeds = calls[0]["encoder_hidden_states"]
    assert torch.equal(prompt_embeds, pe.to(torch.float32)), f"{name}: prompt_embeds != encode_prompt's"
    negative_embeds = None
    if cfg:
        negative_embeds = calls[1]["encoder_hidden_states"]
        assert torch.equal(negative_embeds, ne.to(torch.float32)), f"{name}: negative embeds != encode_prompt's"
        assert not torch.equal(prompt_embeds, negative_embeds), f"{name}: cond and uncond contexts are equal"
    # Initial latents: the first call's input, the first step's sample, and randn of the CPU generator.
    latents_init = calls[0]["hidden_states"]
    assert torch.equal(latents_init, steps[0]["sample"])
    g = torch.Generator("cpu").manual_seed(case["seed"])
    assert torch.equal(latents_init, torch.randn(latents_init.shape, generator=g, dtype=torch.float32))

    tensors = {f"{name}.latents_init": latents_init}
    if not compact:
        tensors[f"{name}.prompt_embeds"] = prompt_embeds
        if cfg:
            tensors[f"{name}.negative_prompt_embeds"] = negative_embeds
    # Two experts: each step's expert is the one its timestep asks (t >= boundary: transformer/),
    # with its guidance (guidance_2 unset: guidance), and both experts run.
    step_experts, step_guidance = [0] * n, [case["guidance"]] * n
    if len(experts) == 2:
        boundary = pipe.config.boundary_ratio * pipe.scheduler.config.num_train_timesteps
        step_experts = [0 if t >= boundary else 1 for t in timesteps]
        assert 0 < step_experts.count(0) < n, f"{name}: the steps do not span both experts: {step_experts}"
        g2 = case["guidance"] if case.get("guidance_2") is None else case["guidance_2"]
        step_guidance = [case["guidance"] if e == 0 else g2 for e in step_experts]
    prev = latents_init
    for i in range(n):
        cond = calls[i * branches]
        assert all(c["expert"] == step_experts[i] for c in calls[i * branches:(i + 1) * branches]), \
            f"{name} step {i}: not expert {step_experts[i]}'s calls"
        assert torch.equal(cond["encoder_hidden_states"], prompt_embeds), f"{name} step {i}: first call not cond"
        assert torch.equal(cond["hidden_states"], prev), f"{name} step {i}: input != previous latents"
        t = cond["timestep"]
        assert t.shape == (1,) and torch.equal(t, timesteps[i].expand(1)), f"{name} step {i}: timestep {t}"
        noise_pred = steps[i]["model_output"]
        tensors[f"{name}.timestep_{i}"] = t.to(torch.float32)
        tensors[f"{name}.noise_cond_{i}"] = cond["output"]
        if cfg:
            unc = calls[i * branches + 1]
            assert torch.equal(unc["encoder_hidden_states"], negative_embeds), f"{name} step {i}: 2nd call not uncond"
            assert torch.equal(unc["timestep"], t) and torch.equal(unc["hidden_states"], prev)
            assert not torch.equal(unc["output"], cond["output"]), f"{name} step {i}: cond == uncond output"
            guided = unc["output"] + step_guidance[i] * (cond["output"] - unc["output"])
            assert torch.equal(noise_pred, guided), f"{name} step {i}: noise_pred != uncond + g * (cond - uncond)"
            tensors[f"{name}.noise_uncond_{i}"] = unc["output"]
        else:
            assert torch.equal(noise_pred, cond["output"]), f"{name} step {i}: noise_pred != cond without CFG"
        assert torch.equal(steps[i]["sample"], prev)
        assert torch.equal(steps[i]["prev_sample"], after[i]), f"{name} step {i}: callback latents != step output"
        tensors[f"{name}.noise_pred_{i}"] = noise_pred
        tensors[f"{name}.latents_{i}"] = after[i]
        prev = after[i]
    tensors[f"{name}.frames"] = torch.from_numpy(np.ascontiguousarray(frames))
    for k, v in tensors.items():
        if k.endswith(".frames"):
            assert v.dtype == torch.uint8
        else:
            assert v.dtype == torch.float32, (k, v.dtype)
        tensors[k] = v.contiguous()

    # --- sanity: the goldens mean something ---
    last = after[-1]
    distinct = len(np.unique(frames))
    assert not torch.isnan(last).any() and torch.isfinite(last).all(), f"{name}: last latents not finite"
    assert distinct > 50, f"{name}: the frames have only {distinct} distinct byte values"
    sha = hashlib.sha256(frames.tobytes()).hexdigest()
    cfg_gap = max((tensors[f"{name}.noise_cond_{i}"] - tensors[f"{name}.noise_uncond_{i}"]).abs().max().item()
                  for i in range(n)) if cfg else None
    if compact:  # the noise predictions were asserted above; the latents after each step carry them
        tensors = {k: v for k, v in tensors.items() if ".noise_" not in k}
    print(f"{name}: {case['scheduler']} shift {flow_shift} g {step_guidance} experts {step_experts} "
          f"timesteps {timesteps.tolist()} "
          f"frames {tuple(frames.shape)} distinct {distinct} last latents finite (|max| {last.abs().max().item():.4f})"
          + (f", max |cond - uncond| {cfg_gap:.4g}" if cfg else "") + f", frames sha256 {sha}")
    meta = {k: case[k] for k in ("prompt", "negative_prompt", "guidance", "steps", "height", "width", "frames",
                                 "seed", "scheduler")}
    meta["flow_shift"] = flow_shift
    meta["timesteps"] = [float(x) for x in timesteps.tolist()]
    meta["timestep_dtype"] = str(calls[0]["timestep"].dtype).replace("torch.", "")  # as the transformer got it
    meta["frames_sha256"] = sha
    if len(experts) == 2:
        meta["guidance_2"] = case.get("guidance_2")
        meta["experts"] = step_experts
    return tensors, meta, frames


def cross_check(bin_dir, model, case, flow_shift, frames, tmp):
    out = os.path.join(tmp, "dlo_frames_" + case["name"])
    report = os.path.join(tmp, "report_" + case["name"] + ".json")
    cmd = [os.path.join(bin_dir, "dlo-generate"), "--model", model, "--prompt", case["prompt"], "--seed",
           str(case["seed"]), "--steps", str(case["steps"]), "--height", str(case["height"]), "--width",
           str(case["width"]), "--frames", str(case["frames"]), "--guidance", repr(case["guidance"]),
           "--negative-prompt", case["negative_prompt"], "--dtype", "fp32", "--threads", "1", "--format", "png",
           "--out", out, "--report", report, "--quiet"]
    if case["name"] != "unipc_cfg":  # case 1 runs on the folder's scheduler, as the bare command line does
        cmd += ["--scheduler", case["scheduler"], "--flow-shift", repr(flow_shift)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(report) as f:
        r = json.load(f)
    found = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "frames_sha256":
                    found.append(v)
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(r)
    ours = hashlib.sha256(frames.tobytes()).hexdigest()
    ok = len(found) == 1 and found[0] == ours
    print(f"cross-check {case['name']} vs dlo-generate: {'ok' if ok else 'FAIL'} (dlo-generate {found}, "
          f"diffusers {ours})")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="folder holding dlo-checkpoint (and dlo-generate)")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", help="write the goldens here (tests/data/goldens/<set>.safetensors; sets: "
                                 + ", ".join(SETS) + ")")
    g.add_argument("--check", nargs="+", metavar="FILE",
                   help="recompute the goldens with the installed diffusers and compare them, tensor by tensor and "
                        "bit for bit, with these committed files (exit 1 on any difference)")
    ap.add_argument("--cross-check", action="store_true", help="also compare every case's frames with dlo-generate's")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    import diffusers
    import transformers

    ok = True
    for path in args.check or [args.out]:
        stem = os.path.basename(path).removesuffix(".safetensors")
        if stem not in SETS:
            ap.error(f"{path}: not a set of goldens this script makes ({', '.join(s + '.safetensors' for s in SETS)})")
        ok &= make_set(args, path, *SETS[stem], diffusers.__version__, transformers.__version__)
    return 0 if ok else 1


def make_set(args, path, make_args, cases, compact, diffusers_version, transformers_version):
    """Computes one set of goldens; writes it to `path` (--out) or compares it with `path` (--check)."""
    tensors = {}
    meta = {}
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        make_model(args.bin, model, make_args)
        parts = [c for c in ("transformer", "transformer_2", "text_encoder", "vae") if os.path.isdir(os.path.join(model, c))]
        sums = {c: repr(weights_sum(os.path.join(model, c))) for c in parts}
        for case in cases:
            t, m, frames = run_case(model, case, compact)
            tensors.update(t)
            meta[case["name"]] = json.dumps(m)
            if args.cross_check:
                ok &= cross_check(args.bin, model, case, m["flow_shift"], frames, tmp)
    meta["cases"] = json.dumps([c["name"] for c in cases])
    meta["make_args"] = json.dumps(make_args)
    meta["weights_sum"] = sums["transformer"]
    meta["weights_sums"] = json.dumps(sums)
    meta["made_by"] = (f"tools/reference/make_pipeline_goldens.py: dlo-checkpoint make DIR {' '.join(make_args)}; "
                       f"WanPipeline fp32, 1 thread; torch {torch.__version__}, diffusers {diffusers_version}, "
                       f"transformers {transformers_version}")
    meta["layout"] = LAYOUT
    meta["cpu"] = cpu_fingerprint()
    if args.check:
        committed = load_file(path)
        with safe_open(path, "pt") as f:
            made_on = (f.metadata() or {}).get("cpu", "")
        # Bitwise on the CPU type that made the file; elsewhere fp32 GEMMs round differently
        # (tests/models/golden.h), so floats within rel 1e-4 and integers within 1.
        here = made_on == meta["cpu"]
        if not here:
            print(f"{path} was made on another CPU ({made_on or 'unrecorded'}; this is {meta['cpu']}): "
                  "tensors compared within rel 1e-4 (floats) or 1 (integers), not bitwise")
        bad, worst = sorted(set(committed) ^ set(tensors)), 0.0
        for name in sorted(set(committed) & set(tensors)):
            a, b = committed[name], tensors[name]
            if a.dtype != b.dtype or a.shape != b.shape:
                bad.append(name)
            elif not torch.equal(a, b):
                if here:
                    bad.append(name)
                elif a.is_floating_point():
                    err = ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()
                    worst = max(worst, err)
                    if err > 1e-4:
                        bad.append(name)
                elif (a.long() - b.long()).abs().max().item() > 1:
                    bad.append(name)
        print(f"{path}: {len(tensors)} tensors recomputed, {len(bad)} differ{': ' + ', '.join(bad) if bad else ''}"
              f"{'' if here else f' (largest float rel err {worst:.2e})'}")
        if bad:
            print("The installed diffusers no longer gives the committed per-step goldens: check what changed, then "
                  "regenerate with --out.")
        return ok and not bad
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_file(tensors, path, metadata=meta)
    print(f"{path}: {os.path.getsize(path)} bytes, {len(tensors)} tensors")
    return ok


if __name__ == "__main__":
    sys.exit(main())
