#!/usr/bin/env bash
# Installs the distribution packages pagoda needs. Idempotent: when every
# package is present it returns without touching apt.
#
# Usage: scripts/install-deps.sh [build] [checks] [fuzz] [compile] [image]
#   build   (default) compilers, libraries and tools to build, test and run
#   checks  the deployment checks' tools: promtool and a Prometheus server,
#           yamllint, shellcheck
#   fuzz    clang and its libFuzzer runtime (make sanitize, make fuzz)
#   compile only what building the binaries needs, without the test suite
#           (the container image's build stage)
#   image   podman, runc and debootstrap (make image-test)
set -euo pipefail

build_packages=(
  cmake ninja-build g++ make pkg-config curl
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libhwy-dev libtbb-dev libcli11-dev libxxhash-dev
  python3-grpcio python3-protobuf python3-numpy python3-venv python3-setuptools python3-wheel
  python3-torch
  openssl
)
compile_packages=(
  cmake ninja-build g++ make pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev prometheus-cpp-dev
  libhwy-dev libtbb-dev libcli11-dev libxxhash-dev
)
check_packages=(prometheus yamllint shellcheck curl)
image_packages=(podman runc debootstrap curl)
fuzz_packages=(clang libclang-rt-14-dev)

packages=()
for group in "${@:-build}"; do
  case "$group" in
    build) packages+=("${build_packages[@]}") ;;
    checks) packages+=("${check_packages[@]}") ;;
    fuzz) packages+=("${fuzz_packages[@]}") ;;
    compile) packages+=("${compile_packages[@]}") ;;
    image) packages+=("${image_packages[@]}") ;;
    *) echo "install-deps: expected a group among build, checks, fuzz, compile, image; received '$group'" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
