#!/usr/bin/env python3
"""Train the demo model: a tiny Wan2.1 text-to-video model of the world in tools/demo_world.py.

Through the classes dlo loads (diffusers' AutoencoderKLWan and WanTransformer3DModel, transformers'
UMT5EncoderModel, a SentencePiece T5 tokenizer, the UniPC scheduler config):
  1. the base: tokenizer, text encoder (random, frozen) and scheduler from `dlo-checkpoint make`;
  2. the VAE, trained as an autoencoder on clips of the world (object pixels weighted up);
  3. latents of fresh clips encoded by it, their per-channel mean and std written into its config;
  4. the transformer, trained by flow matching on those latents, conditioned on the text encoder's
     output of the clip's prompt (one of four phrasings), the prompt dropped to "" for 12% of
     samples so classifier-free guidance works; an exponential moving average is what is saved;
  5. the folder in the diffusers layout, weights in bf16, with dlo_defaults.json (the size,
     frames, steps and guidance the model was made for) and training.json (losses, times);
  6. a check: WanPipeline renders the 60 prompts from the saved folder, tools/check_demo_video.py's
     judge reads colour, shape and direction back, and the script prints the accuracy.
The VAE is Wan2.1's with one level fewer (--vae-factor 4: 4x in space, 4x in time, 4 latent
channels; Wan2.1's is 8x with 16 channels, the same numbers per frame): at 8x an 11-pixel object
fills one or two latent pixels and its shape hid in how their channels varied with where it sat
in them (a linear probe read it in 54% of frames, the VAE's own reconstructions got it right in
68%); at 4x it spans two or three, drawn in space (80% and 93%). The transformer's tokens each
hold a 2x2 patch of latent pixels across all five latent frames (patch_size [5, 2, 2]: 80 numbers;
width 160, 64 tokens): with Wan's one frame per token ([1, 2, 2]) a model this small drew each
latent frame from that frame's own noise, so objects jumped between frames and the direction was
at chance (research/demo-model/diary.md); a token that holds its whole trajectory draws it
in one piece, and attention only has to agree between neighbouring tokens. 2x2 rather than 4x4
patches (16 tokens of 320 numbers at width 320): a little slower per step (5.7-6.0 against 6.7
steps/s), a quarter of the weights, and a lower loss (0.29 against 0.45). The VAE decodes its
latents through noise (--vae-latent-noise) so that every colour lies well away from the background
and from the others in the latent space the transformer samples in. The transformer has 8 layers
(--layers): with 4 it learnt colour and direction but drew the shape in 40% of videos, with 8 in
57% (lower loss at every step, 3.1 against 5.6 steps/s); 10 layers at width 128 drew it in 45%, and
half the steps at twice the rate in 48% (50% on three times the clips, 50% from DiT's zero start,
--init zero).
Fixed seed; 83 minutes on 2 cores (VAE 13 min, latents 3, transformer 67). The same files come
back on the same machine; on another CPU the floats differ, and with them the VAE (on an AMD EPYC
of 2026-12-05 its colours lay nearer the background) and the time (about 100 minutes there, estimated):
research/demo-model/diary.md, "A recipe within the hour, and on another CPU". CPU only; Python is for
making the model, never at run time. The shipped model is:
  .venv/bin/python tools/train_demo_model.py --out configs/demo-model --no-check
"""
import argparse
import copy
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_world as world  # noqa: E402

HEIGHT, WIDTH, FRAMES, FPS = 64, 64, 17, 16
DEFAULTS = {"height": HEIGHT, "width": WIDTH, "frames": FRAMES, "steps": 20, "guidance": 4.0, "fps": FPS}
MAX_TOKENS = 512  # WanPipeline's max_sequence_length
TEXT_DIM = 32  # the tiny text encoder's d_model (make_base), the transformer's text_dim
DROP_PROMPT = 0.12


def log(msg):
    tqdm.write(f"[{time.strftime('%H:%M:%S')}] {msg}")


def clips(rng, n, frames, twins=False):
    """n random clips of the world: float [n, 3, frames, H, W] in [-1, 1], weights, prompt parts.

    With twins (n a multiple of 3), n // 3 scenes each drawn in all three shapes, in world.SHAPES
    order: same colour, direction, size, start and travel (render_clip's draws do not depend on
    the shape, so each twin starts from the same generator state)."""
    xs, ws, parts = [], [], []
    while len(parts) < n:
        c = rng.choice(list(world.COLOURS))
        s = rng.choice(world.SHAPES)
        d = rng.choice(list(world.DIRECTIONS))
        state = rng.bit_generator.state
        for s in world.SHAPES if twins else (s,):
            rng.bit_generator.state = state
            video, _ = world.render_clip(c, s, d, frames, HEIGHT, WIDTH, rng)
            xs.append(torch.from_numpy(video).permute(3, 0, 1, 2).float() / 127.5 - 1.0)
            ws.append(object_weights(video))
            parts.append((c, s, d))
    return torch.stack(xs), torch.stack(ws), parts


def object_weights(video):
    """The reconstruction loss's weights [1, F, H, W] for uint8 frames [F, H, W, 3]: object pixels
    (and a pixel around them) weigh 25x more. The object is ~3% of the frame, and at equal weight
    the autoencoder first learns to draw the background alone."""
    m = torch.from_numpy(world.object_mask(video, threshold=20.0)).float()[None, None]
    return 1.0 + 24.0 * torch.nn.functional.max_pool3d(m, (1, 3, 3), 1, (0, 1, 1))[0]


def make_base(args, base):
    if os.path.exists(os.path.join(base, "model_index.json")):
        return
    subprocess.run([args.dlo_checkpoint, "make", base, "--preset", "wan-test", "--layers", "1", "--dim", "32",
                    "--heads", "2", "--text-dim", str(TEXT_DIM), "--dtype", "bf16"], check=True, stdout=subprocess.DEVNULL)


def whole_word_tokenizer(base):
    """Gives the world's words (its colours, shapes and directions) a piece each in the tokenizer.

    The tiny tokenizer of `dlo-checkpoint make` learnt its 512 pieces from a few KB of prose, so it
    cut "square" into five pieces ('▁', 's', 'qu', 'ar', 'e'), "triangle" into four and "circle"
    into three, sharing them with other words ('le' of "triangle" and "left"). Then the shape word
    shifts every token after it, and the text a shape differs by is mostly the direction moved
    along. Real UMT5's vocabulary holds each of these words whole. Here each missing word takes the
    place of one of the lowest-scored pieces that are neither a single character nor a word start
    (so every text still tokenises), scored above every other piece so that it is always chosen."""
    from sentencepiece import sentencepiece_model_pb2
    path = os.path.join(base, "tokenizer", "spiece.model")
    model = sentencepiece_model_pb2.ModelProto()
    with open(path, "rb") as f:
        model.ParseFromString(f.read())
    have = {p.piece for p in model.pieces}
    words = ["\u2581" + w for w in (*world.COLOURS, *world.SHAPES, *world.DIRECTIONS) if "\u2581" + w not in have]
    if not words:
        return
    top = max(p.score for p in model.pieces if p.type == 1)
    spare = sorted((i for i, p in enumerate(model.pieces)
                    if p.type == 1 and len(p.piece) > 1 and not p.piece.startswith("\u2581")),
                   key=lambda i: (model.pieces[i].score, i))[:len(words)]
    for i, w in zip(sorted(spare), words):
        model.pieces[i].piece, model.pieces[i].score = w, top + 0.5
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


@torch.no_grad()
def per_frame_init(vae):
    """Start the causal VAE as a per-frame autoencoder: every causal 3D convolution sees only the
    current frame (the taps on past frames zero), the encoder's temporal downsampling keeps a frame
    and the decoder's upsampling repeats it. The first phase trains on single frames, where the
    past taps see only padding and would get no gradient: left random, they would inject noise
    into every frame after the first once clips arrive. From here the clip phase starts at a video
    that holds each frame for four, and learns the motion in between."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d
    for m in vae.modules():
        if isinstance(m, WanCausalConv3d) and m.weight.shape[2] > 1:
            m.weight[:, :, :-1] = 0  # the last tap is the newest frame
    for m in vae.modules():
        conv = getattr(m, "time_conv", None)
        if conv is None:
            continue
        out_c, in_c = conv.weight.shape[:2]
        conv.weight.zero_()
        conv.bias.zero_()
        for o in range(out_c):
            conv.weight[o, o % in_c, -1, 0, 0] = 1.0


def train_vae(args, work):
    from diffusers import AutoencoderKLWan
    path = os.path.join(work, "vae")
    if os.path.exists(os.path.join(path, "config.json")):
        return AutoencoderKLWan.from_pretrained(path), json.load(open(os.path.join(work, "vae_losses.json")))
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    # Wan2.1's VAE downsamples 8x in space (three levels, time 4x in the last two); --vae-factor 4
    # takes one level off (time 4x in both): an 11-pixel object then spans 2-3 latent pixels, not
    # 1-2, and its shape is drawn in space rather than coded in how one pixel's channels vary.
    levels = {8: ([1, 2, 4, 4], [False, True, True]), 4: ([1, 2, 4], [True, True])}[args.vae_factor]
    vae = AutoencoderKLWan(base_dim=16, z_dim=args.z_dim, dim_mult=levels[0], num_res_blocks=1, attn_scales=[],
                           temperal_downsample=levels[1], dropout=0.0, scale_factor_spatial=args.vae_factor,
                           scale_factor_temporal=4)
    per_frame_init(vae)
    params = list(vae.parameters())
    # Linear read-outs of the shape and the colour from each latent pixel the object covers: they
    # make the encoder write the shape into every such pixel's channels, as a colour is, rather
    # than only into the 3x3 pattern of the pixels around the object, and keep the colours apart.
    heads = {}
    for what, weight, names in (("shape", args.vae_shape_code, world.SHAPES),
                                ("colour", args.vae_colour_code, list(world.COLOURS))):
        if weight > 0:
            heads[what] = (torch.nn.Linear(args.z_dim, len(names)), weight, names)
            params += list(heads[what][0].parameters())
    opt = torch.optim.AdamW(params, lr=1.0, weight_decay=0.0)
    # Two phases. First single frames, 8 at a time (a ninth of the cost of a clip: the
    # convolutions learn to draw the shapes and colours), then 9-frame clips (one latent frame for
    # the first frame, two of four): the causal VAE's chunked path learns the motion, at half the
    # cost of 17 frames. Peak rate after a warm-up, cosine down to a tenth at the end of each.
    images, total = args.vae_image_steps, args.vae_image_steps + args.vae_steps

    def rate(step):
        # The clip phase starts from a good per-frame model: a fifth of the rate keeps it (at the
        # first phase's rate the new temporal taps wreck the frames before they learn the motion).
        # (max: the scheduler asks for the rate one step past the end, where a clip phase of 0 steps
        # would divide by zero.)
        start, n, peak = (0, images, 2e-3) if step < images else (images, max(args.vae_steps, 1), 2e-4)
        s = step - start
        return peak * min(1.0, (s + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / n)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, rate)
    losses, codes, t0 = [], [], time.time()
    bar = tqdm(range(total), desc="vae", dynamic_ncols=True)
    for step in bar:
        single = step < images
        if step == images:
            vae.save_pretrained(os.path.join(work, "vae-frames"))  # the per-frame model, for inspection
        x, w, parts = clips(rng, 2 * args.vae_batch if single else args.vae_batch, 1 if single else 9)
        # A deterministic autoencoder (the posterior's mean) decoded through noise of a fixed
        # share of each channel's spread: sampling with the initial unit variance drowns the
        # latents, and the decoder then learns the mean frame. The noise is what keeps the colours
        # apart in the latent space the transformer samples in (per-channel normalised, as here):
        # at 0.05 of the global spread the encoder put red, blue and yellow on one line at
        # different lengths and green next to the background (colour_geometry), so the
        # transformer had to hit a latent's length to get a colour right, and green vanished.
        # The penalty keeps the latents' scale bounded.
        mu = vae.encode(x).latent_dist.mode()
        spread = mu.detach().std(dim=(0, 2, 3, 4), keepdim=True)
        z = mu
        if args.vae_blur > 0:
            # A share of the frames is decoded from spatially blurred latents: the 3x3 pattern at the
            # object is then gone, and only what every latent pixel of the object says (as a colour
            # is said) can give the decoder the shape. Tried at 1.0 with 4 layers: the pixels then
            # carry the shape in 70% of blurred reconstructions, but the transformer draws it in
            # 41% of videos, as without (research/demo-model/diary.md, 2026-12-06 (later)).
            blurred = (torch.rand(mu.shape[0]) < args.vae_blur_share).view(-1, 1, 1, 1, 1)
            z = torch.where(blurred, blur_latents(mu, args.vae_blur), mu)
        y = vae.decode(z + args.vae_latent_noise * spread * torch.randn_like(mu)).sample
        rec = (w * (y - x) ** 2).mean()
        kl = (mu ** 2).mean()
        loss = rec + 1e-4 * kl
        code = torch.zeros(())
        for what, (head, weight, names) in heads.items():
            labels = torch.tensor([names.index(p[1] if what == "shape" else p[0]) for p in parts])
            c = code_loss(head, x, mu, spread, args.vae_code_noise, labels)
            loss = loss + weight * c
            code = code + c.detach()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(rec.item())
        codes.append(code.item())
        bar.set_postfix(rec=f"{np.mean(losses[-20:]):.4f}", z2=f"{kl.item():.2f}",
                        **({"code": f"{np.mean(codes[-20:]):.3f}"} if heads else {}))
        if step % 200 == 0 or step == total - 1:
            log(f"vae step {step} ({'frames' if single else 'clips'}): weighted reconstruction mse "
                f"{np.mean(losses[-20:]):.5f}" + (f", code read-outs {np.mean(codes[-20:]):.4f}" if heads else ""))
    vae.save_pretrained(path)
    info = {"frame_steps": images, "frame_batch": 2 * args.vae_batch, "clip_steps": args.vae_steps,
            "clip_batch": args.vae_batch, "clip_frames": 9, "latent_noise": args.vae_latent_noise, "seconds": round(time.time() - t0, 1),
            "final_weighted_mse": round(float(np.mean(losses[-50:])), 5)}
    if args.vae_blur > 0:
        info.update(blur=args.vae_blur, blur_share=args.vae_blur_share)
    if heads:
        info.update(shape_code=args.vae_shape_code, colour_code=args.vae_colour_code, code_noise=args.vae_code_noise,
                    final_code_cross_entropy=round(float(np.mean(codes[-20:])), 4))
    json.dump(info, open(os.path.join(work, "vae_losses.json"), "w"))
    return vae, info


def blur_latents(z, sigma):
    """z [B, C, T, h, w] blurred over each latent frame's pixels by a Gaussian of `sigma` latent
    pixels (edges replicated: the border is background)."""
    r = max(1, math.ceil(2 * sigma))
    t = torch.arange(-r, r + 1, dtype=z.dtype)
    k = torch.exp(-t ** 2 / (2 * sigma ** 2))
    k = k / k.sum()
    y = torch.nn.functional.pad(z.flatten(0, 2)[:, None], (r, r, r, r), mode="replicate")
    y = torch.nn.functional.conv2d(torch.nn.functional.conv2d(y, k.view(1, 1, 1, -1)), k.view(1, 1, -1, 1))
    return y[:, 0].view_as(z)


def object_coverage(x, latent_shape):
    """The share of each latent pixel's frames and pixels that the object covers: x [B, 3, F, H, W]
    in [-1, 1], latent_shape (T, h, w) of the causal VAE (frame 0 alone, then groups of frames)."""
    bg = torch.tensor(world.BACKGROUND, dtype=x.dtype).view(1, 3, 1, 1, 1) / 127.5 - 1.0
    m = ((x - bg).norm(dim=1, keepdim=True) * 127.5 > 60.0).float()
    t, h, w = latent_shape
    first = torch.nn.functional.adaptive_avg_pool3d(m[:, :, :1], (1, h, w))
    if t == 1:
        return first[:, 0]
    rest = torch.nn.functional.adaptive_avg_pool3d(m[:, :, 1:], (t - 1, h, w))
    return torch.cat([first, rest], dim=2)[:, 0]


def code_loss(head, x, mu, spread, noise, labels):
    """Cross-entropy of the clips' labels [B] (shape or colour) read from each latent pixel the object
    covers at least a third of, through noise of `noise` x each channel's spread (so the code
    must stand well clear of it)."""
    cover = object_coverage(x, mu.shape[2:])  # [B, T, h, w]
    z = mu + noise * spread * torch.randn_like(mu)
    logits = head(z.permute(0, 2, 3, 4, 1))  # [B, T, h, w, shapes]
    labels = labels.view(-1, 1, 1, 1).expand_as(cover)
    keep = cover >= 1 / 3
    return torch.nn.functional.cross_entropy(logits[keep], labels[keep])


@torch.no_grad()
def check_vae(vae, seed, n=60, blur=0.0):
    """The judge on VAE reconstructions of n fresh 17-frame clips: what the decoder can show at best
    (with `blur` > 0, decoded from latents blurred as training blurred them: what every latent
    pixel of the object says on its own)."""
    rng = np.random.default_rng(seed)
    tally = {"colour_ok": 0, "shape_ok": 0, "direction_ok": 0}
    for i in range(n):
        c, s, d = list(world.COLOURS)[i % 5], world.SHAPES[i % 3], list(world.DIRECTIONS)[i % 4]
        video, _ = world.render_clip(c, s, d, FRAMES, HEIGHT, WIDTH, rng)
        x = torch.from_numpy(video).permute(3, 0, 1, 2).float()[None] / 127.5 - 1.0
        z = vae.encode(x).latent_dist.mode()
        y = vae.decode(blur_latents(z, blur) if blur > 0 else z).sample[0].clamp(-1, 1)
        frames = ((y.permute(1, 2, 3, 0) + 1) * 127.5).round().to(torch.uint8).numpy()
        r = world.judge(frames, world.prompt(c, s, d))
        for k in tally:
            tally[k] += r[k]
    return {k.replace("_ok", ""): round(v / n, 3) for k, v in tally.items()}


def background_latent(z):
    """The background's latent [C, T] of normalised latents z [N, C, T, H, W]: the median over
    clips, then over latent pixels (the object covers a few of 64)."""
    return z.median(dim=0).values.flatten(2).median(dim=-1).values


@torch.no_grad()
def colour_geometry(data):
    """How far apart the VAE's latent space puts the five colours, in the per-channel normalised
    units the transformer samples in: each colour's mean latent at its object (the latent pixel
    farthest from the background in each latent frame after the first) less the background's, its
    distance from the background and the closest pair of colours. A colour near the background or
    near another is one a small error in the sampled latent loses."""
    z = (data["z"] - data["mean"].view(1, -1, 1, 1, 1)) / data["std"].view(1, -1, 1, 1, 1)
    diff = (z - background_latent(z)[None, :, :, None, None]).flatten(3)  # [N, C, T, H*W]
    at = diff.norm(dim=1).argmax(dim=-1)  # [N, T]: the object's latent pixel per frame
    picked = diff.gather(3, at[:, None, :, None].expand(-1, diff.shape[1], -1, 1))[..., 0]  # [N, C, T]
    proto = {}
    for c in world.COLOURS:
        rows = [i for i, p in enumerate(data["parts"]) if p[0] == c]
        proto[c] = picked[rows][:, :, 1:].mean(dim=(0, 2))
    pairs = [(float((proto[a] - proto[b]).norm()), a, b) for i, a in enumerate(proto) for b in list(proto)[i + 1:]]
    d, a, b = min(pairs)
    return {"from_background": {c: round(float(v.norm()), 2) for c, v in proto.items()},
            "closest_pair": [a, b, round(d, 2)]}


def shape_probe(data, seed=0):
    """How plainly the latents say the object's shape: a linear classifier of the shape from the
    normalised latents less the background in the 3x3 latent pixels around the object (its
    farthest latent pixel, each latent frame after the first), trained on 80% of the clips and
    scored on the rest; the same for colour. Chance is a third for shape, a fifth for colour."""
    z = (data["z"] - data["mean"].view(1, -1, 1, 1, 1)) / data["std"].view(1, -1, 1, 1, 1)
    diff = z - background_latent(z)[None, :, :, None, None]
    n, c, t, h, w = diff.shape
    at = diff.norm(dim=1)[:, 1:].flatten(2).argmax(dim=-1)  # [N, T-1]
    padded = torch.nn.functional.pad(diff[:, :, 1:], (1, 1, 1, 1))
    feats = torch.stack([padded[i, :, k, y:y + 3, x:x + 3].flatten()
                         for i in range(n) for k in range(t - 1)
                         for y, x in [divmod(int(at[i, k]), w)]])
    labels = {"shape": [world.SHAPES.index(p[1]) for p in data["parts"]],
              "colour": [list(world.COLOURS).index(p[0]) for p in data["parts"]]}
    train = torch.arange(len(feats)) < (n * 4 // 5) * (t - 1)  # whole clips on each side
    x = (feats - feats[train].mean(0)) / (feats[train].std(0) + 1e-6)
    out = {}
    for what, lab in labels.items():
        y = torch.tensor(lab).repeat_interleave(t - 1)
        torch.manual_seed(seed)
        lin = torch.nn.Linear(x.shape[1], int(y.max()) + 1)
        opt = torch.optim.Adam(lin.parameters(), 1e-2, weight_decay=1e-4)
        for _ in range(500):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(lin(x[train]), y[train]).backward()
            opt.step()
        with torch.no_grad():
            out[what] = round(float((lin(x[~train]).argmax(1) == y[~train]).float().mean()), 3)
    return out


@torch.no_grad()
def encode_latents(args, work, vae):
    path = os.path.join(work, "latents.pt")
    if os.path.exists(path):
        return torch.load(path, weights_only=False)  # written by this script
    rng = np.random.default_rng(args.seed + 1)
    zs, parts, t0 = [], [], time.time()
    batch = 6 if args.shape_twins else 8  # twins: two scenes a batch, each in its three shapes
    for _ in tqdm(range(args.clips // batch), desc="encode", dynamic_ncols=True):
        x, _, p = clips(rng, batch, FRAMES, twins=args.shape_twins)
        zs.append(vae.encode(x).latent_dist.mode())
        parts += p
    z = torch.cat(zs)
    mean = z.mean(dim=(0, 2, 3, 4))
    std = z.std(dim=(0, 2, 3, 4))
    data = {"z": z, "parts": parts, "mean": mean, "std": std, "seconds": round(time.time() - t0, 1),
            "twins": bool(args.shape_twins)}
    torch.save(data, path)
    return data


@torch.no_grad()
def text_embeddings(base, texts, dtype):
    """WanPipeline's prompt embeddings: [n, 512, text_dim], zero past each prompt's tokens, and the
    number of tokens of each."""
    from transformers import AutoTokenizer, UMT5EncoderModel
    tok = AutoTokenizer.from_pretrained(os.path.join(base, "tokenizer"))
    enc = UMT5EncoderModel.from_pretrained(os.path.join(base, "text_encoder"), dtype=dtype).eval()
    out, lengths = [], []
    for t in texts:
        ids = tok([t], padding="max_length", max_length=MAX_TOKENS, truncation=True, add_special_tokens=True,
                  return_attention_mask=True, return_tensors="pt")
        h = enc(ids.input_ids, ids.attention_mask).last_hidden_state.float()
        n = int(ids.attention_mask.sum())
        h[:, n:] = 0
        out.append(h[0])
        lengths.append(n)
    return torch.stack(out), torch.tensor(lengths)


class CompactTextAttention:
    """Cross-attention over a prompt's tokens and one share of its padding, exactly as over all 512.

    WanPipeline pads every prompt's embeddings to 512 tokens with zeros, and a zero token gives every
    padding position the same key and value; softmax over k equal keys is one such key with its logit
    raised by log(k). Training on the prompt's tokens plus a few padding slots, each slot's logit
    raised by log(padding / slots), computes the same attention (max difference 1e-5 on outputs of
    ~7, measured): training steps ran 1.8x faster (4.7 vs 2.6 per second, 2 cores).
    `bias` [B, 1, 1, slots] is set before every forward."""

    def __init__(self):
        self.bias = None

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        k = attn.norm_k(attn.to_k(encoder_hidden_states)).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        v = attn.to_v(encoder_hidden_states).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.bias.to(q.dtype))
        return attn.to_out[1](attn.to_out[0](out.transpose(1, 2).flatten(2, 3).type_as(q)))


def compact_text(emb, lengths):
    """emb [..., n_texts, 512, D] cut to the longest prompt plus one padding slot, and the logit
    bias of each slot: 0 on a prompt's tokens, log(padding / slots) on its padding."""
    slots = int(lengths.max()) + 1
    pos = torch.arange(slots)[None, :]
    n = lengths[:, None].float()
    bias = torch.where(pos < n, torch.zeros(()), torch.log((MAX_TOKENS - n) / (slots - n)))
    return emb[..., :slots, :].contiguous(), bias


def use_compact_text(model):
    proc = CompactTextAttention()
    for block in model.blocks:
        block.attn2.set_processor(proc)
    return proc


def shifted_sigmas(steps=20, shift=3.0):
    """The sampler's grid: steps + 1 sigmas from 1 to 0, shifted as the flow-matching schedulers do."""
    s = torch.linspace(1.0, 0.0, steps + 1)
    return shift * s / (1 + (shift - 1) * s)


@torch.no_grad()
def euler(model, proc, x, cond, bias, sig, start=0, guidance=4.0):
    """Normalised latents x [n, ...] sampled by Euler steps from sig[start] to sig[-1] with
    classifier-free guidance: cond and bias (for `proc`) hold the n prompts' rows, then n rows of
    the empty prompt."""
    n = x.shape[0]
    for i in range(start, len(sig) - 1):
        proc.bias = bias
        v = model(torch.cat([x, x]), torch.full((2 * n,), float(sig[i]) * 1000.0), cond, return_dict=False)[0]
        x = x + (sig[i + 1] - sig[i]) * (v[n:] + guidance * (v[:n] - v[n:]))
    return x


@torch.no_grad()
def sample_check(model, vae, data, ctx, bias, prompts, steps=20, guidance=4.0, shift=3.0, seed=0):
    """The judge on videos the model samples (Euler flow matching, shifted sigmas, guidance, one
    batch) for `prompts` (rows of ctx and bias; row 0 the empty prompt): a cheap view, during
    training, of what tools/check_demo_video.py will say of the rendered videos."""
    proc = use_compact_text(model)
    rows = [p[0] for p in prompts]
    n = len(rows)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((n,) + tuple(data["z"].shape[1:]), generator=g)
    x = euler(model, proc, x, torch.cat([ctx[rows], ctx[[0] * n]]),
              torch.cat([bias[rows], bias[[0] * n]])[:, None, None, :], shifted_sigmas(steps, shift), guidance=guidance)
    z = x * data["std"].view(1, -1, 1, 1, 1) + data["mean"].view(1, -1, 1, 1, 1)
    tally = {"colour_ok": 0, "shape_ok": 0, "direction_ok": 0}
    for j in range(n):
        y = vae.decode(z[j:j + 1]).sample[0].clamp(-1, 1)
        frames = ((y.permute(1, 2, 3, 0) + 1) * 127.5).round().to(torch.uint8).numpy()
        r = world.judge(frames, prompts[j][1])
        for k in tally:
            tally[k] += r[k]
    return {k.replace("_ok", ""): round(v / n, 3) for k, v in tally.items()}


def world_texts():
    """What the transformer is conditioned on: the empty prompt (dropout), then every prompt of the
    world in every template."""
    return [""] + [world.prompt(c, s, d, k) for c in world.COLOURS for s in world.SHAPES
                   for d in world.DIRECTIONS for k in range(len(world.TEMPLATES))]


def demo_transformer(args, channels):
    """A fresh transformer of the recipe's shape (--layers, --dim, --head-dim, --ffn, --patch-t,
    --patch) on `channels` latent channels, conditioned on the tiny text encoder's TEXT_DIM."""
    from diffusers import WanTransformer3DModel
    return WanTransformer3DModel(patch_size=(args.patch_t, args.patch, args.patch), num_attention_heads=args.dim // args.head_dim,
                                 attention_head_dim=args.head_dim, in_channels=channels, out_channels=channels, text_dim=TEXT_DIM,
                                 freq_dim=256, ffn_dim=args.ffn, num_layers=args.layers, cross_attn_norm=True,
                                 qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)


def zero_init(model):
    """DiT's adaLN-Zero start (Peebles & Xie 2023) in Wan's blocks, gates only: every block begins
    as the identity and the model's output at zero. The gates of the self-attention and the
    feed-forward (chunks 2 and 5 of each block's scale_shift_table and of the shared time_proj's
    output), the cross-attention's output projection (Wan adds it ungated) and proj_out are set to
    zero; the rest keeps diffusers' initialisation. The class, its config and its forward are
    unchanged. Measured in research/demo-model/diary.md ("DiT's zero start"): 3% lower loss, same shape."""
    dim = model.config.num_attention_heads * model.config.attention_head_dim
    with torch.no_grad():
        proj = model.condition_embedder.time_proj
        for k in (2, 5):
            proj.weight[k * dim:(k + 1) * dim].zero_()
            proj.bias[k * dim:(k + 1) * dim].zero_()
        for block in model.blocks:
            block.scale_shift_table[:, (2, 5)] = 0.0
            block.attn2.to_out[0].weight.zero_()
            block.attn2.to_out[0].bias.zero_()
        model.proj_out.weight.zero_()
        model.proj_out.bias.zero_()


def train_transformer(args, work, base, data, vae):
    from diffusers import WanTransformer3DModel
    path = os.path.join(work, "transformer")
    done = os.path.exists(os.path.join(path, "config.json"))
    if done and not args.dit_more:
        return WanTransformer3DModel.from_pretrained(path), json.load(open(os.path.join(work, "dit_losses.json")))
    torch.manual_seed(args.seed + 2)
    rng = np.random.default_rng(args.seed + 2)
    texts = world_texts()
    index = {t: i for i, t in enumerate(texts)}
    # dlo runs the text encoder in bf16 by default, WanPipeline in the weights' dtype: train on both.
    (emb32, lengths), (emb16, _) = (text_embeddings(base, texts, dt) for dt in (torch.float32, torch.bfloat16))
    emb, bias = compact_text(torch.stack([emb32, emb16]), lengths)
    watch = [(index[p], p) for p in world.all_prompts()[::3]]  # 20 prompts, every colour, shape, direction
    z = (data["z"] - data["mean"].view(1, -1, 1, 1, 1)) / data["std"].view(1, -1, 1, 1, 1)
    parts = data["parts"]
    # --balance-colours: each clip's loss divided by its latents' energy about the background (as a
    # share of the median clip's, within 1/4..4). Unweighted, a green object, the faintest in this
    # VAE's latent space, costs a quarter of a red one when it is left out, and the model leaves it out.
    energy = ((z - background_latent(z)[None, :, :, None, None]) ** 2).sum(dim=(1, 2, 3, 4))
    clip_weight = (energy.median() / energy).clamp(0.25, 4.0) if args.balance_colours else torch.ones(len(z))
    # --object-weight K: the latent pixels at the object (and one around them) weigh 1 + K in each
    # clip's loss, which is then divided by the clip's total weight. The object is ~5% of the
    # latent pixels, and its shape a small part of its error: unweighted, the model gets colour and
    # place right long before it draws a corner.
    pixel_weight = None
    if args.object_weight > 0:
        near = (z - background_latent(z)[None, :, :, None, None]).norm(dim=1) > 2.0  # [N, T, H, W]
        near = torch.nn.functional.max_pool2d(near.float().flatten(0, 1)[:, None], 3, 1, 1).view(near.shape)
        pixel_weight = 1.0 + args.object_weight * near[:, None]  # [N, 1, T, H, W]
    model = demo_transformer(args, data["z"].shape[1])
    if args.init == "zero":
        zero_init(model)
    if args.cross_attn_gain != 1.0:
        # WanPipeline pads every prompt to 512 tokens with zeros, so ~500 equal padding keys face the
        # prompt's ~13 and, with q and k RMS-normalised (logits about N(0, 1) at init), the prompt
        # starts with a few percent of each head's attention (the shipped model, trained: a tenth or
        # less in most heads from sigma 0.6 down; probe 13). Scaling the cross-attention's q and k
        # norms' weights scales every logit: the prompt's tokens can then outbid the padding's
        # log(500) head start. Tried at 4 with 4 layers: the trained model ends with similar shares
        # and the same shape, 40% (research/demo-model/diary.md, 2026-12-06 (later)).
        with torch.no_grad():
            for block in model.blocks:
                block.attn2.norm_q.weight.mul_(math.sqrt(args.cross_attn_gain))
                block.attn2.norm_k.weight.mul_(math.sqrt(args.cross_attn_gain))
    before = {}
    if done:  # --dit-more: go on from the saved (averaged) weights for another --dit-steps
        model = WanTransformer3DModel.from_pretrained(path)
        before = json.load(open(os.path.join(work, "dit_losses.json")))
    proc = use_compact_text(model)
    ema = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=args.dit_lr, weight_decay=0.01)
    warm = 200
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / args.dit_steps))))
    losses, watched, t0 = [], list(before.get("watched", [])), time.time()
    twins, twin_losses = args.shape_twins, []  # twin_losses: the --twin-loss term, for the log
    if twins and not data.get("twins"):
        raise SystemExit(f"--shape-twins: {work}/latents.pt was written without it; remove it to encode twins")
    bar = tqdm(range(args.dit_steps), desc="transformer", dynamic_ncols=True)
    for step in bar:
        if twins:  # pairs: one scene in two of its shapes, with one template, dropout, sigma and noise
            scene, first = rng.integers(0, len(z) // 3, args.dit_batch // 2), rng.integers(0, 3, args.dit_batch // 2)
            pick = np.stack([3 * scene + first, 3 * scene + (first + rng.integers(1, 3, len(first))) % 3], 1).reshape(-1)
            ids = []
            for a, b in pick.reshape(-1, 2):
                drop, k = rng.random() < DROP_PROMPT, rng.integers(0, 4)
                ids += [0 if drop else index[world.prompt(*parts[i], k)] for i in (a, b)]
        else:
            pick = rng.integers(0, len(z), args.dit_batch)
            ids = []
            for i in pick:
                c, s, d = parts[i]
                ids.append(0 if rng.random() < DROP_PROMPT else index[world.prompt(c, s, d, rng.integers(0, 4))])
        x0 = z[pick]
        ctx = emb[rng.integers(0, 2), ids]
        proc.bias = bias[ids][:, None, None, :]
        # sigma: half uniform, half shifted towards noise as Wan's flow shift does at sampling.
        def draw_sigmas(*shape):
            u = torch.rand(shape)
            drawn = torch.where(torch.rand(shape) < 0.5, u, 3.0 * u / (1 + 2.0 * u))
            if args.high_sigma > 0:  # where the sampler decides where the object is (and its shape)
                lo, hi = args.high_sigma_range
                drawn = torch.where(torch.rand(shape) < args.high_sigma, lo + (hi - lo) * torch.rand(shape), drawn)
            return drawn.clamp(1e-3, 1.0)

        if twins:
            sigma = draw_sigmas(args.dit_batch // 2).repeat_interleave(2)
            noise = torch.randn_like(x0[::2]).repeat_interleave(2, dim=0)
        else:
            sigma = draw_sigmas(args.dit_batch)
            noise = torch.randn_like(x0)
        frames = x0.shape[2]
        if args.frame_sigmas > 0:
            # Some samples with a sigma of each latent frame's own (per-token timesteps, as
            # diffusers' Wan takes for Wan2.2 TI2V): with every frame at one sigma a frame's own
            # noisy latent says as much about its object as its neighbours do, and the model never
            # learns to place an object from the frames around it (measured: with 4 of 5 latent
            # frames held to a real clip, the last frame's object landed ~31 px off, at random).
            own = torch.rand(args.dit_batch) < args.frame_sigmas
            if args.frame_sigma_mode == "context":  # each frame either nearly clean or nearly noise
                ctx_frame = torch.rand(args.dit_batch, frames) < 0.5
                drawn = torch.where(ctx_frame, 0.3 * torch.rand(args.dit_batch, frames),
                                    0.7 + 0.3 * torch.rand(args.dit_batch, frames))
            else:
                drawn = draw_sigmas(args.dit_batch, frames)
            per_frame = torch.where(own[:, None], drawn, sigma[:, None].expand(-1, frames))
            s5 = per_frame.view(-1, 1, frames, 1, 1)
            tokens = x0.shape[3] * x0.shape[4] // (model.config.patch_size[1] * model.config.patch_size[2])
            t = (per_frame * 1000.0).repeat_interleave(tokens, dim=1)
        else:
            s5 = sigma.view(-1, 1, 1, 1, 1)
            t = sigma * 1000.0
        xt = (1 - s5) * x0 + s5 * noise
        pred = model(xt, t, ctx, return_dict=False)[0]
        w = clip_weight[torch.from_numpy(pick)]
        err = (pred - (noise - x0)) ** 2
        if pixel_weight is None:
            per_clip = err.mean(dim=(1, 2, 3, 4))
        else:
            pw = pixel_weight[torch.from_numpy(pick)]
            per_clip = (pw * err).sum(dim=(1, 2, 3, 4)) / (pw.sum(dim=(1, 2, 3, 4)) * err.shape[1])
        loss = (w * per_clip).sum() / w.sum()
        if args.twin_loss > 0:
            # How much of the twins' difference (target a - target b = x0 b - x0 a) the two
            # predictions miss, as a share of it, over the pairs that both had their prompt.
            both = torch.tensor([ids[i] != 0 for i in range(0, len(ids), 2)])
            if both.any():
                dt = (x0[1::2] - x0[0::2])[both]
                dp = (pred[0::2] - pred[1::2])[both]
                twin_term = ((dp - dt) ** 2).sum() / (dt ** 2).sum()
                twin_losses.append(float(twin_term))
                loss = loss + args.twin_loss * twin_term
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for k, v in model.state_dict().items():
                ema[k].mul_(decay).add_(v.detach(), alpha=1 - decay)
        losses.append(float(loss))
        bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
        if step % 250 == 0 or step == args.dit_steps - 1:
            log(f"transformer step {step}: flow-matching mse {np.mean(losses[-50:]):.5f}" +
                (f", twins' difference missed {np.mean(twin_losses[-50:]):.4f}" if twin_losses else ""))
        if args.watch_every and ((step + 1) % args.watch_every == 0 or step == args.dit_steps - 1):
            probe = copy.deepcopy(model)
            probe.load_state_dict(ema)
            acc = sample_check(probe, vae, data, emb[0], bias, watch, seed=step)
            watched.append({"step": step + 1 + before.get("steps", 0), **acc})
            log(f"transformer step {step + 1}: the judge on 20 sampled videos (EMA weights, Euler): {acc}")
    model.load_state_dict(ema)
    for block in model.blocks:
        block.attn2.set_processor(block.attn2._default_processor_cls())
    model.save_pretrained(path)
    info = {"steps": args.dit_steps + before.get("steps", 0), "batch": args.dit_batch,
            "seconds": round(time.time() - t0 + before.get("seconds", 0), 1), "rounds": before.get("rounds", 1) + bool(done),
            "final_mse": round(float(np.mean(losses[-200:])), 5), "prompt_dropout": DROP_PROMPT,
            "ema": args.ema, "clips": len(z), "lr": args.dit_lr, "watched": watched,
            # the gain shapes a fresh model only: a --dit-more round keeps the first round's
            "cross_attn_gain": before.get("cross_attn_gain", 1.0) if done else args.cross_attn_gain,
            "init": before.get("init", "wan") if done else args.init,
            "colour_balance": before.get("colour_balance", []) + [args.balance_colours],
            "object_weight": before.get("object_weight", [0.0] * before.get("rounds", 0)) + [args.object_weight],
            "shape_twins": before.get("shape_twins", [False] * before.get("rounds", 0)) + [bool(twins)],
            "twin_loss": before.get("twin_loss", [0.0] * before.get("rounds", 0)) + [args.twin_loss]}
    if twin_losses:
        info["final_twin_missed"] = round(float(np.mean(twin_losses[-200:])), 5)
    json.dump(info, open(os.path.join(work, "dit_losses.json"), "w"))
    return model, info


def save_folder(args, base, vae, model, data, info):
    out = args.out
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    for part in ("tokenizer", "text_encoder"):
        shutil.copytree(os.path.join(base, part), os.path.join(out, part))
    shutil.copy(os.path.join(base, "model_index.json"), out)
    os.makedirs(os.path.join(out, "scheduler"))
    sched = json.load(open(os.path.join(base, "scheduler", "scheduler_config.json")))
    sched["flow_shift"] = args.flow_shift
    json.dump(sched, open(os.path.join(out, "scheduler", "scheduler_config.json"), "w"), indent=2)
    vae.register_to_config(latents_mean=[round(float(v), 4) for v in data["mean"]],
                           latents_std=[round(float(v), 4) for v in data["std"]])
    vae.to(torch.bfloat16).save_pretrained(os.path.join(out, "vae"))
    model.to(torch.bfloat16).save_pretrained(os.path.join(out, "transformer"))
    for part in ("vae", "transformer"):  # a stage loaded from --work names its folder there: drop it
        cfg_path = os.path.join(out, part, "config.json")
        cfg = json.load(open(cfg_path))
        if cfg.pop("_name_or_path", None) is not None:
            with open(cfg_path, "w") as f:
                f.write(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    vae.float()
    model.float()
    defaults = {"about": "The demo model, trained by tools/train_demo_model.py on the world of tools/demo_world.py: "
                         "prompts 'a {colour} {shape} moving {direction}' with colour red, green, blue, yellow or "
                         "white; shape circle, square or triangle; direction left, right, up or down.",
                "defaults": DEFAULTS}
    json.dump(defaults, open(os.path.join(out, "dlo_defaults.json"), "w"), indent=2)
    json.dump(info, open(os.path.join(out, "training.json"), "w"), indent=2)


def check(args):
    """WanPipeline renders every prompt from the saved folder; the judge reads them back."""
    from diffusers import WanPipeline
    pipe = WanPipeline.from_pretrained(args.out, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    tally = {"colour_ok": 0, "shape_ok": 0, "direction_ok": 0}
    prompts = world.all_prompts()
    for i, p in enumerate(tqdm(prompts, desc="check", dynamic_ncols=True)):
        video = pipe(prompt=p, negative_prompt="", height=HEIGHT, width=WIDTH, num_frames=FRAMES,
                     num_inference_steps=DEFAULTS["steps"], guidance_scale=DEFAULTS["guidance"],
                     generator=torch.Generator().manual_seed(i), output_type="np").frames[0]
        r = world.judge(np.rint(video * 255).astype(np.uint8), p)
        for k in tally:
            tally[k] += r[k]
    acc = {k.replace("_ok", ""): round(v / len(prompts), 3) for k, v in tally.items()}
    log(f"WanPipeline on {len(prompts)} prompts at {DEFAULTS['steps']} steps, guidance {DEFAULTS['guidance']}: {acc}")
    return acc


def parser():
    """The recipe's flags and defaults (research/demo-model/bench_train_step.py builds its model from them too)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the model folder to write (replaced)")
    ap.add_argument("--work", default="out/train-demo", help="stages kept here; a rerun resumes after the last")
    ap.add_argument("--dlo-checkpoint", default="build/bin/dlo-checkpoint")
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--vae-image-steps", type=int, default=2200, help="VAE steps on single frames")
    # At this budget the clip phase costs more than it gives: 400 steps cut the judge's colour
    # accuracy on reconstructions (the past-frame taps learn slowly); the per-frame model holds
    # each latent frame's picture for four frames, and colour, shape and direction survive.
    ap.add_argument("--vae-steps", type=int, default=0, help="VAE steps on 9-frame clips, after those")
    ap.add_argument("--vae-factor", type=int, default=4, choices=(4, 8), help="the VAE's spatial downsampling (Wan2.1's: 8)")
    ap.add_argument("--z-dim", type=int, default=4, help="latent channels, the transformer's in and out channels (Wan2.1's: 16)")
    ap.add_argument("--vae-batch", type=int, default=4)
    ap.add_argument("--vae-shape-code", type=float, default=0.0,
                    help="weight of a loss that makes every latent pixel the object covers say its shape")
    ap.add_argument("--vae-colour-code", type=float, default=0.0,
                    help="weight of a loss that makes every latent pixel the object covers say its colour")
    ap.add_argument("--vae-code-noise", type=float, default=1.0,
                    help="noise (x each channel's spread) the read-outs see the latents through")
    ap.add_argument("--vae-latent-noise", type=float, default=0.3,
                    help="noise added to the latents before decoding, as a share of each channel's spread")
    ap.add_argument("--vae-blur", type=float, default=0.0,
                    help="decode a share of the VAE's training frames from latents blurred by a Gaussian of this many latent pixels")
    ap.add_argument("--vae-blur-share", type=float, default=0.5, help="the share of frames --vae-blur blurs")
    ap.add_argument("--clips", type=int, default=2400)
    ap.add_argument("--dit-steps", type=int, default=12000)
    ap.add_argument("--dit-more", action="store_true", help="train the saved transformer for --dit-steps more")
    ap.add_argument("--dit-batch", type=int, default=32)
    ap.add_argument("--dit-lr", type=float, default=5e-4)
    ap.add_argument("--frame-sigmas", type=float, default=0.0,
                    help="share of transformer samples whose latent frames each get a sigma of their own")
    ap.add_argument("--frame-sigma-mode", choices=("mixed", "context"), default="mixed",
                    help="frames' own sigmas: drawn as the shared one is, or each nearly clean (< 0.3) or nearly noise (> 0.7)")
    ap.add_argument("--head-dim", type=int, default=40, help="attention head dimension (divides --dim)")
    ap.add_argument("--dim", type=int, default=160,
                    help="the transformer's width (at least a token's numbers: 5 x 2 x 2 x 4 = 80 at the defaults)")
    ap.add_argument("--layers", type=int, default=8, help="the transformer's blocks")
    ap.add_argument("--ffn", type=int, default=480, help="the transformer's feed-forward width")
    ap.add_argument("--patch-t", type=int, default=5,
                    help="latent frames per token: 5 puts all 5 latent frames of a 17-frame clip in one token, "
                         "1 (Wan's) one frame per token (see the module's docstring)")
    ap.add_argument("--high-sigma", type=float, default=0.0,
                    help="share of training samples with sigma drawn uniformly from --high-sigma-range")
    ap.add_argument("--high-sigma-range", type=lambda v: tuple(float(x) for x in v.split(",")), default=(0.85, 1.0),
                    metavar="LO,HI", help="where sampling places the object (0.85..1) and decides its shape (1..0.6)")
    ap.add_argument("--travel", help="LO,HI: the world's travel range (demo_world.TRAVEL) for the clips drawn here")
    ap.add_argument("--patch", type=int, default=2, choices=(1, 2, 4),
                    help="the transformer's spatial patch in latent pixels (Wan's is 2)")
    ap.add_argument("--balance-colours", action="store_true",
                    help="weigh each clip's transformer loss by the inverse of its latents' energy (see train_transformer)")
    ap.add_argument("--object-weight", type=float, default=0.0,
                    help="extra weight of the latent pixels at the object in the transformer's loss (see train_transformer)")
    ap.add_argument("--shape-twins", action="store_true",
                    help="clips as scenes drawn in all three shapes; each training batch pairs two shapes of a scene")
    ap.add_argument("--twin-loss", type=float, default=0.0,
                    help="with --shape-twins: weight of the share of the twins' difference their predictions miss")
    ap.add_argument("--cross-attn-gain", type=float, default=1.0,
                    help="scale the cross-attention's initial logits by this (its q and k norms' weights by the root)")
    ap.add_argument("--init", choices=("wan", "zero"), default="wan",
                    help="the transformer's start: diffusers' initialisation, or with its blocks' gates, "
                         "cross-attention outputs and proj_out at zero (zero_init)")
    ap.add_argument("--ema", type=float, default=0.999)
    ap.add_argument("--flow-shift", type=float, default=3.0)
    ap.add_argument("--latent-scale", type=float, default=1.0,
                    help="latents_std = the latents' per-channel std times this (see main)")
    ap.add_argument("--watch-every", type=int, default=500,
                    help="every so many transformer steps, sample 20 prompts with the averaged weights and judge them")
    ap.add_argument("--whole-words", action="store_true",
                    help="give the world's words a tokenizer piece each (whole_word_tokenizer)")
    ap.add_argument("--no-check", action="store_true")
    return ap


def main():
    ap = parser()
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # 3D RoPE splits a head's dimensions over time, height and width (at 24, 4 rotation
    # frequencies per axis; at 80, 13-14), so --head-dim sets how finely offsets are told apart.
    if args.dim % args.head_dim or (args.frame_sigmas and args.patch_t != 1):
        ap.error("--head-dim must divide --dim, and --frame-sigmas needs --patch-t 1")
    if args.shape_twins and (args.frame_sigmas or args.clips % 6 or args.dit_batch % 2):
        ap.error("--shape-twins needs --clips a multiple of 6, an even --dit-batch and no --frame-sigmas")
    if args.twin_loss and not args.shape_twins:
        ap.error("--twin-loss needs --shape-twins")
    if args.travel:
        world.TRAVEL = tuple(float(v) for v in args.travel.split(","))
        world.MIN_TRAVEL = world.TRAVEL[0] / 2  # the judge's threshold follows, as demo_world defines it
    os.makedirs(args.work, exist_ok=True)
    t0 = time.time()
    base = os.path.join(args.work, "base")
    make_base(args, base)
    if args.whole_words:
        whole_word_tokenizer(base)
    vae, vae_info = train_vae(args, args.work)
    if "reconstruction_check" not in vae_info:
        vae_info["reconstruction_check"] = check_vae(vae, args.seed + 3)
        json.dump(vae_info, open(os.path.join(args.work, "vae_losses.json"), "w"))
    log(f"the judge on VAE reconstructions of 60 clips: {vae_info['reconstruction_check']}")
    if args.vae_blur > 0 and "blurred_reconstruction_check" not in vae_info:
        vae_info["blurred_reconstruction_check"] = check_vae(vae, args.seed + 3, blur=args.vae_blur)
        json.dump(vae_info, open(os.path.join(args.work, "vae_losses.json"), "w"))
        log(f"the judge on them decoded from blurred latents: {vae_info['blurred_reconstruction_check']}")
    data = encode_latents(args, args.work, vae)
    # Per-channel statistics are mostly the background's (with the 8x VAE the object was ~6% of latent pixels, at
    # ~3.7 of those std), so normalised latents hold the object far out of unit noise until sigma
    # ~0.95. --latent-scale > 1 divides them further (WanPipeline and dlo read it back from
    # latents_std); 3.0 was tried on 2026-12-02 and sampled no better after 3000 steps.
    data = dict(data, std=data["std"] * args.latent_scale)
    log(f"latents {tuple(data['z'].shape)}: channel std {data['std'].min():.3f}..{data['std'].max():.3f}")
    if "colour_geometry" not in vae_info:
        vae_info["colour_geometry"] = colour_geometry(data)
        json.dump(vae_info, open(os.path.join(args.work, "vae_losses.json"), "w"))
    log(f"colours in the normalised latent space: {vae_info['colour_geometry']}")
    if "linear_probe" not in vae_info:
        vae_info["linear_probe"] = shape_probe(data)
        json.dump(vae_info, open(os.path.join(args.work, "vae_losses.json"), "w"))
    log(f"shape and colour read linearly from the object's latents (held-out clips): {vae_info['linear_probe']}")
    model, dit_info = train_transformer(args, args.work, base, data, vae)
    info = {"vae": vae_info, "encode_seconds": data["seconds"], "transformer": dit_info, "seed": args.seed,
            "threads": args.threads, "torch": torch.__version__}
    save_folder(args, base, vae, model, data, info)
    if not args.no_check:
        info["wanpipeline_check"] = check(args)
    # The stages' own times, so a run that resumed after a stage kept in --work still reports what
    # the whole recipe takes (this invocation's wall time beside it).
    info["total_seconds"] = round(vae_info["seconds"] + data["seconds"] + dit_info["seconds"], 1)
    info["this_run_seconds"] = round(time.time() - t0, 1)
    json.dump(info, open(os.path.join(args.out, "training.json"), "w"), indent=2)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(args.out) for f in fs)
    log(f"wrote {args.out}: {size / 1e6:.1f} MB; {json.dumps(info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
