#!/usr/bin/env bash
# What SIGTERM to mpirun itself does to a batch (docs/slurm.md, "srun or mpirun"): renders a batch
# of 20 small jobs on 2 ranks, sends SIGTERM to mpirun after DELAY seconds, and prints mpirun's
# exit code, how long it took to end, the last log lines, the results recorded and whether the
# output folder's lock was left.
#   tools/bench/measure_mpirun_sigterm.sh [BIN_DIR] [DELAY_S] [SLOW_DECODE_MS]
# SLOW_DECODE_MS > 0 makes every decode that slow (a test hook), so the ranks cannot stop within
# Open MPI's odls_base_sigkill_timeout (1 s by default) and are SIGKILLed.
set -uo pipefail
BIN=$(cd "${1:-build/bin}" && pwd)
DELAY=${2:-8}
SLOW=${3:-0}
T=$(mktemp -d)
trap 'pkill -KILL -f "$T/" 2>/dev/null; rm -rf "$T"' EXIT
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
"$BIN/dlo-checkpoint" make "$T/m" --preset wan-test --layers 2 --dtype bf16 >/dev/null
{ echo "model: m"; echo "output_dir: out"; echo "defaults: {frames: 5, height: 32, width: 48, steps: 400}"; echo "jobs:"
  for i in $(seq 0 19); do echo "  - {id: j$i, prompt: \"p $i\"}"; done; } >"$T/j.yaml"
extra=()
[ "$SLOW" -gt 0 ] && extra=(--slow-decode-ms "$SLOW")
mpirun -np 2 "$BIN/dlo-generate-testhooks" --threads 1 --jobs "$T/j.yaml" "${extra[@]}" >"$T/log" 2>&1 &
M=$!
sleep "$DELAY"
t0=$(date +%s%N)
kill -TERM "$M"
wait "$M"
rc=$?
echo "mpirun exit code $rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms after SIGTERM"
grep -E "stopped by signal|job\(s\) done" "$T/log" || echo "(no stop message: the ranks were killed)"
ok=$(grep -c '"status":"ok"' "$T/out/results.jsonl" 2>/dev/null) || true
echo "results recorded: ${ok:-0}; videos: $(ls "$T/out"/*.mp4 2>/dev/null | wc -l)"
[ -e "$T/out/.dlo-generate.lock" ] && echo "the lock was left behind" || echo "the lock was released"
