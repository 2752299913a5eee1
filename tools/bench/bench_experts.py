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
prefetched for its next pass), and the switch's own wait against any other block's: the wait
at each pass's entry (block 0) of an expert, its first switch and the largest, vs the mean wait
at the other blocks. Ratios within one run of this script; the machine is shared.

  bench_experts.py --bin build/bin [--size 64,96,9] [--cases ABCD] [--a14b-cut] [--json out.json]

--a14b-cut: A14B's real block shape (dim 5120, 40 heads, ffn 13824; 702 MB per bf16 block), 3
blocks per expert, shorter batches (B: 2 x 4 steps; D: 6 jobs of 8 steps at shift 12 and 4 at 3).
"""
import json
import os
import struct
import tempfile

import benchlib

ENV = benchlib.env(OMP_NUM_THREADS="1")
SHAPE = ["--layers", "8", "--dim", "256", "--heads", "4", "--ffn-dim", "768", "--text-dim", "32", "--dtype", "bf16"]
# --a14b-cut: Wan2.2 A14B's own block shape (dim 5120, 40 heads, ffn 13824, text 4096), 3 blocks
# per expert (702 MB each in bf16; with 2 both would stay in the expert's two slots and never
# stream again), a 2-layer text encoder of that width.
A14B_CUT = ["--layers", "3", "--dim", "5120", "--heads", "40", "--ffn-dim", "13824", "--text-dim", "4096",
            "--te-layers", "2", "--te-d-ff", "1024", "--dtype", "bf16"]


VAE_ARGS = []  # --vae-base-dim N: a cheaper VAE, so that decoding does not bound the batch


def run(bin_dir, tmp, name, preset, steps, ranks, size, shifts=None, extra=()):
    model = benchlib.make_model(bin_dir, f"{tmp}/{preset}", "--preset", preset, *SHAPE, *VAE_ARGS)
    with open(f"{tmp}/{name}.yaml", "w") as f:
        h, w, n = size
        f.write(f"model: {preset}\ndefaults: {{height: {h}, width: {w}, frames: {n}, format: png, guidance: 4}}\njobs:\n")
        for i, s in enumerate(steps):
            shift = f", flow_shift: {shifts[i]}" if shifts else ""
            f.write(f'  - {{id: j{i}, prompt: "prompt {i}", steps: {s}, seed: {i}{shift}}}\n')
    wall, _ = benchlib.run([os.path.join(bin_dir, "dlo-generate"), "--jobs", f"{tmp}/{name}.yaml", "--output-dir",
                            f"{tmp}/out_{name}", "--threads", "1", "--quiet", "--offload", "dlo",
                            "--report", f"{tmp}/{name}.json", *extra], ranks, environ=ENV)
    rep = benchlib.load_json(f"{tmp}/{name}.json")
    r0 = rep["ranks"][0]
    total_steps = sum(steps)
    out = {"wall_s": round(wall, 2), "wave_s": round(max(r["wave_s"] for r in rep["ranks"]), 3),
           "s_per_step": round(max(r["wave_s"] for r in rep["ranks"]) * ranks / total_steps, 4),
           "traversals": r0["traversals"], "ghost_traversals": r0["ghost_traversals"],
           "bytes_gathered_per_step_per_rank": round(sum(r["bytes_gathered"] for r in rep["ranks"]) / total_steps),
           "exposed_wait_s": round(r0["exposed_wait_s"], 4),
           "passes_waiting_for_decodes": r0["passes_waiting_for_decodes"],
           "jobs_per_hour": round(len(steps) * 3600 / max(r["wave_s"] for r in rep["ranks"]), 1)}
    ck = sum(benchlib.weight_bytes(os.path.join(model, d)) for d in ("transformer", "transformer_2"))
    out["host_bytes_per_rank"] = r0["host_bytes"]
    out["host_bytes_over_checkpoint_per_rank"] = round(r0["host_bytes"] / (ck / ranks), 3)  # blocks only / all tensors
    out["host_bytes_over_blocks_per_rank"] = round(r0["host_bytes"] / (block_bytes(model) / ranks), 4)
    if "experts" in r0:
        out["passes_streaming_both_experts"] = r0["passes_streaming_both_experts"]
        out["share_of_passes_streaming_both"] = round(r0["passes_streaming_both_experts"] / r0["traversals"], 3)
        out["expert_alignment_switches"] = sum(r.get("expert_alignment_switches", 0) for r in rep["ranks"])
        out["expert_traversals"] = [e["traversals"] for e in r0["experts"]]
        out["expert_exposed_wait_s"] = [round(e["exposed_wait_s"], 4) for e in r0["experts"]]
        out.update(switch_waits(rep["ranks"]))
    return out


def block_bytes(model):
    """The bytes of the experts' block tensors as stored (safetensors headers; the run computes
    in bf16, as the bench's checkpoints are stored)."""
    total = 0
    for d in ("transformer", "transformer_2"):
        folder = os.path.join(model, d)
        for f in os.listdir(folder) if os.path.isdir(folder) else []:
            if not f.endswith(".safetensors"):
                continue
            with open(os.path.join(folder, f), "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k.startswith("blocks."))
    return total


def switch_waits(ranks):
    """The switch's cost against any other block's, per rank, from the engines' waits: an expert's
    entry waits (at block 0, one per pass on it) after its first, where a switch lands, against the
    mean wait at its other blocks. The low-noise expert's first entry is the batch's first switch;
    the high-noise expert's first entry is the batch's cold start, left out (reported: what the
    switch cost before an expert that sits passes out prefetched its entry)."""
    cold, first_switch, entry_max, entry_mean, other_mean = [], [], [], [], []
    for r in ranks:
        e0, e1 = r["experts"]
        cold.append(e0["entry_wait_s"][0] if e0["entry_wait_s"] else 0.0)  # what a switch cost unprefetched
        first_switch.append(e1["entry_wait_s"][0] if e1["entry_wait_s"] else 0.0)
        entries = e0["entry_wait_s"][1:] + e1["entry_wait_s"]
        entry_max.append(max(entries, default=0.0))
        entry_mean.append(sum(entries) / max(len(entries), 1))
        rest = sum(e["exposed_wait_s"] for e in (e0, e1)) - sum(e0["entry_wait_s"]) - sum(e1["entry_wait_s"])
        other = sum(e["blocks_acquired"] for e in (e0, e1)) - len(e0["entry_wait_s"]) - len(e1["entry_wait_s"])
        other_mean.append(rest / max(other, 1))
    r4 = lambda xs: [round(x, 4) for x in xs]
    return {"cold_start_wait_s": r4(cold), "first_switch_wait_s": r4(first_switch), "entry_wait_max_s": r4(entry_max),
            "entry_wait_mean_s": r4(entry_mean), "other_block_wait_mean_s": r4(other_mean)}


def main():
    ap = benchlib.parser(__doc__)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--size", default="64,96,9", help="height,width,frames (larger: compute dominates the gathers)")
    ap.add_argument("--cases", default="ABCD", help="which cases to run (letters)")
    ap.add_argument("--vae-base-dim", type=int, help="the models' VAE base_dim (default: dlo-checkpoint's, 16)")
    ap.add_argument("--a14b-cut", action="store_true", help="Wan2.2 A14B's block shape, 2 blocks per expert")
    ap.add_argument("--jobs", type=int, help="case D's job count (default 12)")
    args = ap.parse_args()
    if args.a14b_cut:
        SHAPE[:] = A14B_CUT
    if args.vae_base_dim:
        VAE_ARGS.extend(["--vae-base-dim", str(args.vae_base_dim)])
    size = [int(x) for x in args.size.split(",")]
    aligned = [10] * 8
    drifting = [10, 7] * 4
    mixed_steps, mixed_shifts = [16, 8] * 6, [12.0, 3.0] * 6
    if args.a14b_cut:  # ~2 s per block and step here: fewer, shorter jobs
        aligned, drifting = [4] * 2, [4, 3]
        mixed_steps, mixed_shifts = [8, 4] * 3, [12.0, 3.0] * 3
    if args.jobs:  # the same alternation, that many jobs
        mixed_steps = (mixed_steps[:2] * args.jobs)[:args.jobs]
        mixed_shifts = (mixed_shifts[:2] * args.jobs)[:args.jobs]
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
    benchlib.emit(res, args.json)


if __name__ == "__main__":
    main()
