#!/usr/bin/env bash
# The main job on the built-in demo model: a prompt to an MP4 with dlo-generate on two ranks, the
# transformer's blocks split between them (distributed layerwise offload: each rank keeps half of
# every block, blocks are rebuilt by AllGather just before they run, guidance shares each gather).
# The model has random weights, so the video is noise; see the README for a real Wan2.1 folder.
#   tools/demo.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/demo}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
mkdir -p "$OUT"
[ -f "$OUT/model/model_index.json" ] || build/bin/dlo-checkpoint make "$OUT/model" --preset wan-test --layers 6 \
  --dim 48 --heads 4 --text-dim 32 --in-channels 16 --out-channels 16 --dtype bf16 --shard-size 100KB
mpirun -np 2 build/bin/dlo-generate --model "$OUT/model" --prompt "A red fox trotting through fresh snow at dawn" \
  --seed 42 --steps 8 --height 64 --width 96 --frames 17 --offload dlo --threads 1 \
  --out "$OUT/fox.mp4" --report "$OUT/report.json"
echo "wrote $OUT/fox.mp4 (random weights: the video is noise) and $OUT/report.json"
