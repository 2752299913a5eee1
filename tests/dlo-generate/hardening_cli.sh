#!/usr/bin/env bash
# dlo-generate against what a demanding user does to a batch (issue 17's defects, each as a class):
#  1. outputs that would replace the batch's inputs or foreign files (the manifest, a checkpoint,
#     a new file in the model folder, someone's MP4, a text named .mp4, "a.mp4/", --out onto a
#     YAML or into the model folder): exit 2 before any work, every one named, nothing changed;
#  2. a manifest with both kinds of problems (a misspelt key; sizes that need the model) reports
#     all of them in one run;
#  3. new weights in the same model folder: the finished job counts as changed; --force renders
#     it again with other frames;
#  4. the same manifest named from another folder or by absolute path: nothing to render;
#  5. ranks in different working directories render from rank 0's canonical paths (frames equal
#     one rank's); a rank that sees no model folder there, or another model in it (a mount
#     namespace the test makes), stops every rank before any gather, exit 2, named;
#  6. a finished video without its results.jsonl line (the run stopped before recording it) is
#     recognised from its own metadata (mp4, png, ffv1) and recorded "recovered" with its frames'
#     hash; a cut one renders again; one whose metadata records other parameters is refused as
#     changed;
#  7. late checks made early: a VAE checkpoint that does not fit its config, --device tpu and a
#     --report in a missing folder exit 2 before the output folder is made;
#  8. absurd jobs: steps 1e9 and height 2^40 refused at validation (exit 2); a job that cannot fit
#     in memory fails alone, recorded, the rest of the batch renders (exit 3);
#  9. rerunning a finished batch with --save-latents exits 0; a UTF-8 BOM is not part of the first
#     prompt of a .txt manifest;
# 10. a second batch on an output folder in use is refused, naming the holder; the lock of a
#     SIGKILLed run is taken over, and its MPI session folder removed by the next run;
# 11. with a slow VAE (test hook) a rank holds at most 4 decodes and stops taking jobs meanwhile;
# 12. a second SIGTERM ends every rank at once (1 and 2 ranks; a coarse bound well under one
#     decode), exit 143, lock released; the rerun renders the rest.
#   hardening_cli.sh BIN_DIR
set -euo pipefail
# shellcheck source=tests/common/cli.sh
source "$(dirname "$0")/../common/cli.sh" "$1"
GEN=("$BIN/dlo-generate" --threads 1 --quiet)
make_model() { "$BIN/dlo-checkpoint" make "$1" --preset wan-test --layers 2 --dtype bf16 --rope-max-seq-len 4096 "${@:2}" >/dev/null; }
make_model "$T/m"
tree_sum() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16); }
DEF="defaults: {frames: 5, height: 32, width: 48, steps: 2, guidance: 1.0}"

# ---- 1. outputs that are the batch's inputs or someone else's files
mkdir -p "$T/b1"
ffmpeg -v error -nostdin -f lavfi -i testsrc=size=48x32:rate=16 -frames:v 5 -pix_fmt yuv420p "$T/b1/theirs.mp4"
echo "not a video" >"$T/b1/notes.mp4"
cat >"$T/b1/jobs.yaml" <<EOF
model: ../m
$DEF
jobs:
  - {id: a, prompt: a, output: jobs.yaml}
  - {id: b, prompt: b, output: ../m/transformer/diffusion_pytorch_model.safetensors}
  - {id: c, prompt: c, output: ../m/new.mp4}
  - {id: d, prompt: d, output: theirs.mp4}
  - {id: e, prompt: e, output: notes.mp4}
  - {id: f, prompt: f, output: f.mp4/}
  - {id: g, prompt: g}
EOF
before="$(tree_sum "$T/m") $(tree_sum "$T/b1")"
expect 2 "$T/b1.log" "${GEN[@]}" --jobs "$T/b1/jobs.yaml"
for want in "job 0 (id 'a'): output: '.*jobs.yaml' is this manifest" \
            "job 1 (id 'b'): output: .* is inside the model folder" \
            "job 2 (id 'c'): output: .* is inside the model folder" \
            "job 3 (id 'd'): output: .*theirs.mp4' exists and is a video dlo did not write" \
            "job 4 (id 'e'): output: .*notes.mp4' exists and is not an MP4 file" \
            "job 5 (id 'f'): output: .*f.mp4/' ends with '/': an MP4 output is a file, not a folder"; do
  grep -q "$want" "$T/b1.log" || fail "outputs: no '$want' in: $(cat "$T/b1.log")"
done
! grep -q "id 'g'" "$T/b1.log" || fail "outputs: the good job was blamed: $(cat "$T/b1.log")"
[ "$before" = "$(tree_sum "$T/m") $(tree_sum "$T/b1")" ] || fail "outputs: the model folder or the batch folder changed"
expect 2 "$T/b1p.log" "${GEN[@]}" --model "$T/m" --prompt x --steps 1 --height 32 --width 48 --frames 5 --out "$T/b1/jobs.yaml"
grep -q "jobs.yaml' exists and is not an MP4 file" "$T/b1p.log" || fail "--out onto a YAML: $(cat "$T/b1p.log")"
expect 2 "$T/b1q.log" "${GEN[@]}" --model "$T/m" --prompt x --steps 1 --height 32 --width 48 --frames 5 --out "$T/m/vae/x.mp4"
grep -q -- "--out: .* is inside the model folder" "$T/b1q.log" || fail "--out into the model: $(cat "$T/b1q.log")"
expect 2 "$T/b1r.log" "${GEN[@]}" --model "$T/m" --prompt x --steps 1 --height 32 --width 48 --frames 5 --out "$T/b1/noext"
grep -qF -- "--out: '$T/b1/noext' has no extension (a mp4 video: e.g. 'noext.mp4')" "$T/b1r.log" || fail "--out without an extension: $(cat "$T/b1r.log")"
[ "$before" = "$(tree_sum "$T/m") $(tree_sum "$T/b1")" ] || fail "outputs: --out changed a file"
echo "ok: outputs onto the manifest, the model folder, foreign files, 'a.mp4/' or without an extension (--out too) are refused (exit 2), nothing changed"

# ---- 2. every problem in one run
cat >"$T/both.yaml" <<EOF
model: m
$DEF
jobs:
  - {id: a, prompt: a, heigth: 64}
  - {id: b, prompt: b, height: 100}
  - {id: c, prompt: c, frames: 8}
EOF
expect 2 "$T/both.log" "${GEN[@]}" --jobs "$T/both.yaml" --output-dir "$T/both"
grep -q "unknown key 'heigth' (did you mean 'height'?)" "$T/both.log" || fail "both kinds: $(cat "$T/both.log")"
grep -q "job 1 (id 'b'): height: 100 is not a multiple of 16" "$T/both.log" || fail "both kinds: $(cat "$T/both.log")"
grep -q "job 2 (id 'c'): frames: " "$T/both.log" || fail "both kinds: $(cat "$T/both.log")"
echo "ok: a misspelt key and the problems that need the model are reported in one run"

# ---- 3. new weights in the same folder; 4. the same manifest named otherwise
make_model "$T/m3"
printf 'model: m3\noutput_dir: out3\n%s\njobs:\n  - {id: a, prompt: "a fox"}\n' "$DEF" >"$T/w.yaml"
expect 0 "$T/w1.log" "${GEN[@]}" --jobs "$T/w.yaml"
sha1=$(sha_of "$T/out3/results.jsonl" a)
mkdir -p "$T/elsewhere/deeper"
expect 0 "$T/w2.log" bash -c "cd '$T/elsewhere/deeper' && ${GEN[*]} --jobs ../../w.yaml && ${GEN[*]} --jobs '$T/w.yaml'"
[ "$(grep -c '"id":"a"' "$T/out3/results.jsonl")" = 1 ] || fail "another spelling of the manifest rendered again"
echo "ok: the same manifest from another folder and by absolute path renders nothing (exit 0)"
rm -rf "$T/m3"
make_model "$T/m3" --seed 9
expect 2 "$T/w3.log" "${GEN[@]}" --jobs "$T/w.yaml"
grep -q "job 0 (id 'a'): changed since its video" "$T/w3.log" || fail "new weights: $(cat "$T/w3.log")"
expect 0 "$T/w4.log" "${GEN[@]}" --jobs "$T/w.yaml" --force
sha2=$(sha_of "$T/out3/results.jsonl" a)
[ -n "$sha2" ] && [ "$sha1" != "$sha2" ] || fail "new weights gave the same frames ($sha1)"
echo "ok: new weights in the same folder make the finished job changed; --force renders other frames"

# ---- 5. ranks in different working directories; a rank that sees another model
mkdir -p "$T/r5"
printf 'model: m\noutput_dir: out5\n%s\njobs:\n' "$DEF" >"$T/r5.yaml"
for i in 0 1 2 3; do echo "  - {id: j$i, prompt: \"prompt $i\"}" >>"$T/r5.yaml"; done
expect 0 "$T/r5a.log" bash -c "cd '$T' && ${GEN[*]} --jobs r5.yaml --output-dir '$T/one'"
expect 0 "$T/r5b.log" bash -c "cd '$T' && mpirun -np 1 ${GEN[*]} --jobs r5.yaml : -np 1 -wdir '$T/r5' ${GEN[*]} --jobs r5.yaml"
for i in 0 1 2 3; do
  [ "$(sha_of "$T/one/results.jsonl" j$i)" = "$(sha_of "$T/out5/results.jsonl" j$i)" ] || fail "rank 1 elsewhere: job j$i differs"
done
grep -q '"rank":1' "$T/out5/results.jsonl" || fail "rank 1 rendered nothing"
echo "ok: rank 1 started in another folder renders from rank 0's paths; frames equal one rank's"
if unshare -m --propagation private true 2>/dev/null; then
  make_model "$T/other" --seed 3
  cat >"$T/rank1-sees.sh" <<EOF
#!/usr/bin/env bash
# Rank 1 in its own mount namespace: the model folder hidden (empty) or holding another model.
exec unshare -m --propagation private bash -c 'if [ "\$0" = hide ]; then mount -t tmpfs tmpfs "$T/m"; else mount --bind "$T/other" "$T/m"; fi; exec "\$@"' "\$@"
EOF
  chmod +x "$T/rank1-sees.sh"
  for mode in hide other; do
    expect 2 "$T/r5$mode.log" mpirun -np 1 "${GEN[@]}" --jobs "$T/r5.yaml" --output-dir "$T/o$mode" : \
      -np 1 "$T/rank1-sees.sh" $mode "${GEN[@]}" --jobs "$T/r5.yaml" --output-dir "$T/o$mode"
    want="rank 1: .*model folder"
    [ $mode = other ] && want="rank 1: .*holds other files here than on rank 0"
    grep -q "$want" "$T/r5$mode.log" || fail "rank 1 ($mode): $(cat "$T/r5$mode.log")"
    ! ls "$T/o$mode"/*.mp4 >/dev/null 2>&1 || fail "rank 1 ($mode): work was done"
  done
  echo "ok: a rank that sees no model folder, or another model, at rank 0's path stops every rank (exit 2, named)"
else
  echo "skip: no mount namespaces here (unshare -m): the other-model case is not run"
fi

# ---- 6. finished videos without their results.jsonl lines
cat >"$T/r6.yaml" <<EOF
model: m
output_dir: out6
$DEF
jobs:
  - {id: v, prompt: a}
  - {id: p, prompt: b, format: png}
  - {id: k, prompt: c, format: ffv1}
  - {id: cut, prompt: d}
EOF
expect 0 "$T/r6a.log" "${GEN[@]}" --jobs "$T/r6.yaml"
cp "$T/out6/results.jsonl" "$T/r6-first.jsonl"
rm "$T/out6/results.jsonl"
size=$(stat -c %s "$T/out6/cut.mp4")
truncate -s $((size - 200)) "$T/out6/cut.mp4"
expect 0 "$T/r6b.log" "${GEN[@]}" --jobs "$T/r6.yaml"
for id in v p k; do
  grep "\"id\":\"$id\"" "$T/out6/results.jsonl" | grep -q '"status":"ok".*"recovered":true' || fail "$id not recovered: $(cat "$T/out6/results.jsonl")"
  # Its frames' hash too (probe V6): from the MP4's and the PNG folder's metadata, from the MKV's decoded frames.
  [ "$(sha_of "$T/out6/results.jsonl" $id)" = "$(sha_of "$T/r6-first.jsonl" $id)" ] ||
    fail "$id recovered with frames_sha256 '$(sha_of "$T/out6/results.jsonl" $id)', rendered with '$(sha_of "$T/r6-first.jsonl" $id)'"
done
grep '"id":"cut"' "$T/out6/results.jsonl" | grep -q '"recovered":false' || fail "the cut video was not rendered again"
[ "$(sha_of "$T/out6/results.jsonl" cut)" = "$(sha_of "$T/r6-first.jsonl" cut)" ] || fail "the re-rendered video differs"
rm "$T/out6/results.jsonl"
sed -i 's/{id: v, prompt: a}/{id: v, prompt: a, seed: 77}/' "$T/r6.yaml"
expect 2 "$T/r6c.log" "${GEN[@]}" --jobs "$T/r6.yaml"
grep -q "job 0 (id 'v'): changed since its video .* in its metadata" "$T/r6c.log" || fail "changed by metadata: $(cat "$T/r6c.log")"
echo "ok: videos without a results line are recognised by their metadata (mp4, png, ffv1); a cut one renders again; a changed one is refused"

# ---- 7. late checks made early
cp -r "$T/m" "$T/mv"
python3 - "$T/mv/vae/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["base_dim"] = c["base_dim"] * 2
json.dump(c, open(sys.argv[1], "w"))
EOF
printf 'model: mv\noutput_dir: out7\n%s\njobs:\n  - {id: a, prompt: a, steps: 40}\n' "$DEF" >"$T/r7.yaml"
t0=$(date +%s)
expect 2 "$T/r7a.log" "${GEN[@]}" --jobs "$T/r7.yaml"
grep -q "loading vae .*: .*tensor" "$T/r7a.log" || fail "bad VAE: $(cat "$T/r7a.log")"
[ ! -e "$T/out7/a.mp4" ] && ! grep -qs '"id":"a"' "$T/out7/results.jsonl" || fail "bad VAE: a job ran"
printf 'model: m\noutput_dir: out7b\n%s\njobs:\n  - {id: a, prompt: a}\n' "$DEF" >"$T/r7b.yaml"
for flags in "--device tpu" "--report $T/no/such/folder/r.json"; do
  expect 2 "$T/r7b.log" "${GEN[@]}" --jobs "$T/r7b.yaml" $flags
  [ ! -e "$T/out7b" ] || fail "$flags: the output folder was made before the check: $(cat "$T/r7b.log")"
done
echo "ok: a VAE that does not fit its config, --device tpu and a --report in a missing folder exit 2 before any work"

# ---- 8. absurd jobs
printf 'model: m\noutput_dir: out8\n%s\njobs:\n  - {id: a, prompt: a, steps: 1000000000}\n  - {id: b, prompt: b, height: 1099511627776}\n' "$DEF" >"$T/r8.yaml"
expect 2 "$T/r8a.log" "${GEN[@]}" --jobs "$T/r8.yaml" --dry-run
grep -q "job 0 (id 'a'): steps: must be at most 10000, got 1000000000" "$T/r8a.log" && grep -q "job 1 (id 'b'): height: must be at most 65536" "$T/r8a.log" \
  || fail "absurd values: $(cat "$T/r8a.log")"
printf 'model: m\noutput_dir: out8\n%s\njobs:\n  - {id: big, prompt: a, height: 16384, width: 16384, frames: 1001}\n  - {id: small, prompt: b}\n' "$DEF" >"$T/r8.yaml"
expect 3 "$T/r8b.log" mpirun -np 2 "${GEN[@]}" --jobs "$T/r8.yaml"
grep '"id":"big"' "$T/out8/results.jsonl" | grep -q '"status":"failed".*does not fit in memory' || fail "big job: $(cat "$T/out8/results.jsonl")"
grep '"id":"small"' "$T/out8/results.jsonl" | grep -q '"status":"ok"' || fail "the small job did not render"
echo "ok: steps 1e9 and height 2^40 are refused (exit 2); a job beyond memory fails alone, recorded (exit 3)"

# ---- 9. --save-latents on a finished batch; a BOM
expect 0 "$T/r9a.log" "${GEN[@]}" --jobs "$T/w.yaml" --save-latents "$T/x.h5"
printf '\xEF\xBB\xBFbom prompt\nsecond\n' >"$T/p.txt"
expect 0 "$T/r9b.log" "${GEN[@]}" --jobs "$T/p.txt" --model "$T/m" --output-dir "$T/out9" --steps 1 --height 32 --width 48 --frames 5
grep -q '"prompt":"bom prompt"' "$T/out9/results.jsonl" || fail "BOM: $(head -1 "$T/out9/results.jsonl")"
echo "ok: --save-latents on a finished batch exits 0; a .txt manifest's BOM is not in its first prompt"

# ---- 10. two batches on one output folder; the lock of a killed run
LOCK=.dlo-generate.lock
{ echo "model: m"; echo "output_dir: out10"; echo "defaults: {frames: 5, height: 32, width: 48, steps: 400}"; echo "jobs:"
  for i in 0 1 2; do echo "  - {id: j$i, prompt: \"p $i\"}"; done; } >"$T/r10.yaml"
# The batches without mpirun are singletons: each keeps its MPI session folder in TMPDIR, which a
# SIGKILLed one leaves behind for the next singleton to remove (planted: folders naming a live
# process, another host, and none, which stay; one naming a process that is gone, which goes).
S10="$T/tmp10"
mkdir -p "$S10/dlo-mpi-live" "$S10/dlo-mpi-other" "$S10/dlo-mpi-noowner" "$S10/dlo-mpi-gone"
printf 'host %s\npid %s\n' "$(hostname)" $$ >"$S10/dlo-mpi-live/owner"
printf 'host %s\npid 1\n' "not-$(hostname)" >"$S10/dlo-mpi-other/owner"
true & GONE=$!; wait $GONE
printf 'host %s\npid %s\n' "$(hostname)" $GONE >"$S10/dlo-mpi-gone/owner"
TMPDIR="$S10" "${GEN[@]}" --jobs "$T/r10.yaml" >"$T/r10a.log" 2>&1 &
A=$!
for _ in $(seq 300); do [ -s "$T/out10/$LOCK" ] && break; sleep 0.1; done
[ -s "$T/out10/$LOCK" ] || fail "no lock file while a batch runs: $(ls -a "$T/out10" 2>&1)"
grep -q "^pid $A\$" "$T/out10/$LOCK" || fail "the lock does not name the running batch (pid $A): $(cat "$T/out10/$LOCK")"
expect 2 "$T/r10b.log" mpirun -np 2 "${GEN[@]}" --jobs "$T/r10.yaml"
grep -q "the output folder '$T/out10' is in use by another run (host $(hostname), pid $A, since " "$T/r10b.log" || fail "second batch: $(cat "$T/r10b.log")"
expect 0 "$T/r10c.log" "${GEN[@]}" --jobs "$T/r10.yaml" --dry-run  # a dry run writes nothing and takes no lock
kill -KILL "$A"; wait "$A" 2>/dev/null || true
[ -s "$T/out10/$LOCK" ] || fail "SIGKILL removed the lock (it cannot)"
KILLED_SESSION=$(grep -l "^pid $A\$" "$S10"/dlo-mpi-??????/owner 2>/dev/null || true)
[ -n "$KILLED_SESSION" ] || fail "no session folder of the killed singleton (pid $A) in $S10: $(ls "$S10")"
sed -i 's/steps: 400/steps: 1/' "$T/r10.yaml"
expect 0 "$T/r10d.log" env TMPDIR="$S10" "$BIN/dlo-generate" --threads 1 --jobs "$T/r10.yaml" --force
[ "$(cd "$S10" && echo *)" = "dlo-mpi-live dlo-mpi-noowner dlo-mpi-other" ] ||
  fail "session folders after the next singleton: $(ls "$S10") (want the live, other-host and owner-less ones only)"
grep -q "took over the lock of the output folder from a run that is gone" "$T/r10d.log" || fail "stale lock: $(cat "$T/r10d.log")"
for i in 0 1 2; do tail -3 "$T/out10/results.jsonl" | grep "\"id\":\"j$i\"" | grep -q '"status":"ok"' || fail "after the takeover: j$i"; done
[ ! -e "$T/out10/$LOCK" ] || fail "after the takeover the lock is left: $(ls -a "$T/out10")"
echo "ok: a second batch on a folder in use is refused (exit 2, naming host and pid); a killed run's lock and MPI session folder are taken over"

# ---- 11. a rank behind on its VAE takes no new job: the decode queue stays bounded
{ echo "model: m"; echo "output_dir: out11"; echo "defaults: {frames: 5, height: 32, width: 48, steps: 1}"; echo "jobs:"
  for i in $(seq 0 7); do echo "  - {id: j$i, prompt: \"p $i\"}"; done; } >"$T/r11.yaml"
expect 0 "$T/r11.log" "$BIN/dlo-generate-testhooks" "${GEN[@]:1}" --jobs "$T/r11.yaml" --slow-decode-ms 400 --report "$T/r11.json"
python3 - "$T/r11.json" <<'PY' || fail "decode queue: $(cat "$T/r11.json")"
import json, sys
r = json.load(open(sys.argv[1]))["ranks"][0]
print("decode backlog peak", r["decode_backlog_peak"], "passes waiting", r["passes_waiting_for_decodes"])
assert 1 <= r["decode_backlog_peak"] <= 4, r  # 2 waiting + the 2 jobs a rank holds
assert r["passes_waiting_for_decodes"] > 0, r
PY
[ "$(grep -c '"status":"ok"' "$T/out11/results.jsonl")" = 8 ] || fail "decode queue: not 8 videos"
echo "ok: with a slow VAE a rank holds at most 4 decodes and waits for them instead of taking jobs"

# ---- 12. a second signal stops at once (1 rank and 2 ranks); the rerun completes
for np in 1 2; do
  rm -rf "$T/out12"
  sed 's/out11/out12/' "$T/r11.yaml" >"$T/r12.yaml"
  if [ "$np" = 1 ]; then "$BIN/dlo-generate-testhooks" "${GEN[@]:1}" --jobs "$T/r12.yaml" --slow-decode-ms 5000 >"$T/r12.log" 2>&1 &
  else mpirun -np 2 "$BIN/dlo-generate-testhooks" "${GEN[@]:1}" --jobs "$T/r12.yaml" --slow-decode-ms 5000 >"$T/r12.log" 2>&1 & fi
  L=$!
  ranks() { pgrep -f "^$BIN/dlo-generate-testhooks .*--jobs $T/r12.yaml" || true; }
  for _ in $(seq 300); do [ -s "$T/out12/$LOCK" ] && [ "$(ranks | wc -l)" -ge "$np" ] && break; sleep 0.1; done
  sleep 2  # jobs denoised, decodes queued behind the slow VAE
  kill -TERM $(ranks)
  sleep 0.5
  t0=$(date +%s%N)
  kill -TERM $(ranks) 2>/dev/null || true
  set +e; wait "$L"; rc=$?; set -e
  gone_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  [ -z "$(ranks)" ] || fail "np $np: ranks left after the second signal"
  [ "$gone_ms" -lt 4000 ] || fail "np $np: $gone_ms ms after the second signal (a queued decode takes 5000)"
  [ "$rc" = 143 ] || fail "np $np: exit $rc after two SIGTERMs, want 143: $(cat "$T/r12.log")"
  grep -q "second signal 15: stopping now" "$T/r12.log" || fail "np $np: no message: $(cat "$T/r12.log")"
  [ ! -e "$T/out12/$LOCK" ] || fail "np $np: the lock was left behind"
  expect 0 "$T/r12b.log" mpirun -np "$np" "${GEN[@]}" --jobs "$T/r12.yaml"
  [ "$(grep -c '"status":"ok"' "$T/out12/results.jsonl")" = 8 ] || fail "np $np: the rerun did not complete: $(cat "$T/out12/results.jsonl")"
  ! ls -a "$T/out12" | grep -q "tmp" || fail "np $np: temporaries left: $(ls -a "$T/out12")"
  echo "ok: np $np: a second SIGTERM ends every rank in $gone_ms ms (exit 143, lock released); the rerun renders the rest"
done
echo "all ok"
