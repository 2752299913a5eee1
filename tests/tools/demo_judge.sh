#!/usr/bin/env bash
# tools/check_demo_video.py, the demo's judge, on videos drawn here with ffmpeg (no model, no C++
# build): a red square moving left half the frame is judged right; a still square and one that
# creeps 6% of the frame have no direction (the still one used to count as "left", probe N4), so
# --max-misses direction=0 fails them with exit 1; an all-black video has no object (its shape
# counted as a square); bad input (a prompt outside the world, a
# missing file, not a video, a cut video, a garbage results.jsonl line, --max-misses colour=x,
# --json a folder, probe V10) is one line naming it and exit 2, never a traceback.
#   demo_judge.sh PYTHON SOURCE_DIR
set -euo pipefail
PY=${1:?python}
SRC=$(cd "${2:?source dir}" && pwd)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
CHECK=("$PY" "$SRC/tools/check_demo_video.py")
LEFT="a red square moving left"
# square VIDEO X_EXPRESSION [FFMPEG_OPTIONS]: a 12-pixel red square on the demo's background, 17 frames of 64x64.
square() {
  ffmpeg -v error -y -f lavfi -i color=c=0x282828:s=64x64:d=1.0625:r=16 -f lavfi -i color=c=0xDC2828:s=12x12:d=1.0625:r=16 \
    -filter_complex "[0][1]overlay=x='$2':y=26" -frames:v 17 "${@:3}" "$1"
}
square "$T/left.mp4" "46-t*32"
square "$T/still.mp4" "26"
square "$T/creep.mp4" "30-t*4"
square "$T/left.mkv" "46-t*32" -c:v ffv1
ffmpeg -v error -y -f lavfi -i color=c=black:s=64x64:d=1.0625:r=16 -frames:v 17 "$T/black.mp4"

# expect_rc RC WHAT OUTPUT_PATTERN -- ARGS: the judge's exit code and a line of its output.
expect_rc() {
  local want=$1 what=$2 pattern=$3 rc=0
  shift 4
  "${CHECK[@]}" "$@" >"$T/out" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || { cat "$T/out"; fail "$what: exit $rc, want $want"; }
  grep -q -- "$pattern" "$T/out" || { cat "$T/out"; fail "$what: no line matching '$pattern'"; }
  ! grep -q Traceback "$T/out" || { cat "$T/out"; fail "$what: a traceback"; }
}
ALL=(--max-misses "colour=0,direction=0,shape=0")
expect_rc 0 "a square moving left" "direction left shape square; moved 0.50" -- "$T/left.mp4" --prompt "$LEFT" "${ALL[@]}"
expect_rc 0 "the same as FFV1" "direction left shape square" -- "$T/left.mkv" --prompt "$LEFT" "${ALL[@]}"
# N4: nothing moves, so there is no direction, and it is a miss.
expect_rc 1 "a still square" "direction - (wrong)" -- "$T/still.mp4" --prompt "$LEFT" "${ALL[@]}"
expect_rc 1 "a still square, the tally" "FAIL: direction: 1 of 1 wrong" -- "$T/still.mp4" --prompt "$LEFT" "${ALL[@]}"
# An all-black video has no object (its whole frame is far from the background): no shape either.
expect_rc 1 "an all-black video" "FAIL: shape: 1 of 1 wrong" -- "$T/black.mp4" --prompt "$LEFT" "${ALL[@]}"
expect_rc 1 "a square creeping 6% of the frame" "direction - (wrong)" -- "$T/creep.mp4" --prompt "$LEFT" --max-misses direction=0
expect_rc 0 "a still square without --max-misses" "direction 0/1" -- "$T/still.mp4" --prompt "$LEFT"

# V10: bad input is one line and exit 2.
one_line() {  # one_line WHAT PATTERN -- ARGS
  expect_rc 2 "$@"
  [ "$(wc -l <"$T/out")" = 1 ] || { cat "$T/out"; fail "$1: more than one line"; }
}
one_line "a prompt outside the world" "not a prompt of the demo world" -- "$T/left.mp4" --prompt "a purple blob"
one_line "a missing file" "no such file" -- "$T/nothere.mp4" --prompt "$LEFT"
one_line "not a video" "not a video ffprobe can read" -- "$SRC/README.md" --prompt "$LEFT"
head -c 1200 "$T/left.mkv" >"$T/cut.mkv"
one_line "a cut FFV1 video" "cut.mkv: .*" -- "$T/cut.mkv" --prompt "$LEFT"
head -c 1200 "$T/left.mp4" >"$T/cut.mp4"
one_line "a cut MP4" "cut.mp4: .*" -- "$T/cut.mp4" --prompt "$LEFT"
one_line "a video that records no prompt" "records no prompt; give --prompt" -- "$T/left.mp4"
one_line "--max-misses colour=x" "colour='x': need a whole number" -- "$T/left.mp4" --prompt "$LEFT" --max-misses colour=x
one_line "--max-misses of an unknown property" "unknown property 'hue'" -- "$T/left.mp4" --prompt "$LEFT" --max-misses hue=1
one_line "--json a folder" "--json $T: not a file" -- "$T/left.mp4" --prompt "$LEFT" --json "$T"
mkdir "$T/batch" && cp "$T/left.mp4" "$T/batch/a.mp4"
good='{"id":"a","status":"ok","output":"a.mp4","parameters":{"prompt":"'"$LEFT"'"}}'
printf '%s\n' "$good" >"$T/batch/results.jsonl"
expect_rc 0 "a results.jsonl" "a.mp4: '$LEFT': colour red direction left" -- --results "$T/batch/results.jsonl" "${ALL[@]}"
printf '%s\nGARBAGE\n' "$good" >"$T/batch/results.jsonl"
one_line "a garbage line in results.jsonl" "results.jsonl:2: not a results line" -- --results "$T/batch/results.jsonl"
printf '%s\n' "${good/$LEFT/a red fox}" >"$T/batch/results.jsonl"
one_line "a results.jsonl of another world's prompts" "not a prompt of the demo world" -- --results "$T/batch/results.jsonl"
one_line "a missing results.jsonl" "No such file" -- --results "$T/batch/nothere.jsonl"
echo "PASS: the judge finds a direction only in motion, and answers bad input with one line and exit 2"
