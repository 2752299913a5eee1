#!/usr/bin/env python3
"""MpiWorld's small collectives at 2, 8, 32 and 64 ranks (oversubscribed on a small machine), one
build against another in one run (ratios: the machine is shared):

  bench_collectives.py --bin build/bin [--baseline-bin OLD/bin] [--ranks 2,8,32,64] [--rounds 3]
                       [--iterations 100] [--json OUT]

Runs dlo-bench-collectives (the pass-boundary allgather of 18 words per rank, the results gather to
rank 0, a broadcast, check_all; each the slowest rank's microseconds per call) for every rank count,
the two builds alternately, `rounds` times; prints the medians, their ranges, and after / before.
--baseline-bin: a build of an earlier commit (e.g. `git worktree add /tmp/old REV && cd /tmp/old &&
tools/setup.sh && cmake --build build --target dlo-bench-collectives`).
"""
import json
import os

import benchlib

ENV = benchlib.env(OMP_NUM_THREADS="1", DLO_GATHER_TIMEOUT_S="600")
KEYS = ("boundary_allgather_us", "gather_strings_us", "broadcast_string_us", "check_all_us")


def run(bin_dir, ranks, iterations):
    _, out = benchlib.run([os.path.join(bin_dir, "dlo-bench-collectives"), "--iterations", str(iterations)], ranks,
                          mpirun_flags=("--bind-to", "none"), environ=ENV, capture=True, timeout=1800)
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = benchlib.parser(__doc__)
    ap.add_argument("--baseline-bin")
    ap.add_argument("--ranks", default="2,8,32,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=100)
    args = ap.parse_args()
    builds = {"after": args.bin}
    if args.baseline_bin:
        builds = {"before": args.baseline_bin, "after": args.bin}
    out = {}
    for n in (int(x) for x in args.ranks.split(",")):
        samples = {b: {k: [] for k in KEYS} for b in builds}
        for _ in range(args.rounds):
            for b, d in builds.items():
                r = run(d, n, args.iterations)
                for k in KEYS:
                    samples[b][k].append(r[k])
        med = lambda v: sorted(v)[len(v) // 2]
        row = {b: {k: {"median": med(v), "range": [min(v), max(v)]} for k, v in s.items()} for b, s in samples.items()}
        if "before" in row:
            row["after_over_before"] = {k: round(row["after"][k]["median"] / row["before"][k]["median"], 3) for k in KEYS}
        out[str(n)] = row
        print(n, "ranks:", json.dumps(row))
    if args.json:
        open(args.json, "w").write(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
