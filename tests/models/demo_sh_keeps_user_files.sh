#!/usr/bin/env bash
# tools/demo.sh deletes no file it did not write (probe V9: it removed out/demo/videos, with a
# user's notes in it, whenever out/demo/model differed from configs/demo-model). In a copy of the
# tree's demo files with this build's binaries:
#  1. the demo renders its 7 jobs (at 2 steps each);
#  2. a file the demo model lacks in out/demo/model stops it with exit 2 naming that file; the file,
#     the model and the videos are kept;
#  3. a changed model file (the file removed again): the demo installs the model over it and renders
#     every job again over its own videos (the same frames), keeping a user's file in out/demo/videos.
#   demo_sh_keeps_user_files.sh BIN_DIR PYTHON SOURCE_DIR
set -euo pipefail
# shellcheck source=tests/common/cli.sh
source "$(dirname "$0")/../common/cli.sh" "$1"
PY=${2:?python}
SRC=$(cd "${3:?source dir}" && pwd)
R=$T/tree
mkdir -p "$R/tools" "$R/configs" "$R/jobs" "$R/build"
cp "$SRC"/tools/{demo.sh,check_demo_video.py,demo_world.py} "$R/tools/"
cp -r "$SRC/configs/demo-model" "$R/configs/"
# The demo's 7 jobs at 2 steps each (what is tested here is which files it keeps, not its videos).
sed -e 's/^\( *steps:\) [0-9]*/\1 2/' -e 's/^output_dir: .*/&\ndefaults: {steps: 2}/' "$SRC/jobs/demo.yaml" >"$R/jobs/demo.yaml"
grep -q "^defaults: {steps: 2}" "$R/jobs/demo.yaml" || fail "jobs/demo.yaml has no output_dir line to follow"
ln -s "$BIN" "$R/build/bin"
ln -s "$(dirname "$(dirname "$PY")")" "$R/.venv"   # the venv's folder, so that its python finds its packages
V=$R/out/demo/videos
ok_lines() { grep -c '"status":"ok"' "$V/results.jsonl"; }

# 1.
"$R/tools/demo.sh" >"$T/log1" 2>&1 || { cat "$T/log1"; fail "the first demo: exit"; }
[ "$(ok_lines)" = 7 ] || fail "the first demo recorded $(ok_lines) jobs ok, want 7"
grep -q "^tally: colour [0-7]/7" "$T/log1" || { cat "$T/log1"; fail "the demo did not judge its 7 videos"; }
[ ! -e "$R/out/demo/model-installed" ] || fail "the demo left its new-model mark behind"
shas() { for id in red-circle-left blue-square-up yellow-triangle-right green-circle-down white-square-right \
  green-triangle-up; do sha_of "$V/results.jsonl" "$id"; done; }
before=$(shas)

# 2.
echo "my notes" >"$V/NOTES.txt"
echo "{}" >"$R/out/demo/model/tokenizer.json"
rc=0
"$R/tools/demo.sh" >"$T/log2" 2>&1 || rc=$?
[ "$rc" = 2 ] || { cat "$T/log2"; fail "an extra file in out/demo/model: exit $rc, want 2"; }
grep -q "out/demo/model holds what configs/demo-model does not: tokenizer.json" "$T/log2" ||
  { cat "$T/log2"; fail "the refusal does not name the extra file"; }
for f in "$R/out/demo/model/tokenizer.json" "$V/NOTES.txt" "$V/red-circle-left.mp4"; do
  [ -f "$f" ] || fail "the refused demo deleted $f"
done

# 3.
rm "$R/out/demo/model/tokenizer.json"
echo '{"edited": true}' >"$R/out/demo/model/training.json"
"$R/tools/demo.sh" >"$T/log3" 2>&1 || { cat "$T/log3"; fail "the demo over a changed model: exit"; }
diff -rq "$SRC/configs/demo-model" "$R/out/demo/model" >/dev/null || fail "the demo did not install the model again"
[ "$(cat "$V/NOTES.txt")" = "my notes" ] || fail "the demo deleted or changed the user's file in out/demo/videos"
[ "$(ok_lines)" = 14 ] || fail "after a changed model $(ok_lines) ok lines, want 14 (every job rendered again)"
[ "$(shas)" = "$before" ] || fail "the jobs rendered again gave other frames"
# 4. A rerun renders nothing.
"$R/tools/demo.sh" >"$T/log4" 2>&1 || { cat "$T/log4"; fail "the demo's rerun: exit"; }
[ "$(ok_lines)" = 14 ] || fail "a rerun rendered jobs again ($(ok_lines) ok lines)"
echo "PASS: tools/demo.sh refuses a foreign file in its model folder by name, renders a new model over its own videos, and deletes nothing"
