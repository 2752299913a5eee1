#!/usr/bin/env python3
"""Makes the input images of tests/media/test_image.cpp and what Pillow 13.0 and diffusers 0.42.1
make of them (run with the project's venv; the files are committed, a few KB):

  src.png                 a 37x23 RGB image of smooth gradients and hard edges (the source)
  src.webp                the same, lossless WebP
  src_rgba.png            the same with an alpha channel (Pillow's convert("RGB") drops it)
  orient{1..8}.jpg        a smooth 48x32 picture (gradients, soft discs: photo-like, so that chroma
                          subsampling is not the whole content) as JPEG (quality 95) with EXIF
                          Orientation 1..8
  orient{1..8}.ppm        ImageOps.exif_transpose(Image.open(jpg)).convert("RGB"): the upright image
  orient{3,6}.png/.webp   src as PNG (eXIf chunk) and lossless WebP (EXIF chunk) with Orientation 3, 6;
  orient{3,6}_lossless.ppm  their upright images (the same for both)
  stretch_WxH.ppm         VaeImageProcessor.resize(src, H, W) (resize_mode "default": Lanczos)
  crop_WxH.ppm            VaeImageProcessor.resize(src, H, W, resize_mode="crop")
  lanczos_WxH.ppm         src.resize((W, H), Image.LANCZOS)

  .venv/bin/python tests/media/images/make_images.py
"""
import os

import numpy as np
from PIL import Image, ImageOps

from diffusers.image_processor import VaeImageProcessor

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = [(16, 24), (48, 16), (37, 23), (64, 40), (9, 31)]  # (W, H): down, up, same, both, odd


def ppm(path, img):
    a = np.asarray(img.convert("RGB"), dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(f"P6\n{a.shape[1]} {a.shape[0]}\n255\n".encode() + a.tobytes())


def main():
    y, x = np.mgrid[0:23, 0:37]
    a = np.stack([x * 255 // 36, y * 255 // 22, ((x // 5 + y // 4) % 2) * 200 + 30], axis=-1).astype(np.uint8)
    a[5:9, 10:20] = (250, 20, 120)
    src = Image.fromarray(a, "RGB")
    src.save(os.path.join(HERE, "src.png"))
    src.save(os.path.join(HERE, "src.webp"), lossless=True)
    rgba = src.copy()
    rgba.putalpha(Image.fromarray((x * 7 % 256).astype(np.uint8), "L"))
    rgba.save(os.path.join(HERE, "src_rgba.png"))
    py, px = np.mgrid[0:32, 0:48].astype(np.float64)
    soft = lambda cx, cy, r: np.clip(1.5 - np.hypot(px - cx, py - cy) / r, 0, 1)
    photo = np.stack([40 + 150 * px / 47 + 60 * soft(14, 12, 8), 60 + 120 * py / 31 + 50 * soft(34, 20, 10),
                      90 + 40 * np.sin(px / 7) + 70 * soft(24, 16, 6)], axis=-1)
    photo = Image.fromarray(np.clip(photo, 0, 255).astype(np.uint8), "RGB")
    for o in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = o
        p = os.path.join(HERE, f"orient{o}.jpg")
        photo.save(p, quality=95, exif=exif)
        ppm(os.path.join(HERE, f"orient{o}.ppm"), ImageOps.exif_transpose(Image.open(p)))
    for o in (3, 6):
        exif = Image.Exif()
        exif[0x0112] = o
        src.save(os.path.join(HERE, f"orient{o}.png"), exif=exif)
        src.save(os.path.join(HERE, f"orient{o}.webp"), lossless=True, exif=exif)
        up = ImageOps.exif_transpose(Image.open(os.path.join(HERE, f"orient{o}.png")))
        assert (np.asarray(up) == np.asarray(ImageOps.exif_transpose(Image.open(os.path.join(HERE, f"orient{o}.webp"))))).all()
        ppm(os.path.join(HERE, f"orient{o}_lossless.ppm"), up)
    proc = VaeImageProcessor()
    for w, h in SIZES:
        ppm(os.path.join(HERE, f"stretch_{w}x{h}.ppm"), proc.resize(src, h, w))
        ppm(os.path.join(HERE, f"crop_{w}x{h}.ppm"), proc.resize(src, h, w, resize_mode="crop"))
        ppm(os.path.join(HERE, f"lanczos_{w}x{h}.ppm"), src.resize((w, h), Image.LANCZOS))


if __name__ == "__main__":
    main()
