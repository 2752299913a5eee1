#!/usr/bin/env python3
"""Probes behind diary.md's "why more transformer steps do not fix direction" and the chapters after it.

  1. latents: share of latent pixels that are the object (max |normalised value| > 2), their RMS
     against the background's, after the VAE config's per-channel normalisation (times --scale);
  2. prompts: how far the text encoder's embeddings of "red" vs "blue" and "left" vs "up" lie apart
     (relative L2 per token position);
  3. time: the transformer's flow-matching loss on 128 clips in order and with latent frames
     permuted (0, 3, 1, 4, 2), at several sigmas: the ratio says how much it uses frame order.
  4. context (--context): how much the transformer's output for the last latent frame moves when
     the four frames before it come from other clips, against when that frame itself does, at
     sigma 0.3, 0.6, 0.9 (its use of the frames around it);
  5. held frames (--held 0,2,4): 16 fresh clips sampled (Euler, shift 3, 20 steps, guidance 4,
     2 seeds) with their first K latent frames held to the clip's (replaced at every step by the
     clip's latents noised to that step's sigma); how far the last frame's object lands from the
     clip's, and how often the direction is right. K = 5 (all) gives ~1 px, the probe's floor.
  6. clean context (--clean 4): as 5, but the K held frames are clean at every step (timestep 0 for
     their tokens, diffusers' per-token timesteps): can the model continue a motion it is shown?
  7. pooling (--pool): from 64 clips noised at one sigma for all frames (as sampling has them),
     how often the model's estimate of the clean last frame (x_t - sigma v) has its largest energy
     on the latent pixel where the clip's object is, with the four frames before it from the same
     clip and from other clips: the gap is what the model gets from the frames around a frame
     while all are equally noisy, where sampling decides where the object is. For reference, the
     same from the exact posterior over the latents file's other clips, from all frames and from
     the last frame alone: what knowing the data gives.
  8. words (--words): the flow-matching loss on the latents file's last 96 clips with their own
     prompt against the prompt with one word swapped (the colour, the shape or the direction to
     the next in demo_world's order) or empty, at sigma 0.3-0.9: how much the model uses each word.
  9. from sigma (--from-sigma 0.2,0.5,1): 30 fresh clips (10 of each shape) noised to sigma S and
     sampled from there (Euler, shift 3, the 20-step grid below S, guidance 4), with their own
     prompt and with the shape word swapped; the judge's shape on each: where sampling loses the
     shape (own prompt) and from where the prompt's shape wins over the clip's (swapped).
 10. one-step fill (--x0-fill 0.5,0.7,0.85): the same 30 clips noised to sigma S; the model's
     estimate of the clean clip (x_t - sigma v, guidance 1 and 4) with each of the three shape
     words in the prompt, decoded, and the judge's median fill of the object's bounding box per
     word (drawn ideally: square 1, circle 0.785, triangle 0.5): whether the shape word moves
     what the model predicts, where sampling decides the shape.
 11. decoder margin (--decode-noise 0.1,0.3,0.5): the same 30 clips' latents with Gaussian noise
     of L in the normalised units the transformer samples in (L x each channel's std) added,
     decoded and judged: how precisely a latent must be drawn for the decoder to show its colour
     and shape. No transformer is used.
 12. one-pixel code (--pixel-code): a linear classifier of the shape from the one latent pixel
     farthest from the background (each latent frame after the first, less the background),
     trained on the latents file's first 80% of clips and scored on the rest; then the 60
     prompts sampled (Euler, shift 3, 20 steps, guidance 4, seed 0) and the classifier's majority
     over each sample's frames against the prompt's shape: whether the shape is written into the
     object's pixels as a colour is (train_demo_model.py --vae-shape-code), and whether the
     transformer writes it.
 13. text attention (--text-attention): the share of each cross-attention head's attention that
     goes to the prompt's tokens rather than to WanPipeline's zero padding (to 512 tokens), on 48
     clips with their own prompts noised to sigma 0.9, 0.6 and 0.3: how loudly each layer hears
     the prompt (train_demo_model.py --cross-attn-gain).
 14. window code (--window-code 4): probe 12 with the pattern, not one pixel: a linear classifier of
     the shape from the 5x5 latent pixels around the object's farthest pixel in every latent frame
     (less the background), trained on the latents file's first 80% of clips and scored on the
     rest; then the 60 prompts sampled with N seeds (as probe 12) and, for each sample, the
     classifier's verdict against the prompt's shape beside the judge's on the decoded video (the
     model folder's VAE), and the median fill of the object's box per asked shape in the samples
     and in 90 real clips decoded: whether the transformer writes a shape the decoder then does
     not draw.
 15. fresh gap (--fresh-gap 192): the flow-matching loss on the latents file's first N clips (the
     transformer was trained on them) against N fresh clips of the same prompts (demo_world, seed
     777, encoded by the model folder's VAE), with the same noise, at sigma 0.2-0.95: how much the
     model has learnt its training clips rather than the world.
Reads a latents file written by tools/train_demo_model.py (out/train-demo/latents.pt) and a model
folder (the transformer, VAE config and text encoder it uses). CPU, 2 threads, about a minute
(probe 5: a minute per K).
  .venv/bin/python research/demo-model/probe_demo_model.py --model configs/demo-model --latents out/train-demo/latents.pt --context --held 0,2,4
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))  # the recipe
import demo_world as world  # noqa: E402
import train_demo_model as train  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="configs/demo-model")
    ap.add_argument("--transformer", help="a transformer folder (default: the model's)")
    ap.add_argument("--latents", default="out/train-demo/latents.pt")
    ap.add_argument("--scale", type=float, default=1.0, help="the --latent-scale the transformer was trained with")
    ap.add_argument("--context", action="store_true", help="also probe 4")
    ap.add_argument("--held", help="also probe 5 with these numbers of held frames, e.g. 0,2,4")
    ap.add_argument("--clean", help="also probe 6 with these numbers of clean held frames, e.g. 4")
    ap.add_argument("--pool", action="store_true", help="also probe 7")
    ap.add_argument("--words", action="store_true", help="also probe 8")
    ap.add_argument("--from-sigma", help="also probe 9 from these sigmas, e.g. 0.2,0.5,1")
    ap.add_argument("--x0-fill", help="also probe 10 at these sigmas, e.g. 0.5,0.7,0.85")
    ap.add_argument("--decode-noise", help="also probe 11 at these noise levels, e.g. 0.1,0.3,0.5")
    ap.add_argument("--pixel-code", action="store_true", help="also probe 12")
    ap.add_argument("--text-attention", action="store_true", help="also probe 13")
    ap.add_argument("--window-code", type=int, metavar="SEEDS", help="also probe 14 with this many seeds per prompt")
    ap.add_argument("--fresh-gap", type=int, metavar="N", help="also probe 15 on N training and N fresh clips")
    args = ap.parse_args()
    torch.set_num_threads(2)
    from diffusers import WanTransformer3DModel

    d = torch.load(args.latents, weights_only=False)  # written by train_demo_model.py
    std = d["std"].view(1, -1, 1, 1, 1) * args.scale
    z = (d["z"] - d["mean"].view(1, -1, 1, 1, 1)) / std
    tok = z.permute(0, 2, 3, 4, 1).reshape(-1, z.shape[1])
    obj = tok.abs().amax(1) > 2 / args.scale
    print(f"1. latents: object share {obj.float().mean():.3f}, object RMS {tok[obj].pow(2).mean().sqrt():.2f}, "
          f"background RMS {tok[~obj].pow(2).mean().sqrt():.2f}, max |value| {tok.abs().max():.1f}")

    pairs = [("a red circle moving left", "a blue circle moving left"), ("a red circle moving left", "a red circle moving up")]
    texts = sorted({t for p in pairs for t in p})
    emb, lens = train.text_embeddings(args.model, texts, torch.float32)
    for a, b in pairs:
        ea, eb = emb[texts.index(a)], emb[texts.index(b)]
        n = int(min(lens[texts.index(a)], lens[texts.index(b)]))
        rel = ((ea[:n] - eb[:n]).norm(dim=-1) / ea[:n].norm(dim=-1)).max().item()
        print(f"2. prompts: {a!r} vs {b!r}: largest per-token relative difference {rel:.2f}")

    model = WanTransformer3DModel.from_pretrained(args.transformer or os.path.join(args.model, "transformer"))
    model = model.float().eval()
    parts = d["parts"][:128]
    emb, lens = train.text_embeddings(args.model, [world.prompt(*p) for p in parts], torch.float32)
    ctx, bias = train.compact_text(emb, lens)
    proc = train.use_compact_text(model)
    proc.bias = bias[:, None, None, :]
    x0 = z[:128]
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    perm = torch.tensor([0, 3, 1, 4, 2])
    with torch.no_grad():
        for s in (0.95, 0.9, 0.8, 0.6, 0.4):
            loss = []
            for xx in (x0, x0[:, :, perm]):
                v = model((1 - s) * xx + s * noise, torch.full((128,), s * 1000.0), ctx, return_dict=False)[0]
                loss.append(((v - (noise - xx)) ** 2).mean().item())
            print(f"3. time: sigma {s}: loss in order {loss[0]:.4f}, frames permuted {loss[1]:.4f} "
                  f"(+{100 * (loss[1] / loss[0] - 1):.1f}%)")
    if args.context:
        probe_context(model, proc, z, ctx, bias, noise)
    if args.held:
        probe_held(args, model, proc, [int(k) for k in args.held.split(",")])
    if args.clean:
        probe_held(args, model, proc, [int(k) for k in args.clean.split(",")], clean=True)
    if args.pool:
        probe_pool(model, proc, z, d["parts"], args.model)
    if args.words:
        probe_words(model, proc, z, d["parts"], args.model)
    if args.from_sigma:
        probe_from_sigma(args, model, proc, [float(v) for v in args.from_sigma.split(",")])
    if args.x0_fill:
        probe_x0_fill(args, model, proc, [float(v) for v in args.x0_fill.split(",")])
    if args.decode_noise:
        probe_decode_noise(args, [float(v) for v in args.decode_noise.split(",")])
    if args.pixel_code:
        probe_pixel_code(model, proc, z, d["parts"], args.model)
    if args.text_attention:
        probe_text_attention(model, z, d["parts"], args.model)
    if args.window_code:
        probe_window_code(model, proc, z, d["parts"], args.model, args.window_code, d["mean"].view(1, -1, 1, 1, 1), std)
    if args.fresh_gap:
        probe_fresh_gap(args, model, proc, d, args.fresh_gap)
    return 0


class PromptShare(train.CompactTextAttention):
    """The compact cross-attention, also keeping each head's mean attention on the prompt's tokens
    (`words` [B, 1, 1, slots]: 1 on them, 0 on the padding slot)."""

    def __init__(self, words):
        super().__init__()
        self.words, self.shares = words, []

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        k = attn.norm_k(attn.to_k(encoder_hidden_states)).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        p = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + self.bias).softmax(-1)  # [B, heads, tokens, slots]
        self.shares.append((p * self.words).sum(-1).mean(dim=(0, 2)))
        return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)


@torch.no_grad()
def probe_text_attention(model, z, parts, folder, n=48):
    emb, lens = train.text_embeddings(folder, [world.prompt(*p) for p in parts[:n]], torch.float32)
    ctx, bias = train.compact_text(emb, lens)
    words = (torch.arange(ctx.shape[1])[None, :] < lens[:, None]).float()[:, None, None, :]
    procs = []
    for block in model.blocks:
        procs.append(PromptShare(words))
        procs[-1].bias = bias[:, None, None, :]
        block.attn2.set_processor(procs[-1])
    g = torch.Generator().manual_seed(0)
    for s in (0.9, 0.6, 0.3):
        for pr in procs:
            pr.shares.clear()
        model((1 - s) * z[:n] + s * torch.randn(z[:n].shape, generator=g), torch.full((n,), s * 1000.0), ctx,
              return_dict=False)
        rows = "; ".join(f"{pr.shares[0].mean():.2f} ({pr.shares[0].min():.2f}-{pr.shares[0].max():.2f})" for pr in procs)
        print(f"13. text attention: sigma {s}: the prompt's share per layer, mean over heads (range): {rows}")


def object_pixel(z, background):
    """[N, T-1, C]: each clip's latent pixel farthest from the background in each latent frame after
    the first, less the background."""
    diff = (z - background[None, :, :, None, None])[:, :, 1:].flatten(3)  # [N, C, T-1, H*W]
    at = diff.norm(dim=1).argmax(dim=-1)  # [N, T-1]
    return diff.gather(3, at[:, None, :, None].expand(-1, diff.shape[1], -1, 1))[..., 0].transpose(1, 2)


def probe_pixel_code(model, proc, z, parts, folder):
    background = train.background_latent(z)
    feats = object_pixel(z, background)
    n, t, c = feats.shape
    labels = torch.tensor([world.SHAPES.index(p[1]) for p in parts])
    split = n * 4 // 5
    x, y = feats[:split].reshape(-1, c), labels[:split].repeat_interleave(t)
    torch.manual_seed(0)
    lin = torch.nn.Linear(c, len(world.SHAPES))
    opt = torch.optim.Adam(lin.parameters(), 1e-2)
    for _ in range(1000):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(lin(x), y).backward()
        opt.step()
    with torch.no_grad():
        held = (lin(feats[split:].reshape(-1, c)).argmax(1) == labels[split:].repeat_interleave(t)).float().mean()
        print(f"12. one-pixel code: the shape read from the object's farthest latent pixel in {held:.1%} of "
              f"held-out frames (chance 33%)")
        xt, prompts = sample_prompts(model, proc, folder, tuple(z.shape[1:]))
        m = len(prompts)
        said = lin(object_pixel(xt, background).reshape(-1, c)).argmax(1).view(m, -1).mode(dim=1).values
    want = torch.tensor([world.SHAPES.index(world.parse_prompt(p)[1]) for p in prompts])
    rows = ", ".join(f"{s} as {'/'.join(str(int((said[want == k] == j).sum())) for j in range(len(world.SHAPES)))}"
                     for k, s in enumerate(world.SHAPES))
    print(f"12. one-pixel code in the transformer's samples of the 60 prompts: the asked shape in "
          f"{(said == want).float().mean():.1%} ({rows}, counted as {'/'.join(world.SHAPES)})")


@torch.no_grad()
def sample_prompts(model, proc, folder, latent, seeds=1, steps=20, shift=3.0, guidance=4.0, batch=60):
    """The 60 prompts sampled `seeds` times (Euler, shifted sigmas, guidance; the noise of all
    samples drawn at once from seed 0, prompt by prompt within each seed): normalised latents
    [60 * seeds, *latent] and the prompt of each."""
    prompts = world.all_prompts() * seeds
    emb, lens = train.text_embeddings(folder, [""] + world.all_prompts(), torch.float32)
    ctx, bias = train.compact_text(emb, lens)
    rows = [1 + i % 60 for i in range(len(prompts))]
    xt = torch.randn((len(prompts),) + latent, generator=torch.Generator().manual_seed(0))
    sig = train.shifted_sigmas(steps, shift)
    out = []
    for a in range(0, len(prompts), batch):
        r = rows[a:a + batch]
        out.append(train.euler(model, proc, xt[a:a + batch], torch.cat([ctx[r], ctx[[0] * len(r)]]),
                               torch.cat([bias[r], bias[[0] * len(r)]])[:, None, None, :], sig, guidance=guidance))
    return torch.cat(out), prompts


def object_window(z, background, r=2):
    """[N, C * T * (2r+1)^2]: in every latent frame, the (2r+1)^2 latent pixels around the one
    farthest from the background (zero past the frame's edge), less the background."""
    diff = z - background[None, :, :, None, None]
    n, c, t, h, w = diff.shape
    at = diff.norm(dim=1).flatten(2).argmax(dim=-1)  # [N, T]
    padded = torch.nn.functional.pad(diff, (r, r, r, r))
    out = torch.empty(n, c, t, 2 * r + 1, 2 * r + 1)
    for i in range(n):
        for f in range(t):
            y, x = divmod(int(at[i, f]), w)
            out[i, :, f] = padded[i, :, f, y:y + 2 * r + 1, x:x + 2 * r + 1]
    return out.flatten(1)


def probe_window_code(model, proc, z, parts, folder, seeds, d_mean, d_std):
    from diffusers import AutoencoderKLWan

    background = train.background_latent(z)
    feats = object_window(z, background)
    labels = torch.tensor([world.SHAPES.index(p[1]) for p in parts])
    split = len(parts) * 4 // 5
    mu, sd = feats[:split].mean(0), feats[:split].std(0) + 1e-6
    torch.manual_seed(0)
    lin = torch.nn.Linear(feats.shape[1], len(world.SHAPES))
    opt = torch.optim.Adam(lin.parameters(), 1e-2)
    for _ in range(1000):
        opt.zero_grad()
        (torch.nn.functional.cross_entropy(lin((feats[:split] - mu) / sd), labels[:split])
         + 1e-3 * lin.weight.pow(2).sum()).backward()
        opt.step()
    with torch.no_grad():
        held = (lin((feats[split:] - mu) / sd).argmax(1) == labels[split:]).float().mean()
        print(f"14. window code: the shape read from the 5x5 latent pixels around the object in {held:.1%} of "
              f"held-out clips (chance 33%)")
        xt, prompts = sample_prompts(model, proc, folder, tuple(z.shape[1:]), seeds=seeds)
        said = lin((object_window(xt, background) - mu) / sd).argmax(1)
        vae = AutoencoderKLWan.from_pretrained(os.path.join(folder, "vae")).float().eval()
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
        verdicts = [world.judge(decoded(vae, xt[i:i + 1], mean, std), p) for i, p in enumerate(prompts)]
        # The decoder on the real clips' own latents, for comparison: the last 90 held-out clips.
        real = [world.judge(decoded(vae, z[i:i + 1], d_mean, d_std), world.prompt(*parts[i]))
                for i in range(len(parts) - 90, len(parts))]
    want = torch.tensor([world.SHAPES.index(world.parse_prompt(p)[1]) for p in prompts])
    drawn = torch.tensor([world.SHAPES.index(v["shape"]) if v["shape"] else -1 for v in verdicts])

    def fills(vs):
        by = {s: [v["fill"] for v in vs if v["want"]["shape"] == s and v["fill"] is not None] for s in world.SHAPES}
        return ", ".join(f"{s} {statistics.median(f):.3f} (10th percentile {statistics.quantiles(f, n=10)[0]:.3f})"
                         for s, f in by.items())

    def rows(got):
        return ", ".join(f"{s} as {'/'.join(str(int((got[want == k] == j).sum())) for j in range(len(world.SHAPES)))}"
                         for k, s in enumerate(world.SHAPES))
    print(f"14. window code in the transformer's {len(prompts)} samples: the classifier reads the asked shape in "
          f"{(said == want).float().mean():.1%} ({rows(said)}); the judge sees it in the decoded videos in "
          f"{(drawn == want).float().mean():.1%} ({rows(drawn)}); counted as {'/'.join(world.SHAPES)}")
    both = ((said == want) & (drawn != want)).sum()
    print(f"14. window code: {int(both)} samples written in the asked shape (classifier) but drawn in another (judge)")
    print(f"14. window code: median fill of the object's box by asked shape (the judge's boundaries: square/circle "
          f"0.893, circle/triangle 0.643): samples {fills(verdicts)}; 90 real clips decoded {fills(real)}")


def fresh_latents(args, vae, parts, seed):
    """Clips of `parts` drawn by demo_world and encoded, normalised as the transformer sees them."""
    import numpy as np
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1) * args.scale
    rng = np.random.default_rng(seed)
    x0, ends = [], []
    for p in parts:
        video, centres = world.render_clip(*p, train.FRAMES, train.HEIGHT, train.WIDTH, rng)
        x = torch.from_numpy(video).permute(3, 0, 1, 2).float()[None] / 127.5 - 1.0
        x0.append((vae.encode(x).latent_dist.mode() - mean) / std)
        ends.append(centres[-1])
    return torch.cat(x0), ends, mean, std


@torch.no_grad()
def probe_fresh_gap(args, model, proc, d, n, batch=64):
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(os.path.join(args.model, "vae")).float().eval()
    parts = d["parts"][:n]
    fresh, _, mean, std = fresh_latents(args, vae, parts, seed=777)
    seen = (d["z"][:n] - mean) / std  # normalised as the fresh ones: by the VAE config, as dlo does
    emb, lens = train.text_embeddings(args.model, [world.prompt(*p) for p in parts], torch.float32)
    ctx, bias = train.compact_text(emb, lens)
    g = torch.Generator().manual_seed(0)
    for s in (0.2, 0.4, 0.6, 0.8, 0.95):
        noise = torch.randn(seen.shape, generator=g)
        loss = []
        for x0 in (seen, fresh):
            total = 0.0
            for i in range(0, n, batch):
                rows = slice(i, i + batch)
                proc.bias = bias[rows][:, None, None, :]
                v = model((1 - s) * x0[rows] + s * noise[rows], torch.full((len(x0[rows]),), s * 1000.0), ctx[rows],
                          return_dict=False)[0]
                total += ((v - (noise[rows] - x0[rows])) ** 2).sum().item()
            loss.append(total / noise.numel())
        print(f"15. fresh gap: sigma {s}: loss on {n} training clips {loss[0]:.4f}, on {n} fresh clips of "
              f"their prompts {loss[1]:.4f} ({100 * (loss[1] / loss[0] - 1):+.1f}%)")


def decoded(vae, x, mean, std):
    """One normalised latent [1, C, T, H, W] as uint8 frames [T, H, W, 3]."""
    y = vae.decode(x * std + mean).sample[0].clamp(-1, 1)
    return ((y.permute(1, 2, 3, 0) + 1) * 127.5).round().to(torch.uint8).numpy()


def shape_clips(args, n=30):
    """Probes 9 and 10's clips: n fresh ones, every colour, shape and direction in turn, encoded;
    with the VAE, the normalisation and the noise (seed 9) they are sampled from."""
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(os.path.join(args.model, "vae")).float().eval()
    colours, directions, shapes = list(world.COLOURS), list(world.DIRECTIONS), world.SHAPES
    parts = [(colours[i % 5], shapes[i % 3], directions[i % 4]) for i in range(n)]
    x0, _, mean, std = fresh_latents(args, vae, parts, seed=9)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(9))
    return vae, parts, x0, mean, std, noise


@torch.no_grad()
def probe_from_sigma(args, model, proc, starts, n=30, steps=20, shift=3.0, guidance=4.0):
    vae, parts, x0, mean, std, noise = shape_clips(args, n)
    shapes = world.SHAPES
    other = [(c, shapes[(shapes.index(s) + 1) % 3], d) for c, s, d in parts]
    texts = [""] + [world.prompt(*p) for p in parts] + [world.prompt(*p) for p in other]
    emb, lens = train.text_embeddings(args.model, texts, torch.float32)
    ctx, bias = train.compact_text(emb, lens)
    grid = torch.linspace(1.0, 0.0, steps + 1)
    grid = shift * grid / (1 + (shift - 1) * grid)
    for s in starts:
        sig = torch.cat([torch.tensor([s]), grid[grid < s - 1e-6]])
        said = []
        for rows, asked in ((range(1, n + 1), parts), (range(n + 1, 2 * n + 1), other)):
            rows = list(rows)
            c = torch.cat([ctx[rows], ctx[[0] * n]])
            b = torch.cat([bias[rows], bias[[0] * n]])[:, None, None, :]
            x = (1 - s) * x0 + s * noise
            for i in range(len(sig) - 1):
                proc.bias = b
                v = model(torch.cat([x, x]), torch.full((2 * n,), float(sig[i]) * 1000.0), c, return_dict=False)[0]
                x = x + (sig[i + 1] - sig[i]) * (v[n:] + guidance * (v[:n] - v[n:]))
            said.append([world.judge(decoded(vae, x[j:j + 1], mean, std), world.prompt(*asked[j])) for j in range(n)])
        own = sum(r["shape_ok"] for r in said[0]) / n
        swapped = sum(r["shape_ok"] for r in said[1]) / n
        kept = sum(r["shape"] == p[1] for r, p in zip(said[1], parts)) / n
        print(f"9. from sigma {s} ({len(sig) - 1} steps): shape right with the own prompt {own:.2f}; with the shape "
              f"swapped, the prompt's shape {swapped:.2f}, the clip's {kept:.2f}")


@torch.no_grad()
def probe_x0_fill(args, model, proc, sigmas, n=30):
    import numpy as np

    vae, parts, x0, mean, std, noise = shape_clips(args, n)
    shapes = world.SHAPES
    texts = [""] + [world.prompt(c, s, d) for c, _, d in parts for s in shapes]
    emb, lens = train.text_embeddings(args.model, texts, torch.float32)
    ctx, bias = train.compact_text(emb, lens)
    for s in sigmas:
        xt = (1 - s) * x0 + s * noise
        t = torch.full((n,), s * 1000.0)
        proc.bias = bias[[0] * n][:, None, None, :]
        uncond = model(xt, t, ctx[[0] * n], return_dict=False)[0]
        said = []
        for k, shape in enumerate(shapes):
            rows = [1 + 3 * j + k for j in range(n)]
            proc.bias = bias[rows][:, None, None, :]
            cond = model(xt, t, ctx[rows], return_dict=False)[0]
            for g in (1.0, 4.0):
                est = xt - s * (uncond + g * (cond - uncond))
                fills = [world.judge(decoded(vae, est[j:j + 1], mean, std), world.prompt(*parts[j]))["fill"]
                         for j in range(n)]
                fills = [f for f in fills if f is not None]
                said.append(f"{shape} {np.median(fills):.3f}" + ("" if g == 1.0 else " guided"))
        print(f"10. one-step fill: sigma {s}: median fill of the estimate with each shape word: " + ", ".join(said))


@torch.no_grad()
def probe_decode_noise(args, levels, n=30):
    import numpy as np

    vae, parts, x0, mean, std, _ = shape_clips(args, n)
    gen = torch.Generator().manual_seed(11)
    for level in [0.0] + levels:
        right, fills = {"colour_ok": 0, "shape_ok": 0}, {}
        for j in range(n):
            x = x0[j:j + 1] + level * torch.randn(x0[j:j + 1].shape, generator=gen)
            r = world.judge(decoded(vae, x, mean, std), world.prompt(*parts[j]))
            for k in right:
                right[k] += r[k]
            if r["fill"] is not None:
                fills.setdefault(parts[j][1], []).append(r["fill"])
        print(f"11. decoder margin: noise {level}: colour right {right['colour_ok']}/{n}, shape {right['shape_ok']}/{n}, "
              "median fill " + ", ".join(f"{k} {np.median(v):.3f}" for k, v in sorted(fills.items())))


@torch.no_grad()
def probe_words(model, proc, z, parts, folder, n=96):
    colours, directions = list(world.COLOURS), list(world.DIRECTIONS)

    def swapped(p, word):
        c, s, d = p
        if word == "colour":
            c = colours[(colours.index(c) + 1) % len(colours)]
        elif word == "shape":
            s = world.SHAPES[(world.SHAPES.index(s) + 1) % len(world.SHAPES)]
        elif word == "direction":
            d = directions[(directions.index(d) + 1) % len(directions)]
        return "" if word == "empty" else world.prompt(c, s, d)

    words = ("own", "colour", "shape", "direction", "empty")
    picked = parts[-n:]
    texts = sorted({world.prompt(*p) if w == "own" else swapped(p, w) for p in picked for w in words})
    emb, lens = train.text_embeddings(folder, texts, torch.float32)
    ctx, bias = train.compact_text(emb, lens)
    x0 = z[-n:]
    g = torch.Generator().manual_seed(0)
    for s in (0.3, 0.5, 0.7, 0.9):
        noise = torch.randn(x0.shape, generator=g)
        xt = (1 - s) * x0 + s * noise
        loss = {}
        for w in words:
            rows = [texts.index(world.prompt(*p) if w == "own" else swapped(p, w)) for p in picked]
            proc.bias = bias[rows][:, None, None, :]
            v = model(xt, torch.full((n,), s * 1000.0), ctx[rows], return_dict=False)[0]
            loss[w] = ((v - (noise - x0)) ** 2).mean().item()
        print(f"8. words: sigma {s}: loss with the own prompt {loss['own']:.4f}; with one word swapped: " +
              ", ".join(f"{w} +{100 * (loss[w] / loss['own'] - 1):.1f}%" for w in words[1:]))


@torch.no_grad()
def probe_pool(model, proc, z, parts, folder, n=64):
    x0, other = z[:n], z[n:2 * n]
    emb, lens = train.text_embeddings(folder, [world.prompt(*p) for p in parts[:n]], torch.float32)
    ctx, bias = train.compact_text(emb, lens)
    proc.bias = bias[:, None, None, :]
    last = x0.shape[2] - 1

    def where(x):  # [n, C, H, W] -> index of the latent pixel with the most energy
        return x.pow(2).sum(1).flatten(1).argmax(1)

    truth = where(x0[:, :, last])
    for s in (0.99, 0.97, 0.95, 0.9, 0.8):
        g = torch.Generator().manual_seed(0)
        xt = (1 - s) * x0 + s * torch.randn(x0.shape, generator=g)
        found = []
        for mixed in (False, True):
            x = xt.clone()
            if mixed:
                x[:, :, :last] = ((1 - s) * other + s * torch.randn(other.shape, generator=g))[:, :, :last]
            v = model(x, torch.full((n,), s * 1000.0), ctx, return_dict=False)[0]
            found.append((where((x - s * v)[:, :, last]) == truth).float().mean().item())
        raw = (where(xt[:, :, last]) == truth).float().mean().item()
        # A reference that knows the data: the posterior mean over the other clips' latents (the
        # exact denoiser of that finite set), from all frames and from the last frame alone.
        known = []
        for frames in (slice(None), slice(last, last + 1)):
            a, b = xt[:, :, frames].flatten(1), ((1 - s) * z[2 * n:, :, frames]).flatten(1)
            w = torch.softmax(-torch.cdist(a, b) ** 2 / (2 * s * s), dim=1)
            known.append((where((w @ z[2 * n:, :, last].flatten(1)).view_as(x0[:, :, last])) == truth).float().mean().item())
        print(f"7. pooling: sigma {s}: the last frame's object found (1 of {x0.shape[3] * x0.shape[4]} latent pixels) "
              f"{found[0]:.2f} with its own clip's frames around it, {found[1]:.2f} with other clips', "
              f"{raw:.2f} from x_t alone; the posterior over {len(z) - 2 * n} other clips {known[0]:.2f} from all "
              f"frames, {known[1]:.2f} from the last alone")


@torch.no_grad()
def probe_context(model, proc, z, ctx, bias, noise):
    n = 32
    a, b = z[:n], z[n:2 * n]
    proc.bias = bias[:n, None, None, :]
    last = a.shape[2] - 1
    for s in (0.3, 0.6, 0.9):
        xa, xb = (1 - s) * a + s * noise[:n], (1 - s) * b + s * noise[:n]
        t = torch.full((n,), s * 1000.0)
        base = model(xa, t, ctx[:n], return_dict=False)[0][:, :, last]
        around, itself = xa.clone(), xa.clone()
        around[:, :, :last] = xb[:, :, :last]
        itself[:, :, last] = xb[:, :, last]
        d_around = (model(around, t, ctx[:n], return_dict=False)[0][:, :, last] - base).pow(2).mean().sqrt().item()
        d_itself = (model(itself, t, ctx[:n], return_dict=False)[0][:, :, last] - base).pow(2).mean().sqrt().item()
        print(f"4. context: sigma {s}: the last frame's output moves by {d_around:.3f} when the frames before it "
              f"change, {d_itself:.3f} when it does (ratio {d_around / d_itself:.2f})")


@torch.no_grad()
def probe_held(args, model, proc, helds, n=16, steps=20, shift=3.0, guidance=4.0, clean=False):
    import numpy as np
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(os.path.join(args.model, "vae")).float().eval()
    parts = [(list(world.COLOURS)[i % 5], world.SHAPES[i % 3], list(world.DIRECTIONS)[i % 4]) for i in range(n)]
    x0, ends, mean, std = fresh_latents(args, vae, parts, seed=7)
    emb, lens = train.text_embeddings(args.model, [""] + [world.prompt(*p) for p in parts], torch.float32)
    ctx, bias = train.compact_text(emb, lens)
    c = torch.cat([ctx[1:], ctx[[0] * n]])
    b = torch.cat([bias[1:], bias[[0] * n]])[:, None, None, :]
    sig = torch.linspace(1.0, 0.0, steps + 1)
    sig = shift * sig / (1 + (shift - 1) * sig)
    pt, ph, pw = model.config.patch_size
    if clean and pt != 1:  # a token spans several latent frames: no timestep of a frame's own
        print(f"6. clean frames: not for a transformer with {pt} latent frames per token")
        return
    tokens = x0.shape[3] * x0.shape[4] // (ph * pw)  # per latent frame
    for held in helds:
        off, right = [], 0
        for seed in (0, 1):
            noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(seed))
            x = noise.clone()
            for i in range(steps):
                t = torch.full((2 * n, x0.shape[2]), float(sig[i]) * 1000.0)
                if clean:
                    x[:, :, :held] = x0[:, :, :held]
                    t[:, :held] = 0.0
                else:
                    x[:, :, :held] = (1 - sig[i]) * x0[:, :, :held] + sig[i] * noise[:, :, :held]
                proc.bias = b
                v = model(torch.cat([x, x]), t.repeat_interleave(tokens, dim=1) if clean else t[:, 0], c,
                          return_dict=False)[0]
                x = x + (sig[i + 1] - sig[i]) * (v[n:] + guidance * (v[:n] - v[n:]))
            x[:, :, :held] = x0[:, :, :held]
            for j in range(n):
                frames = decoded(vae, x[j:j + 1], mean, std)
                m = world.object_mask(frames[-1], half_max=True)
                yy, xx = np.nonzero(m)
                off.append(float(np.hypot(xx.mean() - ends[j][0], yy.mean() - ends[j][1])) if m.sum() >= 4 else 64.0)
                right += world.judge(frames, world.prompt(*parts[j]))["direction_ok"]
        print(f"{6 if clean else 5}. {'clean' if clean else 'held'} frames: {held} of {x0.shape[2]}: the last frame's object {np.median(off):.1f} px from the clip's "
              f"(median; mean {np.mean(off):.1f}), direction right {right / (2 * n):.2f}")


if __name__ == "__main__":
    sys.exit(main())
