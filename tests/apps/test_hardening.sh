#!/usr/bin/env bash
# Issue 8 (hardening), one block per defect class, through the tools as a user runs them. Each
# block states the rule; a failed expectation prints the tool's output and fails the script.
# Every tool call runs under `timeout`, so a hang fails the test (exit 124) instead of stalling it.
#   test_hardening.sh BIN_DIR PYTHON
set -uo pipefail
BIN=$1 PY=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*"; [ -f "$T/log" ] && sed 's/^/    | /' "$T/log" | head -20; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }
# run EXPECTED_RC GREP_PATTERN DESCRIPTION -- command...: runs the command (60 s bound) into $T/log.
run() {
  local want=$1 pattern=$2 what=$3
  shift 4
  timeout 60 "$@" >"$T/log" 2>&1
  local rc=$?
  if [ "$rc" != "$want" ]; then fail "$what: exit $rc, expected $want"; return 1; fi
  if [ -n "$pattern" ] && ! grep -q -- "$pattern" "$T/log"; then fail "$what: no '$pattern' in the output"; return 1; fi
  if grep -q "Exception raised from\|frame #" "$T/log"; then fail "$what: a libtorch stack trace reached the user"; return 1; fi
  ok "$what"
}
CK=$BIN/dlo-checkpoint FW=$BIN/dlo-forward

"$CK" make "$T/m" --preset wan-test --layers 3 --dtype fp32 --components transformer >/dev/null || { echo "make failed"; exit 1; }
"$PY" - "$T" <<'PY' || { echo "inputs failed"; exit 1; }
import sys, torch
from safetensors.torch import save_file
t = sys.argv[1]
g = torch.Generator().manual_seed(1)
x, ctx = torch.randn(1, 4, 2, 4, 4, generator=g), torch.randn(1, 3, 16, generator=g)
save_file({"hidden_states": x, "timestep": torch.tensor([5]), "encoder_hidden_states": ctx}, f"{t}/in.safetensors")
# Weak answers: batch sizes that disagree, and a 0-dim timestep.
save_file({"hidden_states": torch.randn(2, 4, 2, 4, 4), "timestep": torch.tensor([5, 6]),
           "encoder_hidden_states": ctx}, f"{t}/batch.safetensors")
save_file({"hidden_states": x, "timestep": torch.tensor(5), "encoder_hidden_states": ctx}, f"{t}/t0.safetensors")
PY
FWD=("$FW" --model "$T/m" --component transformer --threads 1)

echo "== 2. outputs that are not regular files are refused (exit 2, before work); symlinks followed"
run 2 "'/dev/null' is a character device" "dlo-forward --out /dev/null" -- "${FWD[@]}" --inputs "$T/in.safetensors" --out /dev/null
mkfifo "$T/fifo-out"
run 2 "is a FIFO" "dlo-forward --out FIFO" -- "${FWD[@]}" --inputs "$T/in.safetensors" --out "$T/fifo-out"
run 2 "is a directory" "dlo-forward --out DIR" -- "${FWD[@]}" --inputs "$T/in.safetensors" --out "$T"
run 2 "'/dev/null' is a character device" "dlo-forward --report /dev/null" -- "${FWD[@]}" --inputs "$T/in.safetensors" --out "$T/o.safetensors" --report /dev/null
[ -e "$T/o.safetensors" ] && fail "--report refused but --out was written anyway"
run 0 "" "dlo-forward reference output" -- "${FWD[@]}" --inputs "$T/in.safetensors" --out "$T/ref.safetensors"
echo "stale" >"$T/target.safetensors"
ln -s target.safetensors "$T/link.safetensors"
run 0 "" "dlo-forward --out SYMLINK" -- "${FWD[@]}" --inputs "$T/in.safetensors" --out "$T/link.safetensors"
{ [ -L "$T/link.safetensors" ] && cmp -s "$T/target.safetensors" "$T/ref.safetensors"; } && ok "the link stays a link, its target holds the output" \
  || fail "symlink: the link was replaced or its target does not hold the output"
run 2 "exists and is a regular file, not a folder" "dlo-checkpoint make into a file" -- "$CK" make "$T/ref.safetensors" --components transformer
run 2 "a character device" "dlo-checkpoint copy into /dev/null" -- "$CK" copy "$T/m/transformer" /dev/null

echo "== 9. every output location is checked before the work (missing or unwritable folder)"
run 2 "does not exist" "dlo-forward --report into a missing folder" -- "${FWD[@]}" --inputs "$T/in.safetensors" --out "$T/o2.safetensors" --report "$T/nowhere/r.json"
[ -e "$T/o2.safetensors" ] && fail "--report refused but --out was written anyway"
run 2 "does not exist" "dlo-forward --out into a missing folder" -- "${FWD[@]}" --inputs "$T/in.safetensors" --out "$T/nowhere/o.safetensors"

echo "== 8. a FIFO as an input path is refused at once, never waited on"
mkfifo "$T/fifo.safetensors"
run 2 "is a FIFO, not a regular file" "dlo-checkpoint inspect FIFO" -- "$CK" inspect "$T/fifo.safetensors"
run 2 "is a FIFO, not a regular file" "dlo-forward --inputs FIFO" -- "${FWD[@]}" --inputs "$T/fifo.safetensors" --out "$T/o.safetensors"
cp -r "$T/m" "$T/mfifo" && rm "$T/mfifo/transformer/config.json" && mkfifo "$T/mfifo/transformer/config.json"
run 2 "config.json' is a FIFO" "dlo-forward with config.json a FIFO" -- "$FW" --model "$T/mfifo" --component transformer --inputs "$T/in.safetensors" --out "$T/o.safetensors"
mkdir -p "$T/tok/tokenizer" && mkfifo "$T/tok/tokenizer/spiece.model"
run 2 "spiece.model' is a FIFO" "dlo-forward --component tokenizer with spiece.model a FIFO" -- "$FW" --model "$T/tok" --component tokenizer --prompt hi --out "$T/o.safetensors"

echo "== 3. a checkpoint write replaces the folder's previous checkpoint completely; copy onto itself refused"
"$CK" make "$T/s" --preset wan-test --layers 3 --dtype fp32 --components transformer --shard-size 20KB --seed 1 >/dev/null
ls "$T/s/transformer"/*.index.json >/dev/null 2>&1 || fail "setup: the sharded make wrote no index"
run 0 "" "make (one file, seed 2) into the folder of a sharded checkpoint" -- "$CK" make "$T/s" --preset wan-test --layers 3 --dtype fp32 --components transformer --shard-size 0 --seed 2
left=$(ls "$T/s/transformer" | grep -c "safetensors")
[ "$left" = 1 ] && ok "one checkpoint file left (stale shards and index removed)" || fail "stale files left: $(ls "$T/s/transformer")"
"$CK" make "$T/s2" --preset wan-test --layers 3 --dtype fp32 --components transformer --shard-size 0 --seed 2 >/dev/null
cmp -s "$T/s/transformer/diffusion_pytorch_model.safetensors" "$T/s2/transformer/diffusion_pytorch_model.safetensors" \
  && ok "the folder loads the new weights (byte-identical to a fresh make)" || fail "the folder does not hold the new weights"
"$CK" make "$T/s3" --preset wan-test --layers 3 --dtype fp32 --components transformer --shard-size 20KB --seed 3 >/dev/null
run 0 "" "copy (one file) into a folder holding another sharded checkpoint" -- "$CK" copy "$T/s2/transformer" "$T/s3/transformer" --shard-size 0
[ "$(ls "$T/s3/transformer" | grep -c safetensors)" = 1 ] && ok "copy removed the stale shards and index" || fail "stale after copy: $(ls "$T/s3/transformer")"
run 2 "holds the source checkpoint" "copy onto itself" -- "$CK" copy "$T/s2/transformer" "$T/s2/transformer" --shard-size 20KB
run 2 "holds the source checkpoint" "copy onto itself through another path" -- "$CK" copy "$T/s2/transformer/diffusion_pytorch_model.safetensors" "$T/s2/./transformer/"
"$CK" inspect "$T/s2/transformer" >/dev/null || fail "copy onto itself damaged the source"

echo "== 7. a write that fails (file size limit: a full disk for this process) fails the command, leaves nothing half-written"
( ulimit -f 16; trap '' XFSZ; exec timeout 60 "$CK" make "$T/full" --preset wan-test --layers 3 --dtype fp32 ) >"$T/log" 2>&1
rc=$?
{ [ $rc -ne 0 ] && grep -q "File too large" "$T/log"; } && ok "make under a 16 KiB file size limit: exit $rc with the write error" \
  || fail "make under a file size limit: exit $rc"
bad=$(find "$T/full" -type f \( -size 0 -o -name '.*tmp-*' \) 2>/dev/null)
[ -z "$bad" ] && ok "no empty or temporary file left" || fail "left behind: $bad"

echo "== 6. two runs writing one output at once both leave a complete file (unique temporaries)"
"${FWD[@]}" --random-inputs 2,4,4,3 --seed 1 --out "$T/r1.safetensors" 2>/dev/null && "${FWD[@]}" --random-inputs 2,4,4,3 --seed 2 --out "$T/r2.safetensors" 2>/dev/null \
  || fail "concurrent: reference runs"
for i in 1 2 3; do
  timeout 60 "${FWD[@]}" --random-inputs 2,4,4,3 --seed 1 --out "$T/same.safetensors" 2>"$T/c1.log" & p1=$!
  timeout 60 "${FWD[@]}" --random-inputs 2,4,4,3 --seed 2 --out "$T/same.safetensors" 2>"$T/c2.log" & p2=$!
  wait $p1; r1=$?; wait $p2; r2=$?
  if [ $r1 -ne 0 ] || [ $r2 -ne 0 ]; then fail "concurrent round $i: exits $r1 $r2"; cat "$T/c1.log" "$T/c2.log"; continue; fi
  if cmp -s "$T/same.safetensors" "$T/r1.safetensors" || cmp -s "$T/same.safetensors" "$T/r2.safetensors"; then
    ok "concurrent round $i: both exit 0, the file is one whole output"
  else fail "concurrent round $i: the file is neither output"; fi
done
ls -a "$T" | grep -q "tmp-" && fail "temporary files left: $(ls -a "$T" | grep tmp-)"

echo "== 10. checkpoint tensors the config does not use, wrong block shapes and ffn_dim are caught at load"
cp -r "$T/m" "$T/short"
"$PY" -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c['num_layers']=2; json.dump(c,open(p,'w'))" "$T/short/transformer/config.json"
run 2 "the config does not use: 'blocks.2." "num_layers 2 on a 3-block checkpoint" -- "$FW" --model "$T/short" --component transformer --inputs "$T/in.safetensors" --out "$T/o.safetensors"
grep -q "blocks up to 2" "$T/log" || fail "the num_layers hint is missing"
cp -r "$T/m" "$T/ffn"
"$PY" -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c['ffn_dim']=40; json.dump(c,open(p,'w'))" "$T/ffn/transformer/config.json"
run 2 "ffn.net.0.proj.weight' has shape \[32, 24\], the config implies \[40, 24\]" "a wrong ffn_dim (engine path, blocks not bound)" -- "$FW" --model "$T/ffn" --component transformer --inputs "$T/in.safetensors" --out "$T/o.safetensors" --offload dlo
"$CK" make "$T/wide" --preset wan-test --layers 3 --dtype fp32 --components transformer --ffn-dim 40 >/dev/null
cp "$T/m/transformer/config.json" "$T/wide/transformer/config.json"
run 2 "has shape \[40, 24\], the config implies \[32, 24\]" "block weights of the wrong shape" -- "$FW" --model "$T/wide" --component transformer --inputs "$T/in.safetensors" --out "$T/o.safetensors"

echo "== 11. memory: a run that cannot fit is refused before it starts, with the figure"
"$CK" make "$T/big" --preset wan-test --layers 1 --dtype fp32 --components transformer --rope-max-seq-len 4096 >/dev/null
run 2 "out of memory: this run needs about" "dlo-forward with huge random latents" -- "$FW" --model "$T/big" --component transformer --random-inputs 512,2048,2048,16 --out "$T/o.safetensors"
run 2 "out of memory: writing these components needs about" "make with a 20 TB tensor" -- "$CK" make "$T/huge" --preset wan2.1-t2v-14b --layers 1 --ffn-dim 2000000000 --components transformer
[ -e "$T/huge" ] && fail "make refused for memory but created the folder"

echo "== 12. --threads is bounded by the cores with a message"
run 0 "exceeds the" "dlo-forward --threads 100000" -- "$FW" --model "$T/m" --component transformer --threads 100000 --inputs "$T/in.safetensors" --out "$T/o.safetensors"

echo "== settings are parsed strictly (DLO_GATHER_TIMEOUT_S)"
for v in abc "" -1 0 5s; do
  run 2 "DLO_GATHER_TIMEOUT_S='$v' is not a number of seconds > 0" "DLO_GATHER_TIMEOUT_S='$v'" -- env DLO_GATHER_TIMEOUT_S="$v" "${FWD[@]}" --inputs "$T/in.safetensors" --out "$T/o.safetensors"
done
run 2 "DLO_GATHER_TIMEOUT_S='abc'" "dlo-bench-engine DLO_GATHER_TIMEOUT_S=abc" -- env DLO_GATHER_TIMEOUT_S=abc "$BIN/dlo-bench-engine" --model "$T/m" --passes 1
run 0 "" "DLO_GATHER_TIMEOUT_S=30" -- env DLO_GATHER_TIMEOUT_S=30 "${FWD[@]}" --inputs "$T/in.safetensors" --out "$T/o.safetensors"

echo "== inputs that disagree are caught at start: batch sizes, a 0-dim timestep"
run 2 "encoder_hidden_states must be \[2, L, 16\] (batch 2 as hidden_states), got \[1, 3, 16\]" "batch 2 latents with batch 1 text" -- "${FWD[@]}" --inputs "$T/batch.safetensors" --out "$T/o.safetensors"
run 2 "timestep must be \[1\] (one per batch entry of hidden_states) or \[1, [0-9]*\] (one per token, Wan2.2.s expand_timesteps), got \[\]" "a 0-dim timestep" -- "${FWD[@]}" --inputs "$T/t0.safetensors" --out "$T/o.safetensors"

echo "== make refuses before writing anything; its parts fit together"
run 2 "unknown component 'bogus'" "make --components transformer,bogus" -- "$CK" make "$T/bogus" --components transformer,bogus
[ -e "$T/bogus" ] && fail "make with a bogus component wrote $(find "$T/bogus")"
run 2 "must equal the VAE's z_dim (16)" "make --in-channels 4 with a VAE" -- "$CK" make "$T/mix" --preset wan-test --in-channels 4 --components transformer,vae
[ -e "$T/mix" ] && fail "make refused but created the folder"
run 0 "" "make --preset wan-test (every component)" -- "$CK" make "$T/full_ok" --preset wan-test
"$PY" - "$T/full_ok" <<'PY' && ok "the transformer's in/out channels follow the VAE's z_dim" || fail "transformer channels != VAE z_dim"
import json, sys
t = json.load(open(f"{sys.argv[1]}/transformer/config.json")); v = json.load(open(f"{sys.argv[1]}/vae/config.json"))
assert t["in_channels"] == t["out_channels"] == v["z_dim"] == 16, (t["in_channels"], t["out_channels"], v["z_dim"])
PY

echo "== a VAE config whose scale_factor_temporal disagrees with temperal_downsample: followed, with a warning"
"$PY" - "$T" <<'PY' || fail "vae setup"
import json, sys, torch
from safetensors.torch import save_file
t = sys.argv[1]
p = f"{t}/full_ok/vae/config.json"; c = json.load(open(p)); c["scale_factor_temporal"] = 8; json.dump(c, open(p, "w"))
save_file({"latents": torch.randn(1, 16, 2, 2, 2)}, f"{t}/lat.safetensors")
PY
run 0 "warning: .*scale_factor_temporal' is 8, but temperal_downsample" "vae with scale_factor_temporal 8" -- "$FW" --model "$T/full_ok" --component vae --inputs "$T/lat.safetensors" --out "$T/v.safetensors" --threads 1

# dlo-forward's component entry point names the component and the key (it lives in the app now).
"$PY" - "$T" <<'PY' || fail "vae inputs setup"
import sys, torch
from safetensors.torch import save_file
t = sys.argv[1]
save_file({"hidden_states": torch.randn(1, 16, 1, 2, 2)}, f"{t}/no_latents.safetensors")
save_file({"latents": torch.randn(1, 16, 1, 2)}, f"{t}/lat4d.safetensors")
PY
run 2 "vae: inputs lack 'latents'" "dlo-forward --component vae without latents" -- "$FW" --model "$T/full_ok" --component vae --inputs "$T/no_latents.safetensors" --out "$T/v.safetensors" --threads 1
run 2 "vae decode: latents must be \[B, 16, F, H, W\], got \[1, 16, 1, 2\]" "dlo-forward --component vae with 4-d latents" -- "$FW" --model "$T/full_ok" --component vae --inputs "$T/lat4d.safetensors" --out "$T/v.safetensors" --threads 1

echo "== 5. --rank-passes: the rank that computes writes; nobody computing is refused"
run 0 "" "mpirun -np 2 --rank-passes 0,1" -- mpirun -np 2 "${FWD[@]}" --inputs "$T/in.safetensors" --out "$T/rp.safetensors" --rank-passes 0,1
cmp -s "$T/rp.safetensors" "$T/ref.safetensors" && ok "rank 1 wrote the output (equal to one rank's)" || fail "--rank-passes 0,1: output missing or different"
run 2 "no rank has a pass to compute" "mpirun -np 2 --rank-passes 0,0" -- mpirun -np 2 "${FWD[@]}" --inputs "$T/in.safetensors" --out "$T/rp0.safetensors" --rank-passes 0,0
[ -e "$T/rp0.safetensors" ] && fail "--rank-passes 0,0 wrote an output"

if [ $fails -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all hardening checks passed"
