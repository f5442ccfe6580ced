#!/usr/bin/env bash
# Builds the GPU binaries on a build machine (nvcc, no GPU needed) and gathers
# them, with the non-system shared libraries they load, into one folder that can
# travel to a GPU machine lacking gRPC, Protobuf, spdlog, prometheus-cpp...
#
#   scripts/bundle-gpu.sh [BUNDLE_DIR]        (default: build-gpu)
#
# Environment: BUILD_DIR (the CMake build tree, default build-gpu-tree),
# SKIP_BUILD=1 to take an existing tree as is, JOBS (default 1).
# The bundle holds bin/ and lib/; run on the GPU machine with
#   LD_LIBRARY_PATH=build-gpu/lib build-gpu/bin/pagoda_cuda_tests
# or simply scripts/gpu-check.sh OUTDIR build-gpu.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bundle=${1:-$root/build-gpu}
build=${BUILD_DIR:-$root/build-gpu-tree}
max_bytes=$((64 * 1024 * 1024))  # what a device run can carry

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  # CUDA runtime linked statically (pagoda_cuda asks for cudart_static) and
  # GoogleTest static (Debian ships only the static archives).
  cmake -G Ninja -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="90a;80"
  cmake --build "$build" -j "${JOBS:-1}" \
    --target pagoda_cuda_tests pagoda-bench pagoda-server pagoda-cli
fi

binaries=(tests/cuda/pagoda_cuda_tests client/pagoda-bench server/pagoda-server client/pagoda-cli)
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
for b in "${binaries[@]}"; do
  if [[ -x "$build/$b" ]]; then
    cp "$build/$b" "$bundle/bin/"
    strip --strip-unneeded "$bundle/bin/$(basename "$b")"
  else
    echo "bundle-gpu: $build/$b not built; left out" >&2
  fi
done

# Everything ldd resolves except glibc's own libraries (they must match the
# target's loader) and the driver's libcuda (it comes with the GPU machine).
# libstdc++ and libgcc_s travel: the target may carry older ones.
for bin in "$bundle"/bin/*; do
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | libresolv.so* | \
      libutil.so* | libcuda.so* | libnvidia-*) ;;
    *) cp -L "$lib" "$bundle/lib/" ;;
  esac
done

# A binary that still misses a library here would miss it there too.
for bin in "$bundle"/bin/*; do
  if LD_LIBRARY_PATH="$bundle/lib" ldd "$bin" | grep -q "not found"; then
    echo "bundle-gpu: $bin misses libraries:" >&2
    LD_LIBRARY_PATH="$bundle/lib" ldd "$bin" | grep "not found" >&2
    exit 1
  fi
done

bytes=$(du -sb "$bundle" | cut -f1)
echo "bundle-gpu: $bundle holds $(find "$bundle/bin" -type f | wc -l) binaries and $(find "$bundle/lib" -type f | wc -l) libraries, $((bytes / 1024 / 1024)) MiB"
if ((bytes > max_bytes)); then
  echo "bundle-gpu: over the 64 MiB a device run carries" >&2
  exit 1
fi
