#!/usr/bin/env bash
# configs/slurm/dlo-generate.sbatch with --nodes 2 on a throwaway two-node Slurm cluster on this
# machine (tests/common/nodes.sh: a network and hostname namespace per node; tests/slurm/
# slurm_cluster.sh: slurmctld on node0, one slurmd per node, srun --mpi=pmix), 2 tasks per node:
#   1. a batch renders on both nodes: COMPLETED 0:0; ranks 0, 1 on node0 and 2, 3 on node1 (local
#      ranks 0, 1 on each); the host memory rule counts a node's 2 ranks; every job's frames equal
#      one node's (mpirun -np 4 here);
#   2. SIGTERM (scancel --signal=TERM, as --signal delivers it) reaches every task on both nodes:
#      they stop at a pass boundary and exit 143; with DLO_MAX_REQUEUES=1 the script requeues the
#      job, which continues on both nodes and completes the batch, every job's frames equal one
#      node's, nothing rendered twice.
#   sbatch_two_nodes.sh BIN_DIR
# Exit 77 (skip) without Slurm, munge, namespaces or root.
set -uo pipefail
BIN_DIR=$(cd "${1:?usage: sbatch_two_nodes.sh BIN_DIR}" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
for b in munged mungekey slurmctld slurmd sbatch squeue scontrol scancel srun sinfo nsenter; do
  command -v "$b" >/dev/null || { echo "SKIP: $b not found (tools/setup.sh installs slurmctld slurmd slurm-client munge)"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "SKIP: the test cluster's slurmd must run as root"; exit 77; }
set -e
# shellcheck source=tests/common/cli.sh
source "$SRC/tests/common/cli.sh" "$BIN_DIR"
# shellcheck source=tests/common/nodes.sh
source "$SRC/tests/common/nodes.sh"
nodes_available || { echo "SKIP: cannot create network namespaces here"; exit 77; }
nodes_start 2
# shellcheck source=tests/slurm/slurm_cluster.sh
source "$SRC/tests/slurm/slurm_cluster.sh"
set +e
slurm_cluster_start 4 2 || { slurm_cluster_stop; nodes_stop; fail "the two-node cluster did not start"; }
trap 'slurm_cluster_stop; cleanup; nodes_stop' EXIT
set -e

"$BIN/dlo-checkpoint" make "$T/M" --preset wan-test --layers 3 --dtype bf16 --shard-size 20KB >/dev/null
manifest "$T/run.yaml" M r 4 2
# Case 2's batch: about six waves of four jobs, so the signal (sent after the first result) lands
# with jobs still to start even on a loaded machine; with 8 jobs the batch once ended first.
LONG=24
manifest "$T/long.yaml" M r "$LONG" 30
same_as_one_node() {  # same_as_one_node REF_DIR DIR IDS...
  local ref=$1 dir=$2 id
  shift 2
  for id in "$@"; do
    [ -n "$(sha_of "$ref/results.jsonl" "$id")" ] && [ "$(sha_of "$dir/results.jsonl" "$id")" = "$(sha_of "$ref/results.jsonl" "$id")" ] \
      || fail "$dir: $id's frames differ from one node's"
  done
}
GEN=(--threads 1 --offload dlo)
mpirun -np 4 "$BIN/dlo-generate" --quiet --jobs "$T/run.yaml" --output-dir "$T/ref" "${GEN[@]}" 2>"$T/log" || fail "one node: $(cat "$T/log")"
mpirun -np 4 "$BIN/dlo-generate" --quiet --jobs "$T/long.yaml" --output-dir "$T/refl" "${GEN[@]}" 2>"$T/log" || fail "one node: $(cat "$T/log")"

# The jobs' environment (sbatch exports the submitter's): the CPU, Open MPI over the nodes' links.
export DLO_BIN=$BIN/dlo-generate DLO_DEVICE=cpu OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 \
  OMPI_MCA_btl_tcp_if_include=198.51.100.0/24
cd "$T"
submit() {  # submit LOG SBATCH_ARGS... -- ARGS...: the job id
  local log=$1 s=()
  shift
  while [ "$1" != -- ]; do s+=("$1"); shift; done
  shift
  sbatch --parsable --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 --time=10 -o "$log" "${s[@]}" \
    "$SRC/configs/slurm/dlo-generate.sbatch" "$@"
}

# 1. A batch on both nodes.
J=$(submit "$T/run.log" -- --jobs "$T/run.yaml" --output-dir "$T/run" "${GEN[@]}" --report "$T/run.json")
STATE=$(slurm_job_wait "$J" 180) || true
[ "$STATE" = COMPLETED ] && [ "$(slurm_job_field "$J" ExitCode)" = 0:0 ] || fail "case 1: job $J $STATE: $(tail -20 "$T/run.log")"
python3 - "$T/run.json" <<'PY' || fail "case 1: the ranks' facts"
import json, sys
r = json.load(open(sys.argv[1]))
where = [(x["rank"], x["host"], x["local_rank"]) for x in r["ranks"]]
assert where == [(0, "node0", 0), (1, "node0", 1), (2, "node1", 0), (3, "node1", 1)], where
assert "4 rank(s)" in r["choice"], r["choice"]
print("ok: case 1: srun put ranks", where)
PY
same_as_one_node "$T/ref" "$T/run" r0 r1 r2 r3
echo "ok: case 1: a batch on 2 nodes x 2 tasks through the sbatch script: COMPLETED, every job's frames as on one node"

# 2. SIGTERM to every task on both nodes, then the requeue continues and completes.
J=$(DLO_MAX_REQUEUES=1 submit "$T/long.log" --requeue -- --jobs "$T/long.yaml" --output-dir "$T/long" "${GEN[@]}")
wait_for_results "$T/long/results.jsonl" 1
scancel --signal=TERM "$J"
end=$(($(date +%s) + 240))
while STATE=$(slurm_job_field "$J" JobState); RESTARTS=$(slurm_job_field "$J" Restarts); \
      ! { [ "$STATE" = COMPLETED ] && [ "${RESTARTS:-0}" -ge 1 ]; }; do
  case "$STATE" in FAILED|CANCELLED|TIMEOUT|NODE_FAIL) [ "${RESTARTS:-0}" -ge 1 ] && break ;; esac
  [ "$(date +%s)" -lt "$end" ] || break
  sleep 0.5
done
[ "$STATE" = COMPLETED ] && [ "${RESTARTS:-0}" = 1 ] || fail "case 2: job $J $STATE after ${RESTARTS:-0} restart(s): $(tail -30 "$T/long.log")"
[ "$(slurm_tasks_ended "$T/long.log" "Exited with exit code 143" | tr '\n' ' ')" = "0@node0 1@node0 2@node1 3@node1 " ] \
  || fail "case 2: not every task on both nodes stopped with 143: $(grep srun: "$T/long.log")"
grep -q "requeueing (restart 1 of 1)" "$T/long.log" || fail "case 2: no requeue in the log"
[ "$(grep -c '"status":"ok"' "$T/long/results.jsonl")" = "$LONG" ] && [ "$(find "$T/long" -name '*.mp4' | wc -l)" = "$LONG" ] \
  || fail "case 2: after the requeue $(grep -c '"status":"ok"' "$T/long/results.jsonl") ok results, $(find "$T/long" -name '*.mp4' | wc -l) videos"
[ "$(python3 -c "import json,sys; print(len({json.loads(l)['id'] for l in open(sys.argv[1])}))" "$T/long/results.jsonl")" = "$LONG" ] \
  && [ "$(wc -l <"$T/long/results.jsonl")" = "$LONG" ] || fail "case 2: a job recorded twice: $(cat "$T/long/results.jsonl")"
# shellcheck disable=SC2046  # one id per word
same_as_one_node "$T/refl" "$T/long" $(seq -f 'r%g' 0 $((LONG - 1)))
echo "ok: case 2: SIGTERM stopped every task on both nodes (143); the requeued job continued on both and completed the batch, frames as on one node"
