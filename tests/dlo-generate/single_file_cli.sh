#!/usr/bin/env bash
# dlo-generate --transformer FILE as a user runs it, on a tiny random model:
#  1. the folder's transformer rewritten (dlo-checkpoint copy --wan-names) in the original Wan
#     layout as one file, under ComfyUI's 'model.diffusion_model.' prefix, and as original-layout
#     shards with an index (a folder, as the Wan-AI repositories ship them) renders the folder's
#     own frames, byte for byte;
#  2. a batch rendered from the folder and then run again with --transformer FILE: the job's
#     fingerprint covers the file, so resume reports the job changed (exit 2) instead of
#     skipping it;
#  3. bad input is refused before any work, exit 2, naming the file, nothing written: a VAE's
#     file, a transformer of another shape (ffn_dim, layers), of other latent channels (another
#     expert or model), a shape no known config has without the folder's config, a pickle (with
#     the command that converts it), a missing file, --transformer-2 for a model of one
#     transformer, in a batch too;
#  4. dlo-forward --transformer FILE gives the folder's transformer's output.
# (That the names are diffusers' own reading of such files: the parity label,
# tools/reference/single_file_parity.py, against diffusers' convert_wan_transformer_to_diffusers.)
#   single_file_cli.sh BIN_DIR
set -euo pipefail
# shellcheck source=tests/common/cli.sh
source "$(dirname "$0")/../common/cli.sh" "$1"
G="$BIN/dlo-generate"
C="$BIN/dlo-checkpoint"
"$C" make "$T/m" --preset wan-test --layers 2 --dtype fp32 --seed 5 >/dev/null
"$C" copy "$T/m/transformer" "$T/original" --shard-size 0 --wan-names original --base-name wan >/dev/null
"$C" copy "$T/m/transformer" "$T/comfyui" --shard-size 0 --wan-names comfyui --base-name wan >/dev/null
"$C" copy "$T/m/transformer" "$T/shards" --shard-size 20KB --wan-names original >/dev/null
grep -q '"blocks.1.self_attn.q.weight"' "$T/original/wan.safetensors" || fail "copy --wan-names original wrote no original names"
grep -q '"model.diffusion_model.blocks.1.ffn.0.weight"' "$T/comfyui/wan.safetensors" || fail "no ComfyUI names"
[ "$(ls "$T/shards" | grep -c 'safetensors$')" -ge 2 ] && ls "$T/shards" | grep -q 'index.json$' || fail "no shards: $(ls "$T/shards")"

frames() {  # frames OUT [flags...]: renders one prompt into the PNG folder OUT; prints the frames' sha256
  local out=$1
  shift
  "$G" --prompt "a red ball rolls" --seed 3 --steps "${STEPS:-2}" --frames 5 --height 32 --width 48 --dtype fp32 --threads 1 \
    --format png --out "$out" --quiet "$@" >/dev/null
  cat "$out"/*.png | sha256sum | cut -d' ' -f1
}

# 1. The same frames from every layout.
want=$(frames "$T/f-folder" --model "$T/m")
for file in "$T/original/wan.safetensors" "$T/comfyui/wan.safetensors" "$T/shards"; do
  got=$(frames "$T/f-$(basename "$(dirname "$file")")-$(basename "$file")" --model "$T/m" --transformer "$file")
  [ "$got" = "$want" ] || fail "--transformer $file: frames $got, the folder's $want"
done
cp -r "$T/m" "$T/no-transformer"
rm -r "$T/no-transformer/transformer"
echo "1. the folder's frames ($want) from the original layout, ComfyUI's and original shards"
# Two experts: --transformer-2 replaces the low-noise expert alone (the high-noise expert's weights
# given as the low-noise one change the frames; the low-noise expert's own give the folder's).
"$C" make "$T/e" --preset wan2.2-a14b-test --dtype fp32 --seed 6 >/dev/null
"$C" copy "$T/e/transformer" "$T/e-high" --shard-size 0 --wan-names comfyui --base-name high >/dev/null
"$C" copy "$T/e/transformer_2" "$T/e-low" --shard-size 0 --wan-names original --base-name low >/dev/null
two=$(STEPS=4 frames "$T/f-e" --model "$T/e")
[ "$(STEPS=4 frames "$T/f-e-low" --model "$T/e" --transformer-2 "$T/e-low/low.safetensors" --transformer "$T/e-high/high.safetensors")" = "$two" ] \
  || fail "two experts given as files: other frames than the folder's"
[ "$(STEPS=4 frames "$T/f-e-swap" --model "$T/e" --transformer-2 "$T/e-high/high.safetensors")" != "$two" ] \
  || fail "--transformer-2 naming the high-noise expert's weights changed nothing: the file was not used"
echo "   two experts: --transformer and --transformer-2 files give the folder's frames; the other expert's file others"

# 2. The fingerprint covers the file: a batch's job changed when another transformer renders it.
printf 'a red ball rolls\n' >"$T/prompts.txt"
batch=(--jobs "$T/prompts.txt" --output-dir "$T/batch" --steps 2 --frames 5 --height 32 --width 48 --threads 1
       --format png --quiet)
"$G" --model "$T/m" "${batch[@]}"
set +e
msg=$("$G" --model "$T/m" "${batch[@]}" --transformer "$T/original/wan.safetensors" 2>&1)
rc=$?
set -e
[ $rc = 2 ] && grep -q "changed since its video" <<<"$msg" || fail "a job rendered by another transformer file was not seen changed (rc $rc): $msg"
"$G" --model "$T/m" "${batch[@]}" --transformer "$T/original/wan.safetensors" --force
# The manifest's own key (resolved against the manifest's folder) renders the folder's frames too.
for key in "" "transformer: original/wan.safetensors"; do
  printf 'model: m\n%s\ndefaults: {frames: 5, height: 32, width: 48, steps: 2, seed: 3}\njobs:\n  - {id: a, prompt: "a red ball rolls"}\n' \
    "$key" >"$T/k.yaml"
  "$G" --jobs "$T/k.yaml" --output-dir "$T/k${key:+-file}" --format png --dtype fp32 --threads 1 --quiet
done
k=$(sha_of "$T/k/results.jsonl" a)
[ -n "$k" ] && [ "$(sha_of "$T/k-file/results.jsonl" a)" = "$k" ] || fail "the manifest's transformer key: other frames"
echo "2. resume sees a job changed when --transformer names a file; the manifest's transformer key renders the folder's frames"

# 3. Refusals: exit 2 before any work, a message naming the file, no output.
refused() {  # refused WHAT EXPECTED-MESSAGE FLAGS...
  local what=$1 expected=$2 rc
  shift 2
  rm -rf "$T/out"
  set +e
  msg=$("$G" --prompt "x" --steps 2 --frames 5 --height 32 --width 48 --format png --out "$T/out" "$@" 2>&1)
  rc=$?
  set -e
  [ $rc = 2 ] || fail "$what: exit $rc, not 2: $msg"
  grep -qF -- "$expected" <<<"$msg" || fail "$what: message lacks '$expected': $msg"
  [ ! -e "$T/out" ] || fail "$what: wrote $T/out"
  echo "   $what: exit 2, '$expected'"
}
"$C" make "$T/wide" --preset wan-test --ffn-dim 48 --dtype fp32 >/dev/null
"$C" make "$T/deep" --preset wan-test --layers 3 --dtype fp32 >/dev/null
"$C" make "$T/i2v" --preset wan-test --in-channels 36 --out-channels 16 --components transformer --dtype fp32 >/dev/null
: >"$T/wan2.1_t2v_1.3B.pth"
refused "a VAE file" "vae/diffusion_pytorch_model.safetensors: not a Wan transformer" \
  --model "$T/m" --transformer "$T/m/vae/diffusion_pytorch_model.safetensors"
refused "another ffn_dim" "its tensors give ffn_dim 48, the model folder's transformer config has 32" \
  --model "$T/m" --transformer "$T/wide/transformer"
refused "another layer count" "its tensors give num_layers 3, the model folder's transformer config has 2" \
  --model "$T/m" --transformer "$T/deep/transformer"
refused "other latent channels (another expert or model)" "transformer weights '$T/i2v/transformer': its tensors give in_channels 36" \
  --model "$T/m" --transformer "$T/i2v/transformer"
refused "no folder config, no known shape" "its tensors give a transformer no known config has (in_channels 16" \
  --model "$T/no-transformer" --transformer "$T/original/wan.safetensors"
refused "a pickle" "python tools/pickle_to_safetensors.py '$T/wan2.1_t2v_1.3B.pth' OUT.safetensors" \
  --model "$T/m" --transformer "$T/wan2.1_t2v_1.3B.pth"
refused "a missing file" "checkpoint '$T/nope.safetensors' does not exist" --model "$T/m" --transformer "$T/nope.safetensors"
refused "--transformer-2 for one transformer" "the model has one transformer (model_index.json names no transformer_2)" \
  --model "$T/m" --transformer-2 "$T/original/wan.safetensors"
rm -rf "$T/batch2"
set +e
msg=$("$G" --model "$T/m" --jobs "$T/prompts.txt" --output-dir "$T/batch2" --steps 2 --frames 5 --height 32 --width 48 \
  --transformer "$T/wide/transformer" 2>&1)
rc=$?
set -e
[ $rc = 2 ] && grep -qF "its tensors give ffn_dim 48" <<<"$msg" || fail "a batch with another shape's file: exit $rc: $msg"
[ ! -e "$T/batch2/results.jsonl" ] || fail "a refused batch wrote results.jsonl"
echo "3. refusals: exit 2, named, nothing written"

# 4. dlo-forward --transformer: the output of the folder's transformer/, from the ComfyUI file.
for run in folder file; do
  extra=()
  [ $run = file ] && extra=(--transformer "$T/comfyui/wan.safetensors")
  "$BIN/dlo-forward" --model "$T/m" --component transformer "${extra[@]}" --random-inputs 2,4,6,5 \
    --out "$T/forward-$run.safetensors" 2>/dev/null
done
cmp -s "$T/forward-folder.safetensors" "$T/forward-file.safetensors" || fail "dlo-forward --transformer: another output"
echo "4. dlo-forward --transformer FILE: the folder's output"
echo "PASS"
