#!/usr/bin/env bash
# dlo-generate --vae FILE as a user runs it, on tiny random models of both VAEs (a Wan2.1-shaped
# model with the Wan2.1 VAE's structure, a TI2V-shaped one with the Wan2.2 VAE's):
#  1. the folder's VAE rewritten (dlo-checkpoint copy --wan-names original) in the original Wan2.1
#     and Wan2.2 VAE layouts, and the folder's own file given as a file, render the folder's
#     frames, byte for byte; dlo-forward --component vae --vae FILE decodes as the folder does;
#  2. the fingerprint covers the file (resume sees the job changed), and the manifest's top-level
#     `vae` key renders the folder's frames;
#  3. bad input is refused before any work, exit 2, naming the file, nothing written: a Wan2.1 VAE
#     for the Wan2.2 model and back (z_dim), another width (base_dim), a name no row maps (with the
#     layout detected), a transformer's file, a pickle (with the command that converts it), a
#     missing file, in a batch too.
# (That the names are diffusers' own reading of such files: the parity label,
# tools/reference/single_file_vae_parity.py, against AutoencoderKLWan.from_single_file.)
#   single_file_vae_cli.sh BIN_DIR
set -euo pipefail
# shellcheck source=tests/common/cli.sh
source "$(dirname "$0")/../common/cli.sh" "$1"
G="$BIN/dlo-generate"
C="$BIN/dlo-checkpoint"
"$C" make "$T/m" --preset wan-test --layers 2 --dtype fp32 --seed 5 >/dev/null
"$C" make "$T/t" --preset wan2.2-ti2v-test --layers 2 --dtype fp32 --seed 6 >/dev/null
"$C" copy "$T/m/vae" "$T/v21" --shard-size 0 --wan-names original --base-name vae >/dev/null
"$C" copy "$T/t/vae" "$T/v22" --shard-size 0 --wan-names original --base-name vae >/dev/null
grep -q '"decoder.upsamples.4.shortcut.weight"' "$T/v21/vae.safetensors" || fail "no original Wan2.1 VAE names"
grep -q '"decoder.upsamples.0.upsamples.3.time_conv.weight"' "$T/v22/vae.safetensors" || fail "no original Wan2.2 VAE names"

frames() {  # frames OUT WIDTH [flags...]: renders one prompt into the PNG folder OUT; prints the frames' sha256
  local out=$1 width=$2
  shift 2
  "$G" --prompt "a red ball rolls" --seed 3 --steps 2 --frames 5 --height 32 --width "$width" --dtype fp32 --threads 1 \
    --format png --out "$out" --quiet "$@" >/dev/null
  cat "$out"/*.png | sha256sum | cut -d' ' -f1
}

# 1. The folder's frames from every layout, for both VAEs.
for model in m t; do
  width=48
  [ $model = t ] && width=64  # the Wan2.2 VAE's 16x spatial factor x the patch of 2
  want=$(frames "$T/f-$model" $width --model "$T/$model")
  file=$T/v21/vae.safetensors
  [ $model = t ] && file=$T/v22/vae.safetensors
  for given in "$file" "$T/$model/vae/diffusion_pytorch_model.safetensors"; do
    got=$(frames "$T/f-$model-$(basename "$(dirname "$given")")" $width --model "$T/$model" --vae "$given")
    [ "$got" = "$want" ] || fail "--model $model --vae $given: frames $got, the folder's $want"
  done
  echo "1. $model: the folder's frames ($want) from the original layout and from the folder's file given"
done
# The file is what decodes: a VAE of other weights (another seed) gives other frames.
"$C" make "$T/other" --preset wan-test --seed 9 --components vae --dtype fp32 >/dev/null
[ "$(frames "$T/f-other" 48 --model "$T/m" --vae "$T/other/vae")" != "$(frames "$T/f-m-again" 48 --model "$T/m")" ] \
  || fail "--vae naming other weights changed nothing: the file was not used"
echo "   a VAE file of other weights: other frames"
python3 - "$T/latents.safetensors" <<'EOF'
import json, random, struct, sys
random.seed(1)
values = [random.gauss(0, 1) for _ in range(12 * 2 * 2 * 2)]
header = json.dumps({"latents": {"dtype": "F32", "shape": [1, 12, 2, 2, 2], "data_offsets": [0, 4 * len(values)]}}).encode()
header += b" " * (-len(header) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(header)) + header + struct.pack(f"<{len(values)}f", *values))
EOF
for run in folder file; do
  extra=()
  [ $run = file ] && extra=(--vae "$T/v22/vae.safetensors")
  "$BIN/dlo-forward" --model "$T/t" --component vae "${extra[@]}" --inputs "$T/latents.safetensors" \
    --out "$T/forward-$run.safetensors" 2>/dev/null
done
cmp -s "$T/forward-folder.safetensors" "$T/forward-file.safetensors" || fail "dlo-forward --vae: another output"
echo "   dlo-forward --component vae --vae FILE: the folder's output"

# 2. The fingerprint covers the file; the manifest's key.
printf 'a red ball rolls\n' >"$T/prompts.txt"
batch=(--jobs "$T/prompts.txt" --output-dir "$T/batch" --steps 2 --frames 5 --height 32 --width 48 --threads 1
       --format png --quiet)
"$G" --model "$T/m" "${batch[@]}"
set +e
msg=$("$G" --model "$T/m" "${batch[@]}" --vae "$T/v21/vae.safetensors" 2>&1)
rc=$?
set -e
[ $rc = 2 ] && grep -q "changed since its video" <<<"$msg" || fail "a job decoded by another VAE file was not seen changed (rc $rc): $msg"
for key in "" "vae: v21/vae.safetensors"; do
  printf 'model: m\n%s\ndefaults: {frames: 5, height: 32, width: 48, steps: 2, seed: 3}\njobs:\n  - {id: a, prompt: "a red ball rolls"}\n' \
    "$key" >"$T/k.yaml"
  "$G" --jobs "$T/k.yaml" --output-dir "$T/k${key:+-file}" --format png --dtype fp32 --threads 1 --quiet
done
k=$(sha_of "$T/k/results.jsonl" a)
[ -n "$k" ] && [ "$(sha_of "$T/k-file/results.jsonl" a)" = "$k" ] || fail "the manifest's vae key: other frames"
grep -q "\"vae\":\"$T/v21/vae.safetensors\"" "$T/k-file/results.jsonl" || fail "the job's parameters do not name the VAE file"
echo "2. resume sees a job changed when --vae names a file; the manifest's vae key renders the folder's frames"

# 3. Refusals: exit 2 before any work, a message naming the file, no output.
refused() {  # refused WHAT EXPECTED-MESSAGE FLAGS...
  local what=$1 expected=$2 rc
  shift 2
  rm -rf "$T/out"
  set +e
  msg=$("$G" --prompt "x" --steps 2 --frames 5 --height 32 --width 64 --format png --out "$T/out" "$@" 2>&1)
  rc=$?
  set -e
  [ $rc = 2 ] || fail "$what: exit $rc, not 2: $msg"
  grep -qF -- "$expected" <<<"$msg" || fail "$what: message lacks '$expected': $msg"
  [ ! -e "$T/out" ] || fail "$what: wrote $T/out"
  echo "   $what: exit 2, '$expected'"
}
"$C" make "$T/wide" --preset wan-test --vae-base-dim 24 --components vae --dtype fp32 >/dev/null
python3 - "$T/v21/vae.safetensors" "$T/renamed.safetensors" <<'EOF'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
header["decoder.upsamples.2.lora_up.weight"] = header.pop("decoder.upsamples.2.residual.6.bias")
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
EOF
: >"$T/Wan2.1_VAE.pth"
refused "a Wan2.1 VAE for the Wan2.2 model" "vae weights '$T/v21/vae.safetensors': its tensors give z_dim 16, the model folder's vae config has 12" \
  --model "$T/t" --vae "$T/v21/vae.safetensors"
refused "a Wan2.2 VAE for the Wan2.1 model" "its tensors give z_dim 12, the model folder's vae config has 16" \
  --model "$T/m" --vae "$T/v22/vae.safetensors"
refused "another width" "its tensors give base_dim 24, the model folder's vae config has 16" \
  --model "$T/m" --vae "$T/wide/vae"
refused "a name no row maps" "1 tensor(s) are not the Wan VAE's in the original Wan2.1 VAE layout detected (2 residual blocks per stage): 'decoder.upsamples.2.lora_up.weight'" \
  --model "$T/m" --vae "$T/renamed.safetensors"
refused "a transformer's file" "transformer/diffusion_pytorch_model.safetensors: not a Wan VAE in a layout dlo knows" \
  --model "$T/m" --vae "$T/m/transformer/diffusion_pytorch_model.safetensors"
refused "a pickle" "python tools/pickle_to_safetensors.py '$T/Wan2.1_VAE.pth' OUT.safetensors" --model "$T/m" --vae "$T/Wan2.1_VAE.pth"
refused "a missing file" "checkpoint '$T/nope.safetensors' does not exist" --model "$T/m" --vae "$T/nope.safetensors"
rm -rf "$T/batch2"
set +e
msg=$("$G" --model "$T/t" --jobs "$T/prompts.txt" --output-dir "$T/batch2" --steps 2 --frames 5 --height 32 --width 64 \
  --vae "$T/v21/vae.safetensors" 2>&1)
rc=$?
set -e
[ $rc = 2 ] && grep -qF "its tensors give z_dim 16" <<<"$msg" || fail "a batch with the other VAE's file: exit $rc: $msg"
[ ! -e "$T/batch2/results.jsonl" ] || fail "a refused batch wrote results.jsonl"
echo "3. refusals: exit 2, named, nothing written"
echo "PASS"
