#!/usr/bin/env python3
"""Parity of dlo's T5 tokenizer (and prompt cleaning) against transformers' T5TokenizerFast and diffusers.

Tokenizes a list of prompts with `dlo-forward --component tokenizer` (inputs "text" + "text_lengths":
the UTF-8 prompts back to back) and compares input_ids and attention_mask with

    T5TokenizerFast(prompt_clean(p), padding="max_length", max_length=L, truncation=True,
                    add_special_tokens=True, return_attention_mask=True)

exactly as WanPipeline._get_t5_prompt_embeds calls it (prompt_clean from diffusers' pipeline_wan).
With --raw the prompts are not cleaned on either side (the tokenizer alone: whitespace, control
characters and CR/LF reach it). Exit 0 when every row is equal, else 1 (the first differences are
printed).

The prompts: a fixed list (punctuation, HTML entities, Unicode incl. combining marks, emoji, CJK,
special-token strings, the empty prompt, a prompt long enough to be truncated) plus --random N
strings drawn from a mixed alphabet. The tokenizer is the one `dlo-checkpoint make` trains, or
--tokenizer DIR, or with --python-spm one trained here with Python's sentencepiece (other options:
identity normalisation, user-defined symbols, byte fallback, 10 extra ids), to exercise more paths.
With --resave the folder is first loaded by transformers and written again by its save_pretrained:
transformers 5 writes tokenizer.json and no spiece.model, and both sides read that folder. With
--both (implies --resave) another tokenizer's spiece.model (the one `dlo-checkpoint make` trains)
is then put beside that tokenizer.json, as when a re-saved tokenizer is written over an original
folder: the two files disagree, transformers' AutoTokenizer reads tokenizer.json, and so must dlo
(the run fails if the two files would give the same ids, which would test nothing).

  tokenizer_parity.py --bin build/bin --random 2000
  tokenizer_parity.py --bin build/bin --raw --python-spm --random 2000
  tokenizer_parity.py --bin build/bin --resave --python-spm --random 2000
  tokenizer_parity.py --bin build/bin --both --python-spm --raw --random 2000
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

FIXED = [
    "",
    " ",
    "A red fox runs through a snowy forest at dawn.",
    "Two dogs play tug-of-war on a sunny beach; waves crash & seagulls call overhead!",
    "Hello, world!!! What's up?? (nothing) [brackets] {braces} <angles> /slashes\\ |pipes| ~tilde~ `ticks`",
    "Email team@example.com or visit https://example.org/videos?id=42&x=y#frag today.",
    "Numbers: 3.14159, 1,000,000, -42, +7, 50% off, $14.99, €12,50, £10, ¥500, 2^10=1024.",
    "Café naïve résumé über façade jalapeño crème brûlée Ångström Øresund ß ŁÓDŹ",
    "Decomposed: Cafe\u0301 nai\u0308ve A\u030a \uff21\u0301 x\u0327\u0301 e\u0301\u0301\u0301",
    "“Smart quotes” and ‘single’ — em dash – en dash … ellipsis •bullet· middle dot",
    "Full-width: ＡＢＣ１２３！ ligature ﬁ ﬂ circled ① ② super² sub₂ fraction ½ ¼ roman Ⅻ",
    "東京 → 大阪 日本語のテキスト 中文 한국어 가나다 각",
    "Emoji: 😀 👍🏽 👨‍👩‍👧 🇺🇸🇫🇷 ❤️ ©️ 1️⃣ 🏳️‍🌈",
    "Arabic مرحبا Hebrew שלום Hindi नमस्ते क्षत्रिय Thai สวัสดี ำ Greek Ωμέγα Cyrillic Привет",
    "HTML: &amp; &lt;tag&gt; &quot;q&quot; &#39;apos&#39; &#x27; &nbsp;x&nbsp; &copy; &notit; &amp;amp; &eacute;",
    "Specials: </s> <pad> <unk> <extra_id_0> <extra_id_99> <extra_id_100> <s> </s></s>x<extra_id_5>y",
    "Whitespace:\tTAB\nNEWLINE\r\nCRLF\u00a0NBSP\u3000IDEO\u2009THIN\u200bZWSP\u2028LS  double   triple",
    "Controls: \x01\x02\x1b[0m \x7f \x1c\x1d\x1e\x1f end",
    "▁literal▁meta ▁ ▁▁ x▁▁y",
    "Cinematic, 4K, shallow depth of field, golden hour lighting, soft film grain, ultra-detailed!!!",
    "a very long prompt that must be truncated to the maximum sequence length, " * 60,
    "supercalifragilisticexpialidocious " * 3 + "x" * 300 + " x" * 600,
]

ALPHABET = (list("abcdefghijklmnopqrstuvwxyz ABCXYZ.,;:!?'\"()-–—…“”‘’0123456789$%&#@/\\\t\r\n\x0b\x0c")
            + list("éèüöçñß漢字東京😀¨´¸½ﬁ①Ａ\u00a0\u3000\u2009\u200b▁²°€\u0301\u1680\u2028\x1c\x85\u0308\u0327"
                   "\u20dd\ufe0f\u200d\u1100\u1161\u11a8가\U0001F1FA\U0001F1F8\U0001F468\U0001F3FD\u0915\u094d"
                   "\u0937\u093f\u0600\u0661ÅÅKΩ\u0e33\u0eb3ﾊﾟ\u3099\u309a")
            + ["</s>", "<unk>", "<extra_id_3>", "<extra_id_", "<pad>", "<s>", "&amp;", "&lt;", "&#65;", "&"])

CORPUS = """The quick brown fox jumps over the lazy dog. A cat, sitting on a mat; watched birds fly!
Wan renders videos from text prompts: "a dancing monkey", 'a red car' (in the rain) -- at night?
Café naïve résumé über straße — “quotes” and ‘single’ … 100% of $5 & more #hashtag @user <sep> [X].
Numbers 1234567890, 3.14159, 2^10 = 1024; e-mail: someone@example.com; URL https://example.org/path?q=1
Snow falls on a small village; smoke curls from chimneys, windows glow warm and the night is quiet.
A robot waters plants in a greenhouse, moving carefully between rows of tomatoes and peppers.
"""


def python_spm(folder):
    """A tokenizer trained with Python's sentencepiece, with options the built-in one lacks."""
    import sentencepiece as spm

    os.makedirs(folder, exist_ok=True)
    corpus = os.path.join(folder, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        for i in range(8):
            f.write(CORPUS.replace("a", "a" * (1 + i % 2)))
    spm.SentencePieceTrainer.train(input=corpus, model_prefix=os.path.join(folder, "spiece"), vocab_size=400,
                                   model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   character_coverage=0.995, hard_vocab_limit=False, byte_fallback=True,
                                   user_defined_symbols=["<sep>", "[X]"], normalization_rule_name="nmt_nfkc_cf",
                                   num_threads=1, minloglevel=2)
    os.remove(os.path.join(folder, "spiece.vocab"))
    os.remove(corpus)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "T5Tokenizer", "extra_ids": 10, "eos_token": "</s>", "pad_token": "<pad>",
                   "unk_token": "<unk>", "model_max_length": 512}, f)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="folder holding dlo-checkpoint and dlo-forward")
    ap.add_argument("--tokenizer", help="an existing tokenizer folder (else `dlo-checkpoint make` writes one)")
    ap.add_argument("--python-spm", action="store_true", help="train the tokenizer with Python's sentencepiece")
    ap.add_argument("--raw", action="store_true", help="no prompt_clean on either side")
    ap.add_argument("--resave", action="store_true",
                    help="compare on the folder transformers' save_pretrained writes (tokenizer.json, no spiece.model)")
    ap.add_argument("--both", action="store_true",
                    help="--resave, then another tokenizer's spiece.model beside tokenizer.json (the files disagree)")
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--random", type=int, default=0, help="random strings added to the fixed prompts")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.resave = args.resave or args.both

    from diffusers.pipelines.wan.pipeline_wan import prompt_clean
    from transformers import AutoTokenizer, T5TokenizerFast

    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        tok_dir = os.path.join(model, "tokenizer")
        if args.tokenizer:
            os.makedirs(model)
            os.symlink(os.path.abspath(args.tokenizer), tok_dir)
        elif args.python_spm:
            python_spm(tok_dir)
        else:
            subprocess.run([os.path.join(args.bin, "dlo-checkpoint"), "make", model, "--components", "tokenizer"],
                           check=True, stdout=subprocess.DEVNULL)
        if args.resave:
            saved = os.path.join(tmp, "resaved")
            AutoTokenizer.from_pretrained(tok_dir).save_pretrained(saved)
            files = sorted(os.listdir(saved))
            if "spiece.model" in files or "tokenizer.json" not in files:
                print(f"FAIL: save_pretrained wrote {files}; --resave expects tokenizer.json without spiece.model")
                return 1
            if os.path.islink(tok_dir):
                os.remove(tok_dir)
            else:
                shutil.rmtree(tok_dir)
            shutil.copytree(saved, tok_dir)
        if args.both:
            other = os.path.join(tmp, "other")
            subprocess.run([os.path.join(args.bin, "dlo-checkpoint"), "make", other, "--components", "tokenizer"],
                           check=True, stdout=subprocess.DEVNULL)
            shutil.copy(os.path.join(other, "tokenizer", "spiece.model"), os.path.join(tok_dir, "spiece.model"))

        rng = random.Random(args.seed)
        words = CORPUS.split()
        prompts = list(FIXED)
        for k in range(args.random):
            if k % 2:
                prompts.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 40))))
            else:
                prompts.append(" ".join(rng.choice(words + ALPHABET) for _ in range(rng.randint(0, 16))))

        data = [p.encode("utf-8") for p in prompts]
        inputs = os.path.join(tmp, "in.safetensors")
        out = os.path.join(tmp, "out.safetensors")
        save_file({"text": torch.frombuffer(bytearray(b"".join(data) or b"\0"), dtype=torch.uint8)[:sum(map(len, data))],
                   "text_lengths": torch.tensor([len(d) for d in data], dtype=torch.int64),
                   "max_sequence_length": torch.tensor(args.max_length, dtype=torch.int64),
                   "clean": torch.tensor(0 if args.raw else 1, dtype=torch.int64)}, inputs)
        subprocess.run([os.path.join(args.bin, "dlo-forward"), "--model", model, "--component", "tokenizer",
                        "--inputs", inputs, "--out", out], check=True)
        ours = load_file(out)

        # With both files: what WanPipeline's from_pretrained gives for the folder (AutoTokenizer).
        tok = AutoTokenizer.from_pretrained(tok_dir) if args.both else T5TokenizerFast.from_pretrained(tok_dir)
        texts = prompts if args.raw else [prompt_clean(p) for p in prompts]
        ref = tok(texts, padding="max_length", max_length=args.max_length, truncation=True, add_special_tokens=True,
                  return_attention_mask=True, return_tensors="pt")
        if args.both:  # the spiece.model beside it, alone, must give other ids: else this tests nothing
            alone = os.path.join(tmp, "spiece_alone")
            os.makedirs(alone)
            shutil.copy(os.path.join(tok_dir, "spiece.model"), alone)
            other_ids = T5TokenizerFast.from_pretrained(alone)(texts, padding="max_length", max_length=args.max_length,
                                                                truncation=True, return_tensors="pt").input_ids
            differ = sum(not torch.equal(other_ids[i], ref.input_ids[i]) for i in range(len(texts)))
            print(f"both files: {type(tok).__name__} on tokenizer.json; spiece.model alone gives other ids for "
                  f"{differ}/{len(texts)} prompts")
            if differ == 0:
                print("FAIL: the two files agree; --both would test nothing")
                return 1

    bad = [i for i in range(len(prompts))
           if not (torch.equal(ours["input_ids"][i], ref.input_ids[i])
                   and torch.equal(ours["attention_mask"][i], ref.attention_mask[i]))]
    for i in bad[:5]:
        n = int(ref.attention_mask[i].sum())
        print(f"  differs: {prompts[i][:200]!r}\n    ref  {ref.input_ids[i][:n].tolist()}\n"
              f"    ours {ours['input_ids'][i][:int(ours['attention_mask'][i].sum())].tolist()}")
    lengths = ref.attention_mask.sum(1)
    truncated = int((lengths == args.max_length).sum())
    print(f"{'PASS' if not bad else 'FAIL'}: tokenizer ({'raw' if args.raw else 'prompt_clean'}, "
          f"{'python-trained' if args.python_spm else args.tokenizer or 'dlo-trained'}"
          f"{', re-saved by transformers: tokenizer.json' if args.resave else ''}"
          f"{' beside another spiece.model' if args.both else ''}, vocab {len(tok)}): "
          f"{len(prompts) - len(bad)}/{len(prompts)} prompts give equal input_ids and attention_mask "
          f"(max_length {args.max_length}; {truncated} truncated; {int((ref.input_ids == tok.unk_token_id).sum())} "
          f"<unk> tokens; shape ours {tuple(ours['input_ids'].shape)} ref {tuple(ref.input_ids.shape)})")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
