#!/usr/bin/env bash
# A rank that throws in the middle of a wave (rank 1, while its transfer of block 2 runs) makes
# every rank exit with an error, with the message, within a bounded time: no rank hangs in a gather.
#   fault_ends_all.sh BIN_DIR PYTHON
set -uo pipefail
BIN=$1 PY=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$BIN/dlo-checkpoint" make "$T/m" --preset wan-test --layers 4 --dtype fp32 --components transformer >/dev/null || exit 1
IN=$T/in.safetensors
"$PY" -c "import sys, torch; from safetensors.torch import save_file; save_file({'hidden_states': torch.randn(1, 4, 2, 4, 4), 'timestep': torch.tensor([5]), 'encoder_hidden_states': torch.randn(1, 3, 16)}, sys.argv[1])" "$IN" || exit 1
# Bad input found before the wave: exit 2 with the message, no abort.
"$BIN/dlo-forward" --model "$T/m" --component transformer --out "$T/x" 2>"$T/missing.log"
rc=$?
[ $rc -eq 2 ] || { echo "missing inputs: expected exit 2, got $rc"; cat "$T/missing.log"; exit 1; }
grep -q "inputs lack 'hidden_states'" "$T/missing.log" || { cat "$T/missing.log"; exit 1; }
start=$(date +%s)
timeout 120 mpirun -np 3 "$BIN/dlo-forward" --model "$T/m" --component transformer --inputs "$IN" \
  --out "$T/o" --offload dlo --threads 1 --passes 3 --fail-at-block 2 --fail-rank 1 >"$T/log" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "exit $rc after ${elapsed}s"
[ $rc -ne 0 ] || { echo "expected a failure"; exit 1; }
[ $rc -ne 124 ] || { echo "hung: killed by the timeout"; cat "$T/log"; exit 1; }
grep -q "injected fault while transferring block 2" "$T/log" || { cat "$T/log"; exit 1; }
echo "every rank ended, message seen"
