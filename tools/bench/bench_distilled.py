#!/usr/bin/env python3
"""A 4-step unguided job (the distilled recipes of docs/distilled.md: schedule lightx2v, guidance 1,
shift 5) against the 50-step guided default (UniPC, guidance 5) on the same random-weight model,
CPU, one rank, alternating the two --repeat times in one run.

Reports for each: transformer passes (forward evaluations of one latent: steps x 2 with guidance,
exact), block traversals (dlo's report: a guided step runs both branches in one traversal of the
blocks, so it streams the weights once), wall time of the whole job (process start to video written)
and its denoising time (results' denoise_s); and the ratios default / distilled. Weights do not
matter for the timing (a LoRA fused for the run costs its merge at load, not per pass), so none is
fused here.

  bench_distilled.py --bin build/bin [--threads 2] [--repeat 3] [--json out.json]
"""
import os
import statistics
import tempfile

import benchlib
from benchlib import spread

PROMPT = "A red fox trotting through fresh snow at dawn"
MODEL_FLAGS = ["--preset", "wan2.1-t2v-1.3b", "--layers", "4", "--te-layers", "2", "--dtype", "fp32",
               "--in-channels", "16", "--out-channels", "16"]
RECIPES = {
    "default": ["--steps", "50", "--guidance", "5", "--scheduler", "unipc", "--flow-shift", "3"],
    "distilled": ["--steps", "4", "--guidance", "1", "--schedule", "lightx2v", "--flow-shift", "5"],
}


def run(args, model, name, tmp, i):
    report = os.path.join(tmp, f"{name}{i}.json")
    cmd = [os.path.join(args.bin, "dlo-generate"), "--model", model, "--prompt", PROMPT, "--seed", "1",
           "--height", str(args.height), "--width", str(args.width), "--frames", str(args.frames), "--dtype", "fp32",
           "--threads", str(args.threads), "--format", "png", "--out", os.path.join(tmp, f"{name}{i}"),
           "--report", report, "--quiet", *RECIPES[name]]
    wall, _ = benchlib.run(cmd)
    r = benchlib.load_json(report)
    job = r["jobs"][0]
    p = job["parameters"]
    return {"wall_s": wall, "denoise_s": job["timings"]["denoise_s"],
            "passes": p["steps"] * (2 if p["guidance"] > 1 else 1),
            "traversals": sum(rk["traversals"] for rk in r["ranks"])}


def main():
    ap = benchlib.parser(__doc__)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--height", type=int, default=64)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--frames", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = benchlib.make_model(args.bin, os.path.join(tmp, "model"), *MODEL_FLAGS)
        runs = {name: [] for name in RECIPES}
        for i in range(args.repeat):
            for name in RECIPES:
                runs[name].append(run(args, model, name, tmp, i))
    out = {"model": " ".join(MODEL_FLAGS), "size": f"{args.width}x{args.height}x{args.frames}",
           "threads": args.threads}
    for name, rs in runs.items():
        out[name] = {"passes": rs[0]["passes"], "traversals": rs[0]["traversals"],
                     "wall_s": spread([r["wall_s"] for r in rs]), "denoise_s": spread([r["denoise_s"] for r in rs])}
    d, s = runs["default"], runs["distilled"]
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    out["ratio"] = {"passes": d[0]["passes"] / s[0]["passes"], "traversals": d[0]["traversals"] / s[0]["traversals"],
                    "wall": med(d, "wall_s") / med(s, "wall_s"), "denoise": med(d, "denoise_s") / med(s, "denoise_s")}
    benchlib.emit(out, args.json)


if __name__ == "__main__":
    main()
