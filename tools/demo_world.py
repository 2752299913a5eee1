"""The demo model's synthetic world: one object on a plain dark-grey background.

The object is a circle, square or triangle about a sixth of the frame wide, coloured red, green,
blue, yellow or white, moving left, right, up or down across at least a third of the frame over
the clip, whole inside the frame in every frame. tools/train_demo_model.py draws its training clips
from here and tools/check_demo_video.py judges rendered videos against the same definitions, so
the two cannot drift apart. numpy only.
"""
import math
import re

import numpy as np

BACKGROUND = (40, 40, 40)
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 235),
    "yellow": (230, 210, 40),
    "white": (240, 240, 240),
}
SHAPES = ("circle", "square", "triangle")
# How far the object travels over a clip, as a share of the frame along its direction (drawn
# uniformly from this range per clip).
TRAVEL = (0.36, 0.68)
# A video whose object moves less than this (the same share) has no direction: half the shortest
# travel, so a still or a barely moving object never counts as moving any way.
MIN_TRAVEL = TRAVEL[0] / 2
# An object's pixels cover at most ~4% of a frame (SIZE); a "object" over a quarter of it is a
# frame whose background is gone (a black or a flat video), not an object.
MAX_OBJECT_AREA = 0.25
# The object's width, as a share of a sixth of the frame's shorter side (drawn per clip).
SIZE = (0.9, 1.15)
DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}  # (dx, dy), y grows down

# Share of its bounding box an ideal shape fills: square 1, circle pi/4, triangle 1/2.
FILL = {"square": 1.0, "circle": math.pi / 4, "triangle": 0.5}

# The canonical prompt, and paraphrases used in training (the check reads the words back).
TEMPLATES = (
    "a {colour} {shape} moving {direction}",
    "a {colour} {shape} that moves {direction}",
    "the {colour} {shape} slides {direction}",
    "one {colour} {shape} going {direction}",
)


def prompt(colour, shape, direction, template=0):
    return TEMPLATES[template].format(colour=colour, shape=shape, direction=direction)


def all_prompts():
    """The 60 canonical prompts, in a fixed order."""
    return [prompt(c, s, d) for c in COLOURS for s in SHAPES for d in DIRECTIONS]


def parse_prompt(text):
    """(colour, shape, direction) named in a prompt; ValueError if one is missing or ambiguous."""
    words = re.findall(r"[a-z]+", text.lower())
    found = []
    for vocab, what in ((COLOURS, "colour"), (SHAPES, "shape"), (DIRECTIONS, "direction")):
        hits = sorted({w for w in words if w in vocab})
        if len(hits) != 1:
            raise ValueError(f"prompt {text!r} names {len(hits)} {what}s ({', '.join(hits) or 'none'}); need one")
        found.append(hits[0])
    return tuple(found)


def _coverage(shape, cx, cy, size, xs, ys):
    """Boolean mask of sample points (xs, ys) inside the shape centred at (cx, cy), `size` wide."""
    h = size / 2.0
    if shape == "circle":
        return (xs - cx) ** 2 + (ys - cy) ** 2 <= h * h
    if shape == "square":
        return (np.abs(xs - cx) <= h) & (np.abs(ys - cy) <= h)
    # An isosceles triangle pointing up: apex at the top centre, base along the bottom edge.
    t = (ys - (cy - h)) / size  # 0 at the apex row, 1 at the base
    return (t >= 0) & (t <= 1) & (np.abs(xs - cx) <= h * t)


def draw_frame(colour, shape, cx, cy, size, height, width, supersample=4):
    """uint8 [height, width, 3]: the shape centred at (cx, cy), `size` wide, on the background,
    its edge pixels blended by the share of supersample x supersample points inside it."""
    s = supersample
    ys, xs = np.mgrid[0:height * s, 0:width * s].astype(np.float64)
    xs, ys = (xs + 0.5) / s, (ys + 0.5) / s
    fg = np.array(COLOURS[colour], np.float64)
    bg = np.array(BACKGROUND, np.float64)
    cov = _coverage(shape, cx, cy, size, xs, ys).reshape(height, s, width, s).mean(axis=(1, 3))
    return np.rint(bg + (fg - bg) * cov[..., None]).astype(np.uint8)


def render_clip(colour, shape, direction, frames, height, width, rng, supersample=4):
    """uint8 [frames, height, width, 3] and the object's centre per frame ([frames, 2], x and y).

    Size, start and distance are drawn from rng: the object is about a sixth of the frame wide, it
    travels a share of the frame in TRAVEL along its direction, and stays whole in every frame.
    """
    side = min(height, width)
    size = side / 6.0 * rng.uniform(*SIZE)
    dx, dy = DIRECTIONS[direction]
    along = width if dx else height
    across = height if dx else width
    margin = size / 2.0 + 1.0
    travel = along * rng.uniform(*TRAVEL)
    travel = min(travel, along - 2 * margin)
    start = rng.uniform(margin, along - margin - travel)
    if dx < 0 or dy < 0:
        start = along - start  # moving towards 0: start near the far edge
    cross = rng.uniform(margin, across - margin)
    out = np.empty((frames, height, width, 3), np.uint8)
    centres = np.empty((frames, 2))
    for f in range(frames):
        pos = start + (dx + dy) * travel * f / max(frames - 1, 1)
        cx, cy = (pos, cross) if dx else (cross, pos)
        out[f] = draw_frame(colour, shape, cx, cy, size, height, width, supersample)
        centres[f] = (cx, cy)
    return out, centres


def object_mask(frame, threshold=60.0, half_max=False):
    """Pixels of a uint8 [H, W, 3] frame far from the background colour: more than `threshold`
    away, and with half_max also at least half as far as the farthest pixel (the object's edge
    where it covers half a pixel, whatever its colour's contrast and however soft the edge)."""
    d = np.linalg.norm(frame.astype(np.float64) - np.array(BACKGROUND, np.float64), axis=-1)
    m = d > threshold
    if half_max and m.any():
        m &= d >= 0.5 * d.max()
    return m


def nearest_colour(rgb):
    return min(COLOURS, key=lambda c: float(np.sum((np.array(COLOURS[c], np.float64) - rgb) ** 2)))


def judge(frames, text):
    """What a video [F, H, W, 3] uint8 shows, against its prompt.

    Returns a dict: the object's colour (nearest of the five to its mean pixel), direction (the
    larger component of the move from the first frame's centroid to the last's; None when that
    component is under MIN_TRAVEL of the frame, so a still video has no direction), distance moved
    (as a share of the frame), shape (the ideal fill nearest to the mean fill of its bounding
    box), and whether each matches the prompt. Object pixels are those more than 60 from the
    background and at least half the frame's largest distance from it (the half-coverage edge).
    A frame with no object pixels, or with more than MAX_OBJECT_AREA of the frame far from the
    background, counts as no object.
    """
    want_colour, want_shape, want_direction = parse_prompt(text)
    frames = np.asarray(frames)
    n, height, width = frames.shape[:3]
    centroids, fills, pixels = [], [], []
    for f in range(n):
        m = object_mask(frames[f], half_max=True)
        if m.sum() < 4 or m.sum() > MAX_OBJECT_AREA * height * width:
            centroids.append(None)
            continue
        yy, xx = np.nonzero(m)
        centroids.append((xx.mean(), yy.mean()))
        box = (xx.max() - xx.min() + 1) * (yy.max() - yy.min() + 1)
        fills.append(m.sum() / box)
        pixels.append(frames[f][m].astype(np.float64))
    result = {"prompt": text, "want": {"colour": want_colour, "shape": want_shape, "direction": want_direction}}
    if centroids[0] is None or centroids[-1] is None or not pixels:
        result.update(colour=None, shape=None, direction=None, distance=0.0, fill=None,
                      colour_ok=False, shape_ok=False, direction_ok=False, object_frames=len(pixels))
        return result
    mean_rgb = np.concatenate(pixels).mean(axis=0)
    colour = nearest_colour(mean_rgb)
    fill = float(np.median(fills))
    shape = min(FILL, key=lambda s: abs(FILL[s] - fill))
    mx = centroids[-1][0] - centroids[0][0]
    my = centroids[-1][1] - centroids[0][1]
    if abs(mx) >= abs(my):
        direction, distance = ("right" if mx > 0 else "left"), abs(mx) / width
    else:
        direction, distance = ("down" if my > 0 else "up"), abs(my) / height
    if distance < MIN_TRAVEL:
        direction = None
    result.update(colour=colour, shape=shape, direction=direction, distance=round(float(distance), 3),
                  fill=round(fill, 3), mean_rgb=[round(float(v), 1) for v in mean_rgb],
                  colour_ok=colour == want_colour, shape_ok=shape == want_shape,
                  direction_ok=direction == want_direction, object_frames=len(pixels))
    return result
