#!/usr/bin/env bash
# dlo-generate on a two-expert model (Wan2.2 A14B's shape: transformer/ above the boundary,
# transformer_2/ below), as a user runs it, on random weights:
#  1. a batch whose ranks are on different experts in the same pass (jobs of different steps,
#     boundaries and schedulers) gives every job the same frames at 1, 2 and 3 ranks and with every
#     strategy (mixed split over the experts included), equal to the job rendered alone; the report
#     counts the passes that streamed both experts, and each expert gathered exactly its plan's
#     bytes (counted here from the safetensors headers) for the passes that streamed it;
#     a drifting batch (many passes on both experts, their blocks traversed together) is the
#     same at 2 and 3 ranks; a job failing in such a pass fails alone (exit 3);
#  2. expert alignment (the default): a batch whose jobs' phases differ (steps 3 and 8, shifts 3
#     and 12), where ranks park jobs and start others early, gives each job the frames it has
#     alone and without alignment, at 2 and 3 ranks (how many passes it saves also depends on
#     the tail's timing, so it is reported here, asserted in test_job_scheduler, measured by
#     tools/bench/bench_experts.py);
#  3. --dry-run counts both experts (their blocks, 2 slots each);
#  4. a guidance_2 that would do nothing (guidance <= 1) is refused by name before any work: exit 2;
#     one from defaults (the manifest's, the model's dlo_defaults.json) beside guidance 1 is not;
#  5. dlo-forward --component transformer_2 runs the low-noise expert (what --component
#     transformer gives on a folder whose transformer/ is that expert), at 2 ranks with dlo.
# (That the frames are WanPipeline's: the parity label, tools/reference/pipeline_parity.py --two-experts.)
#   experts_cli.sh BIN_DIR
set -euo pipefail
# shellcheck source=tests/common/cli.sh
source "$(dirname "$0")/../common/cli.sh" "$1"
export DLO_GATHER_TIMEOUT_S=60  # a pass out of step (a rank skipping an expert's gathers) fails in a minute
"$BIN/dlo-checkpoint" make "$T/m" --preset wan2.2-a14b-test --layers 3 --dtype bf16 --shard-size 20KB >/dev/null
[ -d "$T/m/transformer_2" ] && grep -q '"boundary_ratio": 0.875' "$T/m/model_index.json" \
  || fail "the wan2.2-a14b-test preset wrote no second expert: $(ls "$T/m")"
cmp -s "$T/m/transformer/config.json" "$T/m/transformer_2/config.json" || fail "the experts' configs differ"

# Steps at shift 3 (UniPC): 6 steps have timesteps 999 923 818 667 429 9 -> 2 high-noise steps at
# the folder's 0.875; 'owl' switches after 1 (0.95), 'sea' after 3 of 4 (0.5, Euler), so from the
# second pass on the ranks are on different experts. Section 1 runs without expert alignment, so
# that passes on both experts happen.
cat >"$T/jobs.yaml" <<YAML
model: m
output_dir: out
defaults: {frames: 5, height: 32, width: 48, seed: 11, guidance: 4.0, guidance_2: 3.0, format: png}
jobs:
  - {id: fox, prompt: "a red fox in the snow", steps: 6}
  - {id: owl, prompt: "an owl at night", steps: 3, boundary_ratio: 0.95}
  - {id: sea, prompt: "waves on a beach", steps: 4, boundary_ratio: 0.5, scheduler: euler}
  - {id: car, prompt: "a car on a road", steps: 5, guidance: 1, guidance_2: 1}
YAML
# Data parallel (every rank its own job): the passes where ranks are on different experts.
GEN=("$BIN/dlo-generate" --threads 1 --quiet --no-expert-alignment --sp 1 --cfg-parallel off)

run() {  # run NAME NP ARGS...: the batch; every job's sha checked against the reference
  local name=$1 np=$2; shift 2
  rm -rf "$T/out"
  mpirun -np "$np" "${GEN[@]}" --jobs "$T/jobs.yaml" --report "$T/$name.json" "$@"
  [ "$(grep -c '"status":"ok"' "$T/out/results.jsonl")" = 4 ] || fail "$name: $(cat "$T/out/results.jsonl")"
  for id in fox owl sea car; do
    local s
    s=$(sha_of "$T/out/results.jsonl" $id)
    [ ${#s} = 64 ] || fail "$name $id: no sha"
    if [ "$name" = ref ]; then eval "ref_$id=$s"; else [ "$s" = "$(eval echo \$ref_$id)" ] || fail "$name: $id differs"; fi
  done
  echo "ok: $name ($np rank(s) $*): 4 jobs, frames identical to 1 rank resident"
}
run ref 1 --offload resident
grep -q '"choice": "offload: resident .*; 2 experts, each rank holding its share of both; topology: ' "$T/ref.json" \
  || fail "the report does not say 2 experts: $(grep choice "$T/ref.json")"
run dlo2 2 --offload dlo
python3 - "$T/dlo2.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for rank in r["ranks"]:
    both = rank["passes_streaming_both_experts"]
    assert both >= 1, f"no pass streamed both experts: {rank}"
    ex = rank["experts"]
    assert len(ex) == 2 and all(e["bytes_gathered"] > 0 and e["traversals"] > 0 for e in ex), ex
    assert rank["bytes_gathered"] == sum(e["bytes_gathered"] for e in ex), rank
print(f"ok: 2 ranks: {both} pass(es) streamed both experts; traversals per expert "
      f"{[e['traversals'] for e in r['ranks'][0]['experts']]}; both engines gathered")
PY
run dlo3 3 --offload dlo
# Bytes per pass = the experts it needs, counted from the plan here (stack_plan.h's layout rule on
# the safetensors headers, not the engine's code): expert e gathers, per pass that streams it,
# sum over its blocks of shard * (N - 1), shard = ceil(block bytes / N) rounded up to 256, a block
# being its tensors (wan_block_tensor_names' order, 64-byte aligned) in the compute dtype (bf16;
# diffusers' fp32 modules in fp32); the ring's last prefetch brings block 0 once more. Its passes
# are the report's per-expert traversals (the scheduler's), so a pass on one expert moves only it.
for np in 2 3; do
python3 - "$T/m" "$T/dlo$np.json" "$np" <<'PY'
import glob, json, struct, sys
model, report, n = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3])
SIZE = {"F32": 4, "BF16": 2, "F16": 2}
FP32 = {"rope", "time_embedder", "scale_shift_table", "norm1", "norm2", "norm3"}
ORDER = [f"{a}.{p}.{w}" for a in ("attn1", "attn2") for p in ("to_q", "to_k", "to_v", "to_out.0") for w in ("weight", "bias")]
ORDER = ORDER[:8] + ["attn1.norm_q.weight", "attn1.norm_k.weight"] + ORDER[8:] + ["attn2.norm_q.weight", "attn2.norm_k.weight"]
def per_pass(folder):
    shapes = {}
    for f in glob.glob(f"{model}/{folder}/*.safetensors"):
        with open(f, "rb") as fh:
            (k,) = struct.unpack("<Q", fh.read(8))
            shapes.update({k2: v["shape"] for k2, v in json.loads(fh.read(k)).items() if k2 != "__metadata__"})
    cfg = json.load(open(f"{model}/{folder}/config.json"))
    names = ORDER + (["norm2.weight", "norm2.bias"] if cfg["cross_attn_norm"] else []) + \
        ["ffn.net.0.proj.weight", "ffn.net.0.proj.bias", "ffn.net.2.weight", "ffn.net.2.bias", "scale_shift_table"]
    gathered = []
    for i in range(cfg["num_layers"]):
        off = 0
        for t in names:
            numel = 1
            for d in shapes[f"blocks.{i}.{t}"]: numel *= d
            off = (off + 63) // 64 * 64 + numel * SIZE["F32" if FP32 & set(t.split(".")) else "BF16"]
        shard = ((off + n - 1) // n + 255) // 256 * 256
        gathered.append(shard * (n - 1))
    return sum(gathered), gathered[0]
for rank in report["ranks"]:
    for e, folder in enumerate(["transformer", "transformer_2"]):
        x, (g, g0) = rank["experts"][e], per_pass(folder)
        want = x["traversals"] * g + g0
        assert x["bytes_gathered"] == want, f"{np} ranks, rank {rank['rank']}, {folder}: gathered {x['bytes_gathered']}, " \
            f"the plan says {x['traversals']} passes x {g} + {g0} = {want}"
    t = [x["traversals"] for x in rank["experts"]]
    assert sum(t) - rank["passes_streaming_both_experts"] == rank["traversals"], rank
print(f"ok: {n} ranks: every expert gathered its plan's bytes for exactly the passes that streamed it "
      f"(passes per expert {t}, {report['ranks'][0]['passes_streaming_both_experts']} on both, {report['ranks'][0]['traversals']} in all)")
PY
done
run layerwise2 2 --offload layerwise
run shards2 2 --offload device-shards
run mixed2 2 --offload mixed
run mixed2b 2 --offload mixed --device-budget 8GiB
grep -q '"strategy": "device-shards+mixed"' "$T/mixed2b.json" || fail "mixed over two experts: $(grep '"strategy"' "$T/mixed2b.json" | head -2)"
"$BIN/dlo-generate" --threads 1 --quiet --model "$T/m" --prompt "waves on a beach" --steps 4 --boundary-ratio 0.5 \
  --scheduler euler --frames 5 --height 32 --width 48 --seed 11 --guidance 4 --guidance-2 3 --format png \
  --out "$T/sea" --report "$T/alone.json"
alone=$(grep -o '"frames_sha256": "[0-9a-f]*"' "$T/alone.json" | cut -d'"' -f4)
[ "$alone" = "$ref_sea" ] || fail "sea alone $alone differs from sea in the batch $ref_sea"
echo "ok: a job in the batch equals the same job rendered alone"

# Many passes on both experts (jobs of 6 and 2 steps alternating drift the ranks apart): the
# experts' blocks are traversed together; the same frames as 1 rank.
cat >"$T/drift.yaml" <<YAML
model: m
output_dir: out
defaults: {frames: 5, height: 32, width: 48, seed: 3, guidance: 4.0, guidance_2: 2.0, format: png}
jobs:
YAML
for i in 0 1 2 3 4 5; do echo "  - {id: d$i, prompt: \"drift $i\", steps: $(( i % 2 ? 2 : 6 )), boundary_ratio: 0.8}" >>"$T/drift.yaml"; done
shas() { for i in 0 1 2 3 4 5; do sha_of "$T/out/results.jsonl" d$i; done | tr '\n' ' '; }
rm -rf "$T/out"; "${GEN[@]}" --jobs "$T/drift.yaml" --offload resident; drift1=$(shas)
for np in 2 3; do
  rm -rf "$T/out"; mpirun -np $np "${GEN[@]}" --jobs "$T/drift.yaml" --offload dlo --report "$T/drift$np.json"
  [ "$(shas)" = "$drift1" ] || fail "drifting batch at $np ranks: $(shas) vs $drift1"
  both=$(grep -o '"passes_streaming_both_experts": [0-9]*' "$T/drift$np.json" | head -1 | grep -o '[0-9]*$')
  [ "$both" -ge 1 ] || fail "drifting batch at $np ranks: $both passes on both experts"
  echo "ok: a drifting batch at $np ranks: $both passes on both experts, frames identical to 1 rank"
done

# A job that fails in a pass on both experts (owl's step 2 runs transformer_2 while fox's runs
# transformer), inside the traversal (block 1) or before it (the step's inputs: the rank joins
# both experts' gathers as a ghost): that job alone fails, the others' frames are the reference's,
# exit 3.
for where in 1 -1; do
  rm -rf "$T/out"
  set +e
  mpirun -np 2 "$BIN/dlo-generate-testhooks" "${GEN[@]:1}" --jobs "$T/jobs.yaml" --offload dlo --fail-job 1 --fail-step 2 --fail-block "$where" \
    --report "$T/fail.json" >"$T/stdout" 2>"$T/stderr"
  rc=$?
  set -e
  [ "$rc" = 3 ] || fail "a failed job (block $where): exit $rc, want 3: $(tail -3 "$T/stderr")"
  grep '"id":"owl"' "$T/out/results.jsonl" | grep -q '"status":"failed"' || fail "owl did not fail: $(cat "$T/out/results.jsonl")"
  for id in fox sea car; do
    [ "$(sha_of "$T/out/results.jsonl" $id)" = "$(eval echo \$ref_$id)" ] || fail "$id differs after owl failed (block $where)"
  done
  grep -q '"passes_streaming_both_experts": [1-9]' "$T/fail.json" || fail "the failure was not in a pass on both experts"
  echo "ok: a job failing in a pass on both experts (block $where) fails alone; the others' frames unchanged"
done

# 2. Expert alignment: 8 jobs alternating 8 steps at shift 12 and 3 steps at shift 3 (as the issue's
# mixed batch: their high-noise phases differ), rendered alone, then as a batch at 2 and 3 ranks
# with and without alignment.
cat >"$T/mix.yaml" <<YAML
model: m
output_dir: out
defaults: {frames: 5, height: 32, width: 48, guidance: 4.0, guidance_2: 3.0, format: png}
jobs:
YAML
for i in 0 1 2 3 4 5 6 7; do
  if (( i % 2 )); then st=3 sh=3; else st=8 sh=12; fi
  echo "  - {id: x$i, prompt: \"mixed $i\", steps: $st, flow_shift: $sh, seed: $i}" >>"$T/mix.yaml"
done
ALIGNED=("$BIN/dlo-generate-testhooks" --threads 1 --quiet --await-prepared)
mshas() { for i in 0 1 2 3 4 5 6 7; do sha_of "$T/out/results.jsonl" x$i; done | tr '\n' ' '; }
both_of() { grep -o '"passes_streaming_both_experts": [0-9]*' "$1" | head -1 | grep -o '[0-9]*$'; }
alone=""
for i in 0 1; do  # one job of each kind alone (the batch's frames must be theirs)
  if (( i % 2 )); then st=3 sh=3; else st=8 sh=12; fi
  "${ALIGNED[@]}" --model "$T/m" --prompt "mixed $i" --steps $st --flow-shift $sh --seed $i --frames 5 --height 32 \
    --width 48 --guidance 4 --guidance-2 3 --format png --out "$T/alone$i" --report "$T/alone$i.json"
  alone+="$(grep -o '"frames_sha256": "[0-9a-f]*"' "$T/alone$i.json" | cut -d'"' -f4) "
done
for np in 2 3; do
  rm -rf "$T/out"; mpirun -np $np "${GEN[@]}" --jobs "$T/mix.yaml" --offload dlo --report "$T/mixoff$np.json"
  off=$(mshas)
  rm -rf "$T/out"; mpirun -np $np "${ALIGNED[@]}" --jobs "$T/mix.yaml" --offload dlo --report "$T/mixon$np.json"
  [ "$(grep -c '"status":"ok"' "$T/out/results.jsonl")" = 8 ] || fail "aligned batch at $np ranks: $(cat "$T/out/results.jsonl")"
  [ "$(mshas)" = "$off" ] || fail "aligned batch at $np ranks: frames $(mshas) differ from unaligned $off"
  [ "$(echo "$off" | cut -d' ' -f1-2) " = "$alone" ] || fail "the batch's x0/x1 differ from the jobs alone ($alone)"
  b_off=$(both_of "$T/mixoff$np.json") b_on=$(both_of "$T/mixon$np.json")
  sw=$(grep -o '"expert_alignment_switches": [0-9]*' "$T/mixon$np.json" | grep -o '[0-9]*$' | paste -sd+ | bc)
  [ -n "$b_on" ] && [ -n "$sw" ] || fail "$np ranks: the report lacks the alignment counts"
  # With every next job prepared before the boundary (--await-prepared), the first passes are
  # decided as in test_job_scheduler: ranks do park jobs and start others early.
  [ "$sw" -ge 1 ] || fail "$np ranks: no rank parked a job or started one early"
  echo "ok: $np ranks, 8 jobs of 8 steps at shift 12 and 3 at shift 3: frames as alone and unaligned (passes on both experts $b_off without alignment, $b_on with it; $sw parks/early starts)"
done

# 3. The dry run counts both experts.
mpirun -np 2 "${GEN[@]}" --jobs "$T/jobs.yaml" --dry-run --offload dlo --output-dir "$T/dry" >"$T/plan.txt"
grep -q "(2 experts, both kept; largest" "$T/plan.txt" && grep -q "(4 slots: 2 per expert)" "$T/plan.txt" \
  || fail "--dry-run: $(cat "$T/plan.txt")"
echo "ok: --dry-run counts both experts' blocks and slots"

# 4. A guidance_2 that WanPipeline would ignore: refused where the job sets it beside its own
# guidance 1, naming the job and the field; defaults' guidance_2 beside a job that turns guidance
# off is no error (the job renders unguided).
sed 's/guidance: 1, guidance_2: 1/guidance: 1/' "$T/jobs.yaml" >"$T/off.yaml"
"${GEN[@]}" --jobs "$T/off.yaml" --output-dir "$T/off" --dry-run >/dev/null || fail "defaults' guidance_2 beside guidance 1 refused"
sed 's/guidance: 1, guidance_2: 1/guidance: 1, guidance_2: 3/' "$T/jobs.yaml" >"$T/bad.yaml"
set +e
"${GEN[@]}" --jobs "$T/bad.yaml" --output-dir "$T/bad" >"$T/stdout" 2>"$T/stderr"
rc=$?
set -e
[ "$rc" = 2 ] || fail "guidance_2 without guidance: exit $rc, want 2: $(cat "$T/stderr")"
grep -qF "job 3 (id 'car'): guidance_2: 3 has no effect with guidance 1" "$T/stderr" || fail "guidance_2 without guidance: $(cat "$T/stderr")"
[ ! -e "$T/bad" ] || fail "the refused batch wrote $T/bad"
# The model folder's recommendation is a default too: its guidance_2 beside --guidance 1 renders unguided.
cp -r "$T/m" "$T/md"
echo '{"defaults": {"guidance": 4.0, "guidance_2": 3.0, "steps": 2, "frames": 5, "height": 32, "width": 48}}' >"$T/md/dlo_defaults.json"
"${GEN[@]}" --model "$T/md" --prompt "an owl" --seed 5 --guidance 1 --format png --out "$T/md_off" --report "$T/md_off.json" \
  || fail "dlo_defaults.json's guidance_2 beside --guidance 1 refused"
"${GEN[@]}" --model "$T/m" --prompt "an owl" --seed 5 --guidance 1 --steps 2 --frames 5 --height 32 --width 48 --format png \
  --out "$T/m_off" --report "$T/m_off.json"
sha_md=$(grep -o '"frames_sha256": *"[0-9a-f]*"' "$T/md_off.json") sha_m=$(grep -o '"frames_sha256": *"[0-9a-f]*"' "$T/m_off.json")
[ -n "$sha_md" ] && [ "$sha_md" = "$sha_m" ] || fail "dlo_defaults.json's guidance_2 changed an unguided job: $sha_md vs $sha_m"
set +e
"${GEN[@]}" --model "$T/md" --prompt "an owl" --guidance 1 --guidance-2 3 --out "$T/md_bad" >"$T/stdout" 2>"$T/stderr"
rc=$?
set -e
[ "$rc" = 2 ] && grep -qF -- "--guidance-2: 3 has no effect with guidance 1" "$T/stderr" && [ ! -e "$T/md_bad" ] || fail "--guidance-2 beside --guidance 1: exit $rc: $(cat "$T/stderr")"
echo "ok: guidance_2 > 1 beside the job's own guidance <= 1 is refused by name, nothing written; from defaults (the manifest's or dlo_defaults.json) it is not"

# 5. dlo-forward runs either expert.
mkdir -p "$T/low"
cp -r "$T/m/transformer_2" "$T/low/transformer"
FWD=(mpirun -np 2 "$BIN/dlo-forward" --threads 1 --offload dlo --random-inputs 2,4,6,7 --seed 3)
"${FWD[@]}" --model "$T/m" --component transformer_2 --out "$T/t2.safetensors" 2>"$T/stderr" || fail "transformer_2: $(cat "$T/stderr")"
"${FWD[@]}" --model "$T/low" --component transformer --out "$T/low.safetensors" 2>"$T/stderr" || fail "$(cat "$T/stderr")"
"${FWD[@]}" --model "$T/m" --component transformer --out "$T/t1.safetensors" 2>"$T/stderr" || fail "$(cat "$T/stderr")"
cmp -s "$T/t2.safetensors" "$T/low.safetensors" || fail "--component transformer_2 is not the low-noise expert's forward"
! cmp -s "$T/t2.safetensors" "$T/t1.safetensors" || fail "both experts gave the same output (the components are not told apart)"
set +e
"$BIN/dlo-forward" --model "$T/low" --component transformer_2 --random-inputs 2,4,6,7 --out "$T/none.safetensors" >"$T/stdout" 2>"$T/stderr"
rc=$?
set -e
[ "$rc" = 2 ] && grep -qF -- "--component transformer_2: $T/low has no transformer_2/" "$T/stderr" && [ ! -e "$T/none.safetensors" ] \
  || fail "transformer_2 of a one-expert folder: exit $rc: $(cat "$T/stderr")"
echo "ok: dlo-forward --component transformer_2 is the low-noise expert's forward (2 ranks, dlo); refused by name for one transformer"
