#!/usr/bin/env bash
# make image-test: the Dockerfile's image, built for the CPU (PAGODA_CUDA=OFF)
# with podman from a Debian base bootstrapped here (no registry is reachable;
# the NVIDIA CUDA bases cannot be pulled), then run as CI would run it:
#   non-root (the image's user 10001), read-only root file system, host network;
#   `pagoda-cli health` from outside until SERVING; `pagoda-cli demo` PASS;
#   /metrics served; SIGTERM under load: exit 0 within 1 s, no call CANCELLED;
#   the image under IMAGE_MAX_MB and with no compiler inside.
# Usage: scripts/image-test.sh BUILD_DIR   (the host's pagoda-cli and pagoda-bench)
# Podman runs with runc, the cgroupfs manager and no default ulimits
# (../shared/docs/TOOLCHAIN.md, item 8): a containers.conf of its own says so.
set -euo pipefail
cd "$(dirname "$0")/.."
build="$(realpath "${1:-build}")"
cli="$build/client/pagoda-cli"
bench="$build/client/pagoda-bench"
base=localhost/debian:bookworm
image=localhost/pagoda:image-test
name="pagoda-image-test-$$"
max_mb="${IMAGE_MAX_MB:-400}"
tmp="$(mktemp -d)"
export CONTAINERS_CONF="$tmp/containers.conf"
cat >"$CONTAINERS_CONF" <<'EOF'
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
EOF
podman=(podman --runtime runc)
cleanup() {
  "${podman[@]}" rm -f "$name" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "image-test: FAIL: $*" >&2
  "${podman[@]}" logs "$name" 2>&1 | tail -n 20 >&2 || true
  exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# 1. The base, bootstrapped once per machine (podman keeps it).
t=$(now)
if ! "${podman[@]}" image exists "$base"; then
  debootstrap --variant=minbase bookworm "$tmp/rootfs" >"$tmp/debootstrap.log" 2>&1 \
    || { tail -n 20 "$tmp/debootstrap.log" >&2; fail "debootstrap"; }
  tar -C "$tmp/rootfs" -c . | "${podman[@]}" import - "$base" >/dev/null
  rm -rf "$tmp/rootfs"
  echo "image-test: base $base bootstrapped in $(since "$t") s"
else
  echo "image-test: base $base already present"
fi

# 2. The image: the same Dockerfile, its bases and PAGODA_CUDA as build arguments.
t=$(now)
"${podman[@]}" build --network host --format docker -t "$image" \
  --build-arg BUILD_IMAGE="$base" --build-arg RUNTIME_IMAGE="$base" --build-arg PAGODA_CUDA=OFF \
  . >"$tmp/build.log" 2>&1 || { tail -n 40 "$tmp/build.log" >&2; fail "podman build"; }
echo "image-test: image built in $(since "$t") s"

# 3. Run it non-root on a read-only root file system; health from outside.
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
metrics_port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
t=$(now)
"${podman[@]}" run -d --name "$name" --network host --read-only --no-healthcheck \
  -e PAGODA_LISTEN="127.0.0.1:$port" -e PAGODA_METRICS_ADDRESS="127.0.0.1:$metrics_port" \
  -e PAGODA_BACKEND=cpu -e PAGODA_THREADS=2 "$image" >/dev/null || fail "podman run"
user="$("${podman[@]}" inspect -f '{{.Config.User}}' "$name")"
[ "$user" = "10001:10001" ] || fail "the container runs as '$user', expected 10001:10001"
for _ in $(seq 1 300); do
  if "$cli" --server "127.0.0.1:$port" --timeout-ms 1000 health >/dev/null 2>&1; then break; fi
  [ "$("${podman[@]}" inspect -f '{{.State.Running}}' "$name")" = "true" ] || fail "the container exited at start"
  sleep 0.1
done
"$cli" --server "127.0.0.1:$port" health >/dev/null || fail "pagoda-cli health never answered SERVING"
echo "image-test: SERVING $(since "$t") s after start"
"$cli" --server "127.0.0.1:$port" demo >"$tmp/demo.txt" || { cat "$tmp/demo.txt" >&2; fail "pagoda-cli demo"; }
tail -n 1 "$tmp/demo.txt" | grep -qx PASS || fail "pagoda-cli demo did not print PASS"
curl -fsS "http://127.0.0.1:$metrics_port/metrics" >"$tmp/metrics.txt" || fail "/metrics not served"
grep -q '^pagoda_build_info{.*backend="cpu"' "$tmp/metrics.txt" || fail "/metrics has no pagoda_build_info for cpu"

# 4. SIGTERM under load: every call completes or is refused UNAVAILABLE (the
# bench fails on anything else, CANCELLED included); exit 0 within 1 s.
pid="$("${podman[@]}" inspect -f '{{.State.Pid}}' "$name")"
"$bench" soak --server "127.0.0.1:$port" --clients 4 --calls 1000000 --seed 3 --sigterm-after 1 \
  --server-pid "$pid" >"$tmp/soak.txt" || { cat "$tmp/soak.txt" >&2; fail "a call failed during the drain"; }
grep -q "SIGTERM sent" "$tmp/soak.txt" || fail "the soak ended before its SIGTERM"
code="$("${podman[@]}" wait "$name")"
[ "$code" = "0" ] || fail "the server exited $code after SIGTERM"
took="$("${podman[@]}" logs "$name" 2>&1 | sed -n 's/.*shutdown: done in \([0-9.]*\) s.*/\1/p' | tail -n 1)"
[ -n "$took" ] || fail "no 'shutdown: done' line in the log"
awk -v s="$took" 'BEGIN { exit !(s < 1.0) }' || fail "the drain took $took s, expected under 1 s"
echo "image-test: SIGTERM under load: exit 0, drain $took s, no call cancelled"

# 5. Size, and no compiler in the image.
bytes="$("${podman[@]}" image inspect -f '{{.Size}}' "$image")"
mb=$((bytes / 1024 / 1024))
[ "$mb" -le "$max_mb" ] || fail "the image is $mb MiB, expected at most $max_mb"
# shellcheck disable=SC2016  # $c is the container's shell's
compilers="$("${podman[@]}" run --rm --network host --entrypoint /bin/sh "$image" -c \
  'for c in cc gcc g++ c++ clang clang++ nvcc cmake; do command -v "$c"; done; true')"
[ -z "$compilers" ] || fail "the image holds build tools: $compilers"
echo "image-test: image $mb MiB, no compiler inside"
echo "image-test: OK"
