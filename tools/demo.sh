#!/usr/bin/env bash
# The main job on the built-in demo model. Until dlo-generate exists this writes a small sharded
# checkpoint with Python's safetensors (the reference implementation) and inspects it with dlo.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/demo}
mkdir -p "$OUT"
.venv/bin/python - "$OUT/py.safetensors" <<'PY'
import sys, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(0)
t = {f"blocks.{i}.attn.to_q.weight": torch.randn(256, 256, generator=g).bfloat16() for i in range(8)}
t.update({f"blocks.{i}.ffn.weight": torch.randn(512, 256, generator=g) for i in range(8)})
t["patch_embedding.weight"] = torch.randn(256, 16, 1, 2, 2, generator=g)
save_file(t, sys.argv[1], metadata={"format": "pt"})
PY
build/bin/dlo-checkpoint copy "$OUT/py.safetensors" "$OUT/sharded" --shard-size 2MB --base-name diffusion_pytorch_model
build/bin/dlo-checkpoint inspect "$OUT/sharded"
