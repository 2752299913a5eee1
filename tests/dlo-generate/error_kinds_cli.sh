#!/usr/bin/env bash
# Errors by kind through dlo-generate --jobs at 2 ranks, with the default gather timeout (600 s):
#  1. an I/O error on rank 1 only, mid-batch (--fail-io-at-pass): both ranks end within seconds,
#     with rank 1's own message, exit 1; what rank 0 recorded before stays;
#  2. rank 0 cannot append results.jsonl (a full disk, a tmpfs the test mounts; skipped without
#     the rights), or open it (a dangling symbolic link): every rank ends at once with that
#     message, exit 1;
#  3. a transfer failure at the last block of a pass, and at a middle one (--fail-at-block on rank
#     1): every rank ends at once naming the transfer, exit 1, and no job is recorded as failed
#     for it (a transfer fault is not the job's).
# (A rank that cannot see the model folder, or sees another model: hardening_cli.sh.)
#   error_kinds_cli.sh BIN_DIR
set -euo pipefail
BIN=$(cd "$1" && pwd)
T=$(mktemp -d)
MNT=""
cleanup() {
  pkill -KILL -f "$T/" 2>/dev/null || true
  [ -n "$MNT" ] && umount "$MNT" 2>/dev/null || true
  rm -rf "$T"
}
trap cleanup EXIT
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
unset DLO_GATHER_TIMEOUT_S  # the default 600 s: nothing below may wait for it
fail() { echo "FAIL: $*"; exit 1; }
"$BIN/dlo-checkpoint" make "$T/m" --preset wan-test --layers 3 --dtype bf16 --shard-size 20KB >/dev/null
{ echo "model: m"; echo "output_dir: out"; echo "defaults: {frames: 5, height: 32, width: 48, steps: 40}"; echo "jobs:"
  for i in $(seq 0 11); do echo "  - {id: j$i, prompt: \"prompt $i\", seed: $i}"; done; } >"$T/jobs.yaml"
GEN=("$BIN/dlo-generate" --threads 1 --quiet --jobs "$T/jobs.yaml")

# run LOG ARGS...: runs mpirun -np 2 dlo-generate, sets RC and SECONDS_TAKEN.
run() {
  local log=$1; shift
  local t0 t1
  t0=$(date +%s.%N)
  set +e
  timeout 120 mpirun -np 2 "$@" >"$log" 2>&1
  RC=$?
  set -e
  t1=$(date +%s.%N)
  SECONDS_TAKEN=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
}
within() { python3 -c "import sys; sys.exit(0 if $1 <= $2 else 1)"; }

# A clean run's length, for scale: the faults below end long before it would.
run "$T/clean.log" "${GEN[@]}" --output-dir "$T/clean"
[ "$RC" = 0 ] || fail "clean run: exit $RC: $(cat "$T/clean.log")"
echo "ok: a clean run of the batch takes $SECONDS_TAKEN s"

# 1. I/O error on rank 1 at pass 30 (mid-batch: rank 0 has recorded nothing yet, or a few).
run "$T/io.log" "$BIN/dlo-generate-testhooks" "${GEN[@]:1}" --output-dir "$T/io" --fail-io-at-pass 30 --fail-rank 1
[ "$RC" = 1 ] || fail "io error on rank 1: exit $RC, want 1: $(cat "$T/io.log")"
grep -q "\[1/2\] fatal: pass 30: injected I/O failure (test hook)" "$T/io.log" || fail "io error: rank 1's message missing: $(cat "$T/io.log")"
! grep -q "did not arrive\|has not finished in" "$T/io.log" || fail "io error: a timeout was waited for: $(cat "$T/io.log")"
within "$SECONDS_TAKEN" 8 || fail "io error on rank 1: the ranks took $SECONDS_TAKEN s to end"
echo "ok: an I/O error on rank 1 mid-batch ends both ranks in $SECONDS_TAKEN s with its message, exit 1"

# 2. results.jsonl on a full disk (rank 0's I/O): needs a tmpfs mount (root in a mount namespace).
if mkdir -p "$T/fs" && mount -t tmpfs -o size=192k tmpfs "$T/fs" 2>/dev/null; then
  MNT="$T/fs"
  mkdir "$T/fs/out"
  # Leave room for about one video, then nothing.
  avail=$(df -k --output=avail "$T/fs" | tail -1)
  fallocate -l $(( (avail - 8) * 1024 )) "$T/fs/fill" 2>/dev/null || head -c $(( (avail - 8) * 1024 )) /dev/zero >"$T/fs/fill"
  run "$T/full.log" "${GEN[@]}" --output-dir "$T/fs/out"
  [ "$RC" = 1 ] || fail "full disk: exit $RC, want 1: $(cat "$T/full.log")"
  grep -q "fatal: .*No space left on device" "$T/full.log" || fail "full disk: no message: $(cat "$T/full.log")"
  ! grep -q "did not arrive\|has not finished in" "$T/full.log" || fail "full disk: a timeout was waited for: $(cat "$T/full.log")"
  within "$SECONDS_TAKEN" 15 || fail "full disk: the ranks took $SECONDS_TAKEN s to end"
  echo "ok: rank 0 unable to append results.jsonl (disk full) ends every rank in $SECONDS_TAKEN s: $(grep -o 'fatal: .*' "$T/full.log" | head -1)"
  umount "$T/fs"
  MNT=""
else
  echo "skip: cannot mount a tmpfs here (not root?): the full-disk case is not run"
fi

# 2b. results.jsonl a dangling symbolic link: rank 0 cannot open it after the plan is shared, in
#     the app, not the wave (run_tool's path): every rank ends at once, exit 1.
mkdir -p "$T/dangling"
ln -s "$T/no/such/folder/results.jsonl" "$T/dangling/results.jsonl"
run "$T/dangling.log" "${GEN[@]}" --output-dir "$T/dangling"
[ "$RC" = 1 ] || fail "dangling results.jsonl: exit $RC, want 1: $(cat "$T/dangling.log")"
grep -q "\[0/2\] fatal: dlo-generate: cannot open .*results.jsonl' for appending" "$T/dangling.log" \
  || fail "dangling results.jsonl: no message: $(cat "$T/dangling.log")"
within "$SECONDS_TAKEN" 8 || fail "dangling results.jsonl: the ranks took $SECONDS_TAKEN s to end"
echo "ok: rank 0 unable to open results.jsonl ends every rank in $SECONDS_TAKEN s, exit 1"

# 3. A transfer failure on rank 1, at the last block of a pass (block 2 of 3) and at a middle one.
for block in 2 1; do
  run "$T/t$block.log" "$BIN/dlo-generate-testhooks" "${GEN[@]:1}" --output-dir "$T/t$block" --offload dlo --fail-at-block $block --fail-rank 1
  [ "$RC" = 1 ] || fail "transfer fault at block $block: exit $RC, want 1: $(cat "$T/t$block.log")"
  grep -q "\[1/2\] fatal: .*injected fault while transferring block $block" "$T/t$block.log" \
    || fail "transfer fault at block $block: no message: $(cat "$T/t$block.log")"
  ! grep -q "did not arrive\|has not finished in" "$T/t$block.log" || fail "transfer fault: a timeout was waited for"
  ! grep -qs '"status":"failed"' "$T/t$block/results.jsonl" || fail "a transfer fault was recorded as a job's failure"
  within "$SECONDS_TAKEN" 8 || fail "transfer fault at block $block: the ranks took $SECONDS_TAKEN s to end"
  echo "ok: a transfer failure at block $block (of 3) on rank 1 ends every rank in $SECONDS_TAKEN s, no job blamed"
done

echo "all ok"
