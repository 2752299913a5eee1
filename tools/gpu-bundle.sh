#!/usr/bin/env bash
# Packs what a bare GPU machine needs beyond its own torch (docs/gpu.md; reference: gpu-notes B2):
# stripped binaries, the non-torch shared libraries they load (from ldd: Open MPI, PMIx, hwloc,
# libevent, sentencepiece, yaml-cpp, ...), a relocatable Open MPI prefix (orted, mpirun, MCA
# plugins, help files) and PMIx's plugins and help files.
#   tools/gpu-bundle.sh BUILD_BIN OUTDIR     (e.g. build-bundle/bin .gpu/bundle)
# BUILD_BIN should come from a DLO_BUNDLE_RPATH=ON build (RUNPATH $ORIGIN/../lib); nothing is
# relinked or patched. torch, CUDA, NCCL, glibc and libstdc++ are left to the machine.
set -euo pipefail
[ $# = 2 ] || { echo "usage: tools/gpu-bundle.sh BUILD_BIN OUTDIR" >&2; exit 2; }
BIN=$1 OUTDIR=$2
BINS=(test_engine_gpu test_mpi_smoke test_engine dlo-forward dlo-checkpoint dlo-bench-engine dlo-generate-bare)
for b in "$BIN"/test_*_gpu; do [ -x "$b" ] && BINS+=("$(basename "$b")"); done
mapfile -t BINS < <(printf '%s\n' "${BINS[@]}" | sort -u)
for b in "${BINS[@]}"; do [ -x "$BIN/$b" ] || { echo "gpu-bundle: $BIN/$b missing (build it first)" >&2; exit 1; }; done
for b in "${BINS[@]}"; do
  readelf -d "$BIN/$b" | grep -q 'RUNPATH.*\$ORIGIN/../lib' \
    || echo "gpu-bundle: warning: $b has no \$ORIGIN/../lib RUNPATH (not a DLO_BUNDLE_RPATH=ON build); gpu-run.sh's LD_LIBRARY_PATH still works" >&2
  if readelf -d "$BIN/$b" | grep -qE 'NEEDED.*(libav|libhdf5|libswscale)'; then
    echo "gpu-bundle: $b links libav/HDF5, which cannot travel" >&2; exit 1
  fi
done
rm -rf "$OUTDIR"; mkdir -p "$OUTDIR/bin" "$OUTDIR/lib"
for b in "${BINS[@]}"; do strip --strip-unneeded -o "$OUTDIR/bin/$b" "$BIN/$b"; done
# Libraries the machine provides (its torch wheel, driver, glibc, libstdc++).
SKIP='^(libtorch|libc10|libcudart|libnccl|libcuda\.|libcublas|libcudnn|libnvrtc|libnv|libgomp|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread|ld-linux|libstdc\+\+|libgcc_s|linux-vdso|libz\.so)'
OMPI_LIB=/usr/lib/x86_64-linux-gnu/openmpi
PMIX_DIR=/usr/lib/x86_64-linux-gnu/pmix2
copy_deps() {  # every shared library ldd resolves for the files given, minus SKIP
  ldd "$@" 2>/dev/null | awk '/=> \//{print $1" "$3}' | sort -u | while read -r name path; do
    [[ $name =~ $SKIP ]] && continue
    [[ $path == */site-packages/* ]] && continue   # the torch wheel's (cuBLAS, cuFFT, gomp, ...): the machine has them
    [ -e "$OUTDIR/lib/$name" ] || cp -L "$path" "$OUTDIR/lib/$name"
  done
}
copy_deps "${BINS[@]/#/$BIN/}"
# Open MPI prefix: OPAL_PREFIX=$B/ompi finds lib/openmpi (plugins), share/openmpi (help) and bin/orted.
# Debian's libdir is ${prefix}/lib/x86_64-linux-gnu/openmpi/lib, its plugins in openmpi3/ below.
PLUG=lib/x86_64-linux-gnu/openmpi/lib/openmpi3
mkdir -p "$OUTDIR/ompi/bin" "$OUTDIR/ompi/$PLUG" "$OUTDIR/ompi/share"
cp -L /usr/bin/orterun "$OUTDIR/ompi/bin/mpirun"; cp -L /usr/bin/orted "$OUTDIR/ompi/bin/orted"
strip --strip-debug "$OUTDIR/ompi/bin/"*
cp -a /usr/share/openmpi "$OUTDIR/ompi/share/"
rm -rf "$OUTDIR/ompi/share/openmpi/doc" "$OUTDIR/ompi/share/openmpi/"*wrapper-data* 2>/dev/null || true
# MCA plugins, less the network stacks and I/O layers the machine has no use for.
for f in "$OMPI_LIB"/lib/openmpi3/mca_*.so; do
  case "$(basename "$f")" in
    *ucx*|*ofi*|*psm*|*openib*|*spml*|*sshmem*|*scoll*|*atomic_*|*io_*|*fbtl*|*fcoll*|*fs_*|*sharedfp*|*monitoring*|*_cuda*|*oshmem*|*memheap*|*usnic*|*netlink*) continue ;;
  esac
  cp -L "$f" "$OUTDIR/ompi/$PLUG/"
done
# The Open MPI libraries under ompi/lib too (orted's own RUNPATH-free lookup goes through LD_LIBRARY_PATH).
copy_deps "$OUTDIR/ompi/bin/orted" "$OUTDIR/ompi/bin/mpirun" "$OUTDIR"/ompi/$PLUG/*.so
# PMIx: its plugins (PMIX_PKGLIBDIR) and help files (PMIX_PKGDATADIR).
mkdir -p "$OUTDIR/pmix/lib" "$OUTDIR/pmix/share"
cp -aL "$PMIX_DIR/lib/pmix" "$OUTDIR/pmix/lib/" 2>/dev/null || true
cp -aL "$PMIX_DIR/share/pmix" "$OUTDIR/pmix/share/" 2>/dev/null || cp -aL "$PMIX_DIR/share/." "$OUTDIR/pmix/share/pmix/" 2>/dev/null || true
copy_deps "$OUTDIR"/pmix/lib/pmix/*.so
chmod -R u+w "$OUTDIR"
echo "gpu-bundle: $OUTDIR"
du -sh "$OUTDIR"/bin "$OUTDIR"/lib "$OUTDIR"/ompi "$OUTDIR"/pmix | sed 's/^/  /'
echo "  total $(du -sm "$OUTDIR" | cut -f1) MB ($(du -sb "$OUTDIR" | cut -f1) bytes)"
