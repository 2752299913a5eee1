#!/usr/bin/env bash
# configs/slurm/dlo-generate.sbatch on a real single-node Slurm (Debian's slurmctld, slurmd and
# munge, started here by tests/slurm/slurm_cluster.sh and stopped on every exit path):
#   0. the script's own #SBATCH --signal=TERM@120 under --time=1: Slurm signals every task itself
#      (a shell that traps SIGTERM; submitted first, it runs alongside 1-3, and the signal comes at
#      slurmctld's first time-limit check, about 30 s in); the job ends before its limit, 143;
#   1. a 2-task job runs the program as ranks 0 and 1 of one MPI world through srun --mpi=pmix
#      and ends COMPLETED with exit code 0 and its output written;
#   2. a job whose ranks get SIGTERM as Slurm delivers --signal=TERM@T (to every task of the step,
#      not the batch shell) ends on every rank within a bounded time; the script reports the stop
#      and ends with exit code 143 (a state a rerun/requeue keys on);
#   3. with DLO_MAX_REQUEUES=1 a job stopped by the signal is requeued once, then fails;
#   4. a job that holds no GPU, without DLO_DEVICE=cpu, is refused before srun (exit 2, named):
#      the script never falls back to the CPU silently.
# Cases 0-3 run with DLO_DEVICE=cpu (the test cluster has no GPUs).
#
#   tests/slurm/sbatch_generate.sh BIN_DIR PYTHON3
# Exit 77 (skip) when the Slurm or munge binaries are absent or when not root.
#
# The program under test is a variable: until dlo-generate takes --jobs, dlo-forward runs through
# the same sbatch script (DLO_BIN). To switch, change the block "the program under test" below
# (PROGRAM, RUN_ARGS, LONG_ARGS, SIGNAL_OUTCOME, READY_REGEX, check_run).
set -uo pipefail
BIN_DIR=$(cd "${1:?usage: sbatch_generate.sh BIN_DIR PYTHON3}" && pwd)
PYTHON3=${2:-python3}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SBATCH_SCRIPT=$SRC/configs/slurm/dlo-generate.sbatch
T0=$(date +%s%N)
secs() { awk -v a="$1" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }
say() { echo "[sbatch_generate $(secs "$T0")s] $*"; }

for b in munged mungekey slurmctld slurmd sbatch squeue scontrol scancel srun sinfo; do
  command -v "$b" >/dev/null || { echo "SKIP: $b not found (tools/setup.sh installs slurmctld slurmd slurm-client munge)"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "SKIP: the test cluster's slurmd must run as root"; exit 77; }

# shellcheck source=tests/slurm/slurm_cluster.sh
source "$SRC/tests/slurm/slurm_cluster.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
  OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
FAILED=0
fail() {
  echo "FAIL: $*"
  FAILED=1
  [ -n "${JOB_LOG:-}" ] && _slurm_tail "$JOB_LOG" 40
  _slurm_tail "$SLURM_CLUSTER_DIR/log/slurmd.log" 15
  _slurm_tail "$SLURM_CLUSTER_DIR/log/slurmctld.log" 15
}

slurm_cluster_start 4 || { echo "FAIL: the test cluster did not start"; exit 1; }
W=$SLURM_CLUSTER_DIR/work
mkdir -p "$W"

# ---- the program under test: dlo-generate --jobs ------------------------------------------------
"$BIN_DIR/dlo-checkpoint" make "$W/M" --preset wan-test --layers 2 --in-channels 16 --out-channels 16 >"$W/make.log" 2>&1 \
  || { cat "$W/make.log"; echo "FAIL: dlo-checkpoint make"; exit 1; }
PROGRAM=$BIN_DIR/dlo-generate
{ echo "model: M"; echo "defaults: {frames: 5, height: 32, width: 48, steps: 2}"; echo "jobs:"
  for i in 0 1 2; do echo "  - {id: r$i, prompt: \"prompt $i\", seed: $i}"; done; } >"$W/run.yaml"
# Runs far longer than the test: only the signal ends it.
{ echo "model: M"; echo "defaults: {frames: 5, height: 32, width: 48, steps: 200}"; echo "jobs:"
  for i in $(seq 0 99); do echo "  - {id: l$i, prompt: \"prompt $i\", seed: $i}"; done; } >"$W/long.yaml"
RUN_ARGS=(--jobs "$W/run.yaml" --output-dir "$W/run" --offload dlo --threads 1 --report "$W/run/report.json")
LONG_ARGS=(--jobs "$W/long.yaml" --output-dir "$W/long" --offload dlo --threads 1)
# dlo-generate stops at a pass boundary on SIGTERM and exits 143 on every rank.
SIGNAL_OUTCOME=${SIGNAL_OUTCOME:-Exited with exit code 143}
# The first progress line: the ranks are past start-up (signal handlers installed).
READY_REGEX=${READY_REGEX:-jobs [0-9]+ done}
# Case 1's outputs: 3 videos, 3 ok results, and the report has ranks 0 and 1 of a world of 2.
check_run() {
  [ "$(grep -c '"status":"ok"' "$W/run/results.jsonl" 2>/dev/null)" = 3 ] && [ -s "$W/run/r2.mp4" ] \
    || { fail "case 1: not 3 videos and 3 ok results in $W/run"; return; }
  "$PYTHON3" - "$W/run/report.json" <<'EOF' || fail "case 1: the report does not show ranks 0 and 1 of one world of 2"
import json, sys
r = json.load(open(sys.argv[1]))
ranks = sorted(x["rank"] for x in r["ranks"])
print("report:", r["choice"], "| ranks", ranks, "| local ranks", sorted(x["local_rank"] for x in r["ranks"]))
assert ranks == [0, 1], ranks
assert "2 rank(s)" in r["choice"], r["choice"]
assert sorted(x["local_rank"] for x in r["ranks"]) == [0, 1]
# Both ranks denoised (each its own jobs, or both in one group: the topology the run chose).
assert sorted(set(x for j in r["jobs"] for x in j["ranks"])) == [0, 1], "both ranks rendered"
EOF
}
# -------------------------------------------------------------------------------------------------
mkdir -p "$W/run" "$W/long"
PROG_NAME=$(basename "$PROGRAM" | cut -c1-15)
# The program's processes started by this cluster (the tag travels in the job's environment).
prog_pids() {
  local p
  for p in $(_slurm_tagged_pids); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$PROG_NAME" ] && echo "$p"
  done
  return 0
}
submit() {  # submit LOG [sbatch options] -- [program args]: prints the job id
  local log=$1; shift
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  DLO_BIN=$PROGRAM DLO_DEVICE=${DLO_DEVICE-cpu} sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --time=5 \
    --output="$log" --chdir="$W" "${opts[@]}" "$SBATCH_SCRIPT" "$@"
}
all_ranks_ended_by() {  # all_ranks_ended_by LOG OUTCOME: srun reports tasks 0 and 1 ending with OUTCOME
  local ended
  ended=" $(slurm_tasks_ended "$1" "$2" | cut -d@ -f1 | tr '\n' ' ')"
  [[ "$ended" == *" 0 "* && "$ended" == *" 1 "* ]]
}

# ---- case 0 (submitted first, checked last): the #SBATCH --signal directive itself -------------
cat > "$W/term.sh" <<'EOF'
#!/bin/bash
trap 'echo "task $SLURM_PROCID: SIGTERM"; exit 143' TERM
echo "task $SLURM_PROCID: up"
while :; do sleep 0.2; done
EOF
chmod +x "$W/term.sh"
T_SIG=$(date +%s%N)
J_SIG=$(PROGRAM=$W/term.sh submit "$W/signal.log" --time=1 --) || { fail "case 0: sbatch refused the script"; exit 1; }

# ---- case 1: a 2-task job completes -------------------------------------------------------------
t=$(date +%s%N)
JOB_LOG=$W/run.log
J=$(submit "$JOB_LOG" -- "${RUN_ARGS[@]}") || { fail "case 1: sbatch refused the script"; exit 1; }
STATE=$(slurm_job_wait "$J" 60)
EXIT=$(slurm_job_field "$J" ExitCode)
say "case 1: job $J $STATE, exit code $EXIT, in $(secs "$t") s"
[ "$STATE" = COMPLETED ] && [ "$EXIT" = 0:0 ] || fail "case 1: job $J ended $STATE with exit code $EXIT (want COMPLETED 0:0)"
grep -q "2 task(s) on 1 node(s).*srun --mpi=pmix" "$JOB_LOG" || fail "case 1: the job log does not show 2 tasks launched by srun --mpi=pmix"
check_run

# ---- case 2: SIGTERM to every rank of the step --------------------------------------------------
t=$(date +%s%N)
JOB_LOG=$W/long.log
J=$(submit "$JOB_LOG" -- "${LONG_ARGS[@]}") || { fail "case 2: sbatch refused the script"; exit 1; }
end=$(( $(date +%s) + 60 ))
until [ "$(prog_pids | wc -l)" -eq 2 ] && { [ -z "$READY_REGEX" ] || grep -Eq "$READY_REGEX" "$JOB_LOG" 2>/dev/null; }; do
  [ "$(date +%s)" -lt "$end" ] || { fail "case 2: 2 $PROG_NAME processes not running within 60 s (job $(slurm_job_field "$J" JobState))"; break; }
  sleep 0.2
done
PIDS=$(prog_pids | tr '\n' ' ')
say "case 2: job $J running as $PROG_NAME $PIDS after $(secs "$t") s; SIGTERM to its steps"
# The delivery of --signal=TERM@T (no B:): every task of every step, not the batch shell.
t=$(date +%s%N)
scancel --signal=TERM "$J" || fail "case 2: scancel --signal=TERM $J"
_slurm_wait_for 30 eval 'test -z "$(prog_pids)"' || fail "case 2: $PROG_NAME still running 30 s after SIGTERM: $(prog_pids | tr '\n' ' ')"
GONE=$(secs "$t")
STATE=$(slurm_job_wait "$J" 30)
EXIT=$(slurm_job_field "$J" ExitCode)
say "case 2: every rank gone $GONE s after SIGTERM; job $STATE, exit code $EXIT"
all_ranks_ended_by "$JOB_LOG" "$SIGNAL_OUTCOME" \
  || fail "case 2: srun does not report ranks 0 and 1 ended by SIGTERM ($SIGNAL_OUTCOME)"
grep -q "stopped by SIGTERM" "$JOB_LOG" || fail "case 2: the script did not report the stop"
[ "$STATE" = FAILED ] && [ "$EXIT" = 143:0 ] || fail "case 2: job $J ended $STATE with exit code $EXIT (want FAILED 143:0)"
for f in "$W"/long/*.mp4; do  # every video under a final name is a finished, recorded job
  [ -e "$f" ] || continue
  grep -q "\"output\":\"$f\"" "$W/long/results.jsonl" || fail "case 2: $f is not a recorded job"
done

# ---- case 3: DLO_MAX_REQUEUES=1 requeues a stopped job once -------------------------------------
t=$(date +%s%N)
JOB_LOG=$W/requeue.log
printf '#!/bin/sh\necho "rank $SLURM_PROCID restart ${SLURM_RESTART_COUNT:-0}"; exit 143\n' >"$W/exit143.sh"
chmod +x "$W/exit143.sh"
J=$(PROGRAM=$W/exit143.sh DLO_MAX_REQUEUES=1 submit "$JOB_LOG" --requeue --) \
  || { fail "case 3: sbatch refused the script"; exit 1; }
end=$(( $(date +%s) + 60 ))
while STATE=$(slurm_job_field "$J" JobState); RESTARTS=$(slurm_job_field "$J" Restarts); \
      ! { [ "$STATE" = FAILED ] && [ "${RESTARTS:-0}" -ge 1 ]; }; do
  [ "$(date +%s)" -lt "$end" ] || { fail "case 3: job $J is $STATE after $RESTARTS restart(s) (want FAILED after 1) at 60 s"; break; }
  sleep 0.25
done
say "case 3: job $J $STATE after $RESTARTS restart(s), exit code $(slurm_job_field "$J" ExitCode), in $(secs "$t") s"
[ "$(grep -c "requeueing (restart 1 of 1)" "$JOB_LOG")" -eq 1 ] || fail "case 3: the log does not show exactly one requeue"
grep -q "rank 1 restart 1" "$JOB_LOG" || fail "case 3: the requeued run did not start (no 'rank 1 restart 1')"

# ---- case 4: no GPU in the job and no DLO_DEVICE: refused before srun, not a silent CPU run -------
JOB_LOG=$W/nogpu.log
J=$(DLO_DEVICE= submit "$JOB_LOG" -- "${RUN_ARGS[@]}") || { fail "case 4: sbatch refused the script"; exit 1; }
STATE=$(slurm_job_wait "$J" 60)
EXIT=$(slurm_job_field "$J" ExitCode)
say "case 4: job $J without a GPU: $STATE, exit code $EXIT"
[ "$STATE" = FAILED ] && [ "$EXIT" = 2:0 ] || fail "case 4: job $J ended $STATE with exit code $EXIT (want FAILED 2:0)"
grep -q "this job holds no GPU: submit with --gpus-per-task=1" "$JOB_LOG" || fail "case 4: no message about the missing GPU"
! grep -q "task(s) on" "$JOB_LOG" || fail "case 4: srun ran"

# ---- case 0: checked now ----------------------------------------------------------------------
JOB_LOG=$W/signal.log
STATE=$(slurm_job_wait "$J_SIG" 90)
EXIT=$(slurm_job_field "$J_SIG" ExitCode)
say "case 0: job $J_SIG (--time=1, --signal=TERM@120 from the script) $STATE, exit code $EXIT, after $(secs "$T_SIG") s"
grep -q "task 0: SIGTERM" "$JOB_LOG" && grep -q "task 1: SIGTERM" "$JOB_LOG" \
  || fail "case 0: not every task reports SIGTERM (a TIMEOUT state means the signal came before the tasks started)"
all_ranks_ended_by "$JOB_LOG" "Exited with exit code 143" || fail "case 0: srun does not report ranks 0 and 1 exiting 143"
[ "$STATE" = FAILED ] && [ "$EXIT" = 143:0 ] || fail "case 0: job $J_SIG ended $STATE with exit code $EXIT (want FAILED 143:0, before the time limit)"

slurm_cluster_stop
say "total $(secs "$T0") s (cluster start ${SLURM_CLUSTER_START_S} s)"
[ "$FAILED" -eq 0 ] && echo "PASS" || exit 1
