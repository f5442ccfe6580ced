#!/usr/bin/env bash
# scripts/runtime-packages.sh on the built binaries: the list the container's runtime stage
# installs must name installed packages that hold the gRPC, protobuf and prometheus-cpp
# libraries the binaries load, and no -dev package.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

list="$(bash "$root/scripts/runtime-packages.sh" "$@" 2>/dev/null)"
echo "$list"
status=0
for package in $list; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
    echo "runtime_packages: $package is not an installed package" >&2
    status=1
  fi
  case "$package" in
    *-dev) echo "runtime_packages: $package is a development package" >&2; status=1 ;;
  esac
done
for library in libgrpc++ libprotobuf libprometheus-cpp-pull libprometheus-cpp-core; do
  if ! ldd "$1" | grep -q "$library"; then
    continue  # linked statically in this build: nothing to install for it
  fi
  grep -q "^$library" <<<"$list" || { echo "runtime_packages: no package for $library" >&2; status=1; }
done
[ "$(wc -l <<<"$list")" -ge 3 ] || { echo "runtime_packages: implausibly short list" >&2; status=1; }
exit "$status"
