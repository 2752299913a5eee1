#!/usr/bin/env bash
# dlo-generate across two nodes simulated on this machine (tests/common/nodes.sh: a network and
# hostname namespace per node, veth links on TEST-NET-2, Open MPI started through an rsh agent,
# TCP between the nodes), 2 ranks per node, on a random-weight model:
#  1. a batch whose tail is regrouped across the nodes: every job's frames equal one node's run;
#     each rank's host and local rank are its node's (node0: 0, 1; node1: 0, 1); the memory rule
#     counts the ranks of a node (2), not of the world (4); results.jsonl has one ok line per job
#     and every video once, in the one output folder both nodes see; the exclusive-device check
#     counts ranks per host (test_per_host: 1 rank per node shares nothing, 2 per node do); the
#     weight gather (test_per_host) puts every shard in place on every rank, in two levels (across
#     the nodes, then within) when the ranks sit node by node, flat when they alternate;
#  2. the same command started from node1 (mpirun there) resumes: every job skipped;
#  3. with node1's link shaped to 8 Mbit/s (tbf: this kernel has no netem) the batch completes with
#     the same frames, and its --save-latents FILE.h5 is one HDF5 file the ranks of both nodes wrote
#     (parallel HDF5 over MPI-IO), every job complete, read back with h5py (one render for both);
#     with every packet node1 sends held 200 ms (a tun delay line) the batch completes with the
#     same frames;
#  4. every rank of node1 killed mid-batch (its ranks; Open MPI's daemon there reports their
#     death): every rank ends within 30 s, mpirun naming node1,
#     nothing recorded as done that is not whole; the rerun on both nodes takes the dead run's lock
#     over and completes the batch;
#  5. node1's link cut mid-wave: every rank ends within the gather timeout (+ the roll call's
#     grace), rank 0 naming the phase, node1's ranks and node1; nothing recorded as done that is
#     not whole.
#   two_nodes_cli.sh BIN_DIR
# Exit 77 (skipped) where namespaces cannot be made (not root, no iproute2).
set -euo pipefail
# shellcheck source=tests/common/cli.sh
source "$(dirname "$0")/../common/cli.sh" "$1"
# shellcheck source=tests/common/nodes.sh
source "$(dirname "$0")/../common/nodes.sh"
nodes_available || { echo "SKIP: cannot create network namespaces here (root and iproute2 needed)"; exit 77; }
nodes_start 2

"$BIN/dlo-checkpoint" make "$T/m" --preset wan-test --layers 3 --dtype bf16 --shard-size 20KB >/dev/null
tail_manifest "$T/jobs.yaml"
GEN=("$BIN/dlo-generate" --threads 1 --quiet --jobs "$T/jobs.yaml" --offload dlo)
same_as_ref() {  # same_as_ref DIR: every job's frames as in the one-node run
  for id in j0 j1 j2 j3 j4; do
    [ -n "$(sha_of "$T/ref/results.jsonl" "$id")" ] && [ "$(sha_of "$1/results.jsonl" "$id")" = "$(sha_of "$T/ref/results.jsonl" "$id")" ] \
      || fail "$1: $id's frames differ from one node's"
  done
}
# Nothing recorded ok whose video is not whole: each ok line's output exists with its recorded size.
only_whole_recorded() {
  python3 - "$1" <<'PY' || fail "$1: a job recorded ok without its whole video"
import json, os, sys
for line in open(os.path.join(sys.argv[1], "results.jsonl")):
    r = json.loads(line)
    if r["status"] == "ok":
        assert os.path.getsize(r["output"]) == r["output_bytes"], r
PY
}
mpirun -np 4 "${GEN[@]}" --output-dir "$T/ref" 2>"$T/log" || fail "one node: $(cat "$T/log")"

# 1. Two nodes.
t0=$(date +%s)
nodes_mpirun 2 "${GEN[@]}" --output-dir "$T/two" --report "$T/two.json" 2>"$T/log" || fail "two nodes: $(cat "$T/log")"
two_s=$(($(date +%s) - t0))
same_as_ref "$T/two"
python3 - "$T/two.json" "$T/two/results.jsonl" <<'PY' || fail "two nodes: the ranks' facts"
import json, sys
r = json.load(open(sys.argv[1]))
where = [(x["rank"], x["host"], x["local_rank"]) for x in r["ranks"]]
assert where == [(0, "node0", 0), (1, "node0", 1), (2, "node1", 0), (3, "node1", 1)], where
lines = [json.loads(l) for l in open(sys.argv[2])]
assert sorted(l["id"] for l in lines) == ["j0", "j1", "j2", "j3", "j4"] and all(l["status"] == "ok" for l in lines), lines
tail = [l for l in lines if l["id"] == "j4"][0]
assert tail["ranks"] == [0, 1, 2, 3] and tail["parallel"] == "cfg 2 x sp 2", tail
print("ok: two nodes x 2 ranks:", where, "| the tail job on ranks", tail["ranks"], "of both nodes,", tail["parallel"])
PY
[ "$(find "$T/two" -name '*.mp4' | wc -l)" = 5 ] || fail "two nodes: $(ls "$T/two")"
# The host memory rule per node: resident weights are a node's page cache, and each of the node's
# ranks adds its working memory: 2 ranks per node on two nodes, 4 on one.
DRY=("$BIN/dlo-generate" --threads 1 --quiet --jobs "$T/jobs.yaml" --dry-run)
nodes_mpirun 2 "${DRY[@]}" --output-dir "$T/dry" >"$T/stdout" 2>"$T/log" || fail "dry run: $(cat "$T/log")"
mpirun -np 4 "${DRY[@]}" --output-dir "$T/dry1" >"$T/stdout1" 2>"$T/log" || fail "dry run: $(cat "$T/log")"
grep -q "x 2 rank(s) fit in the node's available memory" "$T/stdout" && grep -q "x 4 rank(s) fit in the node's available memory" "$T/stdout1" \
  || fail "the host memory rule is not per node: $(grep -h 'strategy' "$T/stdout" "$T/stdout1")"
echo "ok: every job's frames as on one node; one line per job, every video once; the host budget per node"
# The exclusive-device check per host: one rank per node on cuda:0 shares nothing; two per node
# share each node's device (test_per_host asserts both from the ranks' hosts, and the weight
# gather's bytes and its two levels, or one where the ranks alternate between the nodes).
nodes_mpirun 1 "$BIN/test_per_host" >"$T/log" 2>&1 || fail "per host, 1 rank per node: $(tail -20 "$T/log")"
nodes_mpirun 2 "$BIN/test_per_host" >"$T/log" 2>&1 || fail "per host, 2 ranks per node: $(tail -20 "$T/log")"
grep -q "two-level gathers over 2 nodes" "$T/log" || fail "per host: no two-level gather node by node: $(tail -5 "$T/log")"
# 3 ranks per node: as many nodes as ranks per node no longer, and a column of 2 per message.
nodes_mpirun 3 "$BIN/test_per_host" >"$T/log" 2>&1 || fail "per host, 3 ranks per node: $(tail -20 "$T/log")"
grep -q "two-level gathers over 2 nodes" "$T/log" || fail "per host: no two-level gather at 3 ranks per node: $(tail -5 "$T/log")"
nodes_mpirun 2 --map-by node "$BIN/test_per_host" >"$T/log" 2>&1 || fail "per host, ranks alternating: $(tail -20 "$T/log")"
! grep -q "two-level" "$T/log" || fail "per host: a two-level gather with the ranks alternating: $(tail -5 "$T/log")"
echo "ok: per host: the exclusive-device check (1 rank per node: none shared; 2 per node: each node's pair refused); the weight gather in two levels node by node (1, 2, 3 ranks per node), flat alternating, every shard in place, in chunks too"

# 2. Resumed from the other node.
nodes_mpirun 2 --head 1 "$BIN/dlo-generate" --threads 1 --jobs "$T/jobs.yaml" --offload dlo --output-dir "$T/two" \
  >"$T/log" 2>&1 || fail "resume from node1: $(cat "$T/log")"
grep -q "5 already done" "$T/log" && [ "$(wc -l <"$T/two/results.jsonl")" = 5 ] || fail "resume from node1: $(tail -3 "$T/log")"
echo "ok: started from node1, the same command finds every job done"

# 3. A slow link (node1's traffic shaped to 8 Mbit/s, packets queued up to 400 ms; this kernel has
# no netem for a fixed delay): slower, and the same frames; the latents of both nodes' ranks in one
# HDF5 file.
node_slow 1 8mbit
nodes_mpirun 2 "${GEN[@]}" --output-dir "$T/slow" --save-latents "$T/lat.h5" 2>"$T/log" || fail "a slow link, latents: $(cat "$T/log")"
node_slow 1 off
same_as_ref "$T/slow"
echo "ok: node1's link shaped to 8 Mbit/s: the batch completes with one node's frames"
/usr/bin/python3 - "$T/lat.h5" <<'PY' || fail "the latents file"
import sys
import h5py
with h5py.File(sys.argv[1], "r") as f:
    done = {n: int(d[()]) for n, d in f["_complete"].items()}
    assert sorted(done) == ["j0", "j1", "j2", "j3", "j4"] and all(v == 1 for v in done.values()), done
    assert all(f[k].shape == (1, 16, 2, 8, 8) for k in done), [f[k].shape for k in done]
print("ok: the latents of both nodes' jobs in one HDF5 file, every job complete")
PY

# 3c. A 200 ms delay on node1's link (every packet it sends held 200 ms: tests/common/delay_line.py,
# as netem would): every collective that crosses it waits, and the batch completes, the same frames.
node_delay 1 200
t0=$(date +%s)
nodes_mpirun 2 "${GEN[@]}" --output-dir "$T/delay" 2>"$T/log" || fail "a 200 ms delay: $(cat "$T/log")"
dt=$(($(date +%s) - t0))
node_delay 1 off
same_as_ref "$T/delay"
echo "ok: 200 ms on node1's link: the batch completes in $dt s (without the delay: $two_s s) with one node's frames"

# 4. Every rank of node1 killed mid-batch.
manifest "$T/long.yaml" m k 12 40
LONG=("$BIN/dlo-generate" --threads 1 --quiet --jobs "$T/long.yaml" --offload dlo)
nodes_mpirun 2 "${LONG[@]}" --output-dir "$T/kill" >"$T/kill.log" 2>&1 &
pid=$!
wait_for_results "$T/kill/results.jsonl" 1
t0=$(date +%s)
node_kill 1 "dlo-generate"  # its ranks, not Open MPI's daemon, which reports their death
set +e
wait $pid
rc=$?
set -e
dt=$(($(date +%s) - t0))
[ "$rc" != 0 ] && [ "$dt" -le 30 ] || fail "node1 killed: exit $rc after $dt s"
grep -q "on node node1" "$T/kill.log" || fail "node1 killed: the message does not name the node: $(tail -5 "$T/kill.log")"
! pgrep -f "^[^ ]*dlo-generate .*$T/kill" >/dev/null || fail "node1 killed: a rank outlived it"
only_whole_recorded "$T/kill"
echo "ok: node1's ranks killed: every rank ended in $dt s (exit $rc), the node named; only whole videos recorded"
# The rerun on the two nodes again: rank 0 on node0, the host of the dead run's lock, sees that
# run's process gone and takes the folder over (from another host it would wait for the lock to
# go stale: a process elsewhere cannot be checked).
nodes_mpirun 2 "$BIN/dlo-generate" --threads 1 --jobs "$T/long.yaml" --offload dlo --output-dir "$T/kill" >"$T/log" 2>&1 \
  || fail "the rerun after node1's death: $(cat "$T/log")"
grep -q "took over the lock" "$T/log" || fail "the rerun did not take over the dead run's lock: $(head -3 "$T/log")"
[ "$(grep -c '"status":"ok"' "$T/kill/results.jsonl")" = 12 ] || fail "the rerun did not complete the batch"
only_whole_recorded "$T/kill"
echo "ok: the rerun on both nodes takes the dead run's lock over and completes the batch"

# 5. node1's link cut mid-wave: the gathers time out and every rank ends, naming the phase.
export DLO_GATHER_TIMEOUT_S=10
nodes_mpirun 2 "${LONG[@]}" --output-dir "$T/cut" >"$T/cut.log" 2>&1 &
pid=$!
wait_for_results "$T/cut/results.jsonl" 1
t0=$(date +%s)
node_link 1 down
# mpirun's own daemon on node1 is cut off too: the ranks end by themselves (rank 0 names the
# ranks it did not hear from), while mpirun waits for that daemon; the test ends mpirun once every
# rank is gone (a batch system ends the job's processes the same way).
for _ in $(seq 90); do pgrep -f "^[^ ]*dlo-generate .*$T/cut" >/dev/null || break; sleep 1; done
dt=$(($(date +%s) - t0))
node_link 1 up
pgrep -f "^[^ ]*dlo-generate .*$T/cut" >/dev/null && fail "link cut: ranks still running $dt s later"
kill -KILL $pid 2>/dev/null || true
wait $pid 2>/dev/null || true
unset DLO_GATHER_TIMEOUT_S
[ "$dt" -le 60 ] || fail "link cut: the ranks ended only $dt s later"
grep -qE "\[0/4\] fatal: .*: ranks 2, 3 \(on node node1\) did not arrive within 10 s" "$T/cut.log" \
  || fail "link cut: no message naming the phase, the ranks and the node: $(grep -i fatal "$T/cut.log" | head -3)"
only_whole_recorded "$T/cut"
echo "ok: node1's link cut mid-wave: every rank ended $dt s later: $(grep -m1 -o '\[0/4\] fatal: .*' "$T/cut.log" | cut -c1-200)"
