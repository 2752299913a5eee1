#!/usr/bin/env bash
# The MP4 of a job is a function of its frames alone (issue 17, defect 9): through dlo-generate at
# the default preset, at widths 32, 48 and Wan's 480x832, the same jobs give
# byte-identical MP4s at 1 rank under MALLOC_PERTURB_ 17 and at 2 ranks under MALLOC_PERTURB_ 170
# (one render varies both: either alone changing a byte fails the comparison; the VAE decode at 832
# wide is most of each render's minute, so a fourth render was a quarter of the test, and a 64x832
# job beside the 480x832 one, dropped 2026-12-08, a fifth of each render); the frames equal those
# of the lossless FFV1 render of the same jobs, and the MP4 decodes to them (PSNR against the
# lossless frames at or above 15 dB: measured 18.3-19.7 dB on these noise-like frames of a
# random-weight model, which x264 at CRF 23 cannot keep; two unrelated uniform-noise frames are
# 10*log10(6) = 7.8 dB apart, so a decode of the wrong frames falls far below the floor).
# Before the fix (libx264's AVX-512 macroblock-tree code reading memory it never wrote) the 480x832
# MP4s of two runs decoded up to 82/255 apart; on a CPU without AVX-512 the old code was stable too.
#   mp4_determinism_cli.sh BIN_DIR
set -euo pipefail
# shellcheck source=tests/common/cli.sh
source "$(dirname "$0")/../common/cli.sh" "$1"
"$BIN/dlo-checkpoint" make "$T/m" --preset wan-test --layers 2 --dtype bf16 --rope-max-seq-len 1024 >/dev/null
manifest() {  # manifest FORMAT
  cat <<EOF
model: m
defaults: {height: 64, frames: 9, steps: 1, guidance: 1.0, format: $1}
jobs:
  - {id: w32, prompt: "a lighthouse", width: 32}
  - {id: w48, prompt: "a harbour", width: 48}
  - {id: wan, prompt: "a fishing boat", width: 832, height: 480, frames: 5}
EOF
}
manifest mp4 >"$T/mp4.yaml"
manifest ffv1 >"$T/ffv1.yaml"
GEN=("$BIN/dlo-generate" --threads 1 --quiet)
MALLOC_PERTURB_=17 "${GEN[@]}" --jobs "$T/mp4.yaml" --output-dir "$T/p17"
MALLOC_PERTURB_=170 mpirun -np 2 -x MALLOC_PERTURB_ "${GEN[@]}" --jobs "$T/mp4.yaml" --output-dir "$T/np2"
"${GEN[@]}" --jobs "$T/ffv1.yaml" --output-dir "$T/lossless"
sha_of() { grep "\"id\":\"$2\"" "$1" | grep -o '"frames_sha256":"[0-9a-f]*"' | cut -d'"' -f4; }
grep -q '"rank":1' "$T/np2/results.jsonl" || fail "rank 1 rendered none of the jobs"
for id in w32 w48 wan; do
  a=$(sha256sum <"$T/p17/$id.mp4" | cut -c1-16)
  b=$(sha256sum <"$T/np2/$id.mp4" | cut -c1-16)
  [ "$a" = "$b" ] || fail "$id: the MP4 at 2 ranks under MALLOC_PERTURB_=170 ($b) differs from 1 rank's under 17 ($a)"
  [ "$(sha_of "$T/p17/results.jsonl" $id)" = "$(sha_of "$T/lossless/results.jsonl" $id)" ] || fail "$id: frames differ from the FFV1 render's"
  psnr=$(ffmpeg -nostdin -v info -i "$T/p17/$id.mp4" -i "$T/lossless/$id.mkv" \
           -lavfi "[0:v]format=rgb24[a];[1:v]format=rgb24[b];[a][b]psnr" -f null - 2>&1 | grep -o 'average:[0-9.inf]*' | cut -d: -f2)
  [ -n "$psnr" ] || fail "$id: no PSNR from ffmpeg"
  python3 -c "import sys; p=float('$psnr'); sys.exit(0 if p >= 15.0 else 1)" || fail "$id: PSNR $psnr dB against the lossless frames, below 15"
  echo "ok: $id: the same MP4 bytes ($a) at 1 rank under MALLOC_PERTURB_ 17 and at 2 ranks under 170; PSNR $psnr dB against the lossless frames"
done
echo "all ok"
