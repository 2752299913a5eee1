# What the tool-level test scripts share, sourced after `set -euo pipefail`:
#   source "$(dirname "$0")/../common/cli.sh" "$1"
# BIN: the tools' folder (absolute); T: a fresh folder, removed on exit with every process started
# from it; MPI as root on an oversubscribed 2-core machine, one thread per rank; fail MESSAGE.
BIN=$(cd "${1:?usage: $0 BIN_DIR}" && pwd)
T=$(mktemp -d)
cleanup() { pkill -KILL -f "$T/" 2>/dev/null || true; rm -rf "$T"; }
trap cleanup EXIT
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
fail() { echo "FAIL: $*"; exit 1; }
