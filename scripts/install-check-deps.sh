#!/usr/bin/env bash
# Installs the tools that check the deployment assets: promtool and a real Prometheus
# server (package prometheus), yamllint and shellcheck.
# Idempotent: when every package is present it returns without touching apt.
set -euo pipefail

packages=(prometheus yamllint shellcheck curl)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

echo "install-check-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
"${sudo_cmd[@]}" apt-get update -qq
# The prometheus package's postinst starts a system service on :9090 where an init system
# runs; policy-rc.d is not touched here, the end-to-end test uses its own port anyway.
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
