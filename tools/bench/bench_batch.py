#!/usr/bin/env python3
"""Batch scheduling on the demo-sized model: jobs per hour at 1 and 2 ranks, rank idle share with
jobs whose steps vary from 2 to 20, boundary waits, and RSS over the batch.

  bench_batch.py --bin build/bin [--jobs 24] [--json out.json]

Ghost share = traversals in which a rank only joined the gathers, over all traversals (from
--report); of those, "while work remained" excludes the tail where no job was left to take. "Equal waves" is the scheme where every rank starts a job together
and all wait for the longest (the original DLO): its idle share is computed from the same job
list (waves of N jobs in order: idle = sum over ranks of max steps - own steps), not run.
"""
import os
import random
import tempfile

import benchlib


def main():
    ap = benchlib.parser(__doc__)
    ap.add_argument("--jobs", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    steps = [rng.randint(2, 20) for _ in range(args.jobs)]
    out = {"jobs": args.jobs, "steps": steps}
    with tempfile.TemporaryDirectory() as tmp:
        benchlib.make_model(args.bin, f"{tmp}/m", "--preset", "wan-test", "--layers", "6", "--dim", "48", "--heads", "4",
                            "--text-dim", "32", "--dtype", "bf16")
        with open(f"{tmp}/jobs.yaml", "w") as f:
            f.write("model: m\ndefaults: {height: 32, width: 48, frames: 5}\njobs:\n")
            for i, s in enumerate(steps):
                f.write(f'  - {{id: j{i}, prompt: "prompt {i}", steps: {s}, seed: {i}}}\n')
        for ranks in (1, 2):
            wall, _ = benchlib.run([os.path.join(args.bin, "dlo-generate"), "--jobs", f"{tmp}/jobs.yaml", "--output-dir",
                                    f"{tmp}/o{ranks}", "--threads", "1", "--quiet", "--offload",
                                    "dlo" if ranks > 1 else "resident", "--report", f"{tmp}/r{ranks}.json"], ranks)
            rep = benchlib.load_json(f"{tmp}/r{ranks}.json")
            trav = sum(r["traversals"] for r in rep["ranks"])
            ghost = sum(r["ghost_traversals"] for r in rep["ranks"])
            idle = sum(r["idle_traversals"] for r in rep["ranks"])
            wave = max(r["wave_s"] for r in rep["ranks"])
            wait = sum(r["boundary_wait_s"] for r in rep["ranks"]) / ranks
            rss = [j["memory"]["rss_peak_kb"] for j in sorted(rep["jobs"], key=lambda j: j["index"])]
            out[f"{ranks}_ranks"] = {
                "wall_s": wall, "jobs_per_hour": args.jobs / wall * 3600,
                "traversals": trav, "ghost_share": ghost / trav, "idle_share_while_work_remained": idle / trav,
                "boundary_wait_share_of_wave": wait / wave,
                "rss_peak_kb_first_last_job": [rss[0], rss[-1]],
            }
            if ranks > 1:
                eq_idle = eq_total = 0
                for w in range(0, len(steps), ranks):
                    wave_steps = steps[w:w + ranks] + [0] * (ranks - len(steps[w:w + ranks]))
                    eq_idle += sum(max(wave_steps) - s for s in wave_steps)
                    eq_total += ranks * max(wave_steps)
                out[f"{ranks}_ranks"]["equal_waves_idle_share_computed"] = eq_idle / eq_total
    benchlib.emit(out, args.json)


if __name__ == "__main__":
    main()
