#!/usr/bin/env python3
"""diffusers' WanTransformer3DModel on a model folder at one shape, the peer beside which dlo's
offload and fp8 storage are read (issue 47, item 6): seconds per pass with the transformer

  resident            bf16 on the device;
  group_offload       enable_group_offload(offload_type="block_level", num_blocks_per_group=1,
                      use_stream=True): each block copied from pinned host memory on a side stream;
  layerwise_fp8       enable_layerwise_casting(storage_dtype=float8_e4m3fn, compute_dtype=bf16),
                      resident;
  group_offload_fp8   both: fp8 blocks streamed, diffusers' nearest counterpart of dlo's fp8 streams.

A pass is one forward or, with --guidance, two (the conditional and the unconditional branch, as
WanPipeline calls them). The first pass is a warm-up; s/pass is the median of the others. Prints one
JSON line per variant (a variant that raises reports its error and the others still run).
Only torch and diffusers (--pythonpath: a folder of unpacked wheels appended to sys.path, so the
machine's own packages come first). group_offload* need a CUDA device and are skipped without one.

  python3 tools/bench/bench_diffusers_transformer.py --model FOLDER --shape F,H,W,L [--guidance]
      [--passes 4] [--device cuda] [--variants resident,group_offload,layerwise_fp8,group_offload_fp8]
      [--pythonpath DIR] [--json out.json]
"""
import argparse
import gc
import json
import statistics
import sys
import time

# The wheels' folder joins sys.path before torch is imported (torch looks for numpy at import).
if "--pythonpath" in sys.argv[1:-1]:
    sys.path.append(sys.argv[sys.argv.index("--pythonpath") + 1])

import torch  # noqa: E402

VARIANTS = ("resident", "group_offload", "layerwise_fp8", "group_offload_fp8")


def load(model, variant, device):
    from diffusers import WanTransformer3DModel
    t = WanTransformer3DModel.from_pretrained(model, subfolder="transformer", torch_dtype=torch.bfloat16).eval()
    if variant.endswith("fp8"):
        t.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
    if variant.startswith("group_offload"):
        t.enable_group_offload(onload_device=torch.device(device), offload_device=torch.device("cpu"),
                               offload_type="block_level", num_blocks_per_group=1, use_stream=True)
    else:
        t.to(device)
    return t


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(a, variant, shape):
    f, h, w, text_len = shape
    t0 = time.perf_counter()
    t = load(a.model, variant, a.device)
    sync(a.device)
    load_s = time.perf_counter() - t0
    cfg = t.config
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, cfg.in_channels, f, h, w, generator=g).to(a.device, torch.bfloat16)
    ctx = [torch.randn(1, text_len, cfg.text_dim, generator=g).to(a.device, torch.bfloat16)
           for _ in range(2 if a.guidance else 1)]
    step = torch.tensor([500.0], device=a.device)
    if a.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    walls = []
    with torch.inference_mode():
        for _ in range(a.passes):
            sync(a.device)
            s = time.perf_counter()
            for c in ctx:
                t(hidden_states=x, timestep=step, encoder_hidden_states=c, return_dict=False)
            sync(a.device)
            walls.append(time.perf_counter() - s)
    steady = walls[1:] or walls
    row = {"variant": variant, "shape": list(shape), "guidance": a.guidance, "passes": a.passes,
           "s_per_pass": statistics.median(steady), "s_min": min(steady), "s_max": max(steady), "load_s": load_s,
           "device_peak_bytes": torch.cuda.max_memory_allocated() if a.device.startswith("cuda") else None}
    del t, x, ctx
    gc.collect()
    if a.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a diffusers folder with transformer/")
    ap.add_argument("--shape", required=True, help="latent frames, height, width and text length: F,H,W,L")
    ap.add_argument("--guidance", action="store_true", help="two forwards per pass")
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--pythonpath", help="a folder appended to sys.path before torch and diffusers are imported")
    ap.add_argument("--json", help="write the rows here too (a JSON list)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    shape = tuple(int(v) for v in a.shape.split(","))
    if len(shape) != 4:
        ap.error("--shape takes F,H,W,L")
    import diffusers
    rows = []
    for variant in a.variants.split(","):
        if variant not in VARIANTS:
            ap.error(f"--variants: unknown variant '{variant}' (known: {', '.join(VARIANTS)})")
        if variant.startswith("group_offload") and not a.device.startswith("cuda"):
            row = {"variant": variant, "skipped": f"needs a CUDA device (--device {a.device})"}
        else:
            try:
                row = measure(a, variant, shape)
            except Exception as e:  # one variant's failure is a result; the others still run
                row = {"variant": variant, "error": f"{type(e).__name__}: {e}"[:300]}
        row["diffusers"] = diffusers.__version__
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
