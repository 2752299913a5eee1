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
or a folder of PNG frames. Prints one line per video and the tally. An object that moves less
than demo_world.MIN_TRAVEL of the frame has no direction (a miss). Bad input (a missing or
unreadable video, a prompt outside the world, a malformed results.jsonl line, a bad option) is
one line naming it, exit 2.
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


class BadInput(Exception):
    """What the user gave cannot be checked; main prints it as one line and exits 2."""


def last_line(text):
    lines = text.strip().splitlines()
    return lines[-1] if lines else "no message"


def probe(path):
    """(width, height, description tag) of a video file, by ffprobe."""
    p = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
                        "stream=width,height:format_tags=description", "-of", "json", path],
                       capture_output=True, text=True)
    info = json.loads(p.stdout) if p.returncode == 0 else {}
    if not info.get("streams"):
        raise BadInput(f"{path}: not a video ffprobe can read ({last_line(p.stderr)})")
    s = info["streams"][0]
    return s["width"], s["height"], info.get("format", {}).get("tags", {}).get("description")


def read_frames(path):
    """uint8 [F, H, W, 3] and the recorded prompt (None when the video records none)."""
    if not os.path.exists(path):
        raise BadInput(f"{path}: no such file or folder")
    if os.path.isdir(path):
        from PIL import Image
        names = sorted(n for n in os.listdir(path) if n.endswith(".png"))
        if not names:
            raise BadInput(f"{path}: a folder without PNG frames")
        try:
            frames = np.stack([np.asarray(Image.open(os.path.join(path, n)).convert("RGB")) for n in names])
        except (OSError, ValueError) as e:
            raise BadInput(f"{path}: PNG frames that cannot be read as one clip ({e})")
        return frames, None
    width, height, description = probe(path)
    # -xerror: a cut or damaged stream is an error, not a shorter clip.
    p = subprocess.run(["ffmpeg", "-v", "error", "-xerror", "-i", path, "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
                       capture_output=True)
    raw, frame_bytes = p.stdout, height * width * 3
    if p.returncode != 0 or p.stderr.strip() or not raw or len(raw) % frame_bytes:
        raise BadInput(f"{path}: the video does not decode whole ({last_line(p.stderr.decode(errors='replace'))})")
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
        raise BadInput(f"{path}: records no prompt; give --prompt")
    try:
        world.parse_prompt(text)
    except ValueError as e:
        raise BadInput(f"{path}: {e}: not a prompt of the demo world")
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


def read_results(results):
    """The last line per job id of a results.jsonl: (output path, prompt, extra) of each job recorded ok."""
    folder = os.path.dirname(os.path.abspath(results))
    last = {}
    try:
        with open(results) as f:
            for n, raw in enumerate(f, 1):
                if not (raw.endswith("\n") and raw.strip()):
                    continue  # a line being written, or a blank one
                try:
                    r = json.loads(raw)
                    last[r["id"]] = r
                except (ValueError, KeyError, TypeError) as e:
                    raise BadInput(f"{results}:{n}: not a results line of dlo-generate ({e})")
    except OSError as e:
        raise BadInput(f"{results}: {e.strerror}")
    jobs = []
    for r in last.values():
        if r.get("status") != "ok":
            continue
        if not isinstance(r.get("output"), str) or not isinstance(r.get("parameters", {}), dict):
            raise BadInput(f"{results}: job {r['id']!r}: no output or parameters recorded")
        out = r["output"] if os.path.isabs(r["output"]) else os.path.join(folder, r["output"])
        p = r.get("parameters", {})
        jobs.append((out, p.get("prompt"), {"id": r["id"], "parameters": p}))
    return jobs


def parse_max_misses(text):
    """{property: misses allowed} from "colour=0,direction=1"."""
    limits = {}
    for item in filter(None, text.split(",")):
        key, _, limit = item.partition("=")
        if key not in PROPERTIES:
            raise BadInput(f"--max-misses: unknown property {key!r} ({', '.join(PROPERTIES)})")
        if not limit.isdigit():
            raise BadInput(f"--max-misses: {key}={limit!r}: need a whole number of videos")
        limits[key] = int(limit)
    return limits


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
    limits = parse_max_misses(args.max_misses)
    if args.json and (os.path.isdir(args.json) or not os.path.isdir(os.path.dirname(os.path.abspath(args.json)))):
        raise BadInput(f"--json {args.json}: not a file in an existing folder")
    verdicts = [check_video(v, args.prompt) for v in args.video]
    for results in args.results:
        verdicts += [check_video(*job) for job in read_results(results)]
    if not verdicts:
        ap.error("nothing to check: give VIDEO or --results")
    t = tally(verdicts)
    if not args.quiet:
        for v in verdicts:
            print(line(v))
    print("tally: " + ", ".join(f"{p} {t[p]['right']}/{t['videos']}" for p in PROPERTIES) +
          f"; all three {t['all_three']}/{t['videos']}")
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump({"tally": t, "videos": verdicts}, f, indent=1)
        except OSError as e:
            raise BadInput(f"--json {args.json}: {e.strerror}")
    failed = [f"{key}: {t[key]['wrong']} of {t['videos']} wrong, at most {limit} allowed"
              for key, limit in limits.items() if t[key]["wrong"] > limit]
    for f in failed:
        print("FAIL: " + f)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BadInput as e:
        print(f"check_demo_video.py: {e}", file=sys.stderr)
        sys.exit(2)
