#!/usr/bin/env bash
# dlo-generate at 64 ranks on this 2-core machine (oversubscribed; a tiny model; the
# CPU acting as a device of 1 GiB per rank, since 64 ranks' share of the host would refuse even
# this model's working memory): the small collectives and the weight gathers at many ranks.
#  1. 64 ranks, 80 jobs: every job ok, the frames of the jobs also rendered at 1 rank the same
#     (a 32-rank batch ran here too until 2026-12-08: 64 covers its collectives, and CI's time is
#     short);
#  2. 64 ranks, one rank killed mid-batch: every rank ends within 60 s, nothing recorded that is
#     not whole; 64 ranks, an I/O failure on rank 63 at a pass boundary: every rank ends with that
#     rank's message (no rank waits for the timeout).
# The batch the faults interrupt has jobs of 6 steps (it had 20): the kill waits for a first job
# done, so for as many passes of all 64 ranks as a job has steps, and with 2 jobs a rank it still
# lands mid-batch; the I/O failure comes at pass 3.
# About 3 minutes and 17 GB of memory at 64 ranks: CTest runs it alone (RUN_SERIAL).
#   scale_cli.sh BIN_DIR
set -euo pipefail
# shellcheck source=tests/common/cli.sh
source "$(dirname "$0")/../common/cli.sh" "$1"
"$BIN/dlo-checkpoint" make "$T/m" --preset wan-test --layers 2 --dtype bf16 --shard-size 20KB >/dev/null
manifest "$T/j80.yaml" m s 80 2
manifest "$T/long.yaml" m s 128 6
manifest "$T/j3.yaml" m s 3 2
GEN=("$BIN/dlo-generate" --threads 1 --quiet --offload dlo --device-budget 1GiB)
MPI=(mpirun --bind-to none)
oks() { grep -c '"status":"ok"' "$1" || true; }

"${MPI[@]}" -np 1 "${GEN[@]}" --jobs "$T/j3.yaml" --output-dir "$T/one" 2>"$T/log" || fail "1 rank: $(cat "$T/log")"
"${MPI[@]}" -np 64 "${GEN[@]}" --jobs "$T/j80.yaml" --output-dir "$T/r64" 2>"$T/log" || fail "64 ranks: $(tail -5 "$T/log")"
[ "$(oks "$T/r64/results.jsonl")" = 80 ] || fail "64 ranks: $(oks "$T/r64/results.jsonl") of 80 jobs ok"
for id in s0 s1 s2; do
  [ "$(sha_of "$T/r64/results.jsonl" $id)" = "$(sha_of "$T/one/results.jsonl" $id)" ] || fail "64 ranks: $id's frames differ from 1 rank"
done
echo "ok: 64 ranks, 80 jobs: every job ok, the frames of 1 rank"

# A rank killed mid-batch at 64 ranks.
"${MPI[@]}" -np 64 "${GEN[@]}" --jobs "$T/long.yaml" --output-dir "$T/kill" >/dev/null 2>&1 &
pid=$!
wait_for_results "$T/kill/results.jsonl" 1
kill_a_rank $pid "$T/kill"
python3 - "$T/kill" <<'PY' || fail "64 ranks, a rank killed: a job recorded ok without its whole video"
import json, os, sys
for line in open(os.path.join(sys.argv[1], "results.jsonl")):
    r = json.loads(line)
    if r["status"] == "ok":
        assert os.path.getsize(r["output"]) == r["output_bytes"], r
PY
echo "ok: 64 ranks, a rank killed mid-batch: every rank ended in ${KILLED_S} s; only whole videos recorded"

# An I/O failure on the last rank at a pass boundary: every rank ends at once with its message.
t0=$(date +%s)
set +e
DLO_GATHER_TIMEOUT_S=120 "${MPI[@]}" -np 64 -x DLO_GATHER_TIMEOUT_S "$BIN/dlo-generate-testhooks" "${GEN[@]:1}" --jobs "$T/long.yaml" --output-dir "$T/io" \
  --fail-io-at-pass 3 --fail-rank 63 >"$T/io.log" 2>&1
rc=$?
set -e
dt=$(($(date +%s) - t0))
[ "$rc" != 0 ] && grep -q "\[63/64\] fatal: .*pass 3: injected I/O failure" "$T/io.log" || fail "64 ranks, an I/O failure: exit $rc: $(grep fatal "$T/io.log" | head -3)"
! grep -q "did not arrive\|has not finished in" "$T/io.log" || fail "64 ranks, an I/O failure: a timeout was waited for"
echo "ok: 64 ranks, an I/O failure on rank 63 at pass 3: every rank ended (exit $rc, $dt s with start-up) with its message"
