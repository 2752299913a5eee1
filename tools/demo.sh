#!/usr/bin/env bash
# The main job on the built-in demo model: until dlo-generate exists, one denoising forward of
# the Wan transformer on two ranks with distributed layerwise offload (each rank keeps half of
# every block; blocks are rebuilt by AllGather), guidance included, and each rank's report.
#   tools/demo.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/demo}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p "$OUT"
[ -f "$OUT/model/model_index.json" ] || build/bin/dlo-checkpoint make "$OUT/model" --preset wan-test --layers 6 \
  --dim 48 --heads 4 --text-dim 32 --dtype bf16 --shard-size 100KB
build/bin/dlo-checkpoint inspect "$OUT/model/transformer" | head -12
mpirun -np 2 build/bin/dlo-forward --model "$OUT/model" --component transformer --offload dlo --dtype bf16 \
  --random-inputs 3,16,16,24 --guidance --passes 3 --threads 1 --out "$OUT/transformer_out.safetensors" \
  --report "$OUT/report.json"
echo "wrote $OUT/transformer_out.safetensors and $OUT/report.json"
