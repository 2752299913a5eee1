#!/usr/bin/env bash
# dlo-forward --sp N: a group of N ranks computes one transformer forward with Ulysses sequence
# parallelism (every rank its share of the tokens; every rank still joins every block's gather),
# and the output file is byte-identical to one rank's, with guidance, uneven tokens (63 over 2, 3
# and 4 ranks) and heads (5 over 2, 3, 4), dlo and layerwise, groups of 2 beside each other at 4
# ranks, and a last group smaller than the others (3 ranks at --sp 2). Refused by name, exit 2,
# nothing written: more ranks per group than ranks, than heads; --sp with --rank-passes.
# --cfg-parallel: the conditional and unconditional branches on partner ranks (with SP inside each
# half at 4 ranks), predictions exchanged: both outputs identical to one rank's; refused without
# --guidance or when the ranks are not a multiple of 2 x --sp.
#   sequence_parallel_cli.sh BIN_DIR
set -euo pipefail
BIN=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
"$BIN/dlo-checkpoint" make "$T/m" --preset wan-test --layers 3 --heads 5 --dim 60 --dtype bf16 --components transformer >/dev/null
grep -q '"num_attention_heads": 5' "$T/m/transformer/config.json" || fail "no 5-head model: $(cat "$T/m/transformer/config.json")"
FWD=("$BIN/dlo-forward" --model "$T/m" --component transformer --random-inputs 7,6,6,9 --seed 12 --guidance
     --dtype bf16 --threads 1 --passes 2)
mpirun -np 1 "${FWD[@]}" --out "$T/one.safetensors" 2>"$T/log" || fail "1 rank: $(cat "$T/log")"
for run in "2 2 dlo" "3 3 dlo" "4 4 dlo" "4 2 dlo" "3 2 layerwise" "2 2 layerwise"; do
  read -r np sp s <<<"$run"
  rm -f "$T/out.safetensors"
  mpirun -np "$np" "${FWD[@]}" --sp "$sp" --offload "$s" --out "$T/out.safetensors" --report "$T/r.json" 2>"$T/log" \
    || fail "np $np --sp $sp: $(cat "$T/log")"
  cmp -s "$T/one.safetensors" "$T/out.safetensors" || fail "np $np --sp $sp $s: output differs from 1 rank"
  grep -q "\"sp_group_size\": $sp" "$T/r.json" || fail "np $np --sp $sp: the report has no group of $sp"
  echo "ok: $np ranks, --sp $sp, $s: byte-identical to 1 rank"
done
refused() {  # refused NP MESSAGE ARGS...: exit 2, the message, no output
  local np=$1 msg=$2; shift 2
  set +e
  mpirun -np "$np" "${FWD[@]}" --out "$T/no.safetensors" "$@" >"$T/stdout" 2>"$T/stderr"
  local rc=$?
  set -e
  [ "$rc" = 2 ] && grep -qF -- "$msg" "$T/stderr" && [ ! -e "$T/no.safetensors" ] \
    || fail "$* at $np ranks: exit $rc, want 2 and '$msg': $(cat "$T/stderr")"
  echo "ok: $* at $np ranks refused: $msg"
}
# CFG parallelism: the branches on partner ranks, alone and with SP inside each half.
for run in "2 1" "4 1" "4 2"; do
  read -r np sp <<<"$run"
  rm -f "$T/out.safetensors"
  mpirun -np "$np" "${FWD[@]}" --cfg-parallel --sp "$sp" --offload dlo --out "$T/out.safetensors" --report "$T/r.json" 2>"$T/log" \
    || fail "np $np --cfg-parallel --sp $sp: $(cat "$T/log")"
  cmp -s "$T/one.safetensors" "$T/out.safetensors" || fail "np $np --cfg-parallel --sp $sp: output differs from 1 rank"
  grep -q '"cfg_partners": 2' "$T/r.json" || fail "np $np --cfg-parallel: the report has no partners"
  [ "$(grep -c '"branches_computed_per_pass": 1' "$T/r.json")" = "$np" ] || fail "np $np --cfg-parallel: a rank computed both branches"
  echo "ok: $np ranks, --cfg-parallel --sp $sp: byte-identical to 1 rank (both branches)"
done
refused 3 "--cfg-parallel: 3 rank(s) are not a multiple of 2 x --sp (2)" --cfg-parallel
refused 2 "--sp 3: a group of 1 to 2 rank(s)" --sp 3
"$BIN/dlo-checkpoint" make "$T/m2" --preset wan-test --layers 2 --heads 2 --dim 24 --components transformer >/dev/null
FWD[2]="$T/m2"
refused 3 "--sp: the attention heads: 2 cannot be split into 3 parts of at least one" --sp 3
refused 2 "--sp with --rank-passes" --sp 2 --rank-passes 1,1
unset 'FWD[9]'  # --guidance
refused 2 "--cfg-parallel needs --guidance" --cfg-parallel
