#!/usr/bin/env bash
# GPU checks on a dev machine with a GPU and this project's set-up (target: under 8 minutes). For a
# bare GPU machine (no registries, no Open MPI) use tools/gpu-bundle.sh + tools/gpu-run.sh (docs/gpu.md).
#   1. set up and build (the same tools/setup.sh as everywhere);
#   2. the gpu-labelled tests (tests skip themselves where no GPU is visible);
#   3. resident vs layerwise vs dlo on 1 rank on the GPU: per-step time, exposed transfer time,
#      H2D bandwidth reached and device memory peak, from dlo-forward's --report.
# Results are printed and written to ${OUT:-out/gpu-check}/.
set -euo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-out/gpu-check}
mkdir -p "$OUTDIR"
T0=$(date +%s)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# A GPU check that checked nothing is a failure: no GPU visible, a gpu test skipped, or none run.
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUTDIR/gpu.txt" \
  || { echo "gpu-check: FAILED: nvidia-smi sees no GPU on this machine; nothing was checked"; exit 1; }
tools/setup.sh --all >"$OUTDIR/setup.log" 2>&1 || { tail -50 "$OUTDIR/setup.log"; exit 1; }
echo "setup+build: $(( $(date +%s) - T0 )) s"
grep -q "CUDA/NCCL compiled in: ON" build/configure.log 2>/dev/null \
  || { echo "gpu-check: FAILED: this build has no CUDA (see build/configure.log)"; exit 1; }
# The gpu tests skip (exit 77) only where no GPU is present; here one is, so a skip is a failure.
DLO_REQUIRE_GPU=1 ctest --test-dir build -L gpu --output-on-failure | tee "$OUTDIR/ctest-gpu.log"
if grep -qE "Not Run|Skipped|No tests were found" "$OUTDIR/ctest-gpu.log"; then
  echo "gpu-check: FAILED: a gpu test was skipped or none ran on a machine with a GPU"; exit 1
fi

# Benchmark: 1.3B-shape blocks, bf16, a latent big enough to give each block real work. The model
# and outputs go to a temporary folder: $OUTDIR gets at most 6 files (gpu.txt, setup.log,
# ctest-gpu.log, report_{resident,layerwise,dlo}.json). python3 needs only its standard library.
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
M="$TMP/model"
build/bin/dlo-checkpoint make "$M" --preset wan2.1-t2v-1.3b --layers ${LAYERS:-12} --dtype bf16 --components transformer >/dev/null
for s in resident layerwise dlo; do
  mpirun -np 1 build/bin/dlo-forward --model "$M" --component transformer --random-inputs ${BENCH_SHAPE:-21,60,104,512} \
    --out "$TMP/out_$s.safetensors" --dtype bf16 --device cuda --offload $s --passes ${PASSES:-4} --guidance \
    --report "$OUTDIR/report_$s.json" 2>&1 | tail -1
done
python3 - "$OUTDIR" <<'PY'
import json, statistics, sys
d = sys.argv[1]
base = None
for s in ("resident", "layerwise", "dlo"):
    r = json.load(open(f"{d}/report_{s}.json"))["ranks"][0]
    steady = r["per_pass"][1:] or r["per_pass"]
    wall = statistics.median(p["wall_s"] for p in steady)
    exposed = statistics.median(p["exposed_transfer_s"] for p in steady)
    per_pass_bytes = r["bytes_streamed"] / max(1, len(r["per_pass"]))
    bw = per_pass_bytes / wall / 1e9 if s != "resident" else 0
    base = base or wall
    print(f"{s:9s}: {wall:.3f} s/step (x{wall / base:.3f} resident), exposed transfer {exposed * 1e3:.1f} ms/step, "
          f"H2D {bw:.1f} GB/s sustained over the step, allocator peak {r['allocator_reserved_peak_bytes'] / 2**30:.2f} GiB, device used {r['device_used_bytes_at_end'] / 2**30:.2f} GiB, "
          f"slot {r['slot_bytes'] / 2**20:.0f} MiB, pinned {r['pinned_bytes'] / 2**30:.2f} GiB")
PY
for s in layerwise dlo; do
  cmp -s "$TMP/out_resident.safetensors" "$TMP/out_$s.safetensors" && echo "$s output bitwise equal to resident: True" \
    || echo "$s output bitwise equal to resident: False"
done
echo "gpu-check: $(( $(date +%s) - T0 )) s"
