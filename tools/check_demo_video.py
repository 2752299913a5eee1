#!/usr/bin/env python3
"""Does a rendered video show what its prompt asked for? A semantic check of the whole product.

For the demo model's world (tools/demo_world.py: "a {colour} {shape} moving {direction}") it finds
the object in every frame (pixels far from the dark-grey background), its colour (the nearest of
the five to its mean pixel), its direction and distance (the centroid in the first and the last
frame) and its shape (how much of its bounding box it fills: square 1, circle 0.79, triangle 0.5),
and compares them with the prompt's words.

  check_demo_video.py VIDEO [--prompt TEXT]     # the prompt defaults to the one the video records
  check_demo_video.py --results DIR/results.jsonl   # every finished job of a batch
Options: --json FILE (every verdict and the tally), --max-misses colour=0,direction=0,shape=2
(exit 1 when more videos than that miss a property). VIDEO is an MP4 or MKV (decoded by ffmpeg)
or a folder of PNG frames. Prints one line per video and the tally.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_world as world  # noqa: E402

PROPERTIES = ("colour", "direction", "shape")


def probe(path):
    """(width, height, description tag) of a video file, by ffprobe."""
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
                          "stream=width,height:format_tags=description", "-of", "json", path],
                         check=True, capture_output=True, text=True).stdout
    info = json.loads(out)
    s = info["streams"][0]
    return s["width"], s["height"], info.get("format", {}).get("tags", {}).get("description")


def read_frames(path):
    """uint8 [F, H, W, 3] and the recorded prompt (None when the video records none)."""
    if os.path.isdir(path):
        from PIL import Image
        names = sorted(n for n in os.listdir(path) if n.endswith(".png"))
        if not names:
            raise SystemExit(f"{path}: a folder without PNG frames")
        frames = np.stack([np.asarray(Image.open(os.path.join(path, n)).convert("RGB")) for n in names])
        return frames, None
    width, height, description = probe(path)
    raw = subprocess.run(["ffmpeg", "-v", "error", "-i", path, "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
                         check=True, capture_output=True).stdout
    frames = np.frombuffer(raw, np.uint8).reshape(-1, height, width, 3)
    recorded = None
    if description:
        try:
            recorded = json.loads(description).get("prompt")
        except json.JSONDecodeError:
            pass
    return frames, recorded


def check_video(path, prompt=None, extra=None):
    frames, recorded = read_frames(path)
    text = prompt if prompt is not None else recorded
    if text is None:
        raise SystemExit(f"{path}: records no prompt; give --prompt")
    verdict = world.judge(frames, text)
    verdict["video"] = path
    verdict.update(extra or {})
    return verdict


def tally(verdicts):
    n = len(verdicts)
    out = {"videos": n}
    for p in PROPERTIES:
        ok = sum(bool(v[p + "_ok"]) for v in verdicts)
        out[p] = {"right": ok, "wrong": n - ok, "accuracy": round(ok / n, 3) if n else None}
    out["all_three"] = sum(all(v[p + "_ok"] for p in PROPERTIES) for v in verdicts)
    return out


def line(v):
    marks = " ".join(f"{p} {v[p] or '-'}{'' if v[p + '_ok'] else ' (wrong)'}" for p in PROPERTIES)
    return f"{os.path.basename(v['video'].rstrip('/'))}: '{v['prompt']}': {marks}; moved {v['distance']:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("video", nargs="*")
    ap.add_argument("--prompt", help="the prompt of a single VIDEO (default: the one it records)")
    ap.add_argument("--results", action="append", default=[], help="a batch's results.jsonl (repeatable)")
    ap.add_argument("--json", help="write every verdict and the tally here")
    ap.add_argument("--max-misses", default="", help="e.g. colour=1,direction=1,shape=3: exit 1 beyond that")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    if args.prompt is not None and len(args.video) != 1:
        ap.error("--prompt goes with exactly one VIDEO")
    verdicts = [check_video(v, args.prompt) for v in args.video]
    for results in args.results:
        folder = os.path.dirname(os.path.abspath(results))
        last = {}
        with open(results) as f:
            for raw in f:
                if raw.endswith("\n") and raw.strip():
                    r = json.loads(raw)
                    last[r["id"]] = r
        for r in last.values():
            if r.get("status") != "ok":
                continue
            out = r["output"] if os.path.isabs(r["output"]) else os.path.join(folder, r["output"])
            p = r.get("parameters", {})
            verdicts.append(check_video(out, p.get("prompt"), {"id": r["id"], "parameters": p}))
    if not verdicts:
        ap.error("nothing to check: give VIDEO or --results")
    t = tally(verdicts)
    if not args.quiet:
        for v in verdicts:
            print(line(v))
    print("tally: " + ", ".join(f"{p} {t[p]['right']}/{t['videos']}" for p in PROPERTIES) +
          f"; all three {t['all_three']}/{t['videos']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tally": t, "videos": verdicts}, f, indent=1)
    failed = []
    for item in filter(None, args.max_misses.split(",")):
        key, _, limit = item.partition("=")
        if key not in PROPERTIES:
            ap.error(f"--max-misses: unknown property {key!r} ({', '.join(PROPERTIES)})")
        if t[key]["wrong"] > int(limit):
            failed.append(f"{key}: {t[key]['wrong']} of {t['videos']} wrong, at most {limit} allowed")
    for f in failed:
        print("FAIL: " + f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
