#!/usr/bin/env bash
# Prints, one a line, the distribution packages that hold the shared libraries the given
# binaries load: the container's runtime stage installs exactly these, so its package
# list follows the build instead of being kept by hand (and names like Ubuntu's
# "t64" renames need no guessing). Libraries no package owns (the host's libcuda,
# mounted by the NVIDIA container runtime) are reported on stderr and left out.
# Usage: scripts/runtime-packages.sh BINARY...
set -euo pipefail

if [ "$#" -eq 0 ]; then
  echo "usage: $0 BINARY..." >&2
  exit 2
fi

# Every library path the binaries resolve to.
libraries=()
for binary in "$@"; do
  if [ ! -x "$binary" ]; then
    echo "runtime-packages: $binary is not an executable file" >&2
    exit 1
  fi
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then
      echo "runtime-packages: $binary: $name not found at build time (left to the host)" >&2
    else
      libraries+=("$path")
    fi
  done < <(ldd "$binary")
done
mapfile -t libraries < <(printf '%s\n' "${libraries[@]}" | sort -u)

# Merged /usr: dpkg may know a file under /lib or /usr/lib, by link or by target. One
# dpkg-query call for all candidates (each call reads the whole database).
candidates=()
for lib in "${libraries[@]}"; do
  candidates+=("$lib" "$(readlink -f "$lib")" "/usr${lib#/usr}" "${lib#/usr}")
done
declare -A owner=()
while IFS= read -r line; do
  # "libfoo1:amd64: /usr/lib/x86_64-linux-gnu/libfoo.so.1"; diversions are not owners.
  [[ "$line" == diversion* ]] && continue
  owner["${line#*: }"]="${line%%:*}"
done < <(dpkg-query -S "${candidates[@]}" 2>/dev/null || true)

declare -A packages=()
for lib in "${libraries[@]}"; do
  found=""
  for candidate in "$lib" "$(readlink -f "$lib")" "/usr${lib#/usr}" "${lib#/usr}"; do
    if [ -n "${owner[$candidate]:-}" ]; then
      found="${owner[$candidate]}"
      break
    fi
  done
  if [ -n "$found" ]; then
    packages["$found"]=1
  else
    echo "runtime-packages: $lib belongs to no package (left out)" >&2
  fi
done

printf '%s\n' "${!packages[@]}" | sort
