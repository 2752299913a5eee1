#!/usr/bin/env bash
# Builds what changed (the tools and the tests) and runs every test: tools/test.sh [extra ctest args, e.g. -L parity]
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh --all
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
exec ctest --test-dir "${DLO_BUILD_DIR:-build}" --output-on-failure -j 2 "$@"
