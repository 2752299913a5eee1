#!/usr/bin/env python3
"""Golden values of diffusers' noise schedulers for dlo's lib/dlo/diffusion (tests/diffusion).

Writes one safetensors file with, for every case, what diffusers computes:
  * schedules: UniPCMultistepScheduler in flow mode (the Wan2.1 config, wan-spec 3.6) and
    FlowMatchEulerDiscreteScheduler, steps 1, 2, 3, 10, 50 x shift 1, 3, 5:
        sched/<name>/timesteps   int64 (UniPC) / float32 (Euler), after set_timesteps(steps)
        sched/<name>/sigmas      float32 [steps + 1]
  * step chains, as WanPipeline drives them (set_timesteps, set_begin_index(0), then
    sample = step(model_output_i, timesteps[i], sample)[0] for every i):
        chain/<name>/sample0        the initial sample (float32)
        chain/<name>/model_output   [steps, ...] one random model output per step (fp32 or bf16)
        chain/<name>/out            [steps, ...] what step() returned at each i
The header metadata holds, per case, the scheduler's config exactly as diffusers saves it
("<case>/config", the scheduler_config.json text) and the step count ("<case>/steps"), so the C++
test also parses diffusers-written configs.

  make_scheduler_goldens.py --out tests/data/schedulers/goldens.safetensors
  make_scheduler_goldens.py --check tests/data/schedulers/goldens.safetensors --bin build/bin
  make_scheduler_goldens.py --check tests/data/schedulers/goldens.safetensors --bin build/bin --device cuda

--check (the parity test) recomputes every output with the installed diffusers from the committed
inputs and compares bit for bit with the committed file (a diffusers upgrade that changes the
numbers is noticed here), then runs `test_diffusion` from --bin against the freshly computed
file (dlo against the live diffusers). Exit 0 when both agree, else 1. With --device cuda the
chains run on the GPU on both sides (WanPipeline's set_timesteps(device=cuda) included) and are
compared with each other bit for bit; exit 77 without a GPU.

UniPC solves a small linear system per step (torch.linalg.solve, MKL's LAPACK), whose last bits
depend on the code path MKL picks for the CPU: the goldens are made, checked and tested with
MKL_CBWR=COMPATIBLE (set here unless set, and by the CTest tests), MKL's path that gives the same
results on every x86 CPU (measured 2026-12-02: without it, 10 UniPC chains differ by <= 7e-7 from
goldens made on another machine type; with it, none).
"""
import argparse
import json
import os

os.environ.setdefault("MKL_CBWR", "COMPATIBLE")  # before torch loads MKL; test_diffusion inherits it
import subprocess
import sys
import tempfile

import diffusers
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler
from safetensors import safe_open
from safetensors.torch import save_file

# The Wan2.1-T2V-*-Diffusers scheduler_config.json (wan-spec 3.6), without the underscore keys.
WAN_UNIPC = {
    "beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001, "disable_corrector": [],
    "dynamic_thresholding_ratio": 0.995, "final_sigmas_type": "zero", "flow_shift": 3.0, "lower_order_final": True,
    "num_train_timesteps": 1000, "predict_x0": True, "prediction_type": "flow_prediction",
    "rescale_betas_zero_snr": False, "sample_max_value": 1.0, "solver_order": 2, "solver_p": None,
    "solver_type": "bh2", "steps_offset": 0, "thresholding": False, "timestep_spacing": "linspace",
    "trained_betas": None, "use_beta_sigmas": False, "use_exponential_sigmas": False, "use_flow_sigmas": True,
    "use_karras_sigmas": False,
}

SHAPE = (1, 4, 2, 3, 5)


def unipc(**kw):
    return UniPCMultistepScheduler(**{**WAN_UNIPC, **kw})


def euler(**kw):
    return FlowMatchEulerDiscreteScheduler(**kw)


def cases():
    """(name, make scheduler, steps, chain: None or (shape, model output dtype, seed))."""
    out = []
    for steps in (1, 2, 3, 10, 50):
        for shift in (1, 3, 5):
            out.append((f"sched/unipc/n{steps}/s{shift}", lambda s=shift: unipc(flow_shift=float(s)), steps, None))
            out.append((f"sched/euler/n{steps}/s{shift}", lambda s=shift: euler(shift=float(s)), steps, None))
    # Odd values: shift 7 (diffusers' Wan pipeline test), a fractional shift, 500 training steps.
    out.append(("sched/unipc/n7/s3.3/t500", lambda: unipc(flow_shift=3.3, num_train_timesteps=500), 7, None))
    out.append(("sched/euler/n7/s7", lambda: euler(shift=7.0), 7, None))
    out.append(("sched/euler/n7/s3.3/t500", lambda: euler(shift=3.3, num_train_timesteps=500), 7, None))
    f32, bf16 = torch.float32, torch.bfloat16
    seed = 100
    for steps in (1, 2, 3, 10):
        seed += 1
        out.append((f"chain/unipc/n{steps}", lambda: unipc(), steps, (SHAPE, f32, seed)))
        seed += 1
        out.append((f"chain/euler/n{steps}", lambda: euler(shift=3.0), steps, (SHAPE, f32, seed)))
    more = [
        ("chain/unipc/n10/bf16", lambda: unipc(), 10, SHAPE, bf16),
        ("chain/unipc/n3/bf16", lambda: unipc(), 3, SHAPE, bf16),
        ("chain/euler/n10/bf16", lambda: euler(shift=3.0), 10, SHAPE, bf16),
        ("chain/euler/n3/bf16", lambda: euler(shift=3.0), 3, SHAPE, bf16),
        ("chain/unipc/n10/s5/batch2", lambda: unipc(flow_shift=5.0), 10, (2, 3, 1, 4, 4), f32),
        ("chain/euler/n10/s5/batch2", lambda: euler(shift=5.0), 10, (2, 3, 1, 4, 4), f32),
        ("chain/unipc/n10/order1", lambda: unipc(solver_order=1), 10, SHAPE, f32),
        ("chain/unipc/n10/order3", lambda: unipc(solver_order=3), 10, SHAPE, f32),
        ("chain/unipc/n3/order3", lambda: unipc(solver_order=3), 3, SHAPE, f32),
        # bh1 only with sigma_min: with a zero final sigma diffusers' last bh1 step is NaN (B(h) = -inf times 0).
        ("chain/unipc/n10/order3/bh1/sigma_min",
         lambda: unipc(solver_order=3, solver_type="bh1", final_sigmas_type="sigma_min"), 10, SHAPE, f32),
        ("chain/unipc/n10/bh1/sigma_min", lambda: unipc(solver_type="bh1", final_sigmas_type="sigma_min"), 10, SHAPE,
         f32),
        ("chain/unipc/n10/not_lower_order_final", lambda: unipc(lower_order_final=False), 10, SHAPE, f32),
        ("chain/unipc/n10/disable_corrector_0_2_9", lambda: unipc(disable_corrector=[0, 2, 9]), 10, SHAPE, f32),
        ("chain/unipc/n10/sigma_min", lambda: unipc(final_sigmas_type="sigma_min"), 10, SHAPE, f32),
        ("chain/unipc/n10/heun", lambda: unipc(solver_type="heun"), 10, SHAPE, f32),
        ("chain/unipc/n5/s3.3/t500", lambda: unipc(flow_shift=3.3, num_train_timesteps=500), 5, SHAPE, f32),
        ("chain/euler/n5/s3.3/t500", lambda: euler(shift=3.3, num_train_timesteps=500), 5, SHAPE, f32),
    ]
    for name, make, steps, shape, dt in more:
        seed += 1
        out.append((name, make, steps, (shape, dt, seed)))
    return out


def run_chain(sched, steps, sample, model_outputs, device=None):
    # WanPipeline: set_timesteps(steps, device=execution device); set_begin_index(0).
    sched.set_timesteps(steps, device=device)
    sched.set_begin_index(0)
    outs = []
    for i, t in enumerate(sched.timesteps):
        sample = sched.step(model_outputs[i], t, sample, return_dict=False)[0]
        outs.append(sample)
    return torch.stack(outs)


def compute(inputs=None, device="cpu"):
    """All goldens. With `inputs` (name -> tensor from a committed file), the random chain inputs
    are taken from there instead of being drawn (so a torch upgrade changing randn is no change).
    The chains run on `device` (outputs brought back to the CPU)."""
    tensors, meta = {}, {"diffusers_version": diffusers.__version__, "torch_version": torch.__version__}
    for name, make, steps, chain in cases():
        sched = make()
        meta[f"{name}/config"] = sched.to_json_string()
        meta[f"{name}/steps"] = str(steps)
        if chain is None:
            sched.set_timesteps(steps)
            tensors[f"{name}/timesteps"] = sched.timesteps.clone()
            tensors[f"{name}/sigmas"] = sched.sigmas.clone()
            continue
        shape, dtype, seed = chain
        if inputs is not None:
            sample0, mo = inputs[f"{name}/sample0"], inputs[f"{name}/model_output"]
        else:
            g = torch.Generator().manual_seed(seed)
            sample0 = torch.randn(shape, generator=g, dtype=torch.float32)
            mo = torch.randn((steps, *shape), generator=g, dtype=torch.float32).to(dtype)
        tensors[f"{name}/sample0"] = sample0
        tensors[f"{name}/model_output"] = mo
        dev = None if device == "cpu" else torch.device(device)
        tensors[f"{name}/out"] = run_chain(sched, steps, sample0.clone().to(device), [m.clone().to(device) for m in mo],
                                           dev).cpu()
    return {k: v.contiguous() for k, v in tensors.items()}, meta


def load(path):
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def check(args):
    if args.device != "cpu" and not torch.cuda.is_available():
        print(f"no CUDA device: skipped")
        return 77
    committed, cmeta = load(args.check)
    fresh, fmeta = compute(inputs=committed, device=args.device)
    bad = []
    if set(committed) != set(fresh):
        bad.append(f"tensor names differ: only committed {sorted(set(committed) - set(fresh))[:5]}, "
                   f"only fresh {sorted(set(fresh) - set(committed))[:5]}")
    for k in sorted(set(committed) & set(fresh)):
        a, b = committed[k], fresh[k]
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            err = (a.double() - b.double()).abs().max().item() if a.shape == b.shape else float("inf")
            if args.device != "cpu" and k.endswith("/out") and a.shape == b.shape:
                # Other kernels (CUDA's log, expm1, ...): not bitwise the CPU goldens; reported only.
                print(f"  {k}: diffusers on {args.device} vs the CPU goldens: max |diff| {err:.3g}")
                continue
            bad.append(f"{k}: committed {a.dtype} {tuple(a.shape)} vs diffusers {b.dtype} {tuple(b.shape)}, "
                       f"max |diff| {err:.3g}")
    for k in sorted(set(cmeta) | set(fmeta)):
        if k.endswith("_version"):
            continue
        if k.endswith("/config"):
            # The saved config carries _diffusers_version; compare the rest.
            a = {x: y for x, y in json.loads(cmeta.get(k, "{}")).items() if x != "_diffusers_version"}
            b = {x: y for x, y in json.loads(fmeta.get(k, "{}")).items() if x != "_diffusers_version"}
            if a != b:
                bad.append(f"{k}: config keys/values changed: committed {sorted(set(a.items()) ^ set(b.items()), key=str)[:4]}")
        elif cmeta.get(k) != fmeta.get(k):
            bad.append(f"metadata {k}: {cmeta.get(k)!r} vs {fmeta.get(k)!r}")
    print(f"goldens: committed by diffusers {cmeta.get('diffusers_version')}, installed diffusers "
          f"{diffusers.__version__}: {len(fresh)} tensors recomputed, {len(bad)} differ")
    for b in bad[:20]:
        print("  DIFFERS", b)
    rc = 0 if not bad else 1
    if bad:
        print("The installed diffusers no longer gives the committed goldens. Check what changed in its schedulers, "
              "port it to lib/dlo/diffusion, then regenerate with --out.")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "goldens.safetensors")
        save_file(fresh, path, metadata=fmeta)
        cmd = [os.path.join(args.bin, "test_diffusion"), "--test-case=*diffusers*"]
        print("running", " ".join(cmd), "with DLO_SCHEDULER_GOLDENS =", path, "DLO_SCHEDULER_DEVICE =", args.device,
              flush=True)
        r = subprocess.run(cmd, env={**os.environ, "DLO_SCHEDULER_GOLDENS": path, "DLO_SCHEDULER_DEVICE": args.device})
        if r.returncode != 0:
            print("dlo's schedulers differ from the installed diffusers (see above)")
            rc = 1
    return rc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", help="write the goldens here")
    g.add_argument("--check", help="compare this committed goldens file with the installed diffusers")
    ap.add_argument("--bin", help="with --check: the folder holding test_diffusion")
    ap.add_argument("--device", default="cpu",
                    help="with --check: run the chains on this device, diffusers and dlo alike (cuda: exit 77 "
                         "without a GPU; the outputs are then compared with the live diffusers only)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.out:
        tensors, meta = compute()
        save_file(tensors, args.out, metadata=meta)
        print(f"wrote {args.out}: {len(tensors)} tensors, {os.path.getsize(args.out)} bytes")
        return 0
    if not args.bin:
        ap.error("--check needs --bin")
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
