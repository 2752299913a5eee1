#!/usr/bin/env bash
# --fuse-lora and the manifest's fuse_loras as a user runs them, on a small random model and a
# ComfyUI-layout LoRA written here byte by byte (alpha != rank, and a full-weight .diff key that
# diffusers ignores). The frames' equality with diffusers' fuse_lora is the parity tests'; here:
#  1. the LoRA changes the frames; 2 ranks with dlo render the 1-rank frames (each rank merged only
#     its rows); the ignored key is named in a warning;
#  2. the manifest's fuse_loras (a path beside the manifest) renders the flag's frames; the job
#     rendered with it, asked again at another strength, is a changed job (the fingerprint covers
#     the fused set), and so is the same strength from a LoRA file whose bytes changed;
#  3. bad input, exit 2 before any work, nothing written: a missing file, high= on a model of one
#     transformer, a two-expert model without high=/low=, a LoRA of another width (file and module
#     named), a key that matches nothing (named), fuse_loras that is not a list (file and key named);
#  4. per-job unfused LoRAs (the job field loras): a batch at 3 ranks with dlo whose jobs carry
#     different LoRAs (one two, one none) renders each job's frames as that job rendered alone at 1
#     rank, and gathers exactly the bytes of the same batch without LoRAs (the adapters stay beside
#     the shared weights); an SP group of 2 renders a LoRA job's 1-rank frames (every member holds
#     the job's adapters); a job's LoRA bytes are in its fingerprint;
#  5. per-job bad input: a missing LoRA file is refused before any work, naming the job and field
#     (exit 2, nothing written); a LoRA of another width fails its job alone, the others render;
#  6. dlo-forward --fuse-lora and --lora (the pass-level benchmarks' flags): each changes the
#     output; 2 ranks with dlo give the 1-rank resident output byte for byte; the report counts the
#     adapters' bytes (by hand: 3 Linears x 2 blocks x rank 4 x (in + out) x 4 bytes); a LoRA of
#     another width exits 2 naming the file.
#   lora_cli.sh BIN_DIR
set -euo pipefail
# shellcheck source=tests/common/cli.sh
source "$(dirname "$0")/../common/cli.sh" "$1"
G="$BIN/dlo-generate"
C="$BIN/dlo-checkpoint"
"$C" make "$T/m" --preset wan-test --layers 2 --dtype fp32 --seed 5 >/dev/null
"$C" make "$T/wide" --preset wan-test --layers 2 --dim 48 --heads 2 --dtype fp32 --seed 5 >/dev/null
"$C" make "$T/ex" --preset wan2.2-a14b-test --layers 2 --dtype fp32 --seed 5 >/dev/null
# write_lora FILE MODEL [EXTRA_KEY]: a ComfyUI LoRA (rank 4, alpha 2, fp32) on three Linears of
# every block of MODEL, plus a full-weight delta diffusers ignores; EXTRA_KEY adds a key that maps
# to nothing.
COMMON=$(cd "$(dirname "$0")/../common" && pwd)  # f32_safetensors.py
write_lora() {
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
    for mod in ("self_attn.q", "cross_attn.v", "ffn.0"):
        out = cfg["ffn_dim"] if mod == "ffn.0" else d
        t[f"diffusion_model.blocks.{i}.{mod}.lora_down.weight"] = ([4, d], g(4 * d))
        t[f"diffusion_model.blocks.{i}.{mod}.lora_up.weight"] = ([out, 4], g(out * 4))
        t[f"diffusion_model.blocks.{i}.{mod}.alpha"] = ([], [2.0])
t["diffusion_model.blocks.0.self_attn.k.diff"] = ([d, d], g(d * d))
if len(sys.argv) > 3:
    t[sys.argv[3]] = ([4, d], g(4 * d))
f32_safetensors.save(path, t)
PY
}
write_lora "$T/l.safetensors" "$T/m"
job=(--prompt "a red ball rolls" --seed 3 --steps 2 --frames 5 --height 32 --width 48 --threads 1 --format png)
frames() { cat "$1"/*.png | sha256sum | cut -d' ' -f1; }

# 1.
"$G" --model "$T/m" "${job[@]}" --quiet --out "$T/plain"
"$G" --model "$T/m" "${job[@]}" --fuse-lora "$T/l.safetensors:0.5" --out "$T/one" 2>"$T/one.log"
mpirun -np 2 "$G" --model "$T/m" "${job[@]}" --quiet --offload dlo --fuse-lora "$T/l.safetensors:0.5" --out "$T/two"
[ "$(frames "$T/one")" != "$(frames "$T/plain")" ] || fail "the fused LoRA changed no frame byte"
[ "$(frames "$T/two")" = "$(frames "$T/one")" ] || fail "2 ranks with dlo render other frames than 1 rank"
grep -q "warning: the LoRA '$T/l.safetensors' has 1 key(s) diffusers ignores.*blocks.0.self_attn.k.diff" "$T/one.log" \
  || fail "no warning naming the ignored key: $(cat "$T/one.log")"
grep -q "with LoRAs fused: $T/l.safetensors:0.5" "$T/one.log" || fail "the job line does not say the fused LoRA"
echo "1. the LoRA changes the frames; 2 ranks with dlo render 1 rank's; the ignored key named"

# 2.
cat >"$T/jobs.yaml" <<YAML
model: m
fuse_loras: [l.safetensors:0.5]
defaults: {frames: 5, height: 32, width: 48, steps: 2}
jobs:
  - {id: a, prompt: "a red ball rolls", seed: 3}
YAML
"$G" --jobs "$T/jobs.yaml" --threads 1 --format png --quiet --output-dir "$T/batch"
[ "$(frames "$T/batch/a")" = "$(frames "$T/one")" ] || fail "fuse_loras in the manifest: not the flag's frames"
sed -i 's/^fuse_loras: \[l.safetensors:0.5\]$/fuse_loras: [l.safetensors:0.25]/' "$T/jobs.yaml"
grep -q ':0.25\]' "$T/jobs.yaml" || fail "could not edit the manifest"
expect 2 "$T/resume.log" "$G" --jobs "$T/jobs.yaml" --threads 1 --format png --quiet --output-dir "$T/batch"
grep -q "changed" "$T/resume.log" || fail "another strength is not a changed job: $(cat "$T/resume.log")"
sed -i 's/:0.25\]$/:0.5]/' "$T/jobs.yaml"
"$G" --jobs "$T/jobs.yaml" --threads 1 --format png --quiet --output-dir "$T/batch" 2>"$T/same.log"  # unchanged: skipped
write_lora "$T/l.safetensors" "$T/m" && python3 - "$T/l.safetensors" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) * 3 // 4] ^= 0x40  # a weight's bytes, not the header
open(p, "wb").write(bytes(b))
PY
expect 2 "$T/bytes.log" "$G" --jobs "$T/jobs.yaml" --threads 1 --format png --quiet --output-dir "$T/batch"
grep -q "changed" "$T/bytes.log" || fail "a LoRA file whose weights changed is not a changed job: $(cat "$T/bytes.log")"
echo "2. fuse_loras renders the flag's frames; another strength or other LoRA bytes make a changed job"

# 3.
expect 2 "$T/e1.log" "$G" --model "$T/m" "${job[@]}" --fuse-lora "$T/nope.safetensors" --out "$T/no1"
grep -q "nope.safetensors': No such file" "$T/e1.log" || fail "$(cat "$T/e1.log")"
expect 2 "$T/e2.log" "$G" --model "$T/m" "${job[@]}" --fuse-lora "high=$T/l.safetensors" --out "$T/no2"
grep -q "names an expert (high=/low=), but the model has one transformer" "$T/e2.log" || fail "$(cat "$T/e2.log")"
expect 2 "$T/e3.log" "$G" --model "$T/ex" "${job[@]}" --fuse-lora "$T/l.safetensors" --out "$T/no3"
grep -q "the model has two experts; name the one it is for" "$T/e3.log" || fail "$(cat "$T/e3.log")"
write_lora "$T/w.safetensors" "$T/wide"
expect 2 "$T/e4.log" "$G" --model "$T/m" "${job[@]}" --fuse-lora "$T/w.safetensors" --out "$T/no4"
grep -q "w.safetensors.*blocks.0.attn1.to_q" "$T/e4.log" || fail "another width: $(cat "$T/e4.log")"
write_lora "$T/k.safetensors" "$T/m" "diffusion_model.blocks.0.self_attn.nonesuch.lora_down.weight"
expect 2 "$T/e5.log" "$G" --model "$T/m" "${job[@]}" --fuse-lora "$T/k.safetensors" --out "$T/no5"
grep -q "k.safetensors.*self_attn.nonesuch" "$T/e5.log" || fail "a key matching nothing: $(cat "$T/e5.log")"
sed -i 's/^fuse_loras: .*$/fuse_loras: l.safetensors/' "$T/jobs.yaml"
expect 2 "$T/e6.log" "$G" --jobs "$T/jobs.yaml" --threads 1 --format png --quiet --output-dir "$T/no6"
grep -q "jobs.yaml.*fuse_loras.*must be a list" "$T/e6.log" || fail "$(cat "$T/e6.log")"
for p in no1 no2 no3 no4 no5 no6; do [ ! -e "$T/$p" ] || fail "a refused run wrote $p"; done
echo "3. missing file, wrong expert selector, another width, an unknown key, a bad manifest key: exit 2, nothing written"

# 4. Per-job unfused LoRAs.
write_lora "$T/l2.safetensors" "$T/m"
cp "$T/l.safetensors" "$T/l1.safetensors"
cat >"$T/per.yaml" <<YAML
model: m
defaults: {frames: 5, height: 32, width: 48, steps: 2}
jobs:
  - {id: a, prompt: "a red ball rolls", seed: 3, loras: [l1.safetensors:0.5]}
  - {id: b, prompt: "a blue cube spins", seed: 4, loras: [l2.safetensors:0.3, l1.safetensors:0.2]}
  - {id: c, prompt: "a green cone", seed: 5}
YAML
sed 's/, loras: \[[^]]*\]//' "$T/per.yaml" >"$T/none.yaml"
grep -q loras "$T/none.yaml" && fail "could not strip the LoRAs"
mpirun -np 3 "$G" --jobs "$T/per.yaml" --threads 1 --format png --quiet --offload dlo --output-dir "$T/per" --report "$T/per.json"
mpirun -np 3 "$G" --jobs "$T/none.yaml" --threads 1 --format png --quiet --offload dlo --output-dir "$T/none" --report "$T/none.json"
single() {  # single OUT PROMPT SEED [LORAS]
  "$G" --model "$T/m" --prompt "$2" --seed "$3" --steps 2 --frames 5 --height 32 --width 48 --threads 1 --format png \
    --quiet ${4:+--lora "$4"} --out "$1"
}
single "$T/sa" "a red ball rolls" 3 "$T/l1.safetensors:0.5"
single "$T/sb" "a blue cube spins" 4 "$T/l2.safetensors:0.3, $T/l1.safetensors:0.2"
single "$T/sc" "a green cone" 5
for j in a b c; do
  [ "$(frames "$T/per/$j")" = "$(frames "$T/s$j")" ] || fail "job $j: the batch's frames are not the job's alone"
done
[ "$(frames "$T/per/a")" != "$(frames "$T/none/a")" ] || fail "job a's LoRA changed nothing"
[ "$(frames "$T/per/c")" = "$(frames "$T/none/c")" ] || fail "job c (no LoRA) changed beside LoRA jobs"
python3 - "$T/per.json" "$T/none.json" <<'PY'
import json, sys
per, none = (json.load(open(p)) for p in sys.argv[1:3])
g = lambda r: sorted((x["rank"], x["bytes_gathered"], x["traversals"]) for x in r["ranks"])
assert g(per) == g(none), f"gathered bytes with LoRAs {g(per)} vs without {g(none)}"
assert all(x[1] > 0 for x in g(per)), g(per)
print(f"4. gathered bytes per rank with per-job LoRAs equal the batch without: {[x[1] for x in g(per)]}")
PY
# (64x96: 48 tokens, 24 a rank; fewer than 16 a rank is refused for SP)
sp=(--prompt "a blue cube spins" --seed 4 --steps 2 --frames 5 --height 64 --width 96 --threads 1 --format png --quiet
    --lora "$T/l2.safetensors:0.3, $T/l1.safetensors:0.2")
"$G" --model "$T/m" "${sp[@]}" --out "$T/sp1"
mpirun -np 2 "$G" --model "$T/m" "${sp[@]}" --sp 2 --out "$T/sp"
[ "$(frames "$T/sp")" = "$(frames "$T/sp1")" ] || fail "an SP group of 2 renders other frames than 1 rank with the job's LoRAs"
python3 - "$T/l2.safetensors" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) * 3 // 4] ^= 0x40
open(p, "wb").write(bytes(b))
PY
expect 2 "$T/per2.log" mpirun -np 3 "$G" --jobs "$T/per.yaml" --threads 1 --format png --quiet --offload dlo --output-dir "$T/per"
grep -q "job 1 (id 'b'): changed" "$T/per2.log" || fail "a job's LoRA bytes are not in its fingerprint: $(cat "$T/per2.log")"
grep -q "id 'a'" "$T/per2.log" && fail "job a (its LoRA unchanged) reported changed: $(cat "$T/per2.log")"
echo "4. per-job LoRAs: each job as rendered alone, the same gathers as without, an SP group as 1 rank, the LoRA's bytes in the fingerprint"

# 5. Per-job bad input.
sed 's/l1.safetensors:0.5/gone.safetensors/' "$T/per.yaml" >"$T/gone.yaml"
expect 2 "$T/gone.log" mpirun -np 2 "$G" --jobs "$T/gone.yaml" --threads 1 --format png --quiet --output-dir "$T/no7"
grep -q "gone.yaml:.*job 0 (id 'a'): loras: .*gone.safetensors': No such file" "$T/gone.log" || fail "$(cat "$T/gone.log")"
[ ! -e "$T/no7" ] || fail "a refused batch wrote its output folder"
sed 's#l1.safetensors:0.5#w.safetensors#' "$T/per.yaml" >"$T/widej.yaml"
set +e
mpirun -np 2 "$G" --jobs "$T/widej.yaml" --threads 1 --format png --quiet --output-dir "$T/wj" >"$T/wj.log" 2>&1
rc=$?
set -e
[ "$rc" != 0 ] || fail "a batch with a failed job exited 0"
grep -q '"id":"a".*"status":"failed".*its LoRAs: .*w.safetensors.*blocks.0.attn1.to_q' "$T/wj/results.jsonl" || fail "job a: $(cat "$T/wj/results.jsonl")"
for j in b c; do grep -q "\"id\":\"$j\".*\"status\":\"ok\"" "$T/wj/results.jsonl" || fail "job $j did not render beside the failed one"; done
# The plan refuses it before any work, and counts the other jobs' adapters.
mpirun -np 2 "$G" --jobs "$T/widej.yaml" --threads 1 --dry-run --output-dir "$T/wj2" >"$T/wj2.log" 2>&1 || fail "dry run: $(cat "$T/wj2.log")"
grep -q "job 0 'a': .*(refused: its LoRAs: .*w.safetensors.*blocks.0.attn1.to_q" "$T/wj2.log" || fail "dry run: $(cat "$T/wj2.log")"
grep -q "LoRA adapters .*(the largest job's, on the device; in working)" "$T/wj2.log" || fail "dry run: $(cat "$T/wj2.log")"
echo "5. a missing per-job LoRA refused before any work; a LoRA of another width refused by the plan, its job alone"

# 6. dlo-forward's LoRA flags.
F="$BIN/dlo-forward"
fwd() {  # fwd OUT NP OFFLOAD [extra...]
  local out=$1 np=$2 s=$3; shift 3
  mpirun -np "$np" "$F" --model "$T/m" --component transformer --random-inputs 2,4,4,8 --guidance --threads 1 \
    --offload "$s" --out "$T/$out.safetensors" --report "$T/$out.json" "$@" >"$T/$out.log" 2>&1 || fail "$out: $(cat "$T/$out.log")"
}
fwd f_none 1 resident
fwd f_fused1 1 resident --fuse-lora "$T/l.safetensors:0.5"
fwd f_fused2 2 dlo --fuse-lora "$T/l.safetensors:0.5"
fwd f_lora1 1 resident --lora "$T/l.safetensors:0.5, $T/l2.safetensors"
fwd f_lora2 2 dlo --lora "$T/l.safetensors:0.5, $T/l2.safetensors"
cmp -s "$T/f_none.safetensors" "$T/f_fused1.safetensors" && fail "dlo-forward --fuse-lora changed nothing"
cmp -s "$T/f_none.safetensors" "$T/f_lora1.safetensors" && fail "dlo-forward --lora changed nothing"
cmp "$T/f_fused1.safetensors" "$T/f_fused2.safetensors" || fail "dlo-forward --fuse-lora: 2 ranks with dlo differ from 1 resident"
cmp "$T/f_lora1.safetensors" "$T/f_lora2.safetensors" || fail "dlo-forward --lora: 2 ranks with dlo differ from 1 resident"
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
cfg = json.load(open(f"{t}/m/transformer/config.json"))
d = cfg["num_attention_heads"] * cfg["attention_head_dim"]
# q and cross-attention v: [4, d] + [d, 4]; ffn.0: [4, d] + [ffn_dim, 4]; fp32; two files, 2 blocks each
per_file = cfg["num_layers"] * 4 * (2 * (d + d) + (d + cfg["ffn_dim"])) * 4
for n in ("f_lora1", "f_lora2"):
    for r in json.load(open(f"{t}/{n}.json"))["ranks"]:
        assert r["adapter_bytes"] == 2 * per_file, (n, r["adapter_bytes"], 2 * per_file)
print(f"6. the report's adapter bytes equal the count by hand: {2 * per_file}")
PY
expect 2 "$T/f_e.log" "$F" --model "$T/m" --component transformer --random-inputs 2,4,4,8 --lora "$T/w.safetensors" \
  --out "$T/no8.safetensors"
grep -q "w.safetensors.*blocks.0.attn1.to_q" "$T/f_e.log" || fail "dlo-forward --lora, another width: $(cat "$T/f_e.log")"
echo "6. dlo-forward --fuse-lora and --lora: change the output, 2 ranks with dlo equal 1 resident, another width refused"
