#!/usr/bin/env bash
# Issue 8 (hardening), the faults under mpirun: every rank ends with a message within a bounded
# time, rank 0's output is kept when the fault comes after it, and no process is left behind.
#   1. a rank stopped while loading (start-up check) or at the closing gather: the others name the
#      phase and the rank after DLO_GATHER_TIMEOUT_S, at 2 and 5 ranks; rank 0 stopped, at 3;
#   4. a mapped checkpoint truncated during a run: a message naming the file, every rank ended
#      (exit 1, not SIGBUS's 135), at 1 and 2 ranks; --inputs truncated mid-run does not matter.
#   test_hardening_mpi.sh BIN_DIR PYTHON
set -uo pipefail
BIN=$1 PY=$2
T=$(mktemp -d)
fails=0
# Processes of this test are found by the unique temporary folder in their command line and ended
# by pid (never by name): a test that leaves one behind fails.
leftovers() { pgrep -f -- "$T/" || true; }
cleanup() {
  for p in $(leftovers); do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$T/log" ] && sed 's/^/    | /' "$T/log" | head -20; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }
no_leftovers() {
  sleep 1
  local left
  left=$(leftovers)
  if [ -n "$left" ]; then fail "$1: processes left behind: $left"; for p in $left; do kill -CONT "$p"; kill -KILL "$p"; done; else ok "$1: no process left behind"; fi
}

"$BIN/dlo-checkpoint" make "$T/m" --preset wan-test --layers 3 --dtype fp32 --components transformer >/dev/null || exit 1
"$PY" -c "import sys, torch; from safetensors.torch import save_file; save_file({'hidden_states': torch.randn(1, 4, 2, 4, 4), 'timestep': torch.tensor([5]), 'encoder_hidden_states': torch.randn(1, 3, 16)}, sys.argv[1])" "$T/in.safetensors" || exit 1
FWD=("$BIN/dlo-forward" --model "$T/m" --component transformer --threads 1 --inputs "$T/in.safetensors")

echo "== 1. collectives outside the wave have a bounded wait naming the phase and the missing rank"
for np in 2 5; do
  last=$((np - 1))
  # A rank stopped (SIGSTOP) after loading, before the start-up check.
  DLO_GATHER_TIMEOUT_S=5 timeout 120 mpirun -np $np "${FWD[@]}" --out "$T/o_$np.safetensors" \
    --test-stop-rank $last --test-stop-at loaded >"$T/log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then fail "np $np, rank stopped while loading: exit $rc"
  elif ! grep -q "start-up check (model and inputs loaded on every rank): rank $last did not arrive within 5 s" "$T/log"; then
    fail "np $np, rank stopped while loading: no message naming the phase and rank $last"
  else ok "np $np, rank $last stopped while loading: every rank ended (exit $rc) naming the phase and rank $last"; fi
  [ -e "$T/o_$np.safetensors" ] && fail "np $np: an output was written although the start-up check failed"
  no_leftovers "np $np, stopped while loading"

  # A rank stopped after its wave, before the closing gather: the output is written first.
  DLO_GATHER_TIMEOUT_S=5 timeout 120 mpirun -np $np "${FWD[@]}" --out "$T/e_$np.safetensors" \
    --test-stop-rank $last --test-stop-at report >"$T/log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then fail "np $np, rank stopped at the closing gather: exit $rc"
  elif ! grep -q "closing report gather: rank $last did not arrive within 5 s" "$T/log"; then
    fail "np $np, rank stopped at the closing gather: no message naming the phase and rank $last"
  else ok "np $np, rank $last stopped at the closing gather: every rank ended (exit $rc) naming the phase and rank"; fi
  "$PY" -c "import sys; from safetensors.torch import load_file; o = load_file(sys.argv[1])['output']; assert o.shape == (1, 4, 2, 4, 4)" \
    "$T/e_$np.safetensors" 2>/dev/null && ok "np $np: rank 0's output was written before the gather" || fail "np $np: output lost"
  no_leftovers "np $np, stopped at the closing gather"
done
# Rank 0 stopped while loading: the collectives' roll call has no one to name the missing rank, so
# the others do, after a grace period (mpi_world.h).
DLO_GATHER_TIMEOUT_S=3 timeout 120 mpirun -np 3 "${FWD[@]}" --out "$T/z.safetensors" --test-stop-rank 0 --test-stop-at loaded \
  >"$T/log" 2>&1
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then fail "np 3, rank 0 stopped while loading: exit $rc"
elif ! grep -q "start-up check (model and inputs loaded on every rank): rank 0 did not arrive within 3 s" "$T/log"; then
  fail "np 3, rank 0 stopped while loading: no message naming the phase and rank 0"
else ok "np 3, rank 0 stopped while loading: every rank ended (exit $rc), the others naming the phase and rank 0"; fi
no_leftovers "np 3, rank 0 stopped"

echo "== 4. a mapped checkpoint truncated while in use: a message naming the file, every rank ended"
file="$T/m/transformer/diffusion_pytorch_model.safetensors"
cp "$file" "$T/weights.bak"
for np in 1 2; do
  cp "$T/weights.bak" "$file"
  timeout 120 mpirun -np $np "${FWD[@]}" --out "$T/b.safetensors" --offload resident --passes 1000000 >"$T/log" 2>&1 &
  job=$!
  # Wait until a rank has the checkpoint mapped, then cut the file to nothing.
  for _ in $(seq 600); do grep -qs -- "$file" /proc/[0-9]*/maps 2>/dev/null && break; sleep 0.1; done
  : >"$file"
  wait $job
  rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $rc -ge 128 ]; then fail "np $np, truncated checkpoint: exit $rc (a signal or a hang)"
  elif ! grep -q "'$file' changed while in use (truncated or rewritten by another process)" "$T/log"; then
    fail "np $np, truncated checkpoint: no message naming the file"
  else ok "np $np, truncated checkpoint: exit $rc with a message naming the file"; fi
  no_leftovers "np $np, truncated checkpoint"
done
cp "$T/weights.bak" "$file"

# --inputs are read once into memory: cutting the file during the run changes nothing.
cp "$T/in.safetensors" "$T/in2.safetensors"
timeout 120 "$BIN/dlo-forward" --model "$T/m" --component transformer --threads 1 --inputs "$T/in2.safetensors" \
  --out "$T/i.safetensors" --passes 300 >"$T/log" 2>&1 &
job=$!
for _ in $(seq 600); do grep -qs -- "$file" /proc/[0-9]*/maps 2>/dev/null && break; sleep 0.1; done
: >"$T/in2.safetensors"
wait $job
rc=$?
[ $rc -eq 0 ] && ok "--inputs truncated during the run: exit 0" || fail "--inputs truncated during the run: exit $rc"
no_leftovers "--inputs truncated"

if [ $fails -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all fault checks passed"
