#!/usr/bin/env bash
# The main job on the built-in demo model: a batch of prompts (jobs/demo.yaml: mixed steps,
# guidance, schedulers and formats) rendered by dlo-generate on two ranks. Both ranks render
# different prompts at once while sharing the transformer's weights: each rank keeps half of
# every block, blocks are rebuilt by AllGather just before they run, and a rank that finishes a
# job takes the next at a pass boundary. The model (configs/demo-model, made by
# tools/train_demo_model.py) is a tiny Wan2.1 trained here on clips of one coloured shape moving
# across the frame (it draws the asked colour and direction in every video, the shape in about 57%); it is installed as out/demo/model. Afterwards the script writes a strip of
# frames of the first video (out/demo/strip.png) and, with the project's Python, checks every
# video's colour, shape and direction against its prompt (tools/check_demo_video.py).
# A rerun skips what is done (results.jsonl); after a new model it renders every job again over
# its own videos (--force). It deletes nothing: a file in out/demo/model that the demo model does
# not have stops it (exit 2) with the path to remove.
#   tools/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
OUT=out/demo   # jobs/demo.yaml names out/demo/model and out/demo/videos
NEW="$OUT/model-installed"   # there while the videos may be of an older model
mkdir -p "$OUT/model"
if ! diff -rq configs/demo-model "$OUT/model" >/dev/null 2>&1; then
  # Files the demo model lacks would become part of it (a tokenizer.json, say): not ours to delete.
  src=$PWD/configs/demo-model
  extra=$(cd "$OUT/model" && find . -mindepth 1 \( -exec test -e "$src/{}" \; -o -printf '%P\n' -prune \))
  if [ -n "$extra" ]; then
    echo "tools/demo.sh: $OUT/model holds what configs/demo-model does not: ${extra//$'\n'/, }" >&2
    echo "tools/demo.sh: remove them (or the whole $OUT/model) and run again" >&2
    exit 2
  fi
  touch "$NEW"
  cp -r configs/demo-model/. "$OUT/model/"
fi
# Videos of another model's weights are refused as changed jobs: a new model renders them again.
force=()
[ ! -e "$NEW" ] || force=(--force)
mpirun -np 2 build/bin/dlo-generate --jobs jobs/demo.yaml --offload dlo --threads 1 "${force[@]}"
rm -f "$NEW"
first="$OUT/videos/red-circle-left.mp4"
# Every 4th frame of the 17, enlarged 3x without smoothing, side by side.
ffmpeg -v error -y -i "$first" -vf "select='not(mod(n\,4))',scale=192:192:flags=neighbor,tile=5x1:padding=4:color=white" \
  -frames:v 1 -update 1 "$OUT/strip.png"
if [ -x .venv/bin/python ]; then
  .venv/bin/python tools/check_demo_video.py --results "$OUT/videos/results.jsonl"
fi
echo "videos in $OUT/videos, one line per job in $OUT/videos/results.jsonl; frames of $first in $OUT/strip.png"
