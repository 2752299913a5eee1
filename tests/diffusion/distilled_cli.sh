#!/usr/bin/env bash
# The 4-step distilled recipes (docs/distilled.md) as a user runs them, on small stand-in models:
#  1. every jobs/ example of a distilled recipe passes `dlo-generate --jobs X --dry-run` as shipped
#     (its model and LoRA paths made here at the published file names), and rendered small its jobs
#     record 4 steps, no guidance, euler with schedule lightx2v at shift 5, the LoRAs fused (one per
#     expert for Lightning, boundary 0.875), the job left on diffusers' default sampler on unipc;
#  2. the schedule decides the frames: lightx2v renders other frames than the default schedule,
#     the default written out renders the unset one's, and a finished job asked again with another
#     schedule is a changed job (the fingerprint covers it) while `default` written out is not;
#  3. bad input, exit 2 before any work, the job and the field named: an unknown schedule in a
#     manifest and as a flag, lightx2v beside scheduler unipc.
#   distilled_cli.sh BIN_DIR SOURCE_DIR
set -euo pipefail
# shellcheck source=tests/common/cli.sh
source "$(dirname "$0")/../common/cli.sh" "$1"
SRC=$(cd "${2:?usage: $0 BIN_DIR SOURCE_DIR}" && pwd)
G="$BIN/dlo-generate"
C="$BIN/dlo-checkpoint"
mkdir -p "$T/jobs" "$T/models/loras"
# Stand-ins at the examples' paths (RoPE long enough for 720x1280).
"$C" make "$T/models/Wan2.1-T2V-14B-Diffusers" --preset wan-test --layers 2 --dtype fp32 --seed 5 \
  --rope-max-seq-len 1024 >/dev/null
"$C" make "$T/models/Wan2.2-T2V-A14B-Diffusers" --preset wan2.2-a14b-test --layers 2 --dtype fp32 --seed 5 \
  --rope-max-seq-len 1024 >/dev/null
"$C" make "$T/models/Wan2.2-T2V-A14B-Lightning-Diffusers" --preset wan2.2-a14b-test --layers 2 --dtype fp32 \
  --seed 6 --rope-max-seq-len 1024 >/dev/null
# write_lora FILE MODEL: a LoRA in lightx2v's layout (diffusion_model.*.lora_down/lora_up, alpha 8 at
# rank 4) on the attention and FFN Linears of every block of MODEL/transformer.
COMMON=$(cd "$(dirname "$0")/../common" && pwd)  # f32_safetensors.py
write_lora() {
  mkdir -p "$(dirname "$1")"
  PYTHONPATH="$COMMON" python3 - "$@" <<'PY'
import json, random, sys
import f32_safetensors
path, model = sys.argv[1], sys.argv[2]
cfg = json.load(open(f"{model}/transformer/config.json"))
d = cfg["num_attention_heads"] * cfg["attention_head_dim"]
rnd = random.Random(len(path))
g = lambda n: [rnd.gauss(0, 0.05) for _ in range(n)]
t = {}
for i in range(cfg["num_layers"]):
    for mod in ("self_attn.q", "self_attn.o", "cross_attn.k", "ffn.0", "ffn.2"):
        fin = cfg["ffn_dim"] if mod == "ffn.2" else d
        out = cfg["ffn_dim"] if mod == "ffn.0" else d
        t[f"diffusion_model.blocks.{i}.{mod}.lora_down.weight"] = ([4, fin], g(4 * fin))
        t[f"diffusion_model.blocks.{i}.{mod}.lora_up.weight"] = ([out, 4], g(out * 4))
        t[f"diffusion_model.blocks.{i}.{mod}.alpha"] = ([], [8.0])
f32_safetensors.save(path, t)
PY
}
write_lora "$T/models/loras/wan2.1_t2v_14b_lora_rank64_lightx2v_4step.safetensors" "$T/models/Wan2.1-T2V-14B-Diffusers"
L=$T/models/loras/Wan2.2-T2V-A14B-4steps-lora-rank64-Seko-V1.1
write_lora "$L/high_noise_model.safetensors" "$T/models/Wan2.2-T2V-A14B-Diffusers"
write_lora "$L/low_noise_model.safetensors" "$T/models/Wan2.2-T2V-A14B-Diffusers"

# 1.
for ex in wan2.1-t2v-14b-lightx2v-4step wan2.2-t2v-a14b-lightning-4step wan2.2-t2v-a14b-lightning-merged; do
  cp "$SRC/jobs/$ex.yaml" "$T/jobs/"
  expect 0 "$T/$ex.log" "$G" --jobs "$T/jobs/$ex.yaml" --dry-run
  # Rendered small (the flags' sizes below the manifests' defaults): what each job ran with.
  "$G" --jobs "$T/jobs/$ex.yaml" --height 32 --width 48 --frames 5 --format png --threads 1 --quiet --output-dir "$T/$ex"
  grep -v '"id":"tokyo-rain-diffusers"' "$T/$ex/results.jsonl" >"$T/$ex.lightx2v"
  [ -s "$T/$ex.lightx2v" ] || fail "$ex: no job"
  n=$(grep -c '"steps":4,"guidance":1.0,.*"scheduler":"euler","flow_shift":5.0,"schedule":"lightx2v"' "$T/$ex.lightx2v" || true)
  [ "$n" = "$(wc -l <"$T/$ex.lightx2v")" ] || fail "$ex: not every job ran 4 unguided euler steps, schedule lightx2v, shift 5: $(cat "$T/$ex/results.jsonl")"
done
grep '"id":"tokyo-rain-diffusers"' "$T/wan2.1-t2v-14b-lightx2v-4step/results.jsonl" \
  | grep -q '"steps":4,"guidance":1.0,.*"scheduler":"unipc","flow_shift":5.0,"model"' \
  || fail "the job on diffusers' sampler is not 4 unipc steps at shift 5 without a schedule"
grep -q "\"fuse_loras\":\[\"$T/models/loras/wan2.1_t2v_14b_lora_rank64_lightx2v_4step.safetensors:1\"\]" \
  "$T/wan2.1-t2v-14b-lightx2v-4step/results.jsonl" || fail "the Wan2.1 LoRA is not fused"
grep -q "\"boundary_ratio\":0.875,.*\"fuse_loras\":\[\"high=$L/high_noise_model.safetensors:1\",\"low=$L/low_noise_model.safetensors:1\"\]" \
  "$T/wan2.2-t2v-a14b-lightning-4step/results.jsonl" || fail "the Lightning pair is not fused per expert at boundary 0.875"
grep -q '"boundary_ratio":0.875' "$T/wan2.2-t2v-a14b-lightning-merged/results.jsonl" || fail "the merged model's boundary"
! grep -q "fuse_loras" "$T/wan2.2-t2v-a14b-lightning-merged/results.jsonl" || fail "the merged checkpoint fuses a LoRA"
echo "1. the distilled jobs/ examples pass --dry-run as shipped: 4 unguided euler steps, schedule lightx2v, shift 5"

# 2.
M=$T/models/Wan2.1-T2V-14B-Diffusers
job=(--model "$M" --prompt "a red ball rolls" --seed 3 --steps 4 --guidance 1 --flow-shift 5 --frames 5 --height 32
     --width 48 --threads 1 --format png --quiet)
frames() { cat "$1"/*.png | sha256sum | cut -d' ' -f1; }
"$G" "${job[@]}" --scheduler euler --out "$T/euler"
"$G" "${job[@]}" --scheduler euler --schedule default --out "$T/default"
"$G" "${job[@]}" --schedule lightx2v --out "$T/lightx2v"
[ "$(frames "$T/default")" = "$(frames "$T/euler")" ] || fail "schedule default renders other frames than none"
[ "$(frames "$T/lightx2v")" != "$(frames "$T/euler")" ] || fail "schedule lightx2v changed no frame byte"
cat >"$T/batch.yaml" <<YAML
model: $M
defaults: {frames: 5, height: 32, width: 48, steps: 4, guidance: 1, flow_shift: 5, scheduler: euler}
jobs:
  - {id: a, prompt: "a red ball rolls", seed: 3}
YAML
"$G" --jobs "$T/batch.yaml" --threads 1 --format png --quiet --output-dir "$T/b"
[ "$(frames "$T/b/a")" = "$(frames "$T/euler")" ] || fail "the manifest's job is not the flag's"
expect 0 "$T/again.log" "$G" --jobs "$T/batch.yaml" --threads 1 --format png --output-dir "$T/b" --schedule default
grep -q "1 already done" "$T/again.log" || fail "schedule default written out made the finished job a changed one: $(cat "$T/again.log")"
expect 2 "$T/changed.log" "$G" --jobs "$T/batch.yaml" --threads 1 --format png --output-dir "$T/b" --schedule lightx2v
grep -q "changed" "$T/changed.log" || fail "another schedule is not a changed job: $(cat "$T/changed.log")"
echo "2. lightx2v changes the frames, default is the unset schedule, the fingerprint covers the schedule"

# 3.
cat >"$T/bad.yaml" <<YAML
model: $M
defaults: {frames: 5, height: 32, width: 48, steps: 4}
jobs:
  - {id: ok, prompt: "a", schedule: lightx2v}
  - {id: typo, prompt: "b", schedule: lightning}
  - {id: clash, prompt: "c", schedule: lightx2v, scheduler: unipc}
YAML
expect 2 "$T/bad.log" "$G" --jobs "$T/bad.yaml" --dry-run
grep -q "job 1 (id 'typo'): schedule: unknown schedule 'lightning' (default, lightx2v)" "$T/bad.log" \
  || fail "the unknown schedule is not named with its job: $(cat "$T/bad.log")"
grep -q "job 2 (id 'clash'): schedule: 'lightx2v' samples with euler.*sets scheduler unipc" "$T/bad.log" \
  || fail "lightx2v beside unipc is not refused with its job: $(cat "$T/bad.log")"
[ "$(wc -l <"$T/bad.log")" = 2 ] || fail "other errors than the two: $(cat "$T/bad.log")"
! grep -q "id 'ok'" "$T/bad.log" || fail "the good job is blamed: $(cat "$T/bad.log")"
expect 2 "$T/flag.log" "$G" "${job[@]}" --schedule lightning --out "$T/never"
grep -q "schedule.*unknown schedule 'lightning'" "$T/flag.log" || fail "the flag's bad value: $(cat "$T/flag.log")"
[ ! -e "$T/never" ] || fail "a refused job wrote output"
echo "3. an unknown schedule and lightx2v beside unipc: exit 2, the job and field named, nothing written"
