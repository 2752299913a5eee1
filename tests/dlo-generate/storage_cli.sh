#!/usr/bin/env bash
# --storage-dtype as a user runs it, on a small random model whose Linears dominate its blocks
# (width 128, FFN 256, 3 layers; bf16 compute):
#  1. bytes: at 2 ranks with dlo, each rank's host shards and the bytes it gathered equal what the
#     safetensors headers give (not the engine's code): a block is its tensors in
#     wan_block_tensor_names' order, 64-byte aligned, the layerwise-cast Linears 1 byte an element
#     at fp8 and 2 at bf16, diffusers' fp32 modules 4, the rest 2; a shard ceil(block / 2) rounded
#     up to 256; gathered = the other rank's shards of every block per pass, and of block 0 once
#     more (the ring's last prefetch).
#     fp8's host bytes are about half of bf16's (test_memory_model: the memory model counts them);
#  2. dlo-checkpoint convert --storage-dtype fp8 writes what dlo keeps: that folder renders, with
#     auto, the source's frames at --storage-dtype fp8, from half the Linears' bytes on disk;
#  3. the manifest's storage_dtype renders the flag's frames (and --dry-run says it); a job rendered
#     at fp8 whose manifest then says auto is a changed job (the fingerprint covers the storage);
#  4. bad input, exit 2 before any work, nothing written: a storage wider than --dtype, an unknown
#     name (flag and manifest key, the file and key named), convert into the source's folder, convert
#     of something that is not a Wan transformer.
#   storage_cli.sh BIN_DIR
set -euo pipefail
# shellcheck source=tests/common/cli.sh
source "$(dirname "$0")/../common/cli.sh" "$1"
G="$BIN/dlo-generate"
C="$BIN/dlo-checkpoint"
"$C" make "$T/m" --preset wan-test --layers 3 --dim 128 --heads 2 --ffn-dim 256 --dtype fp32 --seed 5 >/dev/null
job=(--prompt "a red ball rolls" --seed 3 --steps 2 --frames 5 --height 32 --width 48 --threads 1 --format png --quiet)
frames() { cat "$1"/*.png | sha256sum | cut -d' ' -f1; }

# 1. Bytes against the headers.
mpirun -np 2 "$G" --model "$T/m" "${job[@]}" --offload dlo --out "$T/bf16" --report "$T/bf16.json"
mpirun -np 2 "$G" --model "$T/m" "${job[@]}" --offload dlo --storage-dtype fp8 --out "$T/fp8" --report "$T/fp8.json"
python3 - "$T/m/transformer" "$T/bf16.json" "$T/fp8.json" <<'PY'
import glob, json, struct, sys
folder, reports = sys.argv[1], {"bf16": json.load(open(sys.argv[2])), "fp8": json.load(open(sys.argv[3]))}
FP32 = {"rope", "time_embedder", "scale_shift_table", "norm1", "norm2", "norm3"}
LINEARS = {f"{a}.{p}" for a in ("attn1", "attn2") for p in ("to_q", "to_k", "to_v", "to_out.0")} | {"ffn.net.0.proj", "ffn.net.2"}
ORDER = [f"{a}.{p}.{w}" for a in ("attn1", "attn2") for p in ("to_q", "to_k", "to_v", "to_out.0") for w in ("weight", "bias")]
ORDER = ORDER[:8] + ["attn1.norm_q.weight", "attn1.norm_k.weight"] + ORDER[8:] + ["attn2.norm_q.weight", "attn2.norm_k.weight"]
shapes = {}
for f in glob.glob(f"{folder}/*.safetensors"):
    with open(f, "rb") as fh:
        (k,) = struct.unpack("<Q", fh.read(8))
        shapes.update({n: v["shape"] for n, v in json.loads(fh.read(k)).items() if n != "__metadata__"})
cfg = json.load(open(f"{folder}/config.json"))
names = ORDER + (["norm2.weight", "norm2.bias"] if cfg["cross_attn_norm"] else []) + \
    ["ffn.net.0.proj.weight", "ffn.net.0.proj.bias", "ffn.net.2.weight", "ffn.net.2.bias", "scale_shift_table"]
n = 2
def shards(linear_size):
    out = []
    for i in range(cfg["num_layers"]):
        off = 0
        for t in names:
            numel = 1
            for d in shapes[f"blocks.{i}.{t}"]: numel *= d
            size = 4 if FP32 & set(t.split(".")) else linear_size if t.rsplit(".", 1)[0] in LINEARS else 2
            off = (off + 63) // 64 * 64 + numel * size
        out.append(((off + n - 1) // n + 255) // 256 * 256)
    return out
host = {}
for dtype, size in (("bf16", 2), ("fp8", 1)):
    s = shards(size)
    for rank in reports[dtype]["ranks"]:
        want_gathered = (rank["traversals"] * sum(s) + s[0]) * (n - 1)
        assert rank["host_bytes"] == sum(s), f"{dtype} rank {rank['rank']}: host {rank['host_bytes']}, the headers say {sum(s)}"
        assert rank["bytes_gathered"] == want_gathered, \
            f"{dtype} rank {rank['rank']}: gathered {rank['bytes_gathered']}, the headers say {want_gathered}"
    host[dtype] = sum(s)
ratio = host["fp8"] / host["bf16"]
assert ratio < 0.53, f"fp8 keeps {ratio:.3f} of bf16's bytes"
print(f"1. host shards per rank: bf16 {host['bf16']} B, fp8 {host['fp8']} B ({ratio:.3f}); gathered bytes as the headers say")
PY
[ "$(frames "$T/fp8")" != "$(frames "$T/bf16")" ] || fail "fp8 storage rendered bf16's frames"

# 2. convert.
"$C" convert "$T/m/transformer" "$T/conv" --storage-dtype fp8 --shard-size 300KB >/dev/null
ls "$T/conv" | grep -q 'index.json$' || fail "convert wrote no shards: $(ls "$T/conv")"
"$G" --model "$T/m" "${job[@]}" --storage-dtype fp8 --out "$T/src8"
"$G" --model "$T/m" "${job[@]}" --transformer "$T/conv" --out "$T/conv8"
[ "$(frames "$T/conv8")" = "$(frames "$T/src8")" ] || fail "the converted folder renders other frames than --storage-dtype fp8"
python3 - "$T/m/transformer" "$T/conv" <<'PY'
import glob, json, re, struct, sys
def header(folder):
    out = {}
    for f in glob.glob(f"{folder}/*.safetensors"):
        with open(f, "rb") as fh:
            (k,) = struct.unpack("<Q", fh.read(8))
            out.update({n: v for n, v in json.loads(fh.read(k)).items() if n != "__metadata__"})
    return out
src, conv = header(sys.argv[1]), header(sys.argv[2])
LINEAR = re.compile(r"^blocks\.\d+\.(attn[12]\.(to_q|to_k|to_v|to_out\.0)|ffn\.net\.(0\.proj|2))\.(weight|bias)$")
FP32 = {"rope", "time_embedder", "scale_shift_table", "norm1", "norm2", "norm3"}
assert set(src) == set(conv), set(src) ^ set(conv)
for name, t in src.items():
    want = "F8_E4M3" if LINEAR.match(name) else "F32" if FP32 & set(name.split(".")) else "BF16"
    assert conv[name]["dtype"] == want and conv[name]["shape"] == t["shape"], (name, conv[name], want)
size = lambda h: sum(v["data_offsets"][1] - v["data_offsets"][0] for v in h.values())
print(f"2. convert: every tensor in the dtype dlo keeps it in; {size(conv)} B of {size(src)} (fp32); "
      f"renders the source's frames at --storage-dtype fp8")
PY

# 3. The manifest's key.
cat >"$T/jobs.yaml" <<YAML
model: m
storage_dtype: fp8
defaults: {frames: 5, height: 32, width: 48, steps: 2}
jobs:
  - {id: a, prompt: "a red ball rolls", seed: 3}
YAML
"$G" --jobs "$T/jobs.yaml" --threads 1 --format png --quiet --output-dir "$T/batch"
[ "$(frames "$T/batch/a")" = "$(frames "$T/src8")" ] || fail "storage_dtype: fp8 in the manifest: not the flag's frames"
dry=$("$G" --jobs "$T/jobs.yaml" --threads 1 --dry-run --output-dir "$T/dry" 2>&1)
grep -q "transformer bf16 (Linears fp8 e4m3fn)" <<<"$dry" || fail "--dry-run does not say the manifest's storage: $dry"
[ ! -e "$T/dry" ] || fail "--dry-run wrote its output folder"
sed -i 's/^storage_dtype: fp8$/storage_dtype: auto/' "$T/jobs.yaml"
sed_done=$(grep -c '^storage_dtype: auto$' "$T/jobs.yaml")
[ "$sed_done" = 1 ] || fail "could not edit the manifest"
expect 2 "$T/resume.log" "$G" --jobs "$T/jobs.yaml" --threads 1 --format png --quiet --output-dir "$T/batch"
grep -q "changed" "$T/resume.log" || fail "a storage changed since the job was rendered is not reported: $(cat "$T/resume.log")"
echo "3. the manifest's storage_dtype renders the flag's frames; a changed storage is a changed job"

# 4. Bad input.
expect 2 "$T/wide.log" "$G" --model "$T/m" "${job[@]}" --storage-dtype fp32 --out "$T/no1"
grep -q -- "--storage-dtype: fp32 is wider than the compute dtype bf16" "$T/wide.log" || fail "$(cat "$T/wide.log")"
expect 2 "$T/name.log" "$G" --model "$T/m" "${job[@]}" --storage-dtype int8 --out "$T/no2"
grep -q -- "--storage-dtype: 'int8' is not auto, fp8, bf16, fp16 or fp32" "$T/name.log" || fail "$(cat "$T/name.log")"
sed -i 's/^storage_dtype: auto$/storage_dtype: int8/' "$T/jobs.yaml"
expect 2 "$T/key.log" "$G" --jobs "$T/jobs.yaml" --threads 1 --format png --quiet --output-dir "$T/no3"
grep -q "jobs.yaml.*storage_dtype: 'int8' is not auto, fp8, bf16, fp16 or fp32" "$T/key.log" || fail "$(cat "$T/key.log")"
expect 2 "$T/self.log" "$C" convert "$T/conv" "$T/conv" --storage-dtype fp8
grep -q "holds the source checkpoint" "$T/self.log" || fail "$(cat "$T/self.log")"
expect 2 "$T/vae.log" "$C" convert "$T/m/vae" "$T/no4" --storage-dtype fp8
for p in no1 no2 no3 no4; do [ ! -e "$T/$p" ] || fail "a refused run wrote $p"; done
echo "4. bad storage dtypes and convert inputs refused before any work (exit 2), nothing written"
