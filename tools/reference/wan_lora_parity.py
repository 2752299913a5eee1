#!/usr/bin/env python3
"""dlo's LoRA reader (dlo-checkpoint lora, models/wan_lora.h) against diffusers: the tensors
WanPipeline.lora_state_dict gives, bit for bit, and the scaling PEFT gives each module after
load_lora_weights, for LoRA files in the three layouts users have.

Makes a tiny Wan transformer (dlo-checkpoint make --preset wan-test, or --preset given) and writes:

  peft_meta.safetensors   saved by diffusers itself (WanPipeline.save_lora_weights) from a PEFT adapter
                          added to that transformer: r 4, lora_alpha 8, a rank_pattern (rank 2 and 3
                          modules), an alpha_pattern, lora_bias; with the lora_adapter_metadata diffusers writes
  peft_plain.safetensors  the same layout with no metadata and ranks 2 and 4 (diffusers then scales by 1)
  comfy.safetensors       ComfyUI/Kijai names (diffusion_model.blocks.N.self_attn.q.lora_down/lora_up), bf16,
                          alpha != rank on every block module (alpha/rank 0.125, 0.1, 2.5, and == rank),
                          a diff_b on every module touched, time_projection and text_embedding LoRAs,
                          head.head.diff + diff_b, and keys diffusers ignores (full-weight .diff deltas,
                          diff_m, a norm's diff)
  comfy_ab.safetensors    lightx2v's spelling (lora_A / lora_B, alpha), fp32, no diff_b
  musubi.safetensors      musubi-tuner's (lora_unet_blocks_N_self_attn_q.lora_down/.lora_up/.alpha), fp16

For each: `dlo-checkpoint lora FILE --out X --list --preset P` must write exactly lora_state_dict's
tensors (names, dtypes, shapes, bytes), print as ignored exactly the keys planted for diffusers to
ignore, and list for every module the scaling PEFT's module.scaling[adapter] holds after
pipe.load_lora_weights(FILE) on a transformer of that config (for a two-expert preset, also with
load_into_transformer_2=True on transformer_2). Files diffusers raises on (an alpha outside the
blocks, no block keys, head.head.diff without its diff_b, a text embedder's lone .diff, a key matching
nothing, k_img without v_img, dora_scale in the ComfyUI layout, a musubi module without alpha, factors
of two ranks) must make dlo-checkpoint lora exit 2. Exit 1 on a difference.

  wan_lora_parity.py --bin build/bin [--preset wan2.2-a14b-test]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

BLOCK_ORIGINAL = {"self_attn.q": "attn1.to_q", "self_attn.k": "attn1.to_k", "self_attn.v": "attn1.to_v",
                  "self_attn.o": "attn1.to_out.0", "cross_attn.q": "attn2.to_q", "cross_attn.k": "attn2.to_k",
                  "cross_attn.v": "attn2.to_v", "cross_attn.o": "attn2.to_out.0", "ffn.0": "ffn.net.0.proj",
                  "ffn.2": "ffn.net.2"}


def linear_shapes(transformer):
    """diffusers module name -> (out, in) of every nn.Linear of the transformer."""
    return {n: tuple(m.weight.shape) for n, m in transformer.named_modules() if isinstance(m, torch.nn.Linear)}


def pipe_for(transformer, transformer_2=None):
    from diffusers import WanPipeline
    return WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=None, transformer=transformer,
                       transformer_2=transformer_2)


def write_peft(model, tmp, shapes, g):
    """Two diffusers-layout files: one saved by diffusers with its metadata, one plain."""
    from diffusers import WanPipeline, WanTransformer3DModel
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    t = WanTransformer3DModel.from_pretrained(os.path.join(model, "transformer"), torch_dtype=torch.bfloat16)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["to_q", "to_k", "to_v", "to_out.0", "net.0.proj", "net.2",
                                                           "proj_out", "time_proj"],
                        rank_pattern={"blocks.1.attn1.to_q": 2, "ffn.net.2": 3}, alpha_pattern={"attn2.to_k": 3},
                        lora_bias=True)
    t.add_adapter(config, adapter_name="trained")
    with torch.no_grad():
        for n, p in t.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g))
    layers = get_peft_model_state_dict(t, adapter_name="trained")
    WanPipeline.save_lora_weights(tmp, transformer_lora_layers=layers, weight_name="peft_meta.safetensors",
                                  transformer_lora_adapter_metadata=config.to_dict())
    plain = {}
    for i, (m, (o, n)) in enumerate(sorted(shapes.items())):
        if m.startswith("blocks.") or m == "proj_out":
            r = 2 if i % 3 == 0 else 4
            plain[f"transformer.{m}.lora_A.weight"] = torch.randn(r, n, generator=g).bfloat16()
            plain[f"transformer.{m}.lora_B.weight"] = torch.randn(o, r, generator=g).bfloat16()
    save_file(plain, os.path.join(tmp, "peft_plain.safetensors"))
    return {"peft_meta.safetensors": [], "peft_plain.safetensors": []}


def write_comfy(tmp, shapes, layers, g):
    """ComfyUI/Kijai (lora_down/lora_up, bf16, alphas, diff_b everywhere, head.head.diff, ignored keys) and
    lightx2v's lora_A/lora_B spelling (fp32)."""
    sd, ignored = {}, []
    alphas = [(8, 64), (1.6, 16), (10, 4), (4, 4)]  # alpha/rank 0.125, 0.1 (inexact), 2.5, 1
    k = 0
    for i in range(layers):
        for orig, diff in BLOCK_ORIGINAL.items():
            o, n = shapes[f"blocks.{i}.{diff}"]
            alpha, r = alphas[k % len(alphas)]
            k += 1
            base = f"diffusion_model.blocks.{i}.{orig}"
            sd[f"{base}.lora_down.weight"] = torch.randn(r, n, generator=g).bfloat16()
            sd[f"{base}.lora_up.weight"] = torch.randn(o, r, generator=g).bfloat16()
            sd[f"{base}.alpha"] = torch.tensor(float(alpha)).bfloat16()
            sd[f"{base}.diff_b"] = torch.randn(o, generator=g).bfloat16()
    for orig, diff in [("time_projection.1", "condition_embedder.time_proj"),
                       ("text_embedding.0", "condition_embedder.text_embedder.linear_1")]:
        o, n = shapes[diff]
        sd[f"diffusion_model.{orig}.lora_down.weight"] = torch.randn(3, n, generator=g).bfloat16()
        sd[f"diffusion_model.{orig}.lora_up.weight"] = torch.randn(o, 3, generator=g).bfloat16()
        sd[f"diffusion_model.{orig}.diff_b"] = torch.randn(o, generator=g).bfloat16()
    o, n = shapes["proj_out"]
    sd["diffusion_model.head.head.diff"] = torch.randn(o, n, generator=g).bfloat16()
    sd["diffusion_model.head.head.diff_b"] = torch.randn(o, generator=g).bfloat16()
    # What diffusers ignores: full-weight deltas of Linears, the modulation delta, a norm's diff.
    o, n = shapes["blocks.0.attn1.to_q"]
    for key, shape in [("blocks.0.self_attn.q.diff", (o, n)), ("blocks.1.ffn.2.diff", shapes["blocks.1.ffn.net.2"]),
                       ("blocks.0.diff_m", (1, 6, n)), ("blocks.1.norm3.diff", (n,))]:
        sd[f"diffusion_model.{key}"] = torch.randn(*shape, generator=g).bfloat16()
        ignored.append(f"diffusion_model.{key}")
    save_file(sd, os.path.join(tmp, "comfy.safetensors"))

    ab = {}
    for i in range(layers):
        for orig, diff in BLOCK_ORIGINAL.items():
            o, n = shapes[f"blocks.{i}.{diff}"]
            base = f"diffusion_model.blocks.{i}.{orig}"
            ab[f"{base}.lora_A.weight"] = torch.randn(8, n, generator=g)
            ab[f"{base}.lora_B.weight"] = torch.randn(o, 8, generator=g)
            ab[f"{base}.alpha"] = torch.tensor(3.0)
    save_file(ab, os.path.join(tmp, "comfy_ab.safetensors"))
    return {"comfy.safetensors": ignored, "comfy_ab.safetensors": []}


def write_musubi(tmp, shapes, layers, g):
    sd = {}
    for i in range(layers):
        for orig, diff in BLOCK_ORIGINAL.items():
            o, n = shapes[f"blocks.{i}.{diff}"]
            base = f"lora_unet_blocks_{i}_{orig.replace('.', '_')}"
            sd[f"{base}.lora_down.weight"] = torch.randn(4, n, generator=g).half()
            sd[f"{base}.lora_up.weight"] = torch.randn(o, 4, generator=g).half()
            sd[f"{base}.alpha"] = torch.tensor(1.0 + i)
    save_file(sd, os.path.join(tmp, "musubi.safetensors"))
    return {"musubi.safetensors": []}


def write_refused(tmp, shapes, g):
    """Files dlo refuses because diffusers raises on them (in lora_state_dict or load_lora_weights)."""
    def comfy(module, r=2, alpha=None, diff=None):
        o, n = shapes[diff] if diff else (4, 4)
        sd = {f"diffusion_model.{module}.lora_down.weight": torch.randn(r, n, generator=g),
              f"diffusion_model.{module}.lora_up.weight": torch.randn(o, r, generator=g)}
        if alpha is not None:
            sd[f"diffusion_model.{module}.alpha"] = torch.tensor(float(alpha))
        return sd
    ok = comfy("blocks.0.self_attn.q", alpha=1.0, diff="blocks.0.attn1.to_q")
    o, n = shapes["proj_out"]
    musubi = {"lora_unet_blocks_0_ffn_0.lora_down.weight": torch.randn(2, 24, generator=g),
              "lora_unet_blocks_0_ffn_0.lora_up.weight": torch.randn(32, 2, generator=g)}
    q = shapes["blocks.0.attn1.to_q"]
    cases = {
        "alpha on head.head": {**ok, **comfy("head.head", alpha=1.0, diff="proj_out")},
        "no block keys": comfy("head.head", diff="proj_out"),
        "head.head.diff without diff_b": {**ok, "diffusion_model.head.head.diff": torch.randn(o, n, generator=g)},
        "text_embedding.0.diff alone": {**ok, "diffusion_model.text_embedding.0.diff": torch.randn(24, 16, generator=g)},
        "a key matching nothing": {**ok, **comfy("blocks.0.norm3")},
        "k_img without v_img": {**ok, **comfy("blocks.0.cross_attn.k_img")},
        "dora_scale (ComfyUI layout)": {**ok, "diffusion_model.blocks.0.self_attn.q.dora_scale": torch.ones(1, q[1])},
        "musubi without alpha": musubi,
        "down and up of other ranks": {"transformer.blocks.0.attn1.to_q.lora_A.weight": torch.randn(4, q[1], generator=g),
                                       "transformer.blocks.0.attn1.to_q.lora_B.weight": torch.randn(q[0], 3, generator=g)},
    }
    paths = {}
    for i, (why, sd) in enumerate(cases.items()):
        paths[why] = os.path.join(tmp, f"refused_{i}.safetensors")
        save_file(sd, paths[why])
    return paths


def dlo_lora(args, path, out):
    run = subprocess.run([os.path.join(args.bin, "dlo-checkpoint"), "lora", path, "--out", out, "--list", "--preset",
                          args.preset], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"dlo-checkpoint lora {path} failed ({run.returncode}): {run.stderr}{run.stdout}")
    scalings = {m.group(1): float(m.group(2)) for m in re.finditer(r"^  (\S+) rank \d+ in \d+ out \d+ scaling (\S+)",
                                                                    run.stdout, re.M)}
    ignored, reading = [], False
    for line in run.stdout.splitlines():
        if line.startswith("  ignored as diffusers"):
            reading = True
        elif reading and line.startswith("    "):
            ignored.append(line.strip())
    return scalings, ignored


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="folder holding dlo-checkpoint")
    ap.add_argument("--preset", default="wan-test", help="dlo-checkpoint make preset of the transformer")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from diffusers import WanPipeline, WanTransformer3DModel
    from peft.tuners.lora import LoraLayer

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        subprocess.run([os.path.join(args.bin, "dlo-checkpoint"), "make", model, "--preset", args.preset, "--components",
                        "transformer", "--dtype", "bf16", "--seed", str(args.seed)], check=True, stdout=subprocess.DEVNULL)
        base = WanTransformer3DModel.from_pretrained(os.path.join(model, "transformer"), torch_dtype=torch.bfloat16)
        shapes = linear_shapes(base)
        layers = base.config.num_layers
        files = {}
        files.update(write_peft(model, tmp, shapes, g))
        files.update(write_comfy(tmp, shapes, layers, g))
        files.update(write_musubi(tmp, shapes, layers, g))
        for name, planted in files.items():
            path = os.path.join(tmp, name)
            out = os.path.join(tmp, "dlo-" + name)
            scalings, ignored = dlo_lora(args, path, out)
            ours, ref = load_file(out), WanPipeline.lora_state_dict(path)
            bad = sorted(set(ours) ^ set(ref))
            for key in sorted(set(ours) & set(ref)):
                a, b = ours[key], ref[key].contiguous()
                if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a.view(torch.uint8), b.view(torch.uint8)):
                    bad.append(f"{key}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
            # PEFT's scaling after load_lora_weights on a transformer of that config.
            # A two-expert model (Wan2.2 A14B): the file loaded into transformer_2 as well, as its own expert's LoRA.
            experts = ["transformer"] + (["transformer_2"] if os.path.isdir(os.path.join(model, "transformer_2")) else [])
            loaded = {e: WanTransformer3DModel.from_pretrained(os.path.join(model, e), torch_dtype=torch.bfloat16)
                      for e in experts}
            pipe = pipe_for(loaded["transformer"], loaded.get("transformer_2"))
            for e in experts:
                pipe.load_lora_weights(path, adapter_name="x", load_into_transformer_2=e == "transformer_2")
                t = loaded[e]
                peft = {n: m.scaling["x"] for n, m in t.named_modules() if isinstance(m, LoraLayer) and "x" in m.scaling}
                if set(peft) != set(scalings):
                    bad.append(f"{e} modules: dlo {sorted(set(scalings) - set(peft))} not PEFT's, PEFT "
                               f"{sorted(set(peft) - set(scalings))} not dlo's")
                bad += [f"{e} {m}: scaling {scalings[m]!r} vs PEFT {peft[m]!r}"
                        for m in sorted(set(peft) & set(scalings)) if scalings[m] != peft[m]]
            if sorted(ignored) != sorted(planted):
                bad.append(f"ignored: dlo {sorted(ignored)} vs planted {sorted(planted)}")
            dist = sorted({round(v, 6) for v in peft.values()})
            print(f"{name}: {len(ref)} tensors, {len(peft)} modules in {' and '.join(experts)} (PEFT scalings {dist}), {len(ignored)} ignored: "
                  f"{'equal' if not bad else 'DIFFERENT'}")
            for b in bad[:10]:
                print("   ", b)
            failures += bad
        # Where diffusers raises, dlo refuses (exit 2).
        for why, path in write_refused(tmp, shapes, g).items():
            try:
                t = WanTransformer3DModel.from_pretrained(os.path.join(model, "transformer"), torch_dtype=torch.bfloat16)
                pipe_for(t).load_lora_weights(path, adapter_name="x")
                raised = "no"
            except Exception as e:  # noqa: BLE001 - any exception is diffusers refusing the file
                raised = type(e).__name__
            run = subprocess.run([os.path.join(args.bin, "dlo-checkpoint"), "lora", path, "--preset", args.preset],
                                 capture_output=True, text=True)
            verdict = "both refuse" if raised != "no" and run.returncode == 2 else "DIFFERENT"
            print(f"refused, {why}: diffusers raises {raised}, dlo exits {run.returncode}: {verdict}")
            if verdict != "both refuse":
                failures.append(f"{why}: {run.stderr.strip()}")
    print("ok" if not failures else f"FAILED: {len(failures)} difference(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
