#!/usr/bin/env python3
"""One job, dlo-generate vs diffusers' WanPipeline on the same random-weight model folder, CPU.

Reports, each as the median of --repeat runs with the spread (min-max):
  * wall time of the whole job: dlo-generate's process (start, load, text, denoise, decode, write)
    vs diffusers (from_pretrained + the pipeline call + export), same threads; and the ratio;
  * the share of dlo's wall time in text encoding, denoising, decoding + writing (and of that,
    the writing: H.264 encoding), at 1 and 2
    ranks (2 ranks: --offload dlo, rank 0 renders, rank 1 holds half of each block);
  * dlo's peak RSS of the rendering rank vs the bytes of the weights the job reads.

  bench_generate.py --bin build/bin [--threads 2] [--repeat 3] [--json out.json]
"""
import os
import statistics
import sys
import tempfile

import benchlib
from benchlib import spread

PROMPT = "A red fox trotting through fresh snow at dawn"
MODEL_FLAGS = ["--preset", "wan2.1-t2v-1.3b", "--layers", "4", "--te-layers", "2", "--dtype", "fp32",
               "--in-channels", "16", "--out-channels", "16"]


def run_dlo(args, model, ranks, tmp):
    report = os.path.join(tmp, f"r{ranks}.json")
    cmd = [os.path.join(args.bin, "dlo-generate"), "--model", model, "--prompt", PROMPT, "--seed", "1", "--steps",
           str(args.steps), "--height", str(args.height), "--width", str(args.width), "--frames", str(args.frames),
           "--dtype", "fp32", "--threads", str(args.threads), "--out", os.path.join(tmp, f"v{ranks}.mp4"),
           "--report", report, "--quiet"]
    wall, _ = benchlib.run(cmd + (["--offload", "dlo"] if ranks > 1 else []), ranks if ranks > 1 else None)
    return wall, benchlib.load_json(report)["jobs"][0]


def run_diffusers(args, model):
    """from_pretrained + the pipeline call + export_to_video's encode. The venv has no imageio, so
    the export is done as imageio-ffmpeg does it: the uint8 frames piped into ffmpeg (libx264)."""
    code = f"""
import subprocess, torch, numpy as np
torch.set_num_threads({args.threads})
from diffusers import WanPipeline
pipe = WanPipeline.from_pretrained({model!r}, torch_dtype=torch.float32)
pipe.set_progress_bar_config(disable=True)
video = pipe(prompt={PROMPT!r}, height={args.height}, width={args.width}, num_frames={args.frames},
             num_inference_steps={args.steps}, generator=torch.Generator("cpu").manual_seed(1), output_type="np").frames[0]
frames = np.stack([(f * 255).astype(np.uint8) for f in video])
subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", "{args.width}x{args.height}",
                "-r", "16", "-i", "-", "-c:v", "libx264", "-pix_fmt", "yuv420p", "-crf", "25", {os.path.join(args.tmp, 'ref.mp4')!r}],
               input=frames.tobytes(), check=True)
"""
    return benchlib.run([sys.executable, "-c", code], environ=os.environ)[0]


def main():
    ap = benchlib.parser(__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--height", type=int, default=128)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--frames", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        args.tmp = tmp
        model = os.path.join(tmp, "model")
        benchlib.make_model(args.bin, model, *MODEL_FLAGS)
        weights = sum(benchlib.weight_bytes(os.path.join(model, p)) for p in ("transformer", "text_encoder", "vae"))
        out = {"model": " ".join(MODEL_FLAGS), "weights_bytes": weights, "threads": args.threads,
               "job": f"{args.width}x{args.height}, {args.frames} frames, {args.steps} steps, guidance 5, fp32"}
        walls = {1: [], 2: []}
        shares = {1: [], 2: []}
        rss = []
        ref = []
        for _ in range(args.repeat):
            ref.append(run_diffusers(args, model))
            for ranks in (1, 2):
                wall, job = run_dlo(args, model, ranks, tmp)
                walls[ranks].append(wall)
                shares[ranks].append({k: job["timings"][k] / wall for k in ("text_s", "denoise_s", "decode_s", "encode_s")})
                if ranks == 1:
                    rss.append(job["memory"]["rss_peak_kb"] * 1024)
        out["diffusers_wall_s"] = spread(ref)
        for ranks in (1, 2):
            out[f"dlo_{ranks}rank_wall_s"] = spread(walls[ranks])
            out[f"dlo_{ranks}rank_share"] = {k: statistics.median(s[k] for s in shares[ranks])
                                             for k in ("text_s", "denoise_s", "decode_s", "encode_s")}
        out["ratio_dlo_1rank_over_diffusers"] = spread([a / b for a, b in zip(walls[1], ref)])
        out["peak_rss_over_weights"] = spread([r / weights for r in rss])
    benchlib.emit(out, args.json)


if __name__ == "__main__":
    main()
