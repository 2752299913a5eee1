#!/usr/bin/env bash
# dlo-generate's output lock and a shared --save-latents file, as the 2026-12-07 probe broke them:
#  1. N1, V7: a FIFO, a symbolic link to /dev/zero, a folder or a dangling symbolic link at
#     .dlo-generate.lock is refused at once (exit 2, the lock named, left as it is), at 1 and 2
#     ranks; before, a FIFO hung the batch for ever and /dev/zero was read until memory ran out;
#  2. N2: a second batch given the latents file of a batch that runs is refused (exit 2, naming
#     the file and its lock FILE.h5.lock); the first batch's flags are all set; before, both ran
#     and one batch's flags (or datasets) were lost; the refused batch makes no output folder; a
#     hard link to the file is refused (its lock would not cover it: N5 of the rerun); a second
#     SIGTERM removes both locks;
#  3. resume reads the latents file: a done job whose entry lost its flag renders again, alone;
#     a batch whose ids name another job's complete entries is refused as changed (V11), a latents
#     file inside the model folder is refused (V11);
#  4. V16: an output folder removed mid-batch ends the batch at the next pass boundary (exit 1,
#     the folder named) instead of denoising every remaining job; no room for the lock is an I/O
#     error (exit 1), not bad input (where a tmpfs can be mounted);
#  5. V8: a batch in another PID namespace of this host holds its folder (where unshare works).
#   locks_cli.sh BIN_DIR
set -euo pipefail
# shellcheck source=tests/common/cli.sh
source "$(dirname "$0")/../common/cli.sh" "$1"
GEN=("$BIN/dlo-generate" --threads 1 --quiet)
"$BIN/dlo-checkpoint" make "$T/m" --preset wan-test --dtype fp32 >/dev/null
EXPECT_TIMEOUT_S=60
flags() {  # flags FILE.h5: "name=flag ..." of /_complete/NAME, sorted by name (h5py, not dlo)
  /usr/bin/python3 -c "import h5py,sys; f=h5py.File(sys.argv[1],'r'); \
print(' '.join('%s=%d' % (n, d[()]) for n, d in sorted(f['_complete'].items())))" "$1"
}
batch() {  # batch FILE PREFIX PROMPT: 3 jobs PREFIX0..2 of 5 frames at 32x48, 4 steps
  { echo "model: $T/m"; echo "defaults: {frames: 5, height: 32, width: 48, steps: 4}"; echo "jobs:"
    for i in 0 1 2; do echo "  - {id: $2$i, prompt: \"$3 $i\", seed: $i}"; done; } >"$1"
}
batch "$T/a.yaml" a "a red fox"

# ---- 1. odd things at the lock's path
mkdir -p "$T/n1"
for kind in fifo devzero folder dangling fifolink; do
  rm -rf "$T/n1/.dlo-generate.lock" "$T/fifo"
  case $kind in
    fifo) mkfifo "$T/n1/.dlo-generate.lock"; says="is a FIFO, not a regular file" ;;
    devzero) ln -s /dev/zero "$T/n1/.dlo-generate.lock"; says="is a symbolic link to a character device ('/dev/zero')" ;;
    folder) mkdir "$T/n1/.dlo-generate.lock"; says="is a folder, not a regular file" ;;
    dangling) ln -s "$T/nowhere" "$T/n1/.dlo-generate.lock"; says="is a symbolic link to '$T/nowhere', which does not exist" ;;
    fifolink) mkfifo "$T/fifo"; ln -s "$T/fifo" "$T/n1/.dlo-generate.lock"; says="is a symbolic link to a FIFO" ;;
  esac
  before=$(stat -c %F "$T/n1/.dlo-generate.lock")
  t0=$(date +%s)
  expect 2 "$T/n1.log" "${GEN[@]}" --jobs "$T/a.yaml" --output-dir "$T/n1"
  grep -qF "the lock file '$T/n1/.dlo-generate.lock' $says" "$T/n1.log" || fail "lock $kind: $(cat "$T/n1.log")"
  [ "$(stat -c %F "$T/n1/.dlo-generate.lock")" = "$before" ] || fail "lock $kind: changed"
  [ ! -e "$T/n1/results.jsonl" ] || fail "lock $kind: results.jsonl was made"
  echo "ok: a lock that is $kind: exit 2 in $(($(date +%s) - t0)) s, named, left as it was"
done
rm -f "$T/n1/.dlo-generate.lock"
mkfifo "$T/n1/.dlo-generate.lock"
DLO_GATHER_TIMEOUT_S=20 expect 2 "$T/n1m.log" mpirun -np 2 -x DLO_GATHER_TIMEOUT_S "${GEN[@]}" --jobs "$T/a.yaml" --output-dir "$T/n1"
grep -qF "is a FIFO, not a regular file" "$T/n1m.log" || fail "FIFO lock at 2 ranks: $(cat "$T/n1m.log")"
! grep -q "did not arrive" "$T/n1m.log" || fail "FIFO lock at 2 ranks: a rank was waited for: $(cat "$T/n1m.log")"
echo "ok: a FIFO lock at 2 ranks: exit 2, named, no rank waited for"

# ---- 2. two batches on one latents file
batch "$T/b.yaml" b "an owl"
"$BIN/dlo-generate-testhooks" "${GEN[@]:1}" --jobs "$T/a.yaml" --output-dir "$T/A" --save-latents "$T/lat.h5" --slow-decode-ms 3000 >"$T/A.log" 2>&1 &
apid=$!
for _ in $(seq 300); do [ -e "$T/lat.h5.lock" ] && break; sleep 0.1; done
[ -e "$T/lat.h5.lock" ] || fail "batch A took no lock beside its latents file: $(cat "$T/A.log")"
expect 2 "$T/B.log" "${GEN[@]}" --jobs "$T/b.yaml" --output-dir "$T/B" --save-latents "$T/lat.h5"
grep -qF "the latents file '$T/lat.h5' is in use by another run (host $(hostname), pid $apid" "$T/B.log" \
  || fail "second batch on the latents file: $(cat "$T/B.log")"
grep -qF "lock file '$T/lat.h5.lock'" "$T/B.log" || fail "the latents lock not named: $(cat "$T/B.log")"
[ ! -e "$T/B" ] || fail "the batch refused for its latents file left its output folder behind"
# The lock is named after the path: a second name (a hard link) of the file is refused (probe N5).
ln "$T/lat.h5" "$T/other.h5"
expect 2 "$T/N5.log" "${GEN[@]}" --jobs "$T/b.yaml" --output-dir "$T/B" --save-latents "$T/other.h5"
grep -qF -- "--save-latents: '$T/other.h5' has 2 hard links" "$T/N5.log" || fail "a hard link to the latents file: $(cat "$T/N5.log")"
[ ! -e "$T/B" ] && [ ! -e "$T/other.h5.lock" ] || fail "the batch refused for a hard link wrote something"
rm "$T/other.h5"
wait $apid || fail "batch A: exit $?: $(cat "$T/A.log")"
[ "$(flags "$T/lat.h5")" = "a0=1 a1=1 a2=1" ] || fail "batch A's flags: $(flags "$T/lat.h5")"
[ ! -e "$T/lat.h5.lock" ] || fail "the latents lock was left behind"
echo "ok: a second batch on a latents file in use, or on a hard link to it, is refused (exit 2, named, no folder made); the first's flags all set, its lock removed"

# Both locks go when a second signal ends the batch at once (1 rank: _Exit; 2 ranks: MPI_Abort).
for np in 1 2; do
  rm -rf "$T/S" "$T/lat2.h5"
  mpirun -np $np "$BIN/dlo-generate-testhooks" "${GEN[@]:1}" --jobs "$T/a.yaml" --output-dir "$T/S" --save-latents "$T/lat2.h5" --slow-decode-ms 5000 \
    >"$T/S.log" 2>&1 &
  spid=$!
  ranks() { pgrep -f "^$BIN/dlo-generate-testhooks .*--output-dir $T/S " || true; }
  for _ in $(seq 300); do [ -e "$T/lat2.h5.lock" ] && [ "$(ranks | wc -l)" -ge $np ] && break; sleep 0.1; done
  sleep 2  # decodes queued behind the slow VAE
  kill -TERM $(ranks); sleep 0.5; kill -TERM $(ranks) 2>/dev/null || true
  set +e; wait $spid; rc=$?; set -e
  [ "$rc" = 143 ] || fail "np $np: two SIGTERMs: exit $rc, want 143: $(cat "$T/S.log")"
  [ ! -e "$T/S/.dlo-generate.lock" ] && [ ! -e "$T/lat2.h5.lock" ] || fail "np $np: a lock was left: $(ls -a "$T/S" "$T")"
  echo "ok: np $np: a second SIGTERM removes both locks (the output folder's and the latents file's)"
done

# ---- 3. resume reads the latents file
/usr/bin/python3 -c "import h5py,sys; f=h5py.File(sys.argv[1],'r+'); f['_complete/a1'][()]=0" "$T/lat.h5"
"$BIN/dlo-generate" --threads 1 --jobs "$T/a.yaml" --output-dir "$T/A" --save-latents "$T/lat.h5" >"$T/A2.log" 2>&1 \
  || fail "resume: $(cat "$T/A2.log")"
grep -q "1 job(s) to render, 2 already done" "$T/A2.log" || fail "a done job without its latents flag: $(cat "$T/A2.log")"
[ "$(flags "$T/lat.h5")" = "a0=1 a1=1 a2=1" ] || fail "after resume: $(flags "$T/lat.h5")"
batch "$T/a-other.yaml" a "a blue whale"  # the same ids, other jobs
expect 2 "$T/V11.log" "${GEN[@]}" --jobs "$T/a-other.yaml" --output-dir "$T/C" --save-latents "$T/lat.h5"
grep -qF "job 1 (id 'a1'): its entry in the latents file '$T/lat.h5' holds other parameters" "$T/V11.log" \
  || fail "another job's latents: $(cat "$T/V11.log")"
[ "$(flags "$T/lat.h5")" = "a0=1 a1=1 a2=1" ] || fail "the refused batch changed the flags: $(flags "$T/lat.h5")"
expect 2 "$T/V11m.log" "${GEN[@]}" --jobs "$T/a.yaml" --output-dir "$T/D" --save-latents "$T/m/lat.h5"
grep -qF -- "command line: --save-latents: '$T/m/lat.h5' is inside the model folder" "$T/V11m.log" \
  || fail "latents in the model folder: $(cat "$T/V11m.log")"
[ ! -e "$T/m/lat.h5" ] && [ ! -e "$T/D" ] || fail "latents in the model folder: something was written"
echo "ok: resume renders a done job whose latents flag is 0; another job's entry and the model folder are refused"

# ---- 4. the output folder removed mid-batch; no room for the lock
{ echo "model: $T/m"; echo "defaults: {frames: 5, height: 32, width: 48, steps: 40}"; echo "jobs:"
  for i in $(seq 0 7); do echo "  - {id: r$i, prompt: \"prompt $i\", seed: $i}"; done; } >"$T/rm.yaml"
t0=$(date +%s)
"$BIN/dlo-generate" --threads 1 --jobs "$T/rm.yaml" --output-dir "$T/R" >"$T/R.log" 2>&1 &
rpid=$!
wait_for_results "$T/R/results.jsonl" 1
job_s=$(($(date +%s) - t0))  # the first job, start-up included
rm -rf "$T/R"
t0=$(date +%s)
set +e
wait $rpid
rc=$?
set -e
gone_s=$(($(date +%s) - t0))
[ "$rc" = 1 ] || fail "output folder removed: exit $rc, want 1: $(cat "$T/R.log")"
# rm -rf unlinks the lock inside before the folder: the run may see either first (a CI run of
# 2026-12-08 saw the lock gone while the folder still stood); both stop the batch, naming the folder.
grep -qF -e "the folder '$T/R' was removed while this run held it" \
  -e "the lock file '$T/R/.dlo-generate.lock' of the output folder '$T/R' was removed or replaced while this run held it" \
  "$T/R.log" || fail "output folder removed: $(cat "$T/R.log")"
! grep -q "does not exist" "$T/R.log" || fail "output folder removed: jobs went on and failed: $(cat "$T/R.log")"
echo "ok: an output folder removed mid-batch: exit 1 in $gone_s s (the first job took $job_s s; 7 were left), named"

if mkdir -p "$T/full" && mount -t tmpfs -o size=64k tmpfs "$T/full" 2>/dev/null; then
  mkdir "$T/full/out"
  dd if=/dev/zero of="$T/full/fill" bs=4k 2>/dev/null || true
  set +e
  timeout 60 "${GEN[@]}" --jobs "$T/a.yaml" --output-dir "$T/full/out" >"$T/full.log" 2>&1
  rc=$?
  set -e
  umount "$T/full"
  [ "$rc" = 1 ] || fail "no room for the lock: exit $rc, want 1: $(cat "$T/full.log")"
  grep -q "lock file '$T/full/out/.dlo-generate.lock': No space left on device" "$T/full.log" \
    || fail "no room for the lock: $(cat "$T/full.log")"
  echo "ok: no room for the lock file: exit 1 (an I/O error), named"
else
  echo "skipped: no room for the lock (no tmpfs can be mounted here)"
fi

# ---- 5. a holder in another PID namespace of this host
if unshare --pid --fork --kill-child true 2>/dev/null; then
  unshare --pid --fork --kill-child "$BIN/dlo-generate-testhooks" "${GEN[@]:1}" --jobs "$T/a.yaml" --output-dir "$T/NS" --slow-decode-ms 3000 \
    >"$T/NS.log" 2>&1 &
  nspid=$!
  for _ in $(seq 300); do grep -qs '^pid_ns ' "$T/NS/.dlo-generate.lock" && break; sleep 0.1; done
  grep -qs '^pid_ns ' "$T/NS/.dlo-generate.lock" || fail "the lock names no PID namespace: $(cat "$T/NS.log")"
  expect 2 "$T/NS2.log" "${GEN[@]}" --jobs "$T/a.yaml" --output-dir "$T/NS"
  grep -q "is in use by another run (host $(hostname), pid [0-9]* in another PID namespace" "$T/NS2.log" \
    || fail "a holder in another PID namespace: $(cat "$T/NS2.log")"
  wait $nspid || fail "the batch in its own PID namespace: $(cat "$T/NS.log")"
  [ "$(grep -c '"status":"ok"' "$T/NS/results.jsonl")" = 3 ] || fail "PID namespace: $(cat "$T/NS/results.jsonl")"
  echo "ok: a batch in another PID namespace of this host holds its folder (the second refused)"
else
  echo "skipped: a holder in another PID namespace (unshare --pid is not allowed here)"
fi
