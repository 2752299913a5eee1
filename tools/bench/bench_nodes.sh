#!/usr/bin/env bash
# Two simulated nodes against one (issue 21's measurements), in one run: the same 8 jobs on 4 ranks,
# on one node (mpirun -np 4) and on two nodes of 2 ranks (tests/common/nodes.sh: namespaces joined
# by veth links, TCP between them), alternately, ROUNDS times. Wan2.1 1.3B's block shape cut to 4
# blocks (more than the 2 slots: every pass gathers every block; the weight gathers, not the
# compute, dominate), tiny latents, 2 steps, dlo.
# Prints per run the wall time, the frames' agreement, and for the two-node runs the bytes over
# node1's link per pass against the weight gathers' bytes: each block is 4 shards (one per rank),
# and each rank on node1 gathers node0's 2 shards of every block: 2 of the 3 shards it gathers
# (bytes_gathered, from its report). A flat allgather sends them to each of node1's ranks (all of
# that crosses the link: rx_over_flat ~1); the two-level gather once per node (~0.5).
# With BASELINE_BIN (a build of another commit, e.g. the flat gather's, 1732045) each round also
# runs the two nodes with its dlo-generate: the ratios of the two builds in one run.
# LINK_RATE (e.g. 2gbit) shapes node1's link each way (tbf) for the whole run: a link slower than
# the memory copy a veth is.
#   sudo [LINK_RATE=R] tools/bench/bench_nodes.sh BIN_DIR [ROUNDS [BASELINE_BIN]]   (root: it makes network namespaces)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/common/cli.sh
source "$ROOT/tests/common/cli.sh" "$1"
# shellcheck source=tests/common/nodes.sh
source "$ROOT/tests/common/nodes.sh"
ROUNDS=${2:-3}
BASE=${3:+$(cd "$3" && pwd)}
nodes_available || { echo "bench_nodes: cannot create network namespaces (root and iproute2 needed)"; exit 2; }
nodes_start 2
[ -z "${LINK_RATE:-}" ] || node_slow 1 "$LINK_RATE"
"$BIN/dlo-checkpoint" make "$T/m" --preset wan2.1-t2v-1.3b --layers 4 --dtype bf16 >/dev/null
{ echo "model: m"; echo "defaults: {frames: 5, height: 32, width: 48, steps: 2}"; echo "jobs:"
  for i in $(seq 0 7); do echo "  - {id: b$i, prompt: \"prompt $i\", seed: $i}"; done; } >"$T/jobs.yaml"
GEN=("$BIN/dlo-generate" --threads 1 --quiet --jobs "$T/jobs.yaml" --offload dlo --sp 1 --cfg-parallel off)
now() { date +%s.%N; }
for r in $(seq "$ROUNDS"); do
  t0=$(now)
  mpirun -np 4 "${GEN[@]}" --output-dir "$T/one$r" --report "$T/one$r.json" 2>"$T/log" || { cat "$T/log"; exit 1; }
  t1=$(now)
  read -r tx0 rx0 < <(node_bytes 1)
  nodes_mpirun 2 "${GEN[@]}" --output-dir "$T/two$r" --report "$T/two$r.json" 2>"$T/log" || { cat "$T/log"; exit 1; }
  t2=$(now)
  read -r tx1 rx1 < <(node_bytes 1)
  t3=$t2 rx2=$rx1
  if [ -n "$BASE" ]; then
    nodes_mpirun 2 "$BASE/dlo-generate" "${GEN[@]:1}" --output-dir "$T/base$r" --report "$T/base$r.json" 2>"$T/log" || { cat "$T/log"; exit 1; }
    t3=$(now)
    read -r _ rx2 < <(node_bytes 1)
  fi
  python3 - "$T" "$r" "$t0" "$t1" "$t2" "$t3" "$((rx1 - rx0))" "$((rx2 - rx1))" "${BASE:+1}" <<'PY'
import json, sys
t, r = sys.argv[1], sys.argv[2]
t0, t1, t2, t3 = map(float, sys.argv[3:7])
rx, rx_base, has_base = int(sys.argv[7]), int(sys.argv[8]), sys.argv[9] == "1"
one, two = json.load(open(f"{t}/one{r}.json")), json.load(open(f"{t}/two{r}.json"))
key = lambda rep: sorted((j["id"], j["frames_sha256"]) for j in rep["jobs"])
ranks = two["ranks"]
passes = ranks[0]["traversals"]
# node0's 2 shards of every gathered block to each of node1's ranks: 2/3 of what they gathered.
flat = sum(x["bytes_gathered"] for x in ranks if x["host"] == "node1") * 2 // 3
row = {"round": int(r), "one_node_s": round(t1 - t0, 2), "two_nodes_s": round(t2 - t1, 2),
       "ratio": round((t2 - t1) / (t1 - t0), 3), "frames_identical": key(one) == key(two), "passes": passes,
       "blocks_per_pass": ranks[0]["blocks_acquired"] // max(passes, 1), "block_bytes": ranks[0]["slot_bytes"],
       "node1_rx_per_pass_MB": round(rx / passes / 1e6, 2), "flat_into_node1_per_pass_MB": round(flat / passes / 1e6, 2),
       "rx_over_flat": round(rx / flat, 3)}
if has_base:
    base = json.load(open(f"{t}/base{r}.json"))
    row.update({"baseline_two_nodes_s": round(t3 - t2, 2), "two_nodes_over_baseline": round((t2 - t1) / (t3 - t2), 3),
                "baseline_frames_identical": key(one) == key(base), "baseline_rx_over_flat": round(rx_base / flat, 3)})
print(json.dumps(row))
PY
done
