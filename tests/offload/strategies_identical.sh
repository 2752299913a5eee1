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
  for s in resident layerwise dlo; do
    if [ "$np" = 3 ]; then passes="--rank-passes 2,0,1"; else passes="--passes 2"; fi
    mpirun -np $np "$BIN/dlo-forward" --model "$T/m" --component transformer --inputs "$T/in.safetensors" \
      --out "$T/out_${np}_$s.safetensors" --dtype bf16 --offload $s --threads 1 $passes --guidance \
      --report "$T/r.json" 2>"$T/log"
    grep -q "offload: $s" "$T/log"
    if [ -z "$ref" ]; then ref="$T/out_${np}_$s.safetensors"; continue; fi
    cmp "$ref" "$T/out_${np}_$s.safetensors"
    echo "np $np $s: identical to resident on 1 rank"
  done
done
echo "all identical"
