#!/usr/bin/env bash
# The one install step dlo needs: system packages, the pinned Python venv (libtorch comes from its
# torch wheel), then CMake configure + build into build/: the tools (dlo-generate, dlo-checkpoint,
# dlo-forward, ...); with --all also the tests (tools/test.sh builds them). Idempotent: on a set-up
# machine it only rebuilds what changed, in seconds.
#
#   tools/setup.sh [--no-build | --all]
#
# Environment:
#   DLO_VENV        venv location (default: ~/.cache/dlo/venv-<hash of tools/requirements.txt's pins above
#                   its "added to an existing venv" line>,
#                   shared by every clone on the machine; .venv links to it)
#   DLO_BUILD_DIR   build directory (default: build)
#   DLO_CMAKE_ARGS  extra CMake arguments
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
T0=$(date +%s)
say() { printf '[setup %3ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }

BUILD=1
TARGETS=(dlo-generate dlo-generate-bare dlo-checkpoint dlo-forward dlo-bench-engine)
for a in "$@"; do
  case "$a" in
    --no-build) BUILD=0 ;;
    --all) TARGETS=(all) ;;
    *) echo "usage: tools/setup.sh [--no-build | --all]" >&2; exit 2 ;;
  esac
done

# 1. Debian packages.
APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git clang libclang-rt-14-dev
  openmpi-bin libopenmpi-dev libhdf5-dev libhdf5-openmpi-dev
  libavcodec-dev libavformat-dev libavutil-dev libswscale-dev ffmpeg
  libyaml-cpp-dev libcxxopts-dev doctest-dev nlohmann-json3-dev libsentencepiece-dev
  # Slurm for configs/slurm and its test (which starts its own daemons; srun --mpi=pmix launches
  # Open MPI through libpmix2, already a dependency of libopenmpi3).
  slurmctld slurmd slurm-client munge
  # h5py of Debian's python3 reads the latents files in the tests (the venv stays as pinned).
  python3-h5py
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing ${#missing[@]} Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  # Packages with services (munge, slurmd, slurmctld) must not start them: the Slurm test runs
  # its own daemons with its own key and config. Without systemd, invoke-rc.d asks policy-rc.d;
  # where none exists, one that denies (exit 101) is in place for the install only.
  POLICY=/usr/sbin/policy-rc.d
  if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# tools/setup.sh: no service starts during its apt-get install\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
    trap '$SUDO rm -f "$POLICY"' EXIT
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  if [ -n "$(trap -p EXIT)" ]; then $SUDO rm -f "$POLICY"; trap - EXIT; fi
else
  say "Debian packages present"
fi

# 2. Python venv with the pinned torch (whose libtorch we build against) and reference packages.
# The venv is named by the hash of the pins above requirements.txt's "added to an existing venv"
# line (torch and what the build links against: a new venv means new include paths and a full
# rebuild); the reference-only pins below it are installed into that venv, without dependencies
# (each is pinned itself), each new set once.
REQ=tools/requirements.txt
EXTRAS_MARK='^# ---- added to an existing venv'
HASH=$(sed "/$EXTRAS_MARK/,\$d" "$REQ" | sha256sum | cut -c1-12)
XHASH=$(sha256sum "$REQ" | cut -c1-12)
VENV=${DLO_VENV:-$HOME/.cache/dlo/venv-$HASH}
if [ ! -f "$VENV/.dlo-installed-$HASH" ]; then
  say "creating venv $VENV (pinned torch and reference packages; downloads several GB on a fresh machine)"
  PY=${DLO_BOOTSTRAP_PYTHON:-python3}
  if ! "$PY" -m venv --help >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv
  fi
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r <(sed "/$EXTRAS_MARK/,\$d" "$REQ")
  touch "$VENV/.dlo-installed-$HASH"
else
  say "venv present: $VENV"
fi
if [ ! -f "$VENV/.dlo-extras-$XHASH" ]; then
  if grep -q "$EXTRAS_MARK" "$REQ"; then
    say "installing the reference-only pins into $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -r <(sed -n "/$EXTRAS_MARK/,\$p" "$REQ")
  fi
  touch "$VENV/.dlo-extras-$XHASH"
fi
ln -sfn "$VENV" .venv
PYTHON=$VENV/bin/python
SITE=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# 3. Configure and build.
BUILD_DIR=${DLO_BUILD_DIR:-build}
# Configured again when the venv or the way this script configures changed (the stamp says both).
STAMP="$VENV|ccache-pch-1"
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ "$(cat "$BUILD_DIR/.dlo-venv" 2>/dev/null)" != "$STAMP" ]; then
  say "configuring $BUILD_DIR"
  mkdir -p "$BUILD_DIR"
  # A new venv means new Torch/CUDA paths: drop cached find results (Torch_DIR, ...).
  rm -f "$BUILD_DIR/CMakeCache.txt"
  # ccache with the precompiled header (CMakeLists.txt, DLO_PCH): its sloppiness must allow one, and
  # it hashes the header's inputs (the .gch.sum CMake writes) instead of the .gch, which differs
  # between build trees.
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD_DIR" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$SITE/torch/share/cmake" \
    "-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime;CCACHE_PCH_EXTSUM=1;ccache" \
    -DCMAKE_C_COMPILER_LAUNCHER=ccache \
    -DDLO_PYTHON="$PYTHON" ${DLO_CMAKE_ARGS:-} >"$BUILD_DIR/configure.log" 2>&1 \
    || { cat "$BUILD_DIR/configure.log"; exit 1; }
  grep -E "^-- dlo" "$BUILD_DIR/configure.log" || true
  echo "$STAMP" > "$BUILD_DIR/.dlo-venv"
fi
if ((BUILD)); then
  say "building ($BUILD_DIR: ${TARGETS[*]})"
  # Relative paths in the ccache key and no build directory in it (debug builds would hash it),
  # so fresh clones elsewhere (CI) reuse the cache.
  CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=1 cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${TARGETS[@]}"
fi
say "done"
