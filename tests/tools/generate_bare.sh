#!/usr/bin/env bash
# dlo-generate-bare (no libav, no HDF5): links neither; renders a demo-like job whose frames tensor
# (uint8 [F, H, W, 3] in .safetensors, job parameters in the metadata) hashes to the frames_sha256
# the normal dlo-generate records in results.jsonl; refuses video outputs and .h5 with exit 2.
#   generate_bare.sh BIN_DIR
set -euo pipefail
BIN=$1
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
readelf -d "$BIN/dlo-generate-bare" | grep -E "NEEDED.*(libav|libswscale|libhdf5)" && fail "dlo-generate-bare links libav/HDF5"
readelf -d "$BIN/dlo-generate" | grep -q "NEEDED.*libavcodec" || fail "readelf check cannot fail: dlo-generate shows no libavcodec"
"$BIN/dlo-checkpoint" make "$T/m" --preset wan-test --layers 3 --dim 48 --heads 4 --text-dim 32 --dtype bf16 --shard-size 100KB >/dev/null
cat >"$T/jobs.yaml" <<YAML
model: $T/m
output_dir: $T/videos
jobs:
  - id: fox
    prompt: A red fox trotting through fresh snow at dawn
    seed: 42
    steps: 3
    height: 32
    width: 48
    frames: 5
    guidance: 5.0
    negative_prompt: blurry
    format: ffv1
YAML
"$BIN/dlo-generate" --jobs "$T/jobs.yaml" --threads 1 --quiet
want=$(grep -o '"frames_sha256": *"[0-9a-f]*"' "$T/videos/results.jsonl" | grep -o '[0-9a-f]\{64\}')
[ -n "$want" ] || fail "no frames_sha256 in results.jsonl"
"$BIN/dlo-generate-bare" --model "$T/m" --prompt "A red fox trotting through fresh snow at dawn" --seed 42 --steps 3 \
  --height 32 --width 48 --frames 5 --guidance 5 --negative-prompt blurry --threads 1 --quiet \
  --out "$T/fox.safetensors" --save-latents "$T/fox.latents.safetensors" >/dev/null
got=$(python3 - "$T/fox.safetensors" "$T/fox.latents.safetensors" <<'PY'
import hashlib, json, struct, sys
def read(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; return json.loads(b[8:8 + n]), b[8 + n:]
h, data = read(sys.argv[1])
f = h["frames"]; assert f["dtype"] == "U8" and f["shape"] == [5, 32, 48, 3], f
meta = json.loads(h["__metadata__"]["dlo_job"]); assert meta["seed"] == 42, meta
lh, _ = read(sys.argv[2]); assert "latents" in lh, lh
print(hashlib.sha256(data[f["data_offsets"][0]:f["data_offsets"][1]]).hexdigest())
PY
)
[ "$got" = "$want" ] || fail "bare frames sha256 $got != dlo-generate's $want"
echo "ok: frames equal ($got)"
for bad in "--out $T/v.mp4" "--out $T/v.mkv" "--out $T/pngdir" "--format png" "--save-latents $T/l.h5"; do
  set +e
  # shellcheck disable=SC2086
  "$BIN/dlo-generate-bare" --model "$T/m" --prompt x --steps 1 --height 32 --width 48 --frames 5 $bad 2>"$T/err" >/dev/null
  rc=$?
  set -e
  [ $rc = 2 ] || fail "$bad -> exit $rc, want 2"
  grep -qE "no video encoder|\.h5" "$T/err" || fail "$bad -> message: $(cat "$T/err")"
  echo "ok: $bad -> exit 2: $(cat "$T/err")"
done
[ ! -e "$T/v.mp4" ] && [ ! -e "$T/pngdir" ] || fail "a refused output was written"
