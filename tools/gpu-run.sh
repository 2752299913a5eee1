#!/usr/bin/env bash
# The one command on a bare GPU machine (docs/gpu.md): uses .gpu/bundle (or .gpu/bundle.tar.xz,
# made by tools/gpu-bundle.sh) and the machine's own torch (python3). Every step runs under
# `timeout`, reports PASS/FAIL/SKIP and the script goes on; steps starting after 330 s are skipped
# and none runs past 350 s.
# Results: $OUT/summary.txt and $OUT/logs.tar.gz (at most 2 files).
# MODE=fp8 runs the fp8 measurements instead of the checks (issue 47; see the fp8 section below);
# MODE=lora the LoRA and 4-step measurements (issue 48; the lora section).
# Knobs: ONLY (step names: run just those), DLO_DEVICE=cpu (everything on the CPU: the local
#   rehearsal), LAYERS (benchmark, 12),
#   BENCH_SHAPE (F,H,W,L; 21,60,104,512), PASSES (4), STRATEGIES (1-rank strategies compared with
#   resident), BENCH_STRATEGIES (the benchmark's, "$STRATEGIES auto"), FLAT_LAYERS (layerwise peak
#   depths, "20 40"), PY (python3), BUNDLE (.gpu/bundle).
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
OUT=${OUT:-out/gpu-run}; mkdir -p "$OUT"
W=$(mktemp -d /tmp/gpu-run.XXXXXX); L=$W/logs; mkdir -p "$L"
SUM=$OUT/summary.txt; : >"$SUM"
say() { echo "$*" | tee -a "$SUM"; }
MODE=${MODE:-check}; DEV=${DLO_DEVICE:-cuda}; LAYERS=${LAYERS:-12}; BENCH_SHAPE=${BENCH_SHAPE:-21,60,104,512}; PASSES=${PASSES:-4}
STRATEGIES=${STRATEGIES:-"resident device-shards mixed dlo layerwise"}
PY=${PY:-python3}
B=${BUNDLE:-.gpu/bundle}
if [ ! -d "$B" ] && [ -f .gpu/bundle.tar.xz ]; then tar -C "$W" -xJf .gpu/bundle.tar.xz; B=$W/bundle; fi
B=$(cd "$B" && pwd); chmod -R u+x "$B/bin" "$B/ompi/bin" 2>/dev/null
SP=$("$PY" -c 'import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null)
export LD_LIBRARY_PATH=$B/lib:$SP/torch/lib:$SP/nvidia/cu13/lib:$SP/nvidia/nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OPAL_PREFIX=$B/ompi PMIX_PREFIX=$B/pmix PMIX_PKGDATADIR=$B/pmix/share/pmix PMIX_PKGLIBDIR=$B/pmix/lib/pmix
export PATH=$B/ompi/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_mca_base_param_files=/dev/null DLO_GATHER_TIMEOUT_S=60
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
mpirun_() { mpirun --bind-to none -x LD_LIBRARY_PATH -x OPAL_PREFIX -x PMIX_PREFIX -x PMIX_PKGDATADIR -x PMIX_PKGLIBDIR \
  -x DLO_GATHER_TIMEOUT_S -x OMP_NUM_THREADS "$@"; }
# Two ranks on one GPU: NCCL sees two hosts (NCCL_HOSTID per rank) talking over loopback sockets.
mpirun_nccl2() { mpirun_ -np 2 -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_IB_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo \
  bash -c 'NCCL_HOSTID=dlo-rank-$OMPI_COMM_WORLD_RANK exec "$@"' _ "$@"; }
NPASS=0 NFAIL=0 NSKIP=0
# step NAME TIMEOUT CMD...: runs CMD (a shell function or binary) with its log in logs/NAME.log.
step() {
  local name=$1 to=$2; shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  local t=$(( $(date +%s) - T0 ))
  if (( t > 330 )); then say "SKIP  $name (time: ${t} s into the run)"; NSKIP=$((NSKIP+1)); return; fi
  (( to > 350 - t )) && to=$(( 350 - t ))   # no step runs past 350 s: the whole run stays under 6 minutes
  local s=$(date +%s) rc
  timeout -k 5 "$to" bash -c '"$@"' _ "$@" >"$L/$name.log" 2>&1; rc=$?
  local d=$(( $(date +%s) - s ))
  if [ $rc = 0 ]; then say "PASS  $name (${d} s)"; NPASS=$((NPASS+1))
  elif [ $rc = 77 ]; then say "SKIP  $name: $(tail -1 "$L/$name.log")"; NSKIP=$((NSKIP+1))
  else say "FAIL  $name (exit $rc, ${d} s): $(tail -3 "$L/$name.log" | tr '\n' ' ' | cut -c1-300)"; NFAIL=$((NFAIL+1)); fi
}
gpu_only() { if [ "$DEV" = cpu ]; then echo "GPU step; DLO_DEVICE=cpu"; return 77; fi; "$@"; }
DEVARG=$([ "$DEV" = cpu ] && echo cpu || echo cuda)

facts() {
  set -x
  nvidia-smi || [ "$DEV" = cpu ]
  "$PY" -c 'import torch;print("torch",torch.__version__,"cuda",torch.version.cuda,"nccl",torch.cuda.nccl.version() if torch.cuda.is_available() else "-","gpus",torch.cuda.device_count())'
  ldd --version | head -1
  strings "$(ldconfig -p | awk '/libstdc\+\+\.so\.6 /{print $NF; exit}')" | grep -c GLIBCXX_3.4.30
  local bad=0
  for f in "$B"/bin/* "$B"/ompi/bin/*; do ldd "$f" | grep -q "not found" && { echo "UNRESOLVED $f"; ldd "$f" | grep "not found"; bad=1; }; done
  return $bad
}
model_small() { "$B/bin/dlo-checkpoint" make "$W/small" --preset wan-test --layers 5 --in-channels 16 --out-channels 16 --dtype bf16 --shard-size 50KB; }
fwd() {  # fwd TAG NP STRATEGY [extra...]
  local tag=$1 np=$2 s=$3; shift 3
  local budget=(); [ "$s" = mixed ] && budget=(--device-budget "$(( $(du -sb "$W/small/transformer" | cut -f1) / 2 ))")
  local run=(mpirun_ -np 1); [ "$np" = 2 ] && run=(mpirun_nccl2)
  "${run[@]}" "$B/bin/dlo-forward" --model "$W/small" --component transformer --random-inputs 2,4,6,8 --guidance --dtype bf16 \
    --device "$DEVARG" --offload "$s" "${budget[@]}" --out "$W/out_$tag.safetensors" --report "$W/rep_$tag.json" "$@"
}
same() { cmp "$W/out_resident.safetensors" "$W/out_$1.safetensors"; }
# A strategy this dlo-forward does not know yet (device-shards, mixed before they land) is a SKIP.
known() { "$B/bin/dlo-forward" --help 2>/dev/null | grep -A1 -- "--offload" | grep -qw -- "$1"; }
strategy() { known "$1" || { echo "dlo-forward does not know --offload $1 (yet)"; return 77; }; fwd "$1" 1 "$1" && same "$1"; }
dlo2() { fwd dlo2 2 dlo && same dlo2; }
fault() {
  local s=$(date +%s) rc
  fwd fault 2 dlo --fail-at-block 2 --fail-rank 1 >"$W/fault.txt" 2>&1; rc=$?
  cat "$W/fault.txt"; echo "exit $rc after $(( $(date +%s) - s )) s"
  [ $rc != 0 ] && (( $(date +%s) - s < 60 )) && grep -q "fatal:.*block 2" "$W/fault.txt"
}
gen() {
  "$B/bin/dlo-generate-bare" --model "$W/small" --prompt "a red fox" --steps 2 --height 32 --width 48 --frames 5 \
    --device "$DEVARG" --seed 7 --out "$W/frames.safetensors" || return 1
  "$PY" - "$W/frames.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
o = h["frames"]["data_offsets"]; d = b[8 + n + o[0]:8 + n + o[1]]
print(h["frames"]["shape"], "distinct byte values", len(set(d)))
sys.exit(0 if len(set(d)) > 1 else 1)
PY
}
# Two experts (Wan2.2 A14B's shape, tiny): two jobs whose steps span both experts and whose ranks
# meet on different experts in pass 2 (fox's step 2 runs transformer/, owl's transformer_2/: their
# blocks are traversed together, two NCCL communicators back to back), at 1 rank (resident) and at
# 2 ranks on the one GPU (dlo over NCCL), each rank its own job (--sp 1 --cfg-parallel off: on the
# CPU rehearsal auto would pair them): the same frames per job, byte for byte.
experts() {
  "$B/bin/dlo-checkpoint" make "$W/a14b" --preset wan2.2-a14b-test --layers 3 --in-channels 16 --out-channels 16 \
    --dtype bf16 --shard-size 50KB >/dev/null || return 1
  cat >"$W/experts.yaml" <<YAML
model: a14b
defaults: {frames: 5, height: 32, width: 48, seed: 7, guidance: 4.0, guidance_2: 3.0}
jobs:
  - {id: fox, prompt: "a red fox", steps: 6}
  - {id: owl, prompt: "an owl", steps: 3, boundary_ratio: 0.95}
YAML
  mpirun_ -np 1 "$B/bin/dlo-generate-bare" --jobs "$W/experts.yaml" --output-dir "$W/experts1" --device "$DEVARG" \
    --offload resident --report "$W/rep_experts1.json" || return 1
  mpirun_nccl2 "$B/bin/dlo-generate-bare" --jobs "$W/experts.yaml" --output-dir "$W/experts2" --device "$DEVARG" \
    --offload dlo --no-expert-alignment --sp 1 --cfg-parallel off --report "$W/rep_experts2.json" || return 1
  grep -o '"choice": "[^"]*"' "$W/rep_experts2.json"
  grep -o '"passes_streaming_both_experts": [0-9]*' "$W/rep_experts2.json" | head -1
  grep -q '"passes_streaming_both_experts": [1-9]' "$W/rep_experts2.json" || { echo "no pass on both experts"; return 1; }
  for id in fox owl; do cmp "$W/experts1/$id.safetensors" "$W/experts2/$id.safetensors" || return 1; done
  echo "frames identical at 1 and 2 ranks"
}
# Wan2.2 TI2V's shape, tiny (the residual Wan2.2 VAE with its 2x2 patch, a timestep per token):
# 1 rank resident and 2 ranks on the one GPU (dlo over NCCL) give the same latents.
ti2v() {
  "$B/bin/dlo-checkpoint" make "$W/ti2v" --preset wan2.2-ti2v-test --layers 3 --dtype bf16 --shard-size 50KB >/dev/null || return 1
  cat >"$W/ti2v.yaml" <<YAML
model: ti2v
defaults: {frames: 9, height: 64, width: 64, guidance: 5.0, steps: 4}
jobs:
  - {id: sea, prompt: "waves on a beach", seed: 3}
  - {id: city, prompt: "a city at night", seed: 4}
YAML
  mpirun_ -np 1 "$B/bin/dlo-generate-bare" --jobs "$W/ti2v.yaml" --output-dir "$W/ti2v1" --device "$DEVARG" \
    --offload resident --report "$W/rep_ti2v1.json" || return 1
  mpirun_nccl2 "$B/bin/dlo-generate-bare" --jobs "$W/ti2v.yaml" --output-dir "$W/ti2v2" --device "$DEVARG" \
    --offload dlo --report "$W/rep_ti2v2.json" || return 1
  for id in sea city; do cmp "$W/ti2v1/$id.safetensors" "$W/ti2v2/$id.safetensors" || return 1; done
  echo "TI2V-shaped: latents identical at 1 and 2 ranks"
}
# Sequence parallelism's precondition on this device (sequence-parallel notes 5, 6.2.5): a GEMM on
# a subset of rows gives those rows of the full GEMM, SDPA on a subset of heads those heads, bitwise,
# in bf16 and fp32 at Wan 1.3B's shapes (the machine's torch: the same kernels libtorch calls).
probe() {
  "$PY" - "$DEV" <<'PY'
import sys, torch
import torch.nn.functional as F
dev = sys.argv[1] if torch.cuda.is_available() and sys.argv[1] != "cpu" else "cpu"
S, D, FF, H = (8190, 1536, 8960, 12) if dev != "cpu" else (258, 96, 160, 4)
torch.manual_seed(0)
bad = 0
for dt in (torch.bfloat16, torch.float32):
    x = torch.randn(1, S, D, device=dev, dtype=dt); w = torch.randn(FF, D, device=dev, dtype=dt) / D**0.5
    b = torch.randn(FF, device=dev, dtype=dt); y = F.linear(x, w, b)
    for cut in (S // 2, S // 3, 100):
        parts = torch.cat([F.linear(x[:, :cut], w, b), F.linear(x[:, cut:], w, b)], 1)
        eq = torch.equal(parts, y); bad += not eq
        print(f"{str(dt):15s} linear rows split at {cut:5d}: bitwise {eq}  max|diff| {(parts.float() - y.float()).abs().max().item():.3g}")
    q, k, v = (torch.randn(1, H, S, 128, device=dev, dtype=dt) for _ in range(3))
    o = F.scaled_dot_product_attention(q, k, v)
    for cut in (H // 2, H // 3, 1):
        parts = torch.cat([F.scaled_dot_product_attention(q[:, :cut], k[:, :cut], v[:, :cut]),
                           F.scaled_dot_product_attention(q[:, cut:], k[:, cut:], v[:, cut:])], 1)
        eq = torch.equal(parts, o); bad += not eq
        print(f"{str(dt):15s} SDPA heads split at {cut:5d}: bitwise {eq}  max|diff| {(parts.float() - o.float()).abs().max().item():.3g}")
print("device", dev, "cases not bitwise:", bad)
PY
}
# Compares two .safetensors files tensor by tensor: PASS when bitwise equal, or (not bitwise) when
# every tensor's max |diff| is within TOL x its max |reference| (uint8 frames: TOL x 255); prints
# what it measured either way. compare_st A B TOL
compare_st() {
  "$PY" - "$@" <<'PY'
import json, struct, sys, torch
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); out = {}
    dt = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16, "U8": torch.uint8}
    for k, v in h.items():
        if k == "__metadata__": continue
        o = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(b[8 + n + o[0]:8 + n + o[1]]), dtype=dt[v["dtype"]]).reshape(v["shape"])
    return out
a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
ok = sorted(a) == sorted(b)
for k in sorted(a):
    x, y = a[k].float(), b[k].float()
    scale = 255.0 if a[k].dtype == torch.uint8 else max(x.abs().max().item(), 1e-30)
    d = (x - y).abs().max().item() if x.shape == y.shape else float("inf")
    eq = torch.equal(a[k], b[k])
    ok = ok and (eq or d <= tol * scale)
    print(f"{k}: shape {list(a[k].shape)} bitwise {eq} max|diff| {d:.4g} (scale {scale:.4g}, tolerance {tol * scale:.4g})")
sys.exit(0 if ok else 1)
PY
}
# Sequence and CFG parallelism on the GPU (two ranks on the one GPU, NCCL over loopback): one
# guided forward at SP 2 and as a CFG pair against one rank resident on the device (45 tokens and
# 5 heads: uneven shares, 23/22 and 3/2), and one prompt rendered by dlo-generate-bare at SP 2 and
# as a CFG pair against one rank.
spcfg_forward() {
  local rc=0
  "$B/bin/dlo-checkpoint" make "$W/sp" --preset wan-test --layers 4 --heads 5 --head-dim 16 --dim 80 --ffn-dim 64 \
    --dtype bf16 --components transformer --shard-size 50KB >/dev/null || return 1
  local args=(--model "$W/sp" --component transformer --random-inputs 3,6,10,9 --seed 11 --guidance --dtype bf16 --device "$DEVARG")
  mpirun_ -np 1 "$B/bin/dlo-forward" "${args[@]}" --offload resident --out "$W/sp1.safetensors" >/dev/null 2>&1 || return 1
  mpirun_nccl2 "$B/bin/dlo-forward" "${args[@]}" --offload dlo --sp 2 --out "$W/sp2.safetensors" --report "$W/rep_sp2.json" || return 1
  echo "SP 2 vs 1 rank:"; compare_st "$W/sp1.safetensors" "$W/sp2.safetensors" 0.02 || rc=1
  mpirun_nccl2 "$B/bin/dlo-forward" "${args[@]}" --offload dlo --cfg-parallel --out "$W/cfg2.safetensors" --report "$W/rep_cfg2.json" || return 1
  echo "CFG 2 vs 1 rank:"; compare_st "$W/sp1.safetensors" "$W/cfg2.safetensors" 0.02 || rc=1
  return $rc
}
spcfg_generate() {
  local rc=0
  local args=(--model "$W/small" --prompt "a red fox" --steps 3 --height 48 --width 64 --frames 9 --seed 5 --guidance 4 --device "$DEVARG")
  mpirun_ -np 1 "$B/bin/dlo-generate-bare" "${args[@]}" --out "$W/g1.safetensors" --report "$W/rep_g1.json" || return 1
  mpirun_nccl2 "$B/bin/dlo-generate-bare" "${args[@]}" --sp 2 --cfg-parallel off --out "$W/g_sp2.safetensors" --report "$W/rep_g_sp2.json" || return 1
  echo "frames, SP 2 vs 1 rank:"; compare_st "$W/g1.safetensors" "$W/g_sp2.safetensors" 0.02 || rc=1
  mpirun_nccl2 "$B/bin/dlo-generate-bare" "${args[@]}" --cfg-parallel on --out "$W/g_cfg2.safetensors" --report "$W/rep_g_cfg2.json" || return 1
  echo "frames, CFG 2 vs 1 rank:"; compare_st "$W/g1.safetensors" "$W/g_cfg2.safetensors" 0.02 || rc=1
  grep -o '"parallel": "[^"]*"' "$W/rep_g_sp2.json" "$W/rep_g_cfg2.json" | sort -u
  grep -o '"token_block_rows": [0-9]*' "$W/rep_g1.json" "$W/rep_g_sp2.json" "$W/rep_g_cfg2.json"
  return $rc
}
# A soak: 8 blocks, 20 guided passes at SP 2 over NCCL, random pauses (up to 3 ms) before every
# gather request and every block's exchanges on both ranks: no hang (the watchdogs would end it
# within DLO_GATHER_TIMEOUT_S) and the output of the last pass equals the unjittered run's.
soak() {
  "$B/bin/dlo-checkpoint" make "$W/soak" --preset wan-test --layers 8 --dtype bf16 --shard-size 50KB >/dev/null || return 1
  local args=(--model "$W/soak" --component transformer --random-inputs 3,6,10,9 --seed 3 --guidance --dtype bf16 --device "$DEVARG"
              --offload dlo --sp 2 --passes 20)
  mpirun_nccl2 "$B/bin/dlo-forward" "${args[@]}" --out "$W/soak0.safetensors" >/dev/null 2>&1 || return 1
  local s=$(date +%s)
  mpirun_nccl2 "$B/bin/dlo-forward" "${args[@]}" --test-jitter-us 3000 --out "$W/soak1.safetensors" --report "$W/rep_soak.json" || return 1
  echo "jittered: 20 passes x 8 blocks in $(( $(date +%s) - s )) s"
  cmp "$W/soak0.safetensors" "$W/soak1.safetensors" && echo "jittered output identical to the unjittered one"
}
# Item 6 of the sequence-parallel issue: the text encoder and the VAE on the job's GPU. A 1.3B-shaped
# transformer (2 blocks), Wan2.1's real VAE, a tiny text encoder; 240x416, 17 frames, 2 steps: the
# job's phases with the text encoder and VAE on the GPU (cuda) and on the CPU, and the frames of
# the two compared (mean |diff| in levels; they differ by the devices' rounding only).
whole_job() {
  "$B/bin/dlo-checkpoint" make "$W/lat" --preset wan2.1-t2v-1.3b --layers 2 --vae-preset wan2.1-vae --te-preset umt5-test \
    --dtype bf16 >/dev/null || return 1
  # 240x416 (480x832 took over 148 s to decode on 4 CPU threads); every core of the machine.
  local size=(--height 240 --width 416 --frames 17); [ "$DEV" = cpu ] && size=(--height 64 --width 64 --frames 5)  # the rehearsal: small
  local args=(--model "$W/lat" --prompt "a lighthouse at dusk" --steps 2 "${size[@]}" --seed 9 --device "$DEVARG"
              --threads "$(nproc)")
  for where in cuda cpu; do
    [ "$DEV" = cpu ] && [ "$where" = cuda ] && continue
    mpirun_ -np 1 "$B/bin/dlo-generate-bare" "${args[@]}" --text-vae-device "$where" --out "$W/wj_$where.safetensors" \
      --report "$W/rep_wj_$where.json" 2>&1 | grep -E "phases|offload:" || return 1
  done
  [ "$DEV" = cpu ] && return 0
  "$PY" - "$W" <<'PY'
import json, struct, sys, torch
w = sys.argv[1]
def frames(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); o = h["frames"]["data_offsets"]
    return torch.frombuffer(bytearray(b[8 + n + o[0]:8 + n + o[1]]), dtype=torch.uint8).reshape(h["frames"]["shape"]).float()
for where in ("cuda", "cpu"):
    r = json.load(open(f"{w}/rep_wj_{where}.json")); t = r["jobs"][0]["timings"]
    print(f"text+VAE on {where}: {json.dumps(t)}")
a, b = frames(f"{w}/wj_cuda.safetensors"), frames(f"{w}/wj_cpu.safetensors")
d = (a - b).abs()
print(f"frames {list(a.shape)}: mean |diff| {d.mean().item():.3f} levels, max {d.max().item():.0f}, std of frames {a.std().item():.1f}")
sys.exit(0 if d.mean().item() <= 2.0 and a.std().item() > 1.0 else 1)
PY
}
# A rank of an SP group failing mid-wave (its transfer of block 2) on the GPU ends both ranks, with
# the failing rank's message, within the gather timeout.
fault_sp() {
  "$B/bin/dlo-checkpoint" make "$W/fsp" --preset wan-test --layers 4 --dtype bf16 --components transformer --shard-size 50KB >/dev/null || return 1
  local s=$(date +%s) rc
  mpirun_nccl2 "$B/bin/dlo-forward" --model "$W/fsp" --component transformer --random-inputs 3,6,10,9 --guidance --dtype bf16 \
    --device "$DEVARG" --offload dlo --sp 2 --passes 3 --fail-at-block 2 --fail-rank 1 --out "$W/fsp.safetensors" >"$W/fsp.txt" 2>&1
  rc=$?
  cat "$W/fsp.txt"; echo "exit $rc after $(( $(date +%s) - s )) s"
  [ $rc != 0 ] && (( $(date +%s) - s < 60 )) && grep -q "fatal:.*block 2" "$W/fsp.txt"
}
bench() {
  "$B/bin/dlo-checkpoint" make "$W/big$1" --preset wan2.1-t2v-1.3b --layers "$1" --dtype bf16 --components transformer >/dev/null || return 1
  local rc=0
  for s in $2; do
    [ "$s" = auto ] || known "$s" || { echo "dlo-forward does not know --offload $s (yet)"; rm -rf "$W/big$1"; return 77; }
    "$B/bin/dlo-forward" --model "$W/big$1" --component transformer --random-inputs "$BENCH_SHAPE" --guidance --dtype bf16 \
      --device "$DEVARG" --offload "$s" --passes "$PASSES" --out "$W/bout_$1_$s.safetensors" --report "$W/brep_$1_$s.json" \
      >"$W/bench.txt" 2>&1 || rc=1
    tail -n 3 "$W/bench.txt"
  done
  rm -rf "$W/big$1"
  return $rc
}
table() {
  "$PY" - "$W" "$@" <<'PY'
import json, statistics, sys, glob, os
w = sys.argv[1]
for f in sorted(glob.glob(f"{w}/brep_*.json")):
    tag = os.path.basename(f)[5:-5]
    try:
        doc = json.load(open(f)); r = doc["ranks"][0]
    except Exception as e:
        print(tag, "unreadable report:", e); continue
    pp = r.get("per_pass", []); steady = pp[1:] or pp
    wall = statistics.median(p["wall_s"] for p in steady) if steady else float("nan")
    exp = statistics.median(p.get("exposed_transfer_s", 0) for p in steady) if steady else float("nan")
    # The report has no transfer time of its own: host-to-device bytes over the passes' wall time
    # (the rate sustained over a pass; a lower bound of the copy rate).
    tt = sum(p.get("wall_s", 0) for p in pp)
    bw = r.get("h2d_bytes", r.get("bytes_streamed", 0)) / tt / 1e9 if tt else 0
    gib = lambda k: r.get(k, -1) / 2**30
    print(f"{tag:22s} {wall:8.3f} s/pass  exposed {exp*1e3:8.1f} ms  H2D {bw:6.2f} GB/s  "
          f"alloc peak {gib('allocator_reserved_peak_bytes'):6.2f} GiB (live {gib('allocator_allocated_peak_bytes'):6.2f})  "
          f"device used {gib('device_used_bytes_at_end'):6.2f} GiB  working est {gib('working_bytes_estimate'):6.2f} GiB  "
          f"choice: {doc.get('choice', r.get('choice', '?'))}")
PY
}
# Engine cost per block transition without compute (dlo-bench-engine; it has no --device yet, so
# this is not yet the plain pinned-copy GB/s baseline the issue asks for).
pinned() { "$B/bin/dlo-bench-engine" --model "$W/small" --dtype bf16 --passes 20 --repeats 3 2>&1 | tail -8; }
# The plain copy rate (pinned and pageable host-to-device, device-to-host) with the machine's torch.
h2d() { gpu_only "$PY" tools/bench/bench_h2d.py --json "$W/h2d.json"; }

# ---- MODE=fp8: the blocks' Linears stored in fp8 against bf16, and diffusers on the same GPU ----
# FP8_MODELS "PRESET:LAYERS ..." (random bf16 transformers: one block of the 1.3B is ~96 MiB, of the
# 14B ~720 MiB), FP8_SHAPES "NAME=F,H,W,L[,cfg] ..." (latent frames, height, width, text tokens;
# cfg: both branches per pass). Defaults: 240x416 17 frames unguided (little compute per block:
# streaming exposed) and 480x832 81 frames guided. Per model and shape: dlo-forward resident and dlo
# (1 rank: each block streamed from pinned host memory) at bf16 and fp8 storage, their outputs equal
# across the two strategies byte for byte, then diffusers' WanTransformer3DModel on the same folder
# (tools/bench/bench_diffusers_transformer.py: resident, block-level group offload on a stream, fp8
# layerwise casting, both). diffusers comes from the machine or from .gpu/wheels (tools/gpu-wheels.sh).
FP8_MODELS=${FP8_MODELS:-"wan2.1-t2v-14b:3 wan2.1-t2v-1.3b:8"}
FP8_SHAPES=${FP8_SHAPES:-"240x416x17=5,30,52,512 480x832x81cfg=21,60,104,512,cfg"}
fp8_make() { "$B/bin/dlo-checkpoint" make "$W/f8_$1" --preset "$1" --layers "$2" --dtype bf16 --components transformer >/dev/null; }
fp8_dlo() {  # fp8_dlo PRESET SHAPE_NAME F,H,W,L[,cfg]
  local m=$1 tag=$2 shape=${3%,cfg} cfg=(); [ "$3" != "$shape" ] && cfg=(--guidance)
  for st in bf16 fp8; do
    for s in resident dlo; do
      "$B/bin/dlo-forward" --model "$W/f8_$m" --component transformer --random-inputs "$shape" "${cfg[@]}" --dtype bf16 \
        --storage-dtype "$st" --device "$DEVARG" --offload "$s" --passes "$PASSES" --out "$W/f8out_$s.safetensors" \
        --report "$W/f8rep_${m}_${tag}_${s}_$st.json" | tail -n 1 || return 1
    done
    cmp "$W/f8out_resident.safetensors" "$W/f8out_dlo.safetensors" || { echo "dlo differs from resident at $st storage"; return 1; }
    echo "$st storage: dlo output equals resident's byte for byte"
  done
}
fp8_diffusers() {  # fp8_diffusers PRESET SHAPE_NAME F,H,W,L[,cfg]
  local m=$1 tag=$2 shape=${3%,cfg} cfg=() pp=(); [ "$3" != "$shape" ] && cfg=(--guidance)
  [ -d "$W/py" ] && pp=(--pythonpath "$W/py")
  "$PY" tools/bench/bench_diffusers_transformer.py --model "$W/f8_$m" --shape "$shape" "${cfg[@]}" --passes "$PASSES" \
    --device "$DEVARG" --threads "${OMP_NUM_THREADS:-0}" "${pp[@]}" --json "$W/f8dif_${m}_$tag.json"
}
fp8_wheels() {
  mkdir -p "$W/py"
  for w in .gpu/wheels/*.whl; do "$PY" -m zipfile -e "$w" "$W/py" || return 1; done
  ls "$W/py"
}
fp8_table() {
  "$PY" - "$W" "$FP8_SHAPES" <<'PY'
import glob, json, os, statistics, sys
w = sys.argv[1]
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return None
h2d = load(f"{w}/h2d.json") or []
for r in h2d:
    print(f"copy baseline: {r['case']} {r['bytes'] / 2**20:.0f} MiB: {r['gb_per_s']:.2f} GB/s")
pinned = max((r["gb_per_s"] for r in h2d if r["case"] == "h2d pinned"), default=None)
print("\n| model | shape | run | s/pass | / dlo resident bf16 | exposed transfer | streamed per pass | "
      "that at the pinned rate | device peak |\n|---|---|---|---|---|---|---|---|---|")
gib = lambda b: f"{b / 2**30:.2f} GiB" if b and b > 0 else "-"
order = [sh.split("=")[0] for sh in sys.argv[2].split()]
groups = {os.path.basename(p)[6:].rsplit("_", 2)[0] for p in glob.glob(f"{w}/f8rep_*.json")}
for g in sorted(groups, key=lambda g: (order.index(g.split("_", 1)[1]) if g.split("_", 1)[1] in order else 99, g)):
    model, shape = g.split("_", 1)
    rows = []
    for s in ("resident", "dlo"):
        for st in ("bf16", "fp8"):
            doc = load(f"{w}/f8rep_{g}_{s}_{st}.json")
            if not doc:
                continue
            r = doc["ranks"][0]; pp = r.get("per_pass", []); steady = pp[1:] or pp
            per = r.get("h2d_bytes", 0) / max(1, len(pp)) if s == "dlo" else 0
            rows.append((f"dlo --offload {s}, {st} storage", statistics.median(p["wall_s"] for p in steady),
                         f"{statistics.median(p.get('exposed_transfer_s', 0) for p in steady) * 1e3:.1f} ms",
                         f"{per / 2**20:.1f} MiB" if per else "-",
                         f"{per / pinned / 1e6:.1f} ms" if per and pinned else "-", gib(r.get("allocator_allocated_peak_bytes"))))
    for d in load(f"{w}/f8dif_{g}.json") or []:
        rows.append((f"diffusers {d['diffusers']} {d['variant']}", d.get("s_per_pass"), d.get("error") or d.get("skipped") or "",
                     "", "", gib(d.get("device_peak_bytes"))))
    base = rows[0][1] if rows and rows[0][0] == "dlo --offload resident, bf16 storage" else None
    for name, sp, exp, per, copy, peak in rows:
        rel = f"{sp / base:.3f}" if sp and base else "-"
        print(f"| {model} | {shape} | {name} | {f'{sp:.4f}' if sp else '-'} | {rel} | {exp} | {per} | {copy} | {peak} |")
PY
}

# ---- MODE=lora: a LoRA's cost per pass (fused, unfused) and a 4-step distilled job against the 50-step default ----
# LORA_MODELS "PRESET:LAYERS ..." (random bf16 models, with make's small text encoder and VAE),
# LORA_RANK (32: a PEFT LoRA on every block Linear, tools/bench/make_lora.py), LORA_SHAPE F,H,W,L
# (the per-pass runs: dlo-forward, 1 rank, --offload dlo so every block streams from pinned host
# memory, unguided: the distilled recipe's pass; none, --fuse-lora, --lora; unfused dlo must equal
# unfused resident byte for byte) and LORA_JOB HxWxFRAMES (whole jobs of dlo-generate-bare, 1 rank,
# --offload dlo, text encoder and VAE on the GPU: the default recipe, 50 steps of UniPC, guidance 5,
# shift 3, 100 transformer passes in 50 traversals; the distilled one, 4 steps, guidance 1, schedule
# lightx2v, shift 5, the LoRA fused, 4 passes).
LORA_MODELS=${LORA_MODELS:-"wan2.1-t2v-14b:3 wan2.1-t2v-1.3b:8"}
LORA_RANK=${LORA_RANK:-32}; LORA_SHAPE=${LORA_SHAPE:-21,60,104,512}; LORA_JOB=${LORA_JOB:-480x832x81}
lora_make() {  # lora_make PRESET LAYERS
  "$B/bin/dlo-checkpoint" make "$W/lo_$1" --preset "$1" --layers "$2" --dtype bf16 >/dev/null || return 1
  "$PY" tools/bench/make_lora.py "$W/lo_$1" "$W/lo_$1.safetensors" --rank "$LORA_RANK"
}
lora_pass() {  # lora_pass PRESET
  local m=$1 c
  local common=(--model "$W/lo_$m" --component transformer --random-inputs "$LORA_SHAPE" --dtype bf16 --device "$DEVARG"
                --passes "$PASSES")
  for c in none fused unfused; do
    local extra=()
    [ "$c" = fused ] && extra=(--fuse-lora "$W/lo_$m.safetensors")
    [ "$c" = unfused ] && extra=(--lora "$W/lo_$m.safetensors")
    "$B/bin/dlo-forward" "${common[@]}" --offload dlo "${extra[@]}" --out "$W/lo_out_$c.safetensors" \
      --report "$W/lorep_${m}_$c.json" | tail -n 1 || return 1
  done
  "$B/bin/dlo-forward" "${common[@]}" --offload resident --lora "$W/lo_$m.safetensors" --out "$W/lo_out_res.safetensors" \
    >/dev/null || return 1
  cmp "$W/lo_out_unfused.safetensors" "$W/lo_out_res.safetensors" || { echo "unfused: dlo differs from resident"; return 1; }
  if cmp -s "$W/lo_out_none.safetensors" "$W/lo_out_unfused.safetensors"; then echo "the LoRA changed nothing"; return 1; fi
  echo "unfused: dlo's output equals resident's byte for byte, and differs from no LoRA"
}
lora_steps() {  # lora_steps PRESET
  local m=$1 h w f tv=cuda; IFS=x read -r h w f <<<"$LORA_JOB"; [ "$DEV" = cpu ] && tv=cpu
  local args=(--model "$W/lo_$m" --prompt "a red fox trotting through fresh snow at dawn" --seed 1 --height "$h" --width "$w"
              --frames "$f" --dtype bf16 --device "$DEVARG" --offload dlo --text-vae-device "$tv" --quiet)
  local t0 t1
  t0=$(date +%s.%N)
  mpirun_ -np 1 "$B/bin/dlo-generate-bare" "${args[@]}" --steps 50 --guidance 5 --scheduler unipc --flow-shift 3 \
    --out "$W/lo_default.safetensors" --report "$W/lostep_${m}_default.json" || return 1
  t1=$(date +%s.%N); echo "$t0 $t1" >"$W/lowall_${m}_default"
  mpirun_ -np 1 "$B/bin/dlo-generate-bare" "${args[@]}" --steps 4 --guidance 1 --schedule lightx2v --flow-shift 5 \
    --fuse-lora "$W/lo_$m.safetensors" --out "$W/lo_distilled.safetensors" --report "$W/lostep_${m}_distilled.json" || return 1
  echo "$t1 $(date +%s.%N)" >"$W/lowall_${m}_distilled"
}
lora_table() {
  "$PY" - "$W" "$LORA_MODELS" <<'PY'
import json, statistics, sys
w, models = sys.argv[1], [m.split(":")[0] for m in sys.argv[2].split()]
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return None
print("\n| model | per pass (dlo-forward, 1 rank, dlo) | s/pass | / none | exposed transfer | adapters | engine start (packing; the fused merge) |\n|---|---|---|---|---|---|---|")
for m in models:
    base = None
    for c in ("none", "fused", "unfused"):
        d = load(f"{w}/lorep_{m}_{c}.json")
        if not d:
            continue
        r = d["ranks"][0]; pp = r["per_pass"]; steady = pp[1:] or pp
        sp = statistics.median(p["wall_s"] for p in steady); base = base or sp
        ex = statistics.median(p["exposed_transfer_s"] for p in steady)
        print(f"| {m} | {c} | {sp:.4f} | {sp / base:.3f} | {ex * 1e3:.1f} ms | {r.get('adapter_bytes', 0) / 2**20:.1f} MiB | "
              f"{r.get('engine_start_s', 0):.2f} s |")
print("\n| model | job (dlo-generate-bare, 1 rank, dlo) | transformer passes | traversals | wall s | denoise s | "
      "s/traversal | exposed per traversal | text s | decode s |\n|---|---|---|---|---|---|---|---|---|---|")
for m in models:
    walls = {}
    for c in ("default", "distilled"):
        d = load(f"{w}/lostep_{m}_{c}.json")
        if not d:
            continue
        j, r = d["jobs"][0], d["ranks"][0]; t = j["timings"]; p = j["parameters"]
        try:
            a, b = open(f"{w}/lowall_{m}_{c}").read().split(); walls[c] = float(b) - float(a)
        except Exception:
            walls[c] = float("nan")
        guided = float(p.get("guidance", 1)) > 1
        n = r["traversals"]
        print(f"| {m} | {c}: {p.get('steps')} steps, guidance {p.get('guidance')} | {int(p.get('steps')) * (2 if guided else 1)} | "
              f"{n} | {walls[c]:.1f} | {t['denoise_s']:.2f} | {t['denoise_s'] / max(1, n):.4f} | "
              f"{r['exposed_wait_s'] / max(1, n) * 1e3:.1f} ms | {t['text_s']:.2f} | {t['decode_s']:.2f} |")
    if len(walls) == 2 and walls["distilled"] > 0:
        print(f"| {m} | default / distilled wall | | | {walls['default'] / walls['distilled']:.1f}x | | | | | |")
PY
}

export -f h2d fp8_make fp8_dlo fp8_diffusers fp8_wheels lora_make lora_pass lora_steps fault_sp whole_job compare_st spcfg_forward spcfg_generate soak probe known mpirun_ mpirun_nccl2 gpu_only facts model_small fwd same strategy dlo2 fault gen experts ti2v bench pinned
export W B DEV DEVARG PY BENCH_SHAPE PASSES LAYERS OMP_NUM_THREADS LORA_RANK LORA_SHAPE LORA_JOB
say "gpu-run: mode $MODE, device $DEV, bundle $B, torch site-packages ${SP:-NOT FOUND}, $(date -u)"
step facts 60 facts
if [ "$MODE" = fp8 ]; then
  [ -d .gpu/wheels ] && step wheels 60 fp8_wheels
  step h2d_copy 60 h2d
  # The streaming-exposed shape first (what fp8 storage is for), the big model first.
  for sh in $FP8_SHAPES; do
    for mm in $FP8_MODELS; do
      m=${mm%%:*}
      [ -d "$W/f8_$m" ] || step "make_$m" 90 fp8_make "$m" "${mm##*:}"
      step "fp8_dlo_${m}_${sh%%=*}" 120 fp8_dlo "$m" "${sh%%=*}" "${sh#*=}"
      step "fp8_diffusers_${m}_${sh%%=*}" 150 fp8_diffusers "$m" "${sh%%=*}" "${sh#*=}"
    done
  done
  fp8_table >"$L/table.txt" 2>&1; cat "$L/table.txt" >>"$SUM"
  cp "$W"/h2d.json "$W"/f8rep_*.json "$W"/f8dif_*.json "$L/" 2>/dev/null
  tar -C "$W" -czf "$OUT/logs.tar.gz" logs
  say "gpu-run: $NPASS passed, $NFAIL failed, $NSKIP skipped in $(( $(date +%s) - T0 )) s"
  rm -rf "$W"
  exit $(( NFAIL > 0 ))
fi
if [ "$MODE" = lora ]; then
  for mm in $LORA_MODELS; do
    m=${mm%%:*}
    step "lora_make_$m" 90 lora_make "$m" "${mm##*:}"
    step "lora_pass_$m" 120 lora_pass "$m"
    step "lora_steps_$m" 150 lora_steps "$m"
  done
  lora_table >"$L/table.txt" 2>&1; cat "$L/table.txt" >>"$SUM"
  cp "$W"/lorep_*.json "$W"/lostep_*.json "$L/" 2>/dev/null
  tar -C "$W" -czf "$OUT/logs.tar.gz" logs
  say "gpu-run: $NPASS passed, $NFAIL failed, $NSKIP skipped in $(( $(date +%s) - T0 )) s"
  rm -rf "$W"
  exit $(( NFAIL > 0 ))
fi
step mpi_smoke 60 mpirun_ -np 2 "$B/bin/test_mpi_smoke"
step test_engine_np2 120 mpirun_ -np 2 "$B/bin/test_engine"
step test_engine_gpu 120 "$B/bin/test_engine_gpu"
if [ -x "$B/bin/test_nccl_gpu" ]; then
  step test_nccl_gpu 120 gpu_only mpirun_nccl2 "$B/bin/test_nccl_gpu"
fi
step probe_invariance 60 probe
step model_small 60 model_small
step strategy_resident 90 fwd resident 1 resident
for s in $STRATEGIES; do [ "$s" = resident ] || step "strategy_$s" 90 strategy "$s"; done
step dlo_2ranks_nccl 120 dlo2
step fault_2ranks 90 fault
step generate_bare 120 gen
step experts_1_2ranks 120 experts
step ti2v_1_2ranks 120 ti2v
step sp_cfg_forward 120 spcfg_forward
step sp_cfg_generate 150 spcfg_generate
step soak_sp2_jitter 150 soak
step fault_sp2 90 fault_sp
step whole_job_text_vae 150 whole_job
for s in resident device-shards layerwise dlo auto; do
  case " ${BENCH_STRATEGIES:-$STRATEGIES auto} " in *" $s "*) step "bench_${LAYERS}L_$s" 120 bench "$LAYERS" "$s" ;; esac
done
# Layerwise device peak at two depths (goal: flat).
for n in ${FLAT_LAYERS:-20 40}; do step "bench_layerwise_${n}L" 150 bench "$n" layerwise; done
step pinned_copy 60 pinned
step h2d_copy 60 h2d
table >"$L/table.txt" 2>&1; cat "$L/table.txt" >>"$SUM"
cp "$W"/rep_*.json "$W"/brep_*.json "$W"/h2d.json "$L/" 2>/dev/null
tar -C "$W" -czf "$OUT/logs.tar.gz" logs
say "gpu-run: $NPASS passed, $NFAIL failed, $NSKIP skipped in $(( $(date +%s) - T0 )) s"
rm -rf "$W"
exit $(( NFAIL > 0 ))
