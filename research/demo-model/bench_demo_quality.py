#!/usr/bin/env python3
"""What a setting costs in quality: the demo model's 60 prompts x N seeds rendered by dlo-generate
under several settings, each video judged by tools/check_demo_video.py (colour, direction, shape).

Settings: the model's defaults (20 steps, guidance 4, transformer and text encoder in bf16), half
the steps, guidance off, the transformer in fp32, and the transformer blocks' Linears stored in fp8
(--storage-dtype fp8, bf16 compute). One batch per setting on --ranks ranks
(lossless FFV1, so the codec plays no part), in one run so the settings share the machine's state.
Prints a Markdown table (accuracy per property, all three right, wall time) and writes JSON
(with each setting's colour and shape misses: what was asked, and what was drawn or none; and the
median fill of the object's bounding box per asked shape: square 1, circle 0.785, triangle 0.5
drawn ideally). --guidance 8,12 adds a setting per guidance scale, --flow-shift 1,5 one per flow
shift (the sampler's; the model folder's is 3). Every setting after the first is also compared
with the first frame by frame, job by job: the share of frames and of bytes that differ, the mean
PSNR over the frames and the largest byte difference.
  .venv/bin/python research/demo-model/bench_demo_quality.py [--seeds 2] [--ranks 2] [--settings 0,4] [--every 5]
      [--guidance 8,12] [--flow-shift 1,5] [--json out/bench-demo.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))  # the recipe
import check_demo_video as check  # noqa: E402
import demo_world as world  # noqa: E402

SETTINGS = [
    ("defaults (20 steps, guidance 4, bf16)", {}, []),
    ("half the steps (10)", {"steps": 10}, []),
    ("guidance off", {"guidance": 1.0}, []),
    ("transformer and text encoder fp32", {}, ["--dtype", "fp32"]),
    ("blocks' Linears stored in fp8", {}, ["--storage-dtype", "fp8"]),
]


def frames_of(results):
    """Job id -> uint8 frames [F, H, W, 3] of every finished job in a results.jsonl."""
    with open(results) as f:
        return {r["id"]: check.read_frames(r["output"])[0] for r in map(json.loads, f)}


def compare(base, other):
    """How `other`'s frames differ from `base`'s for the same jobs: shares of frames and bytes that
    differ, mean PSNR over the frames that differ (identical frames have no finite PSNR; counted
    apart), the largest byte difference."""
    frames = differ = bytes_ = bytes_differ = 0
    psnrs, worst = [], 0
    for job, a in base.items():
        b = other[job]
        assert a.shape == b.shape, job
        d = np.abs(a.astype(np.int16) - b.astype(np.int16))
        worst = max(worst, int(d.max()))
        bytes_, bytes_differ = bytes_ + d.size, bytes_differ + int(np.count_nonzero(d))
        for f in d:
            frames += 1
            mse = float(np.mean(f.astype(np.float64) ** 2))
            if mse > 0:
                differ += 1
                psnrs.append(10 * np.log10(255.0 ** 2 / mse))
    return {"frames_differ": round(differ / frames, 4), "bytes_differ": round(bytes_differ / bytes_, 4),
            "mean_psnr_db": round(float(np.mean(psnrs)), 2) if psnrs else None, "max_abs_diff": worst}


def main():
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # the repository
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(root, "build", "bin"))
    ap.add_argument("--model", default=os.path.join(root, "configs", "demo-model"))
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--every", type=int, default=1, help="every K-th of the 60 prompts (5: 12 prompts, each colour, "
                    "shape and direction at least twice; a cut run)")
    ap.add_argument("--settings", default="", help="comma-separated indices into the settings (default: all)")
    ap.add_argument("--guidance", default="", help="comma-separated guidance scales, each a setting of its own")
    ap.add_argument("--flow-shift", default="", help="comma-separated flow shifts, each a setting of its own")
    ap.add_argument("--json", default=os.path.join(root, "out", "bench-demo-quality.json"))
    args = ap.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl_vader_single_copy_mechanism="none",
               OMP_NUM_THREADS="1")
    rows, base = [], None
    with tempfile.TemporaryDirectory() as tmp:
        chosen = [SETTINGS[int(i)] for i in args.settings.split(",")] if args.settings else list(SETTINGS)
        chosen += [(f"guidance {g}", {"guidance": float(g)}, []) for g in args.guidance.split(",") if g]
        chosen += [(f"flow shift {s}", {"flow_shift": float(s)}, []) for s in args.flow_shift.split(",") if s]
        for name, fields, flags in chosen:
            d = os.path.join(tmp, str(len(rows)))
            os.makedirs(d)
            jobs = [{"id": f"p{i:02d}-s{seed}", "prompt": p, "seed": seed}
                    for seed in range(args.seeds) for i, p in enumerate(world.all_prompts()) if i % args.every == 0]
            manifest = {"model": os.path.abspath(args.model), "output_dir": os.path.join(d, "out"),
                        "defaults": dict(format="ffv1", **fields), "jobs": jobs}
            with open(os.path.join(d, "jobs.yaml"), "w") as f:
                json.dump(manifest, f)  # JSON is YAML
            t0 = time.time()
            subprocess.run(["mpirun", "-np", str(args.ranks), os.path.join(args.bin, "dlo-generate"), "--jobs",
                            os.path.join(d, "jobs.yaml"), "--threads", "1", "--quiet", *flags],
                           check=True, env=env)
            wall = time.time() - t0
            verdicts = []
            with open(os.path.join(d, "out", "results.jsonl")) as f:
                for line in f:
                    r = json.loads(line)
                    verdicts.append(check.check_video(r["output"], r["parameters"]["prompt"]))
            t = check.tally(verdicts)
            frames = frames_of(os.path.join(d, "out", "results.jsonl"))
            vs_first = compare(base, frames) if base is not None else None
            base = frames if base is None else base
            # Which colours and shapes are missed and as what ("none": no object in the first or
            # last frame).
            misses = {"colour": {}, "shape": {}}
            for v in verdicts:
                for p in misses:
                    if not v[p + "_ok"]:
                        key = f"{v['want'][p]} as {v[p] or 'none'}"
                        misses[p][key] = misses[p].get(key, 0) + 1
            fills = {}
            for v in verdicts:
                if v["fill"] is not None:
                    fills.setdefault(v["want"]["shape"], []).append(v["fill"])
            rows.append({"setting": name, "videos": t["videos"], "wall_s": round(wall, 1),
                         **{p: t[p]["accuracy"] for p in check.PROPERTIES},
                         "all_three": round(t["all_three"] / t["videos"], 3),
                         "colour_misses": misses["colour"], "shape_misses": misses["shape"],
                         "median_fill": {k: round(statistics.median(f), 3) for k, f in sorted(fills.items())},
                         "vs_first": vs_first})
            print(f"{name}: {rows[-1]}", flush=True)
    print(f"\n{len(world.all_prompts()[::args.every])} prompts x {args.seeds} seeds, {args.ranks} ranks, FFV1:\n")
    print("| setting | colour | direction | shape | all three | wall time |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setting']} | {r['colour']:.0%} | {r['direction']:.0%} | {r['shape']:.0%} | {r['all_three']:.0%} "
              f"| {r['wall_s']:.0f} s |")
    if len(rows) > 1:
        print(f"\nframes against the first setting's ({rows[0]['setting']}), same jobs:\n")
        print("| setting | frames that differ | bytes that differ | mean PSNR of those frames | max byte difference |\n"
              "|---|---|---|---|---|")
        for r in rows[1:]:
            c = r["vs_first"]
            psnr = f"{c['mean_psnr_db']:.1f} dB" if c["mean_psnr_db"] is not None else "-"
            print(f"| {r['setting']} | {c['frames_differ']:.1%} | {c['bytes_differ']:.1%} | {psnr} | {c['max_abs_diff']} |")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"prompts": len(world.all_prompts()[::args.every]), "seeds": args.seeds, "ranks": args.ranks, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
