#!/usr/bin/env bash
# dlo-generate as a user calls it, on a random-weight model:
#  1. every check made before weights are read exits 2 with its message and writes nothing;
#  2. the same job at 1, 2 and 3 ranks and with each strategy gives the same sha256 of frames;
#  3. ffprobe confirms the MP4 (codec, pixel format, size, exact frame count, fps, tags); the
#     FFV1 and PNG outputs decode (with ffmpeg) to exactly the frames whose sha256 dlo reports.
#   generate_cli.sh BIN_DIR
set -euo pipefail
BIN=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
"$BIN/dlo-checkpoint" make "$T/m" --preset wan-test --layers 3 --in-channels 16 --out-channels 16 --dtype bf16 \
  --shard-size 20KB >/dev/null
GEN=("$BIN/dlo-generate" --model "$T/m" --prompt "a red fox in the snow" --steps 2 --height 32 --width 48
     --frames 5 --threads 1 --seed 7)
fail() { echo "FAIL: $*"; exit 1; }

# 0. The shipped --help shows no test hook (they are dlo-generate-testhooks' alone), and refuses them.
"$BIN/dlo-generate" --help >"$T/help"
n=$(grep -cE -- "--fail-|--test-|--slow-decode|--await-prepared|test hooks" "$T/help" || true)
[ "$n" = 0 ] || fail "dlo-generate --help shows $n test-hook line(s)"
# (Into a file: grep -q leaves a pipe at its match, and a help text past stdio's second 4 KiB block
# then dies of SIGPIPE, which pipefail reports.)
"$BIN/dlo-generate-testhooks" --help >"$T/hooks-help"
grep -q -- "--fail-job" "$T/hooks-help" || fail "dlo-generate-testhooks lacks --fail-job"
set +e; "${GEN[@]}" --out "$T/x.mp4" --fail-job 0 >/dev/null 2>"$T/stderr"; rc=$?; set -e
[ "$rc" = 2 ] && grep -q "fail-job" "$T/stderr" || fail "dlo-generate --fail-job: exit $rc: $(cat "$T/stderr")"
echo "ok: dlo-generate --help shows no test hook (0 lines) and refuses --fail-job; dlo-generate-testhooks has them"

# 1. Pre-load checks: exit 2, the message, nothing written.
mkdir "$T/out" "$T/partial" && cp -r "$T/m/transformer" "$T/m/scheduler" "$T/partial/"
check() {  # check 'expected message' args...
  local want=$1; shift
  set +e
  "${GEN[@]}" --out "$T/out/v.mp4" "$@" >"$T/stdout" 2>"$T/stderr"
  local rc=$?
  set -e
  [ "$rc" = 2 ] || fail "$* -> exit $rc, want 2: $(cat "$T/stderr")"
  grep -qF -- "$want" "$T/stderr" || fail "$* -> message '$(cat "$T/stderr")' lacks '$want'"
  [ -z "$(ls -A "$T/out")" ] || fail "$* wrote $(ls -A "$T/out")"
  echo "ok: $* -> $want"
}
check "--height: 500 is not a multiple of 16" --height 500
check "--out: is blank" --out "  "
check "--out: '-' is not a file" --out -
check "--width: must be positive, got 0" --width 0
check "--frames: 80 is not of the form 4k+1" --frames 80
check "--steps: must be >= 1, got 0" --steps 0
check "--crf: must be in 0..51" --crf 60
check "--format: 'gif' is not mp4, png or ffv1" --format gif
check "--offload: 'fast' is not auto, resident, device-shards, mixed, dlo or layerwise" --offload fast
check "--dtype" --dtype fp64
check "--scheduler" --scheduler ddim
check "--flow-shift: must be a positive number" --flow-shift -2
check "model folder '$T/nope': not a folder" --model "$T/nope"
check "lacks vae/, text_encoder/, tokenizer/" --model "$T/partial"
# model_index.json's Wan2.2 fields (as diffusers writes them) that do not fit together, or that
# this build does not run, are refused by name, not rendered with transformer/ alone.
index_variant() {  # index_variant NAME 'python dict update'
  mkdir "$T/$1"
  for part in transformer vae text_encoder tokenizer scheduler; do ln -s "$T/m/$part" "$T/$1/$part"; done
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); j.update($2); json.dump(j, open(sys.argv[2], 'w'))" \
    "$T/m/model_index.json" "$T/$1/model_index.json"
}
index_variant a14b '{"transformer_2": ["diffusers", "WanTransformer3DModel"], "boundary_ratio": 0.875}'
check "model_index.json names transformer_2 (the low-noise expert) but the folder has no transformer_2/" --model "$T/a14b"
index_variant noratio '{"transformer_2": ["diffusers", "WanTransformer3DModel"]}'
check "model_index.json: field 'transformer_2' is [\"diffusers\",\"WanTransformer3DModel\"] but 'boundary_ratio' is null" --model "$T/noratio"
index_variant ratio '{"transformer_2": [None, None], "boundary_ratio": 0.9}'
check "model_index.json: field 'boundary_ratio' is 0.9 but there is no 'transformer_2'" --model "$T/ratio"
index_variant badratio '{"transformer_2": ["diffusers", "WanTransformer3DModel"], "boundary_ratio": 1.5}'
check "model_index.json: field 'boundary_ratio' is 1.5: expected a number in [0, 1]" --model "$T/badratio"
index_variant t2bad '{"transformer_2": ["diffusers", "WanTransformer3DModel"], "boundary_ratio": 0.875}'
mkdir "$T/t2bad/transformer_2"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); j['text_dim']=32; json.dump(j, open(sys.argv[2], 'w'))" \
  "$T/m/transformer/config.json" "$T/t2bad/transformer_2/config.json"
check "transformer_2/config.json: field 'text_dim' differs from transformer/'s (32 vs 16): both experts take the same latents and text" --model "$T/t2bad"
index_variant nullt '{"transformer": None}'
check "model_index.json: field 'transformer' is null: dlo needs the (high-noise) transformer" --model "$T/nullt"
check "--guidance-2: applies to models with two experts" --guidance-2 3
check "--boundary-ratio: applies to models with two experts" --boundary-ratio 0.5
# expand_timesteps (TI2V): WanPipeline's per-token timestep needs the [1, 2, 2] patch.
index_variant ti2v '{"expand_timesteps": True}'
rm "$T/ti2v/transformer" && mkdir "$T/ti2v/transformer"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); j['patch_size']=[1,1,1]; json.dump(j, open(sys.argv[2], 'w'))" \
  "$T/m/transformer/config.json" "$T/ti2v/transformer/config.json"
check "model_index.json: field 'expand_timesteps' is true, but the transformer's patch_size is [1, 1, 1]" --model "$T/ti2v"
# A TI2V-shaped folder (the Wan2.2 VAE: 16x spatial, so 32-pixel multiples with the patch).
"$BIN/dlo-checkpoint" make "$T/ti2v-m" --preset wan2.2-ti2v-test --layers 2 --dtype bf16 >/dev/null
check "--height: 48 is not a multiple of 32" --model "$T/ti2v-m" --height 48 --width 64
# A tokenizer with ids beyond the text encoder's embedding (150 extra ids: 662 ids for a vocab_size
# of 612) is refused when the folder is checked, not by the jobs whose prompts reach those ids.
index_variant bigid '{}'
rm "$T/bigid/tokenizer" && mkdir "$T/bigid/tokenizer" && cp "$T/m/tokenizer/spiece.model" "$T/bigid/tokenizer/"
echo '{"extra_ids": 150}' >"$T/bigid/tokenizer/tokenizer_config.json"
check "bigid/tokenizer/spiece.model: token ids reach 661, beyond the text encoder's vocab_size 612" --model "$T/bigid"
index_variant i2v '{"_class_name": "WanImageToVideoPipeline"}'
check "field '_class_name' is 'WanImageToVideoPipeline'" --model "$T/i2v"
index_variant saved '{"transformer_2": [None, None], "boundary_ratio": None, "expand_timesteps": False}'
check "--out: the folder '$T/missing' of '$T/missing/v.mp4' does not exist" --out "$T/missing/v.mp4"
check "--out: '/dev/null' is a character device" --out /dev/null
check "--save-latents: the folder '$T/missing' of" --save-latents "$T/missing/l.safetensors"
check "--report: the folder '$T/missing' of" --report "$T/missing/r.json"
# Under mpirun the ranks agree and all exit 2.
set +e
mpirun -np 2 "${GEN[@]}" --out "$T/out/v.mp4" --height 500 >/dev/null 2>"$T/stderr"
rc=$?
set -e
[ "$rc" = 2 ] || fail "np 2 --height 500 -> exit $rc: $(cat "$T/stderr")"
[ "$(grep -c "is not a multiple of 16" "$T/stderr")" = 1 ] || fail "np 2: message not printed once: $(cat "$T/stderr")"
echo "ok: np 2 --height 500 -> exit 2, one message"

# 2. Ranks and strategies do not change the frames.
sha_of() { grep -o '"frames_sha256": "[0-9a-f]*"' "$1" | head -1 | cut -d'"' -f4; }
ref=""
for np in 1 2 3; do
  for s in resident layerwise dlo; do
    [ "$np" = 1 ] && [ "$s" = dlo ] && continue
    mpirun -np $np "${GEN[@]}" --offload $s --out "$T/v_${np}_$s.mp4" --report "$T/r.json" --quiet >/dev/null
    grep -q "\"choice\": \"offload: $s" "$T/r.json" || fail "np $np: strategy $s not used"
    sha=$(sha_of "$T/r.json")
    [ ${#sha} = 64 ] || fail "np $np $s: no sha256 in the report"
    if [ -z "$ref" ]; then ref=$sha; fi
    [ "$sha" = "$ref" ] || fail "np $np $s: frames sha256 $sha differs from $ref"
    echo "ok: np $np $s: frames sha256 $sha"
  done
done
# model_index.json as WanPipeline.save_pretrained writes a Wan2.1 folder (the Wan2.2 fields null
# or false): the same frames.
"${GEN[@]}" --model "$T/saved" --out "$T/v_saved.mp4" --report "$T/r.json" --quiet >/dev/null
[ "$(sha_of "$T/r.json")" = "$ref" ] || fail "model_index.json with null Wan2.2 fields: other frames"
echo "ok: model_index.json with transformer_2 [null, null], boundary_ratio null, expand_timesteps false: same frames"

# 3. The MP4 as ffprobe sees it, and lossless outputs decoding to the reported frames.
mp4=$T/v_1_resident.mp4
probe=$(ffprobe -v error -count_frames -select_streams v:0 -show_entries \
  stream=codec_name,pix_fmt,width,height,r_frame_rate,nb_read_frames:format_tags=comment,description \
  -of default=noprint_wrappers=1 "$mp4")
for want in codec_name=h264 pix_fmt=yuv420p width=48 height=32 r_frame_rate=16/1 nb_read_frames=5 \
  "TAG:comment=prompt: a red fox in the snow; negative prompt: ; seed 7; 2 steps; guidance 5" \
  'TAG:description={"id":' '"prompt":"a red fox in the snow"' '"seed":7' '"steps":2' '"scheduler":"unipc"'; do
  grep -qF -- "$want" <<<"$probe" || fail "ffprobe lacks '$want': $probe"
done
echo "ok: ffprobe: h264 yuv420p 48x32, 5 frames at 16/1, tags"
for f in ffv1 png; do
  out=$T/v.$f
  "${GEN[@]}" --format $f --out "$out" --report "$T/r.json" --quiet >/dev/null
  sha=$(sha_of "$T/r.json")
  [ "$sha" = "$ref" ] || fail "$f: frames sha256 $sha differs from $ref"
  if [ $f = png ]; then src=(-i "$out/frame_%05d.png"); else src=(-i "$out"); fi
  dec=$(ffmpeg -v error "${src[@]}" -f rawvideo -pix_fmt rgb24 - | sha256sum | cut -d' ' -f1)
  [ "$dec" = "$ref" ] || fail "$f: ffmpeg decodes to sha256 $dec, dlo reported $ref"
  echo "ok: $f decodes (ffmpeg) to the reported frames"
done
ls -A "$T" | grep -q '\.tmp-' && fail "a temporary file was left: $(ls -A "$T")"
echo "all ok"
