#!/usr/bin/env bash
# dlo-forward's transformer output is byte-identical for every strategy at 1 and 3 ranks, with
# guidance and ranks that run different numbers of passes. Reference: resident on 1 rank.
#   strategies_identical.sh BIN_DIR PYTHON
set -euo pipefail
BIN=$1 PY=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$BIN/dlo-checkpoint" make "$T/m" --preset wan-test --layers 3 --dtype bf16 --components transformer \
  --shard-size 20KB >/dev/null
"$PY" - "$T/in.safetensors" <<'PY'
import sys, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(3)
save_file({"hidden_states": torch.randn(1, 4, 3, 6, 4, generator=g), "timestep": torch.tensor([721]),
           "encoder_hidden_states": torch.randn(1, 7, 16, generator=g),
           "negative_encoder_hidden_states": torch.randn(1, 7, 16, generator=g)}, sys.argv[1])
PY
ref=""
for np in 1 3; do
  for s in resident device-shards mixed dlo layerwise; do
    if [ "$np" = 3 ]; then passes="--rank-passes 2,0,1"; else passes="--passes 2"; fi
    mpirun -np $np "$BIN/dlo-forward" --model "$T/m" --component transformer --inputs "$T/in.safetensors" \
      --out "$T/out_${np}_$s.safetensors" --dtype bf16 --offload $s --device-budget 1 --threads 1 $passes --guidance \
      --report "$T/r.json" 2>"$T/log"
    grep -q "offload: $s" "$T/log"
    if [ -z "$ref" ]; then ref="$T/out_${np}_$s.safetensors"; continue; fi
    cmp "$ref" "$T/out_${np}_$s.safetensors"
    echo "np $np $s: identical to resident on 1 rank"
  done
done

# auto with a device budget (the CPU then acts as a device of that size): each budget picks the
# strategy the rule says, from the figures in the report, and the output stays the same. 8 blocks
# at 2 ranks: shards are 1/2 of the stack and the two slots 1/4, so device shards can win.
"$BIN/dlo-checkpoint" make "$T/m8" --preset wan-test --layers 8 --dtype bf16 --components transformer >/dev/null
run8() {  # run8 NAME OFFLOAD [BUDGET]
  mpirun -np 2 "$BIN/dlo-forward" --model "$T/m8" --component transformer --inputs "$T/in.safetensors" \
    --out "$T/o8_$1.safetensors" --dtype bf16 --offload $2 ${3:+--device-budget $3} --threads 1 --guidance \
    --report "$T/r8_$1.json" 2>"$T/log8"
}
run8 ref resident
run8 probe dlo
read -r total shards slot work <<<"$("$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))["ranks"][0]
print(r["block_bytes_total"], r["shard_bytes_total"], r["slot_bytes"], r["working_bytes_estimate"])' "$T/r8_probe.json")"
# fits(need, budget) is need + need/10 <= budget; budgets between the rule's thresholds:
res=$(( (total + work) * 11 / 10 + 16 ))
shd=$(( (shards + 2 * slot + work) * 11 / 10 + 16 ))
mix=$(( (2 * slot + work + shards / 2) * 11 / 10 + 16 ))   # about half the blocks' shards
low=$(( (2 * slot + work) * 11 / 10 + 16 ))
[ $shd -lt $(( (total + work) * 11 / 10 )) ] || { echo "FAIL: device shards cannot win with these sizes"; exit 1; }
for pick in "resident $res" "device-shards $shd" "mixed $mix" "dlo $low"; do
  set -- $pick
  run8 "$1" auto "$2"
  grep -q "offload: $1 " "$T/log8" || { echo "FAIL: budget $2 did not pick $1:"; cat "$T/log8"; exit 1; }
  cmp "$T/o8_ref.safetensors" "$T/o8_$1.safetensors"
  echo "np 2 auto with --device-budget $2: $1, identical to resident"
done
grep -q '"device_blocks": [1-7]' "$T/r8_mixed.json" || { echo "FAIL: mixed report lacks its device block count"; exit 1; }
echo "all identical"
