# What the tool-level test scripts share, sourced after `set -euo pipefail`:
#   source "$(dirname "$0")/../common/cli.sh" "$1"
# BIN: the tools' folder (absolute); T: a fresh folder, removed on exit with every process started
# from it; MPI as root on an oversubscribed 2-core machine, one thread per rank; fail MESSAGE.
BIN=$(cd "${1:?usage: $0 BIN_DIR}" && pwd)
T=$(mktemp -d)
cleanup() { pkill -KILL -f "$T/" 2>/dev/null || true; rm -rf "$T"; }
trap cleanup EXIT
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
fail() { echo "FAIL: $*"; exit 1; }
# expect RC LOG CMD...: runs CMD under a timeout of EXPECT_TIMEOUT_S (default 120) seconds,
# stdout and stderr to LOG; fails unless it exits RC.
expect() {
  local want=$1 log=$2; shift 2
  set +e
  timeout "${EXPECT_TIMEOUT_S:-120}" "$@" >"$log" 2>&1
  local rc=$?
  set -e
  [ "$rc" = "$want" ] || fail "exit $rc, want $want: $* :: $(cat "$log")"
}
sha_of() {  # sha_of RESULTS ID: the job's last recorded frames sha256 in a results.jsonl
  grep "\"id\":\"$2\"" "$1" | tail -1 | grep -o '"frames_sha256":"[0-9a-f]*"' | cut -d'"' -f4
}
manifest() {  # manifest FILE MODEL PREFIX N STEPS: N tiny jobs PREFIX0.. (5 frames of 32x48), seeds 0..
  { echo "model: $2"; echo "defaults: {frames: 5, height: 32, width: 48, steps: $5}"; echo "jobs:"
    for i in $(seq 0 $(($4 - 1))); do echo "  - {id: $3$i, prompt: \"prompt $i\", seed: $i}"; done; } >"$1"
}
tail_manifest() {  # tail_manifest FILE: 5 guided jobs on model m (64x64, 5 frames), j2 one step longer
  cat >"$1" <<EOF
model: m
defaults: {frames: 5, height: 64, width: 64, steps: 2, guidance: 4}
jobs:
  - {id: j0, prompt: "a red fox", seed: 1}
  - {id: j1, prompt: "an owl", seed: 2}
  - {id: j2, prompt: "a boat", seed: 3, steps: 3}
  - {id: j3, prompt: "a car", seed: 4}
  - {id: j4, prompt: "an elk", seed: 5}
EOF
}
wait_for_results() {  # wait_for_results FILE N: until N ok lines in a results.jsonl (bounded)
  for _ in $(seq 600); do [ -f "$1" ] && [ "$(grep -c '"status":"ok"' "$1")" -ge "$2" ] && return 0; sleep 0.1; done
  fail "timed out waiting for $2 results in $1"
}
kill_a_rank() {  # kill_a_rank PID DIR: SIGKILL one rank of the mpirun PID writing to DIR; every rank
  # must be gone within 30 s; sets KILLED_S (seconds from the kill to mpirun's end).
  local victim t0
  victim=$(pgrep -f "^[^ ]*dlo-generate .*$2" | tail -1)
  t0=$(date +%s)
  kill -KILL "$victim"
  wait "$1" || true
  KILLED_S=$(($(date +%s) - t0))
  [ "$KILLED_S" -le 30 ] || fail "ranks lived $KILLED_S s after one was killed"
  ! pgrep -f "^[^ ]*dlo-generate .*$2" >/dev/null || fail "a rank outlived the kill"
}
