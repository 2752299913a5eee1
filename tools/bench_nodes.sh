#!/usr/bin/env bash
# Two simulated nodes against one (issue 21's measurements), in one run: the same 8 jobs on 4 ranks,
# on one node (mpirun -np 4) and on two nodes of 2 ranks (tests/common/nodes.sh: namespaces joined
# by veth links, TCP between them), alternately, ROUNDS times. Wan2.1 1.3B's block shape cut to 4
# blocks (more than the 2 slots: every pass gathers every block; the weight gathers, not the
# compute, dominate), tiny latents, 2 steps, dlo.
# Prints per run the wall time, the frames' agreement, and for the two-node runs the bytes over
# node1's link per pass against the weight gathers' bytes: each block is 4 shards (one per rank),
# and each rank on node1 needs node0's 2 shards of every block: 2 of the 3 shards it gathers
# (bytes_gathered, from its report) must cross into node1 (a node-aware gather could send them once
# per node, half of that).
#   sudo tools/bench_nodes.sh BIN_DIR [ROUNDS]   (root: it makes network namespaces)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tests/common/cli.sh
source "$ROOT/tests/common/cli.sh" "$1"
# shellcheck source=tests/common/nodes.sh
source "$ROOT/tests/common/nodes.sh"
ROUNDS=${2:-3}
nodes_available || { echo "bench_nodes: cannot create network namespaces (root and iproute2 needed)"; exit 2; }
nodes_start 2
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
  python3 - "$T" "$r" "$t0" "$t1" "$t2" "$((tx1 - tx0))" "$((rx1 - rx0))" <<'PY'
import json, sys
t, r, t0, t1, t2, tx, rx = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:6]), int(sys.argv[6]), int(sys.argv[7])
one, two = json.load(open(f"{t}/one{r}.json")), json.load(open(f"{t}/two{r}.json"))
same = sorted((j["id"], j["frames_sha256"]) for j in one["jobs"]) == sorted((j["id"], j["frames_sha256"]) for j in two["jobs"])
ranks = two["ranks"]
passes = ranks[0]["traversals"]
slot = ranks[0]["slot_bytes"]            # one block, gathered (4 shards)
blocks = ranks[0]["blocks_acquired"] // max(passes, 1)
# node0's 2 shards of every gathered block to each of node1's ranks: 2/3 of what they gathered.
need = sum(x["bytes_gathered"] for x in ranks if x["host"] == "node1") * 2 // 3
print(json.dumps({"round": int(r), "one_node_s": round(t1 - t0, 2), "two_nodes_s": round(t2 - t1, 2),
                  "ratio": round((t2 - t1) / (t1 - t0), 3), "frames_identical": same, "passes": passes,
                  "blocks_per_pass": blocks, "block_bytes": slot,
                  "node1_rx_per_pass_MB": round(rx / passes / 1e6, 2), "node1_tx_per_pass_MB": round(tx / passes / 1e6, 2),
                  "needed_into_node1_per_pass_MB": round(need / passes / 1e6, 2),
                  "rx_over_needed": round(rx / need, 3)}))
PY
done
