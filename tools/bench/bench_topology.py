#!/usr/bin/env python3
"""dlo-generate's topologies on the CPU, 1 thread per rank, in one run (ratios; the machine is shared):

one guided job on 2 ranks
  alone  --sp 1 --cfg-parallel off: rank 0 computes, rank 1 only joins the weight gathers (what
         dlo did for a lone prompt before groups); also 1 rank, the reference frames;
  sp     --sp 2 --cfg-parallel off: the two ranks split the tokens (Ulysses);
  cfg    --cfg-parallel on: the conditional branch on rank 0, the unconditional on rank 1;
a batch of 3 guided jobs on 2 ranks
  auto   the default: every rank its own job, then the third (the tail) on both ranks as a CFG
         pair once the first two are done (the cost model's tail phase; its prediction printed);
  dp     --sp 1 --cfg-parallel off: every rank its own job throughout (the third alone on one rank);
  cfg    --cfg-parallel on: the two ranks as a CFG pair, job after job.
Reports per run: the mpirun wall time, the job's denoising seconds (results.jsonl, rank 0's
record) and its step times; the ratios sp / alone and cfg / alone (denoising, and the whole job),
auto / dp and cfg / dp (the batch's wall time) beside the cost model's predictions; and whether every run's
frames sha256 equals 1 rank's. The model: Wan2.1 1.3B's block shape (dim 1536, 12 heads) cut to
--layers blocks, a small random text encoder and VAE (dlo-checkpoint make's test presets).

  bench_topology.py --bin build/bin [--layers 4] [--size 240x416] [--frames 9] [--steps 4] [--batch-only] [--json OUT]
"""
import os
import re
import tempfile

import benchlib


def generate(bin_dir, tmp, name, ranks, job_args, extra):
    rep = f"{tmp}/{name}.json"
    wall, _ = benchlib.run([os.path.join(bin_dir, "dlo-generate"), "--model", f"{tmp}/m", "--device", "cpu", "--offload",
                            "dlo", "--threads", "1", "--report", rep] + job_args + extra, ranks,
                           environ=benchlib.env(OMP_NUM_THREADS="1"))
    r = benchlib.load_json(rep)
    m = re.search(r"topology: (.*?)(?:\n|$)", r["choice"])
    pred = re.search(r"predicted ([0-9.]+) single-rank step times vs ([0-9.]+) data parallel", r["choice"])
    jobs = sorted(r["jobs"], key=lambda j: j["index"])
    r0 = r["ranks"][0]
    return {"wall_s": round(wall, 2),
            "rank0_exchange_bytes_sent": r0.get("exchange_bytes_sent", 0),
            "rank0_bytes_gathered": r0["bytes_gathered"], "rank0_traversals": r0["traversals"],
            "denoise_s": [round(j["timings"]["denoise_s"], 3) for j in jobs],
            "step_s_median": [round(sorted(j["timings"]["step_s"])[len(j["timings"]["step_s"]) // 2], 3) for j in jobs],
            "job_s": [round(j["timings"]["text_s"] + j["timings"]["denoise_s"] + j["timings"]["decode_s"], 3) for j in jobs],
            "parallel": [j["parallel"] for j in jobs],
            "frames_sha256": [j["frames_sha256"] for j in jobs],
            "topology": m.group(1) if m else "",
            "predicted": float(pred.group(1)) if pred else None,
            "predicted_dp": float(pred.group(2)) if pred else None}


def main():
    ap = benchlib.parser(__doc__)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--size", default="240x416", help="HEIGHTxWIDTH")
    ap.add_argument("--frames", type=int, default=9)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch-only", action="store_true", help="only the batch of 3 (not the single job's runs)")
    args = ap.parse_args()
    h, w = args.size.split("x")
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        benchlib.make_model(args.bin, f"{tmp}/m", "--preset", "wan2.1-t2v-1.3b", "--layers", str(args.layers),
                            "--te-layers", "2", "--dtype", "bf16")
        job = ["--height", h, "--width", w, "--frames", str(args.frames), "--steps", str(args.steps), "--guidance", "5",
               "--seed", "3"]
        one = job + ["--prompt", "a red fox in the snow"]
        runs = {}
        if not args.batch_only:
            runs["one_rank"] = generate(args.bin, tmp, "one_rank", 1, one + ["--out", f"{tmp}/a.mp4"], [])
            runs["alone"] = generate(args.bin, tmp, "alone", 2, one + ["--out", f"{tmp}/b.mp4"], ["--sp", "1", "--cfg-parallel", "off"])
            runs["sp"] = generate(args.bin, tmp, "sp", 2, one + ["--out", f"{tmp}/c.mp4"], ["--sp", "2", "--cfg-parallel", "off"])
            runs["cfg"] = generate(args.bin, tmp, "cfg", 2, one + ["--out", f"{tmp}/d.mp4"], ["--cfg-parallel", "on"])
        with open(f"{tmp}/three.txt", "w") as f:
            f.write("a red fox in the snow\nan owl at night\nwaves on a beach\n")
        batch = job + ["--jobs", f"{tmp}/three.txt"]
        runs["batch_auto"] = generate(args.bin, tmp, "batch_auto", 2, batch + ["--output-dir", f"{tmp}/auto"], [])
        runs["batch_dp"] = generate(args.bin, tmp, "batch_dp", 2, batch + ["--output-dir", f"{tmp}/dp"],
                                    ["--sp", "1", "--cfg-parallel", "off"])
        runs["batch_cfg"] = generate(args.bin, tmp, "batch_cfg", 2, batch + ["--output-dir", f"{tmp}/cfg"],
                                     ["--cfg-parallel", "on"])
        runs["batch_one_rank"] = generate(args.bin, tmp, "batch_one_rank", 1, batch + ["--output-dir", f"{tmp}/one"], [])
    out = {"model": f"Wan2.1 1.3B blocks x {args.layers}, {args.size}, {args.frames} frames, {args.steps} steps, guidance 5",
           "runs": runs}
    if not args.batch_only:
        a = runs["alone"]
        blocks, steps = args.layers, args.steps
        tokens = (args.frames - 1) // 4 + 1
        tokens *= (int(h) // 16) * (int(w) // 16)  # VAE x8, patch 1x2x2
        act = tokens * 1536 * 2  # A = S x D x 2 bytes (bf16)
        exchange = {
            k: {"exchange_bytes_per_block_step": round(runs[k]["rank0_exchange_bytes_sent"] / (blocks * steps)),
                "gather_bytes_per_block_pass": round(runs[k]["rank0_bytes_gathered"] / (blocks * runs[k]["rank0_traversals"]))}
            for k in ("sp", "cfg")}
        # The notes' formula (sequence-parallel-notes.md section 2): Ulysses sends 4A(P-1)/P^2 per rank,
        # block and branch; SP 2 with guidance's two branches: 2 x A.
        exchange["sp"]["formula_bytes_per_block_step"] = 2 * act
        exchange["tokens"] = tokens
        out.update({
            "exchange": exchange,
            "denoise_ratio_sp_over_alone": round(runs["sp"]["denoise_s"][0] / a["denoise_s"][0], 3),
            "denoise_ratio_cfg_over_alone": round(runs["cfg"]["denoise_s"][0] / a["denoise_s"][0], 3),
            "job_ratio_sp_over_alone": round(runs["sp"]["job_s"][0] / a["job_s"][0], 3),
            "job_ratio_cfg_over_alone": round(runs["cfg"]["job_s"][0] / a["job_s"][0], 3),
            "predicted_ratio_sp": round(1 / 1.38, 3),
            "predicted_ratio_cfg": round(1 / 1.84, 3),
            "frames_identical_single": len({r["frames_sha256"][0] for k, r in runs.items() if not k.startswith("batch")}) == 1,
        })
    pred = lambda k: round(runs[k]["predicted"] / runs[k]["predicted_dp"], 3) if runs[k]["predicted"] else None
    out.update({
        "batch_wall_ratio_auto_over_dp": round(runs["batch_auto"]["wall_s"] / runs["batch_dp"]["wall_s"], 3),
        "batch_predicted_ratio_auto_over_dp": pred("batch_auto"),
        "batch_wall_ratio_cfg_over_dp": round(runs["batch_cfg"]["wall_s"] / runs["batch_dp"]["wall_s"], 3),
        "batch_predicted_ratio_cfg_over_dp": pred("batch_cfg"),
        "frames_identical_batch": runs["batch_auto"]["frames_sha256"] == runs["batch_dp"]["frames_sha256"]
                                  == runs["batch_cfg"]["frames_sha256"] == runs["batch_one_rank"]["frames_sha256"],
    })
    benchlib.emit(out, args.json)


if __name__ == "__main__":
    main()
