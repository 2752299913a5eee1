#!/usr/bin/env bash
# The demo model (configs/demo-model, trained by tools/train_demo_model.py) through the product:
#  1. one prompt with no other flag: the model folder's dlo_defaults.json gives the size, frames,
#     steps and guidance (ffprobe: 64x64, 17 frames);
#  2. ten prompts (every colour twice, every shape and direction at least twice), half with UniPC
#     and half with Euler, at 1 rank resident; the first two of them (one per scheduler, one per
#     rank) again at 2 ranks with dlo: those jobs' frames identical in the two runs (the other
#     strategies and rank counts are the --jobs tests' on their models; the other eight at 2 ranks
#     were 8 of the test's 21 renders of 20 steps and asserted nothing the two do not), and
#     tools/check_demo_video.py's verdicts on the ten from the pixels: the colour and the direction right
#     in all but at most one video each (issue 20's bar; the shipped model gets 10 of 10 of each;
#     chance is 2 and 2.5); shape is reported, not asserted (5 of 10, chance 3.3: the transformer
#     draws circles and triangles, squares without corners, though the VAE gets the shape right in
#     93% of its own reconstructions). Guidance off is measured by research/demo-model, not here.
# DLO_DEMO_MAX_MISSES (e.g. colour=0,direction=0,shape=4) sets other bars.
#   demo_model_cli.sh BIN_DIR PYTHON SOURCE_DIR
set -euo pipefail
# shellcheck source=tests/common/cli.sh
source "$(dirname "$0")/../common/cli.sh" "$1"
PY=${2:?python}
SRC=$(cd "${3:?source dir}" && pwd)
MODEL="$SRC/configs/demo-model"
CHECK=("$PY" "$SRC/tools/check_demo_video.py")
GEN=("$BIN/dlo-generate" --threads 1 --quiet)

# 1. One prompt, no other flag.
"${GEN[@]}" --model "$MODEL" --prompt "a yellow square moving down" --seed 3 --out "$T/one.mp4"
read -r w h n < <(ffprobe -v error -count_frames -select_streams v:0 \
  -show_entries stream=width,height,nb_read_frames -of csv=p=0 "$T/one.mp4" | tr ',' ' ')
[ "$w $h $n" = "64 64 17" ] || fail "one prompt: ${w}x${h}, $n frames; want the model's 64x64, 17 frames"
"${CHECK[@]}" "$T/one.mp4"

# 2. Ten prompts, both schedulers, 1 rank resident and 2 ranks dlo.
PROMPTS=("a red circle moving left" "a red square moving up" "a green square moving right"
  "a green triangle moving down" "a blue triangle moving up" "a blue circle moving right"
  "a yellow circle moving down" "a yellow triangle moving left" "a white triangle moving right"
  "a white square moving down")
manifest() {  # manifest FILE N: the first N prompts
  {
    echo "model: $MODEL"
    echo "output_dir: out"
    echo "defaults: {format: ffv1}"
    echo "jobs:"
    local i=0
    for p in "${PROMPTS[@]:0:$2}"; do
      local s=unipc
      [ $((i % 2)) = 1 ] && s=euler
      echo "  - {id: p$i, prompt: \"$p\", scheduler: $s}"
      i=$((i + 1))
    done
  } >"$1"
}
sha_of() { grep "\"id\":\"$2\"" "$1" | tail -1 | grep -o '"frames_sha256":"[0-9a-f]*"' | cut -d'"' -f4; }
first="$T/np1-resident"
for run in "1 resident ${#PROMPTS[@]}" "2 dlo 2"; do
  read -r np s n <<<"$run"
  d="$T/np$np-$s"
  mkdir -p "$d"
  manifest "$d/jobs.yaml" "$n"
  mpirun -np $np "${GEN[@]}" --jobs "$d/jobs.yaml" --offload $s >"$d/log" 2>&1 || { cat "$d/log"; fail "np $np $s: exit"; }
  if [ "$d" = "$first" ]; then
    "${CHECK[@]}" --quiet --results "$d/out/results.jsonl" --json "$d/verdicts.json" \
      --max-misses "${DLO_DEMO_MAX_MISSES:-colour=1,direction=1}" | sed "s/^/np $np $s: /" || fail "np $np $s: the videos do not show their prompts"
  else  # the same frames: the same verdicts
    [ "$(grep -c '"status":"ok"' "$d/out/results.jsonl")" = "$n" ] || fail "np $np $s: $(cat "$d/out/results.jsonl")"
    for i in $(seq 0 $((n - 1))); do
      [ "$(sha_of "$d/out/results.jsonl" p$i)" = "$(sha_of "$first/out/results.jsonl" p$i)" ] ||
        fail "np $np $s: job p$i's frames differ from $(basename "$first")'s"
    done
    grep -q '"rank":1' "$d/out/results.jsonl" || fail "np $np $s: rank 1 rendered none of the jobs"
  fi
done

echo "PASS: the demo model renders with its own settings; frames identical at 1 rank resident and 2 ranks dlo, both schedulers; colour and direction as asked"
