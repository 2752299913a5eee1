#!/usr/bin/env bash
# The main job on the built-in demo model: a batch of prompts (jobs/demo.yaml: mixed steps, sizes,
# frames, guidance and schedulers) rendered by dlo-generate on two ranks. Both ranks render
# different prompts at once while sharing the transformer's weights: each rank keeps half of
# every block, blocks are rebuilt by AllGather just before they run, and a rank that finishes a
# job takes the next at a pass boundary. The model has random weights, so the videos are noise;
# see the README for a real Wan2.1 folder. A rerun skips what is done (results.jsonl).
#   tools/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
OUT=out/demo   # jobs/demo.yaml names out/demo/model and out/demo/videos
mkdir -p "$OUT"
[ -f "$OUT/model/model_index.json" ] || build/bin/dlo-checkpoint make "$OUT/model" --preset wan-test --layers 6 \
  --dim 48 --heads 4 --text-dim 32 --dtype bf16 --shard-size 100KB
mpirun -np 2 build/bin/dlo-generate --jobs jobs/demo.yaml --offload dlo --threads 1
echo "videos in $OUT/videos, one line per job in $OUT/videos/results.jsonl (random weights: the videos are noise)"
