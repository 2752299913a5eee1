#!/usr/bin/env python3
"""Golden token ids from transformers for dlo's T5 tokenizer (tests/data/goldens/tokenizer_unknown_pieces.json).

A user's tokenizer.json may hold pieces made of characters that are not pieces themselves ("éc"
without "é"). There the tokenizer's choice between a piece and an unknown character depends on the
unknown's score, min(score) - 10 in tokenizers' Unigram (kUnkPenalty), which no trained
SentencePiece model exercises (training makes every character of a piece a piece). This file holds
such a vocabulary, written by transformers 5's own T5Tokenizer.save_pretrained, and the ids that
AutoTokenizer.from_pretrained on that folder gives for a list of texts (add_special_tokens=False),
so that the `cpu` label (tests/text/test_tokenizer.cpp) checks dlo against transformers without
Python.

The vocabulary is built so that the unknown penalty decides: "écd" is [▁][<unk>][cd] by 0.5 over
[▁][éc][d] (a penalty of 11 flips it), "éef" is [▁][ée][f] by 0.5 over [▁][<unk>][ef] (a penalty of
9 flips it); the same with 3- and 4-byte characters (東, 😀) and runs of unknowns (fused into one
<unk>). The texts: these, then --random N strings over an alphabet of the pieces' characters and
others (seeded).

  make_tokenizer_goldens.py --out tests/data/goldens/tokenizer_unknown_pieces.json
  make_tokenizer_goldens.py --check tests/data/goldens/tokenizer_unknown_pieces.json   # parity label

--check recomputes the ids with the installed transformers from the committed tokenizer.json and
texts and compares them with the committed ids (exit 0 when equal, else 1).
Versions used: transformers 5.23.0, tokenizers 0.23.3 (tools/requirements.txt).
"""
import argparse
import json
import os
import random
import sys
import tempfile

META = "\u2581"
# Pieces with scores chosen around the unknown penalty; the lowest score (-15, "zzz") sets
# min_score, so an unknown character scores -25.
VOCAB = [
    ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), (META, -2.0),
    ("c", -1.0), ("cd", -1.0), ("\u00e9c", -14.5), ("d", -12.0),          # écd: unknown by 0.5
    ("e", -1.0), ("ef", -1.0), ("\u00e9e", -13.5), ("f", -12.0),          # éef: piece by 0.5
    ("g", -1.0), ("gh", -1.0), ("\u6771g", -14.5), ("h", -12.0),          # 東gh: unknown by 0.5
    ("k", -1.0), ("km", -1.0), ("\U0001F600k", -13.5), ("m", -12.0),      # 😀km: piece by 0.5
    ("x", -3.0), ("\u00e9\u00e9x", -7.0),                               # a piece of two unknowns
    ("zzz", -15.0),
    ("<extra_id_1>", 0.0), ("<extra_id_0>", 0.0),
]
FIXED = ["\u00e9cd", "\u00e9ef", "\u6771gh", "\U0001F600km", "\u00e9cd \u00e9ef \u6771gh \U0001F600km",
         "\u00e9\u00e9cd", "\u00e9\u00e9x", "\u00e9\u00e9\u00e9x", "x\u00e9\u00e9xcd", "\u00e9", "\u00e9\u00e9",
         "\u4eac\u6771gh", "q\u00e9ef", "cd\u00e9ef\u00e9cd", "\U0001F600\U0001F600km \u00e9",
         "unknown letters only", "<extra_id_0>\u00e9cd</s>x"]
ALPHABET = list("cdefghkmxqz ") + ["\u00e9", "\u6771", "\u4eac", "\U0001F600", "cd", "ef", "gh", "km", "\u00e9e",
                                   "\u00e9c", "\u00e9\u00e9x", "</s>", "<extra_id_1>"]


def encode_all(tok_dir, texts):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    return [tok(t, add_special_tokens=False).input_ids for t in texts]


def main(argv=None):
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", help="write the golden here")
    g.add_argument("--check", help="recompute a committed golden with the installed transformers")
    ap.add_argument("--random", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bin", help="ignored (CTest's parity tests pass every script --bin)")
    args = ap.parse_args(argv)

    import tokenizers
    import transformers
    from transformers import T5Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        if args.check:
            with open(args.check, encoding="utf-8") as f:
                golden = json.load(f)
            with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump(golden["tokenizer_json"], f, ensure_ascii=False)
            with open(os.path.join(tmp, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump(golden["tokenizer_config"], f, ensure_ascii=False)
            texts = [c["text"] for c in golden["cases"]]
            ids = encode_all(tmp, texts)
            bad = [i for i, c in enumerate(golden["cases"]) if c["ids"] != ids[i]]
            for i in bad[:5]:
                print(f"  differs: {texts[i]!r}: golden {golden['cases'][i]['ids']}, now {ids[i]}")
            print(f"{'PASS' if not bad else 'FAIL'}: {len(texts) - len(bad)}/{len(texts)} texts give the golden's ids "
                  f"(transformers {transformers.__version__}, tokenizers {tokenizers.__version__})")
            return 1 if bad else 0

        T5Tokenizer(vocab=VOCAB, extra_ids=2).save_pretrained(tmp)
        rng = random.Random(args.seed)
        texts = FIXED + ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 12))) for _ in range(args.random)]
        ids = encode_all(tmp, texts)
        with open(os.path.join(tmp, "tokenizer.json"), encoding="utf-8") as f:
            tokenizer_json = json.load(f)
        with open(os.path.join(tmp, "tokenizer_config.json"), encoding="utf-8") as f:
            tokenizer_config = json.load(f)
    unk = sum(i.count(2) for i in ids)
    golden = {
        "made_by": (f"tools/reference/make_tokenizer_goldens.py --random {args.random} --seed {args.seed} "
                    f"(transformers {transformers.__version__}, tokenizers {tokenizers.__version__})"),
        "what": "T5Tokenizer(vocab=..., extra_ids=2).save_pretrained(); ids = AutoTokenizer.from_pretrained(folder)"
                "(text, add_special_tokens=False).input_ids",
        "tokenizer_json": tokenizer_json,
        "tokenizer_config": tokenizer_config,
        "cases": [{"text": t, "ids": i} for t, i in zip(texts, ids)],
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"wrote {args.out}: {len(texts)} texts, {unk} <unk> ids")
    return 0


if __name__ == "__main__":
    sys.exit(main())
