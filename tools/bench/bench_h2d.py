#!/usr/bin/env python3
"""The plain copy rate between host and GPU on this machine: the baseline beside which dlo's
streamed blocks are read (issue 47, item 6). One tensor of each --sizes is copied host-to-device
from pinned and from pageable memory, and device-to-host into pinned memory, --repeats times after
a warm-up copy, timed with CUDA events. Prints one JSON line per case; GB/s is 1e9 bytes/s, the
median over the repeats. Needs torch with CUDA only (runs on the bare GPU machine's python3).

  python3 tools/bench/bench_h2d.py [--sizes 96MiB,720MiB] [--repeats 10] [--json out.json]

The default sizes are one block of Wan2.1 1.3B (about 96 MiB in bf16) and of 14B (about 720 MiB).
"""
import argparse
import json
import statistics
import sys

import torch


def nbytes(text):
    units = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    for u, m in units.items():
        if text.endswith(u):
            return int(float(text[:-len(u)]) * m)
    return int(text)


def rate(src, dst, repeats):
    """Median GB/s of dst.copy_(src, non_blocking=True) over `repeats` timed copies."""
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return src.numel() / statistics.median(times) / 1e9, min(times), max(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="96MiB,720MiB")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json", help="write the rows here too (a JSON list)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_h2d.py: no CUDA device", file=sys.stderr)
        return 77
    rows = []
    for size in a.sizes.split(","):
        n = nbytes(size)
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True).fill_(1)
        pageable = torch.empty(n, dtype=torch.uint8).fill_(1)
        for case, src, dst in (("h2d pinned", pinned, dev), ("h2d pageable", pageable, dev), ("d2h pinned", dev, pinned)):
            gbs, lo, hi = rate(src, dst, a.repeats)
            rows.append({"case": case, "bytes": n, "gb_per_s": round(gbs, 2), "s_min": lo, "s_max": hi,
                         "device": torch.cuda.get_device_name()})
            print(json.dumps(rows[-1]), flush=True)
        del dev, pinned, pageable
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
