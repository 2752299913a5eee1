#!/usr/bin/env python3
"""What Wan2.2 A14B's two experts cost dlo-generate, on small random-weight models, at 2 ranks (dlo):

  A  one expert, 8 jobs of 10 steps (the baseline);
  B  two experts of A's shape, the same 8 jobs: every rank switches experts at the same pass;
  C  two experts, jobs of 10 and 7 steps alternating: the ranks drift apart, so some passes need
     both experts (each rank computes in its own and joins the other's gathers as a ghost);
  D  a mixed batch of 12 jobs alternating 16 steps at flow shift 12 (10 high-noise steps) and 8
     steps at shift 3 (2 high-noise steps): one expert, two experts with the scheduler's expert
     alignment (the default), and two experts with --no-expert-alignment; the share of passes
     that streamed both experts and jobs per hour.

Per run: seconds per denoising step of the batch (wave time / steps computed, per rank), the
passes that streamed both experts, the bytes each rank gathered per step, and the time compute
waited for a block (exposed_wait_s) per expert (the switch's cost: each expert's block 0 is
prefetched for its next pass). Ratios within one run of this script; the machine is shared.

  bench_experts.py --bin build/bin [--size 64,96,9] [--json out.json]
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl_vader_single_copy_mechanism="none",
           OMP_NUM_THREADS="1")
SHAPE = ["--layers", "8", "--dim", "256", "--heads", "4", "--ffn-dim", "768", "--text-dim", "32", "--dtype", "bf16"]


VAE_ARGS = []  # --vae-base-dim N: a cheaper VAE, so that decoding does not bound the batch


def run(bin_dir, tmp, name, preset, steps, ranks, size, shifts=None, extra=()):
    model = f"{tmp}/{preset}"
    if not os.path.exists(model):
        subprocess.run([os.path.join(bin_dir, "dlo-checkpoint"), "make", model, "--preset", preset] + SHAPE + VAE_ARGS,
                       check=True, stdout=subprocess.DEVNULL)
    with open(f"{tmp}/{name}.yaml", "w") as f:
        h, w, n = size
        f.write(f"model: {preset}\ndefaults: {{height: {h}, width: {w}, frames: {n}, format: png, guidance: 4}}\njobs:\n")
        for i, s in enumerate(steps):
            shift = f", flow_shift: {shifts[i]}" if shifts else ""
            f.write(f'  - {{id: j{i}, prompt: "prompt {i}", steps: {s}, seed: {i}{shift}}}\n')
    t0 = time.perf_counter()
    subprocess.run(["mpirun", "-np", str(ranks), os.path.join(bin_dir, "dlo-generate"), "--jobs", f"{tmp}/{name}.yaml",
                    "--output-dir", f"{tmp}/out_{name}", "--threads", "1", "--quiet", "--offload", "dlo",
                    "--report", f"{tmp}/{name}.json"] + list(extra), check=True, env=ENV)
    wall = time.perf_counter() - t0
    rep = json.load(open(f"{tmp}/{name}.json"))
    r0 = rep["ranks"][0]
    total_steps = sum(steps)
    out = {"wall_s": round(wall, 2), "wave_s": round(max(r["wave_s"] for r in rep["ranks"]), 3),
           "s_per_step": round(max(r["wave_s"] for r in rep["ranks"]) * ranks / total_steps, 4),
           "traversals": r0["traversals"], "ghost_traversals": r0["ghost_traversals"],
           "bytes_gathered_per_step_per_rank": round(sum(r["bytes_gathered"] for r in rep["ranks"]) / total_steps),
           "exposed_wait_s": round(r0["exposed_wait_s"], 4),
           "passes_waiting_for_decodes": r0["passes_waiting_for_decodes"],
           "jobs_per_hour": round(len(steps) * 3600 / max(r["wave_s"] for r in rep["ranks"]), 1)}
    ck = sum(os.path.getsize(os.path.join(model, d, f)) for d in ("transformer", "transformer_2")
             if os.path.isdir(os.path.join(model, d)) for f in os.listdir(os.path.join(model, d)) if f.endswith(".safetensors"))
    out["host_bytes_per_rank"] = r0["host_bytes"]
    out["host_bytes_over_checkpoint_per_rank"] = round(r0["host_bytes"] / (ck / ranks), 3)  # blocks only / all tensors
    if "experts" in r0:
        out["passes_streaming_both_experts"] = r0["passes_streaming_both_experts"]
        out["share_of_passes_streaming_both"] = round(r0["passes_streaming_both_experts"] / r0["traversals"], 3)
        out["expert_alignment_switches"] = sum(r.get("expert_alignment_switches", 0) for r in rep["ranks"])
        out["expert_traversals"] = [e["traversals"] for e in r0["experts"]]
        out["expert_exposed_wait_s"] = [round(e["exposed_wait_s"], 4) for e in r0["experts"]]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--size", default="64,96,9", help="height,width,frames (larger: compute dominates the gathers)")
    ap.add_argument("--json")
    ap.add_argument("--cases", default="ABCD", help="which cases to run (letters)")
    ap.add_argument("--vae-base-dim", type=int, help="the models' VAE base_dim (default: dlo-checkpoint's, 16)")
    args = ap.parse_args()
    if args.vae_base_dim:
        VAE_ARGS.extend(["--vae-base-dim", str(args.vae_base_dim)])
    size = [int(x) for x in args.size.split(",")]
    aligned = [10] * 8
    drifting = [10, 7] * 4
    mixed_steps, mixed_shifts = [16, 8] * 6, [12.0, 3.0] * 6
    res, ratios = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        two = "wan2.2-a14b-test"
        if "A" in args.cases:
            res["A_one_expert"] = run(args.bin, tmp, "a", "wan-test", aligned, args.ranks, size)
        if "B" in args.cases:
            res["B_two_experts_aligned"] = run(args.bin, tmp, "b", two, aligned, args.ranks, size)
        if "C" in args.cases:
            res["C_two_experts_drifting"] = run(args.bin, tmp, "c", two, drifting, args.ranks, size)
        if "D" in args.cases:
            res["D_one_expert"] = run(args.bin, tmp, "d1", "wan-test", mixed_steps, args.ranks, size, mixed_shifts)
            res["D_two_experts_aligned"] = run(args.bin, tmp, "d2", two, mixed_steps, args.ranks, size, mixed_shifts)
            res["D_two_experts_unaligned"] = run(args.bin, tmp, "d3", two, mixed_steps, args.ranks, size, mixed_shifts,
                                                 ["--no-expert-alignment"])
            d1 = res["D_one_expert"]["jobs_per_hour"]
            ratios["D_aligned_over_one_expert_jobs_per_hour"] = round(res["D_two_experts_aligned"]["jobs_per_hour"] / d1, 3)
            ratios["D_unaligned_over_one_expert_jobs_per_hour"] = round(
                res["D_two_experts_unaligned"]["jobs_per_hour"] / d1, 3)
        if "A" in args.cases:
            res["A_one_expert_again"] = run(args.bin, tmp, "a2", "wan-test", aligned, args.ranks, size)
    if "A" in args.cases and "B" in args.cases:
        a = (res["A_one_expert"]["s_per_step"] + res["A_one_expert_again"]["s_per_step"]) / 2
        ratios["B_over_A_s_per_step"] = round(res["B_two_experts_aligned"]["s_per_step"] / a, 3)
    if "B" in args.cases and "C" in args.cases:
        ratios["C_over_B_s_per_step"] = round(res["C_two_experts_drifting"]["s_per_step"] /
                                              res["B_two_experts_aligned"]["s_per_step"], 3)
    res["ratios"] = ratios
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        open(args.json, "w").write(text + "\n")


if __name__ == "__main__":
    main()
