#!/usr/bin/env bash
# dlo-generate with groups of ranks per job (--sp, --cfg-parallel; pipeline/topology.h), on a
# random-weight model (2 heads, 24 wide; 32 tokens per job at 64x64, 5 frames):
#  1. one guided prompt: the frames sha256 at 1 rank equals 2 ranks as a CFG pair (auto), as SP 2,
#     4 ranks as CFG 2 x SP 2 (auto, dlo and layerwise), 3 ranks data parallel; results.jsonl
#     names the ranks and how; each rank's report counts the token rows it computed (its share
#     of the work); an unguided prompt takes SP 2;
#  2. a batch of 5 mixed jobs on 4 ranks as two groups of 2 (SP 2), and 3 guided jobs on 2 ranks
#     as a CFG pair (the manifest's cfg_parallel key; the flag wins over it): each job's frames as
#     at 1 rank; the pair's ranks take turns decoding; auto pairs ranks when there are fewer jobs
#     than ranks; a batch's tail regrouped (5 jobs on 4 ranks: the fifth on all four once the
#     others are done, its frames as at 1 rank); with a slow VAE neither rank of a pair queues
#     more than four decodes;
#  3. a job failing in a group fails once (one record, from the group's first rank) and the
#     batch goes on; exit 3; a failure on one member alone (a block, the step's inputs) is
#     recorded with that member's reason;
#  4. two experts (Wan2.2 A14B preset) in groups of 2: frames as at 1 rank;
#  5. refused by name, exit 2, nothing written (a batch: not even its output folder): more ranks
#     along the sequence than ranks or heads (naming the job), groups larger than the ranks; ranks that disagree on the topology (a test hook) end before
#     any of the groups' collectives; --dry-run prints the topology and each job's ranks;
#  6. SIGTERM to every rank of a CFG pair: exit 143, only finished videos kept, the rerun completes;
#  7. SIGKILL of one rank of a group mid-batch ends every rank within a bounded time.
# Every job whose frames are compared gives each rank of its group at least 16 tokens: the domain
# where tests/models/test_sequence_parallel.cpp's probe shows this libtorch's GEMMs row-invariant.
# Smaller shares can round differently in bf16: libtorch sends an m x k x n GEMM to oneDNN only
# above m*k*n = 4096, so at this model's narrowest GEMM (24 x 16) a 6-token share and its 12-token
# job take different kernels: on an AVX-512 BF16 CPU one of five jobs at 48x32 rounded differently
# from 1 rank. Real Wan widths are above that cut at any share.
#   groups_cli.sh BIN_DIR
set -euo pipefail
# shellcheck source=tests/common/cli.sh
source "$(dirname "$0")/../common/cli.sh" "$1"
"$BIN/dlo-checkpoint" make "$T/m" --preset wan-test --layers 3 --dtype bf16 --shard-size 20KB >/dev/null
grep -q '"num_attention_heads": 2' "$T/m/transformer/config.json" || fail "the test model does not have 2 heads"
ONE=("$BIN/dlo-generate" --model "$T/m" --steps 2 --height 64 --width 64 --frames 5 --threads 1 --seed 7 --quiet)
field() {  # field REPORT NAME: the first job's value of NAME in a --report file
  python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['jobs'][0][sys.argv[2]]))" "$1" "$2"
}

# 1. One prompt, every topology: the same frames.
rows() {  # rows REPORT: each rank's token_block_rows, in rank order
  python3 -c "import json,sys; print(' '.join(str(r['token_block_rows']) for r in json.load(open(sys.argv[1]))['ranks']))" "$1"
}
# The work each rank computed: a guided job at 1 rank is 2 branches x 32 tokens x 3 blocks x 2
# steps = 384 token rows; a CFG pair's ranks one branch each (192), SP 2's ranks half the tokens of
# both (192), CFG 2 x SP 2's a quarter (96); a rank without a job none.
single() {  # single NP WANT_PARALLEL 'WANT_ROWS' ARGS...: renders, checks the frames, the record, the work split
  local np=$1 want=$2 want_rows=$3; shift 3
  rm -f "$T/o.mp4" "$T/r.json"
  mpirun -np "$np" "${ONE[@]}" --out "$T/o.mp4" --report "$T/r.json" "$@" >/dev/null 2>"$T/log" || fail "np $np $*: $(cat "$T/log")"
  [ "$(field "$T/r.json" frames_sha256)" = "$REF" ] || fail "np $np $*: frames differ from 1 rank"
  [ "$(field "$T/r.json" parallel)" = "\"$want\"" ] || fail "np $np $*: parallel $(field "$T/r.json" parallel), want $want"
  [ "$(rows "$T/r.json")" = "$want_rows" ] || fail "np $np $*: token rows per rank $(rows "$T/r.json"), want $want_rows"
  echo "ok: $np rank(s) $* ($want): the frames of 1 rank; token rows per rank $want_rows"
}
mpirun -np 1 "${ONE[@]}" --prompt "a red fox" --guidance 4 --out "$T/one.mp4" --report "$T/one.json" >/dev/null 2>"$T/log" \
  || fail "1 rank: $(cat "$T/log")"
REF=$(field "$T/one.json" frames_sha256)
[ "$(rows "$T/one.json")" = 384 ] || fail "1 rank computed $(rows "$T/one.json") token rows, want 384"
single 2 "cfg 2" "192 192" --prompt "a red fox" --guidance 4
[ "$(field "$T/r.json" ranks)" = "[0, 1]" ] || fail "a CFG pair's record names ranks $(field "$T/r.json" ranks)"
grep -q '"group_size": 2' "$T/r.json" || fail "the report has no group of 2"
single 2 "sp 2" "192 192" --prompt "a red fox" --guidance 4 --sp 2 --cfg-parallel off --offload dlo
single 4 "cfg 2 x sp 2" "96 96 96 96" --prompt "a red fox" --guidance 4 --offload dlo
single 4 "cfg 2 x sp 2" "96 96 96 96" --prompt "a red fox" --guidance 4 --offload layerwise
single 3 "dp" "384 0 0" --prompt "a red fox" --guidance 4
mpirun -np 1 "${ONE[@]}" --prompt "an owl" --guidance 1 --out "$T/one.mp4" --report "$T/one.json" >/dev/null 2>"$T/log" \
  || fail "1 rank: $(cat "$T/log")"
REF=$(field "$T/one.json" frames_sha256)
single 2 "sp 2" "96 96" --prompt "an owl" --guidance 1

# 2. Batches in groups.
cat >"$T/jobs.yaml" <<EOF
model: m
defaults: {frames: 5, height: 64, width: 64, steps: 2, seed: 11}
jobs:
  - {id: fox, prompt: "a red fox in the snow"}
  - {id: owl, prompt: "an owl at night", steps: 4, height: 64, width: 48, frames: 9, guidance: 1}
  - {id: sea, prompt: "waves on a beach", steps: 3, height: 80, width: 64, scheduler: euler}
  - {id: car, prompt: "a car on a road", seed: 5}
  - {id: elk, prompt: "an elk", steps: 3, guidance: 6}
EOF
GEN=("$BIN/dlo-generate" --threads 1 --quiet --jobs "$T/jobs.yaml")
mpirun -np 1 "${GEN[@]}" --output-dir "$T/ref" 2>"$T/log" || fail "the batch at 1 rank: $(cat "$T/log")"
same_as_ref() {  # same_as_ref DIR JOBS...
  local dir=$1; shift
  for id in "$@"; do
    [ -n "$(sha_of "$T/ref/results.jsonl" "$id")" ] && [ "$(sha_of "$dir/results.jsonl" "$id")" = "$(sha_of "$T/ref/results.jsonl" "$id")" ] \
      || fail "$dir: $id's frames differ from 1 rank"
  done
}
mpirun -np 4 "${GEN[@]}" --output-dir "$T/b4" --sp 2 --report "$T/b4.json" 2>"$T/log" || fail "5 jobs in groups of 2: $(cat "$T/log")"
same_as_ref "$T/b4" fox owl sea car elk
grep -q '"parallel":"sp 2"' "$T/b4/results.jsonl" || fail "the unguided job did not run SP 2: $(cat "$T/b4/results.jsonl")"
[ "$(grep -c '"ranks":\[2,3\]' "$T/b4/results.jsonl")" -ge 1 ] || fail "no job ran on the second group"
[ "$(wc -l <"$T/b4/results.jsonl")" = 5 ] || fail "5 jobs made $(wc -l <"$T/b4/results.jsonl") records"
echo "ok: 5 jobs on 4 ranks in two groups of 2: every job's frames as at 1 rank"
# The manifest asks for CFG pairs (its top-level cfg_parallel key).
{ echo "cfg_parallel: on"; head -4 "$T/jobs.yaml"; sed -n '6,7p' "$T/jobs.yaml"; } >"$T/three.yaml"
mpirun -np 2 "$BIN/dlo-generate" --threads 1 --jobs "$T/three.yaml" --output-dir "$T/b2" 2>"$T/log" \
  || fail "3 jobs on 2 ranks: $(cat "$T/log")"
grep -q "topology: 1 group(s) of 2 ranks (guided jobs cfg 2): 3 job(s) on 2 rank(s), predicted 3.80 single-rank step times vs 4.00 data parallel (--sp auto --cfg-parallel on)" "$T/log" \
  || fail "not a CFG pair for 3 jobs on 2 ranks: $(grep topology "$T/log")"
same_as_ref "$T/b2" fox sea car
[ "$(grep -c '"rank":0,"ranks":\[0,1\]' "$T/b2/results.jsonl")" = 2 ] && [ "$(grep -c '"rank":1,"ranks":\[0,1\]' "$T/b2/results.jsonl")" = 1 ] \
  || fail "the pair's ranks did not take turns decoding (by job position): $(cat "$T/b2/results.jsonl")"
echo "ok: 3 jobs on 2 ranks as a CFG pair (the manifest's cfg_parallel: on; the cost model's figures printed): frames as at 1 rank; decodes in turn"
mpirun -np 2 "$BIN/dlo-generate" --threads 1 --jobs "$T/three.yaml" --output-dir "$T/b2f" --cfg-parallel off --dry-run >"$T/stdout" 2>"$T/log" \
  || fail "dry run: $(cat "$T/log")"
grep -q "^topology: every rank its own job: .*(--sp auto --cfg-parallel off)" "$T/stdout" || fail "--cfg-parallel off did not win over the manifest: $(grep topology "$T/stdout")"
# auto: fewer jobs than ranks, the first one long: two CFG pairs; as many jobs as ranks: one each.
sed '/^cfg_parallel/d; s/steps: 2, seed: 11/steps: 6, seed: 11/' "$T/three.yaml" >"$T/three6.yaml"
mpirun -np 4 "$BIN/dlo-generate" --threads 1 --jobs "$T/three6.yaml" --output-dir "$T/b4a" --dry-run >"$T/stdout" 2>"$T/log" \
  || fail "dry run: $(cat "$T/log")"
grep -q "^topology: 2 group(s) of 2 ranks (guided jobs cfg 2): 3 job(s) on 4 rank(s)" "$T/stdout" \
  || fail "auto for 3 jobs on 4 ranks: $(grep topology "$T/stdout")"
mpirun -np 3 "$BIN/dlo-generate" --threads 1 --jobs "$T/three6.yaml" --output-dir "$T/b3a" --dry-run >"$T/stdout" 2>"$T/log" \
  || fail "dry run: $(cat "$T/log")"
grep -q "^topology: every rank its own job: 3 job(s) on 3 rank(s)" "$T/stdout" || fail "auto for 3 jobs on 3 ranks: $(grep topology "$T/stdout")"
echo "ok: auto: 3 jobs on 4 ranks as two CFG pairs, on 3 ranks one each"

# The tail regrouped: 5 guided jobs on 4 ranks, the third one step longer. Data parallel throughout
# leaves the fifth alone on a rank (4 single-rank steps); auto renders the first four one per rank
# (3) and then the fifth on all four as CFG 2 x SP 2 (2 / (1.84 x 1.38) = 0.79): 3.79, less than
# 0.95 x 4. Every job's frames as at 1 rank; the tail job's record names the four ranks; each rank
# computed its job's 384 token rows (the longer one 576) and a quarter of the tail's 384 (96).
tail_manifest "$T/tail.yaml"
TAIL=("$BIN/dlo-generate" --threads 1 --quiet --jobs "$T/tail.yaml")
mpirun -np 1 "${TAIL[@]}" --output-dir "$T/tail1" 2>"$T/log" || fail "the tail batch at 1 rank: $(cat "$T/log")"
mpirun -np 4 "${TAIL[@]}" --output-dir "$T/tail4" --dry-run >"$T/stdout" 2>"$T/log" || fail "the tail's dry run: $(cat "$T/log")"
grep -qF "topology: every rank its own job, then the last 1 job(s) on 1 group(s) of 4 ranks (guided jobs cfg 2 x sp 2) once the others are done: predicted 3.79 single-rank step times vs 4.00 data parallel throughout" "$T/stdout" \
  && grep "job 4 'j4'" "$T/stdout" | grep -qF "(then, once the jobs before it are denoised, on ranks 0-3, cfg 2 x sp 2)" \
  || fail "the tail's dry run: $(cat "$T/stdout")"
mpirun -np 4 "${TAIL[@]}" --output-dir "$T/tail4" --report "$T/tail4.json" 2>"$T/log" || fail "the tail at 4 ranks: $(cat "$T/log")"
for id in j0 j1 j2 j3 j4; do
  [ -n "$(sha_of "$T/tail1/results.jsonl" "$id")" ] && [ "$(sha_of "$T/tail4/results.jsonl" "$id")" = "$(sha_of "$T/tail1/results.jsonl" "$id")" ] \
    || fail "the tail batch: $id's frames differ from 1 rank"
done
grep '"id":"j4"' "$T/tail4/results.jsonl" | grep -q '"ranks":\[0,1,2,3\],"parallel":"cfg 2 x sp 2"' \
  || fail "the tail job's record: $(grep '"id":"j4"' "$T/tail4/results.jsonl")"
[ "$(grep -c '"parallel":"dp"' "$T/tail4/results.jsonl")" = 4 ] || fail "the first four not data parallel: $(cat "$T/tail4/results.jsonl")"
[ "$(rows "$T/tail4.json")" = "480 480 672 480" ] || fail "token rows per rank $(rows "$T/tail4.json"), want 480 480 672 480"
grep -q '"phases": 2' "$T/tail4.json" || fail "the report does not count 2 phases"
# A job failing in the first phase fails alone; the tail still regroups and renders.
set +e
mpirun -np 4 "$BIN/dlo-generate-testhooks" "${TAIL[@]:1}" --output-dir "$T/tailf" --fail-job 1 --fail-step 1 --fail-block 0 2>"$T/log"
rc=$?
set -e
[ "$rc" = 3 ] && grep '"id":"j1"' "$T/tailf/results.jsonl" | grep -q '"status":"failed"' \
  && [ "$(sha_of "$T/tailf/results.jsonl" j4)" = "$(sha_of "$T/tail1/results.jsonl" j4)" ] \
  || fail "a failure before the tail: exit $rc: $(cat "$T/tailf/results.jsonl")"
# Explicit requests keep one phase.
mpirun -np 4 "${TAIL[@]}" --output-dir "$T/tail4e" --cfg-parallel off --dry-run >"$T/stdout" 2>"$T/log" || fail "dry run: $(cat "$T/log")"
grep -q "^topology: every rank its own job: 5 job(s) on 4 rank(s), predicted 4.00 .*(--sp auto --cfg-parallel off)" "$T/stdout" \
  || fail "an explicit request regrouped the tail: $(grep topology "$T/stdout")"
echo "ok: 5 jobs on 4 ranks: the first four one per rank, the fifth regrouped on all four (cfg 2 x sp 2): frames as at 1 rank; a failure before the tail; explicit requests keep one phase"

# A slow VAE: no rank of a CFG pair queues more decodes than a rank alone may (README: at most four).
printf 'p1\np2\np3\np4\np5\n' >"$T/five.txt"
mpirun -np 2 "$BIN/dlo-generate-testhooks" --model "$T/m" --jobs "$T/five.txt" --output-dir "$T/slow" --steps 2 --height 32 --width 48 \
  --frames 5 --threads 1 --quiet --guidance 4 --cfg-parallel on --slow-decode-ms 1000 --report "$T/slow.json" >/dev/null 2>"$T/log" \
  || fail "slow decodes in a pair: $(cat "$T/log")"
python3 - "$T/slow.json" <<'PY' || fail "a rank of the pair queued too many decodes"
import json, sys
r = json.load(open(sys.argv[1]))
peaks = [x["decode_backlog_peak"] for x in r["ranks"]]
assert all(1 <= p <= 4 for p in peaks), peaks
assert sorted(set(j["rank"] for j in r["jobs"])) == [0, 1] and all(j["status"] == "ok" for j in r["jobs"]), r["jobs"]
print("ok: slow decodes in a CFG pair: decode queue peaks", peaks, "(both ranks decode; at most four)")
PY

# 3. A job failing in a group fails once; the batch goes on.
set +e
mpirun -np 2 "$BIN/dlo-generate-testhooks" "${GEN[@]:1}" --output-dir "$T/f" --sp 2 --cfg-parallel off --fail-job 1 --fail-step 2 --fail-block 1 2>"$T/log"
rc=$?
set -e
[ "$rc" = 3 ] || fail "a failed job in a group: exit $rc, want 3: $(cat "$T/log")"
[ "$(grep -c '"id":"owl"' "$T/f/results.jsonl")" = 1 ] && grep '"id":"owl"' "$T/f/results.jsonl" | grep -q '"status":"failed"' \
  || fail "the failed job's records: $(grep owl "$T/f/results.jsonl")"
grep '"id":"owl"' "$T/f/results.jsonl" | grep -q 'denoising step 2: .*injected failure' || fail "the failure's message: $(grep owl "$T/f/results.jsonl")"
same_as_ref "$T/f" fox sea car elk
echo "ok: a job failing in an SP group fails once, the other 4 as at 1 rank, exit 3"
# On one rank of the group only (its block, or its step's inputs): the record gives that rank's reason.
for at in "1:block 1: .*injected failure" "-1:the step's inputs: .*injected failure"; do
  set +e
  mpirun -np 2 "$BIN/dlo-generate-testhooks" "${GEN[@]:1}" --output-dir "$T/f1" --sp 2 --cfg-parallel off --fail-job 0 --fail-step 1 \
    --fail-block "${at%%:*}" --fail-rank 1 2>"$T/log"
  rc=$?
  set -e
  [ "$rc" = 3 ] || fail "a failure on rank 1 alone: exit $rc: $(cat "$T/log")"
  grep '"id":"fox"' "$T/f1/results.jsonl" | tail -1 | grep -q "denoising step 1: rank 1 of this job's group: ${at#*:}" \
    || fail "a failure on rank 1 alone: $(grep fox "$T/f1/results.jsonl" | tail -1)"
  echo "ok: a failure on the group's rank 1 alone (${at#*:}) is recorded with its reason"
done

# 4. Two experts in groups.
"$BIN/dlo-checkpoint" make "$T/x" --preset wan2.2-a14b-test --layers 3 --dtype bf16 --shard-size 20KB >/dev/null
X=("$BIN/dlo-generate" --model "$T/x" --steps 4 --height 64 --width 64 --frames 5 --threads 1 --seed 3 --quiet --prompt "a boat" --guidance 4)
mpirun -np 1 "${X[@]}" --out "$T/x1.mp4" --report "$T/x1.json" >/dev/null 2>"$T/log" || fail "two experts, 1 rank: $(cat "$T/log")"
for t in "--sp 2 --cfg-parallel off" "--cfg-parallel on"; do
  # shellcheck disable=SC2086
  mpirun -np 2 "${X[@]}" --out "$T/x2.mp4" --report "$T/x2.json" $t >/dev/null 2>"$T/log" || fail "two experts, $t: $(cat "$T/log")"
  [ "$(field "$T/x2.json" frames_sha256)" = "$(field "$T/x1.json" frames_sha256)" ] || fail "two experts, $t: frames differ"
  echo "ok: two experts, 2 ranks $t: the frames of 1 rank"
done

# 5. Refusals, and the dry run.
refused() {  # refused NP MESSAGE ARGS...
  local np=$1 msg=$2; shift 2
  set +e
  mpirun -np "$np" "${ONE[@]}" --prompt "a red fox" --guidance 4 --out "$T/no.mp4" "$@" >"$T/stdout" 2>"$T/stderr"
  local rc=$?
  set -e
  [ "$rc" = 2 ] && grep -qF -- "$msg" "$T/stderr" && [ ! -e "$T/no.mp4" ] || fail "np $np $*: exit $rc: $(cat "$T/stderr")"
  echo "ok: np $np $* refused: $msg"
}
refused 4 "--sp 4 --cfg-parallel auto on 4 rank(s): job 'video' (guided, sp 4): 4 ranks along the sequence exceed the model's 2 attention heads" --sp 4
refused 2 "--sp 2 --cfg-parallel on on 2 rank(s): 4 ranks per job (a CFG pair of 2 each) > 2 rank(s)" --sp 2 --cfg-parallel on
refused 1 "--sp auto --cfg-parallel on on 1 rank(s): 2 ranks per job (a CFG pair) > 1 rank(s)" --cfg-parallel on
# A batch: refused before its output folder or results.jsonl exists (probe V1), naming the job that
# would get the impossible split (here the unguided one: all 4 ranks along the sequence).
batch_refused() {  # batch_refused NP MESSAGE MANIFEST_TOPOLOGY_LINE ARGS...
  local np=$1 msg=$2 key=$3; shift 3
  rm -rf "$T/v1"
  { [ -z "$key" ] || echo "$key"; echo "model: m"; echo "defaults: {frames: 5, height: 64, width: 64, steps: 2}"; echo "jobs:"
    echo "  - {id: guided, prompt: a fox, guidance: 4}"; echo "  - {id: plain, prompt: an owl, guidance: 1}"; } >"$T/v1.yaml"
  set +e
  mpirun -np "$np" "$BIN/dlo-generate" --threads 1 --quiet --jobs "$T/v1.yaml" --output-dir "$T/v1" "$@" >"$T/stdout" 2>"$T/stderr"
  local rc=$?
  set -e
  [ "$rc" = 2 ] && grep -qF -- "$msg" "$T/stderr" && [ ! -e "$T/v1" ] || fail "a batch, np $np $key $*: exit $rc, $(ls "$T/v1" 2>&1): $(cat "$T/stderr")"
  echo "ok: a batch, np $np $key $* refused before anything is written: $msg"
}
batch_refused 4 "command line: --sp 2 --cfg-parallel on on 4 rank(s): job 'plain' (unguided, sp 4): 4 ranks along the sequence exceed the model's 2 attention heads" "" --sp 2 --cfg-parallel on
batch_refused 2 "command line: --sp 4 --cfg-parallel auto on 2 rank(s): 4 ranks along the sequence > 2 rank(s)" "" --sp 4
batch_refused 2 "v1.yaml: --sp 4 --cfg-parallel auto on 2 rank(s): 4 ranks along the sequence > 2 rank(s)" "sp: 4"
refused 2 "--cfg-parallel: 'yes' is not on, off or auto" --cfg-parallel yes
refused 2 "--sp: 'two' is not auto or a rank count (1 or more)" --sp two
# Ranks that disagree on the topology (a test hook: rank 1 asks for no CFG pair) are refused before
# any of the groups' collectives, every rank naming the disagreement, nothing written.
set +e
mpirun -np 2 "$BIN/dlo-generate-testhooks" "${ONE[@]:1}" --prompt "a red fox" --guidance 4 --out "$T/no.mp4" --test-topology-skew-rank 1 >"$T/stdout" 2>"$T/stderr"
rc=$?
set -e
[ "$rc" = 1 ] && grep -qF "rank 1 starts phase 0 (jobs 0 + 1) with groups of 2 rank(s) (CFG 0), rank 0 phase 0 (jobs 0 + 1) with groups of 2 (CFG 1)" "$T/stderr" \
  && [ ! -e "$T/no.mp4" ] || fail "a rank disagreeing on the topology: exit $rc: $(cat "$T/stderr")"
echo "ok: ranks disagreeing on the topology are refused before the groups' collectives (exit 1, the disagreement named)"
mpirun -np 4 "${GEN[@]}" --output-dir "$T/dry" --dry-run --sp 2 >"$T/stdout" 2>"$T/log" || fail "dry run: $(cat "$T/log")"
grep -q "job 1 'owl'.*(starts on ranks 2-3, sp 2)" "$T/stdout" && grep -q "^topology: 2 group(s) of 2 ranks" "$T/stdout" \
  || fail "the dry run's topology: $(cat "$T/stdout")"
echo "ok: --dry-run prints the topology and the ranks each job starts on"

# 6. SIGTERM to every rank of a pair: a clean stop (143), nothing unfinished kept; the rerun completes.
{ echo "cfg_parallel: on"; echo "model: m"; echo "defaults: {frames: 5, height: 32, width: 48, steps: 60}"; echo "jobs:"
  for i in 0 1 2 3; do echo "  - {id: t$i, prompt: \"prompt $i\", seed: $i}"; done; } >"$T/term.yaml"
mpirun -np 2 "$BIN/dlo-generate" --threads 1 --quiet --jobs "$T/term.yaml" --output-dir "$T/term" >/dev/null 2>"$T/log" &
pid=$!
wait_for_results "$T/term/results.jsonl" 1
pkill -TERM -f "^[^ ]*dlo-generate .*$T/term" || true
set +e
wait $pid
rc=$?
set -e
[ "$rc" = 143 ] || fail "SIGTERM to a pair: exit $rc, want 143: $(tail -5 "$T/log")"
n_ok=$(grep -c '"status":"ok"' "$T/term/results.jsonl")
[ "$(find "$T/term" -name '*.mp4' | wc -l)" = "$n_ok" ] || fail "SIGTERM left $(ls "$T/term") for $n_ok finished job(s)"
mpirun -np 2 "$BIN/dlo-generate" --threads 1 --quiet --jobs "$T/term.yaml" --output-dir "$T/term" >/dev/null 2>"$T/log" \
  || fail "the rerun after SIGTERM: $(cat "$T/log")"
[ "$(grep -c '"status":"ok"' "$T/term/results.jsonl")" = 4 ] || fail "the rerun did not complete: $(cat "$T/term/results.jsonl")"
echo "ok: SIGTERM to a CFG pair stopped it cleanly (exit 143, $n_ok job(s) kept); the rerun completed the 4"

# 7. SIGKILL of a group's member mid-batch ends every rank.
manifest "$T/long.yaml" m j 3 80
sed -i 's/height: 32, width: 48/height: 64, width: 64/' "$T/long.yaml"  # 32 tokens: SP 2 holds 16 a rank (the floor)
mpirun -np 2 "$BIN/dlo-generate" --threads 1 --quiet --jobs "$T/long.yaml" --output-dir "$T/kill" --sp 2 --cfg-parallel off &
pid=$!
wait_for_results "$T/kill/results.jsonl" 1
kill_a_rank $pid "$T/kill"
echo "ok: SIGKILL of one rank of an SP group ended every rank in ${KILLED_S} s"
