#!/usr/bin/env python3
"""Benchmark of the Wan2.1 VAE decoder on the CPU. Not a test: prints numbers.

1. Working memory for 5 vs 21 latent frames (17 vs 81 video frames), on a VAE with the real
   channel structure (default: the real Wan2.1 config, base_dim 96) at a small spatial size.
   Ours: `dlo-forward --component vae --report`: peak RSS during the decode (VmHWM, reset after
   loading) minus RSS after loading, minus the decoder's weight bytes (they are mmap views, so
   they become resident file pages during the first decode; that is not working memory).
   diffusers: the same in a child Python process (its parameters are read once after loading, so
   that they are resident before the measurement, whether or not they are file-backed).
   Both include the output video; "beyond output" subtracts it.
   glibc raises its mmap threshold as large blocks are freed and then keeps freed blocks in the
   heap, so plain VmHWM also measures what the allocator retains (it varies from run to run). The
   "live" runs fix the thresholds (MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ = 128 KiB) so
   that RSS follows the tensors alive; the "default" runs use glibc's defaults.
2. Speed: decode wall time of the default-malloc runs, ours (dlo-forward's forward_seconds:
   de-normalise + decode, no process start or loading) vs diffusers (WanPipeline's decode step),
   one run each, at the same thread count. Reported as the ratio ours / diffusers.

  .venv/bin/python tools/bench/bench_vae_memory.py --bin build/bin [--threads 2] [--height 6 --width 8]
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import save_file

import benchlib

# The diffusers side, in its own process so that its peak RSS is its own.
CHILD = r"""import json, sys, time
import torch
from diffusers import AutoencoderKLWan
from safetensors.torch import load_file

def kb(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])

vae_dir, inputs, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(threads)
vae = AutoencoderKLWan.from_pretrained(vae_dir, torch_dtype=torch.float32).eval()
latents = load_file(inputs)["latents"]
with torch.no_grad():  # fault in the parameters (they may be file-backed) so that they count as loaded
    for p in vae.parameters():
        p.sum()
after_load = kb("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
t0 = time.perf_counter()
with torch.no_grad():
    lat = latents.to(vae.dtype)
    mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1).to(lat.device, lat.dtype)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1).to(lat.device, lat.dtype)
    video = vae.decode(lat / inv_std + mean, return_dict=False)[0]
seconds = time.perf_counter() - t0
print(json.dumps({"rss_after_load_kb": after_load, "peak_rss_kb": kb("VmHWM"), "seconds": seconds,
                  "shape": list(video.shape)}))
"""


def decoder_weight_bytes(vae_dir):
    total = 0
    for name in os.listdir(vae_dir):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(vae_dir, name), "pt") as f:
                for k in f.keys():
                    if k.startswith("decoder.") or k.startswith("post_quant_conv."):
                        s = f.get_slice(k)
                        n = 1
                        for d in s.get_shape():
                            n *= d
                        total += n * 4  # fp32 checkpoint
    return total


def mib(kb):
    return kb / 1024.0


def main():
    ap = benchlib.parser(__doc__, json_out=False)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vae-preset", default="wan2.1-vae")
    ap.add_argument("--vae-base-dim", type=int, default=None)
    ap.add_argument("--height", type=int, default=6, help="latent height (x8 in the video)")
    ap.add_argument("--width", type=int, default=8, help="latent width (x8 in the video)")
    ap.add_argument("--frames", default="5,21", help="latent frame counts to compare (first is the baseline)")
    ap.add_argument("--skip-diffusers", action="store_true")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    args = ap.parse_args()
    frames = [int(f) for f in args.frames.split(",")]

    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        model = os.path.join(tmp, "model")
        base_dim = ["--vae-base-dim", str(args.vae_base_dim)] if args.vae_base_dim else []
        benchlib.make_model(args.bin, model, "--components", "vae", "--vae-preset", args.vae_preset, "--vae-dtype", "fp32",
                            "--shard-size", "0", *base_dim)
        vae_dir = os.path.join(model, "vae")
        weights_kb = decoder_weight_bytes(vae_dir) / 1024.0
        cfg = json.load(open(os.path.join(vae_dir, "config.json")))
        print(f"VAE {args.vae_preset} base_dim {cfg['base_dim']} (decoder weights {mib(weights_kb):.1f} MiB), "
              f"latent {args.height}x{args.width} -> video {8 * args.height}x{8 * args.width}, fp32, "
              f"{args.threads} threads")

        live_env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
        rows = {}
        for f in frames:
            g = torch.Generator().manual_seed(0)
            latents = torch.randn(1, cfg["z_dim"], f, args.height, args.width, generator=g)
            inp = os.path.join(tmp, f"in{f}.safetensors")
            save_file({"latents": latents}, inp)
            out_frames = 1 + 4 * (f - 1)
            row = {"out_kb": 3 * out_frames * 64 * args.height * args.width * 4 / 1024.0}
            for mode, env in (("live", live_env), ("default", None)):
                rep = os.path.join(tmp, "report.json")
                subprocess.run([os.path.join(args.bin, "dlo-forward"), "--model", model, "--component", "vae",
                                "--inputs", inp, "--out", os.path.join(tmp, "out.safetensors"), "--threads",
                                str(args.threads), "--report", rep], check=True, env=env)
                r = json.load(open(rep))
                row[f"ours_{mode}_kb"] = r["peak_rss_kb"] - r["rss_after_load_kb"] - weights_kb
                row[f"ours_{mode}_s"] = r["forward_seconds"][0]
                if not args.skip_diffusers:
                    res = subprocess.run([sys.executable, "-c", CHILD, vae_dir, inp, str(args.threads)], check=True,
                                         capture_output=True, text=True, env=env)
                    d = json.loads(res.stdout.strip().splitlines()[-1])
                    row[f"ref_{mode}_kb"] = d["peak_rss_kb"] - d["rss_after_load_kb"]
                    row[f"ref_{mode}_s"] = d["seconds"]
            rows[f] = row
            print(f"  {f:3d} latent frames -> {out_frames:3d} video frames (output {mib(row['out_kb']):.1f} MiB):",
                  flush=True)
            for who, name in (("ours", "ours     "), ("ref", "diffusers")):
                if f"{who}_live_kb" in row:
                    print(f"      {name}: working memory live {mib(row[who + '_live_kb']):7.1f} MiB "
                          f"(beyond output {mib(row[who + '_live_kb'] - row['out_kb']):7.1f}), "
                          f"default malloc {mib(row[who + '_default_kb']):7.1f} MiB; "
                          f"decode {row[who + '_default_s']:.2f} s (live-malloc run {row[who + '_live_s']:.2f} s)",
                          flush=True)

        a, b = rows[frames[0]], rows[frames[-1]]
        for who, name in (("ours", "ours"), ("ref", "diffusers")):
            if f"{who}_live_kb" not in a:
                continue
            live = b[who + "_live_kb"] / a[who + "_live_kb"]
            beyond = (b[who + "_live_kb"] - b["out_kb"]) / (a[who + "_live_kb"] - a["out_kb"])
            dflt = b[who + "_default_kb"] / a[who + "_default_kb"]
            print(f"memory ratio {frames[-1]} vs {frames[0]} latent frames, {name}: live {live:.2f}x "
                  f"(beyond output {beyond:.2f}x), default malloc {dflt:.2f}x")
        if "ref_default_s" in b:
            print(f"speed, {args.threads} threads, one run each: {frames[-1]} latent frames ours "
                  f"{b['ours_default_s']:.2f} s / diffusers {b['ref_default_s']:.2f} s = "
                  f"{b['ours_default_s'] / b['ref_default_s']:.2f}; {frames[0]} frames "
                  f"{a['ours_default_s']:.2f} s / {a['ref_default_s']:.2f} s = "
                  f"{a['ours_default_s'] / a['ref_default_s']:.2f}")


if __name__ == "__main__":
    main()
