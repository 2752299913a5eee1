#!/usr/bin/env bash
# Runs CMD as if on the bare GPU machine (gpu-notes B2): a private mount namespace where the
# project venv's path is hidden, its site-packages sits at /opt/torch/.venv/lib/python3.12/
# site-packages (with a python3 there that imports torch), and Debian's Open MPI, PMIx, hwloc,
# libevent, sentencepiece, munge, udev, yaml-cpp, HDF5 and libav are gone: zero-length files are
# bind-mounted over their .so files (a leak fails loudly: "file too short") and over orted/mpirun.
#   tools/sim-foreign.sh CMD...     (root; e.g. DLO_DEVICE=cpu tools/sim-foreign.sh bash tools/gpu-run.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: tools/sim-foreign.sh CMD..." >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "sim-foreign: needs root (unshare -m)" >&2; exit 77; }
VENV=$(readlink -f .venv)
SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
PYBIN=$(readlink -f "$VENV/bin/python")
export SIM_VENV=$VENV SIM_SP=$SP SIM_PY=$PYBIN
exec unshare -m --propagation private bash -c '
set -euo pipefail
E=$(mktemp); EDIR=$(mktemp -d)
T=/opt/torch/.venv
mkdir -p $T/lib/python3.12/site-packages $T/bin
mount --bind "$SIM_SP" $T/lib/python3.12/site-packages
# python3 that imports torch from the machine-like path, not the venv.
cp "$SIM_PY" $T/bin/python3.real
printf "#!/bin/sh\nPYTHONPATH=%s exec %s \"\$@\"\n" $T/lib/python3.12/site-packages $T/bin/python3.real > $T/bin/python3
chmod +x $T/bin/python3
mount --bind "$EDIR" "$SIM_VENV"          # the build venv path is empty
for pat in "libmpi*" "libopen-pal*" "libopen-rte*" "liboshmem*" "libmca_common*" "libpmix*" "libhwloc*" \
           "libevent*" "libsentencepiece*" "libmunge*" "libudev*" "libyaml-cpp*" "libhdf5*" "libavcodec*" \
           "libavformat*" "libavutil*" "libswscale*"; do
  for f in /usr/lib/x86_64-linux-gnu/$pat /usr/lib/x86_64-linux-gnu/openmpi/lib/$pat /usr/lib/x86_64-linux-gnu/hdf5/*/$pat; do
    [ -f "$f" ] && mount --bind "$E" "$f"
  done
done
for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /etc/openmpi /usr/share/openmpi; do
  [ -d "$d" ] && mount --bind "$EDIR" "$d"
done
for b in orted orterun mpirun mpiexec ompi_info; do [ -e /usr/bin/$b ] && mount --bind "$E" "$(readlink -f /usr/bin/$b)"; done
export PATH=$T/bin:$PATH
unset OPAL_PREFIX PMIX_PREFIX LD_LIBRARY_PATH
"$@"
' _ "$@"
