#!/usr/bin/env python3
"""One video's transformer forward on more ranks: sequence parallelism (Ulysses) against one rank
computing while the others only join the weight gathers (what dlo did for a lone prompt).

dlo-forward at N ranks (default 2), --offload dlo, guidance (two branches), the same random
inputs in both runs:
  alone  --rank-passes P,0,...: rank 0 computes, the others are ghosts;
  sp     --sp N: the N ranks compute the one forward together, each its share of the tokens;
  cfg    --cfg-parallel --sp N/2: the two guidance branches on the two halves of the ranks (each
         half sequence-parallel when N > 2), predictions exchanged.
Reports seconds per pass (the report's per-pass wall time on rank 0, after a first pass that
warms up), the ratios alone / sp and alone / cfg (the speed-up of one video), and whether the
outputs are byte for byte the same. The model: Wan2.1 1.3B's block shape (dim 1536, 12 heads, ffn 8960, text 4096),
cut to --layers blocks; tokens from --latent F,H,W (post-VAE; patch 1x2x2). Ratios within one run
of this script; the machine is shared.

  bench_sequence_parallel.py --bin build/bin [--ranks 2] [--latent 3,30,52] [--layers 4] [--passes 3]
"""
import filecmp
import os
import tempfile

import benchlib


def run(bin_dir, tmp, name, ranks, extra, args):
    out, rep = f"{tmp}/{name}.safetensors", f"{tmp}/{name}.json"
    f, h, w = args.latent.split(",")
    benchlib.run([os.path.join(bin_dir, "dlo-forward"), "--model", f"{tmp}/m", "--component", "transformer",
                  "--random-inputs", f"{f},{h},{w},512", "--seed", "7", "--guidance", "--offload", "dlo", "--device", "cpu",
                  "--threads", "1", "--dtype", "bf16", "--out", out, "--report", rep] + extra, ranks,
                 environ=benchlib.env(OMP_NUM_THREADS="1"))
    r = benchlib.load_json(rep)
    ranks_ = r["ranks"] if isinstance(r, dict) and "ranks" in r else r
    r0 = ranks_[0]
    walls = [p["wall_s"] for p in r0["per_pass"]][1:]  # the first pass warms up
    return {"s_per_pass": round(sum(walls) / len(walls), 3), "passes_timed": len(walls),
            "exposed_transfer_s_per_pass": round(sum(p["exposed_transfer_s"] for p in r0["per_pass"][1:]) / len(walls), 3),
            "rss_peak_kb_rank0": r0["rss_peak_kb"]}, out


def main():
    ap = benchlib.parser(__doc__)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--latent", default="3,30,52", help="F,H,W of the latents (tokens F x H/2 x W/2)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        benchlib.make_model(args.bin, f"{tmp}/m", "--preset", "wan2.1-t2v-1.3b", "--layers", str(args.layers),
                            "--components", "transformer", "--dtype", "bf16")
        n = args.ranks
        alone, a_out = run(args.bin, tmp, "alone", n, ["--rank-passes", ",".join([str(args.passes)] + ["0"] * (n - 1))], args)
        sp, s_out = run(args.bin, tmp, "sp", n, ["--sp", str(n), "--passes", str(args.passes)], args)
        cfg, c_out = run(args.bin, tmp, "cfg", n, ["--cfg-parallel", "--sp", str(max(1, n // 2)), "--passes", str(args.passes)],
                         args) if n % 2 == 0 else (None, None)
        alone2, _ = run(args.bin, tmp, "alone2", n, ["--rank-passes", ",".join([str(args.passes)] + ["0"] * (n - 1))], args)
        f, h, w = (int(x) for x in args.latent.split(","))
        res = {"ranks": n, "tokens": f * (h // 2) * (w // 2), "layers": args.layers,
               "alone": alone, "sp": sp, "alone_again": alone2,
               "alone_over_sp": round((alone["s_per_pass"] + alone2["s_per_pass"]) / 2 / sp["s_per_pass"], 3),
               "outputs_identical": filecmp.cmp(a_out, s_out, shallow=False)}
        if cfg:
            res["cfg"] = cfg
            res["alone_over_cfg"] = round((alone["s_per_pass"] + alone2["s_per_pass"]) / 2 / cfg["s_per_pass"], 3)
            res["cfg_output_identical"] = filecmp.cmp(a_out, c_out, shallow=False)
    benchlib.emit(res, args.json)


if __name__ == "__main__":
    main()
