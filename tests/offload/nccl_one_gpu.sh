#!/usr/bin/env bash
# Two ranks over NCCL on ONE GPU (label gpu): each rank gets its own NCCL_HOSTID, so NCCL treats
# them as two hosts and connects them over loopback sockets instead of refusing a duplicate GPU
# (gpu-notes B4; NCCL reads NCCL_HOSTID in getHostHashOnce). On a machine with more GPUs the
# ranks still share device 0 (unit) or follow --device cuda (forward).
#
#   nccl_one_gpu.sh unit BIN_DIR      mpirun -np 2 test_nccl_gpu
#   nccl_one_gpu.sh forward BIN_DIR   dlo-forward --offload dlo at 2 ranks equals --offload resident
#                                     at 1 rank on the GPU, byte for byte
#
# Exit 77 (CTest: skipped) where the machine has no GPU (test_nccl_gpu --probe decides, as
# test_engine_gpu does; DLO_REQUIRE_GPU=1 turns that into a failure). Every mpirun runs under
# `timeout`, so a hang (a gather nobody completes) fails with a message instead of running on.
set -euo pipefail
MODE=${1:?usage: nccl_one_gpu.sh unit|forward BIN_DIR} BIN=${2:?usage: nccl_one_gpu.sh unit|forward BIN_DIR}

rc=0
"$BIN/test_nccl_gpu" --probe || rc=$?
if [ "$rc" != 0 ]; then exit "$rc"; fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
  OMPI_MCA_btl_vader_single_copy_mechanism=none
# Sockets over loopback only: no peer-to-peer or shared-memory transport between the two "hosts",
# no InfiniBand.
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo
LIMIT=${DLO_NCCL_TEST_LIMIT_S:-240}

# run2 CMD...: CMD at 2 ranks, each with NCCL_HOSTID=dlo-rank-<its rank>.
run2() {
  timeout -k 10 "$LIMIT" mpirun -np 2 \
    -x NCCL_P2P_DISABLE -x NCCL_SHM_DISABLE -x NCCL_IB_DISABLE -x NCCL_SOCKET_IFNAME \
    bash -c 'export NCCL_HOSTID=dlo-rank-$OMPI_COMM_WORLD_RANK; exec "$@"' dlo-rank "$@"
}

case "$MODE" in
  unit)
    run2 "$BIN/test_nccl_gpu"
    ;;
  forward)
    T=$(mktemp -d)
    trap 'rm -rf "$T"' EXIT
    "$BIN/dlo-checkpoint" make "$T/m" --preset wan-test --layers 3 --dtype bf16 --components transformer \
      --shard-size 20KB >/dev/null
    # Random inputs seeded by --seed + rank: rank 0 (which writes --out) sees the same inputs at 1
    # and 2 ranks. No Python needed, so this also runs on a bare GPU machine.
    common=(--model "$T/m" --component transformer --random-inputs 3,6,4,7 --seed 5 --dtype bf16 --threads 1
            --passes 2 --guidance --device cuda)
    timeout -k 10 "$LIMIT" mpirun -np 1 "$BIN/dlo-forward" "${common[@]}" --offload resident \
      --out "$T/resident_1.safetensors" --report "$T/r1.json" 2>"$T/log1" || { cat "$T/log1"; exit 1; }
    grep -q "offload: resident" "$T/log1" || { cat "$T/log1"; echo "not resident"; exit 1; }
    run2 "$BIN/dlo-forward" "${common[@]}" --offload dlo \
      --out "$T/dlo_2.safetensors" --report "$T/r2.json" 2>"$T/log2" || { cat "$T/log2"; exit 1; }
    grep -q "offload: dlo" "$T/log2" || { cat "$T/log2"; echo "not dlo"; exit 1; }
    cmp "$T/resident_1.safetensors" "$T/dlo_2.safetensors"
    echo "dlo over NCCL at 2 ranks on the GPU: identical to resident on 1 rank"
    ;;
  *)
    echo "nccl_one_gpu.sh: unknown mode '$MODE' (unit or forward)" >&2
    exit 2
    ;;
esac
