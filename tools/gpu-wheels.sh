#!/usr/bin/env bash
# The wheels diffusers needs beside a bare GPU machine's own torch, at tools/requirements.txt's pins,
# for that machine's Python (3.12 on the lent machines; docs/gpu.md), so tools/gpu-run.sh MODE=fp8
# can time diffusers on the same GPU. tools/gpu-run.sh unpacks them into a folder it appends to
# sys.path: the machine's own packages come first, these fill what it lacks.
#   tools/gpu-wheels.sh [DIR (default .gpu/wheels)] [PYTHON_VERSION (default 3.12)]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpu/wheels}; PYV=${2:-3.12}
# diffusers' import closure (its Requires-Dist, huggingface_hub's, httpx2's, and accelerate's, without which
# from_pretrained refuses Wan's fp32-kept modules), torch's own dependencies excluded.
NAMES="diffusers accelerate psutil huggingface_hub importlib_metadata zipp numpy regex requests urllib3 idna certifi charset-normalizer
       safetensors pillow click hf-xet httpx2 httpcore2 h11 anyio truststore packaging PyYAML tqdm"
pins=()
for n in $NAMES; do
  p=$(grep -i -E "^${n//[-_]/[-_]}==" tools/requirements.txt) || { echo "gpu-wheels.sh: $n is not pinned in tools/requirements.txt" >&2; exit 2; }
  pins+=("$p")
done
mkdir -p "$DIR"
.venv/bin/pip download --quiet --no-deps --only-binary=:all: --implementation cp --python-version "$PYV" \
  --abi "cp${PYV/./}" --abi abi3 --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d "$DIR" "${pins[@]}"
echo "$(ls "$DIR"/*.whl | wc -l) wheels for Python $PYV in $DIR ($(du -sh "$DIR" | cut -f1))"
