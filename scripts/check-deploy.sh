#!/usr/bin/env bash
# Checks the deployment assets for real: Prometheus config and alert rules (promtool),
# the rules' unit tests, the generated PrometheusRule, YAML lint of deploy/, shellcheck of
# scripts/, the Kustomize rendering (when kubectl is present), and the consistency of the
# Dockerfile and manifests with the server's flags, ports and metric families.
#
# Usage: scripts/check-deploy.sh [PAGODA_SERVER [PAGODA_CLI]]
#   With a built pagoda-server, flags are checked against its --help (a renamed flag
#   then fails here, not in a deployment); without, against README.md's flag table.
#   With a built pagoda-cli, the HEALTHCHECK's options are checked against its --help.
# Tools: scripts/install-deps.sh checks installs them.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
server_bin="${1:-}"
cli_bin="${2:-}"

missing=()
for tool in promtool yamllint shellcheck /usr/bin/python3; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "check-deploy: missing ${missing[*]}; run scripts/install-deps.sh checks" >&2
  exit 1
fi
for bin in "$server_bin" "$cli_bin"; do
  if [ -n "$bin" ] && [ ! -x "$bin" ]; then
    echo "check-deploy: $bin is not an executable" >&2
    exit 1
  fi
done

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

# Runs one named check, printing its output only when it fails.
check() {
  local name="$1"
  shift
  if "$@" >"$tmp/out" 2>&1; then
    passed=$((passed + 1))
    echo "PASS  $name"
  else
    failed=$((failed + 1))
    echo "FAIL  $name"
    sed 's/^/      /' "$tmp/out"
  fi
}

check "promtool check config deploy/prometheus/prometheus.yml" \
  promtool check config deploy/prometheus/prometheus.yml
check "promtool check rules deploy/prometheus/rules" \
  promtool check rules deploy/prometheus/rules/*.yml
check "promtool test rules deploy/prometheus/tests" \
  promtool test rules deploy/prometheus/tests/*.yml
check "PrometheusRule generated from the rule file" \
  bash scripts/gen-prometheusrule.sh --check
check "yamllint deploy/" \
  yamllint --strict -c deploy/.yamllint deploy/
check "shellcheck scripts/*.sh tests/deploy/*.sh" \
  shellcheck scripts/*.sh tests/deploy/*.sh

consistency_args=(--dashboard-rules "$tmp/dashboard-rules.yml")
[ -n "$server_bin" ] && consistency_args+=(--server-binary "$server_bin")
[ -n "$cli_bin" ] && consistency_args+=(--cli-binary "$cli_bin")
check "flags, ports, timing and metric names agree" \
  /usr/bin/python3 scripts/check_deploy_consistency.py "${consistency_args[@]}"
if [ -f "$tmp/dashboard-rules.yml" ]; then
  check "dashboard queries parse (promtool)" promtool check rules "$tmp/dashboard-rules.yml"
fi

if command -v kubectl >/dev/null 2>&1; then
  check "kubectl kustomize deploy/kubernetes renders" kubectl kustomize deploy/kubernetes
  # The secure component (TLS, mTLS, tokens from Secrets) as a user adds it.
  cp -r deploy/kubernetes "$tmp/kubernetes"
  printf 'components:\n  - secure\n' >> "$tmp/kubernetes/kustomization.yaml"
  check "kubectl kustomize with the secure component renders" kubectl kustomize "$tmp/kubernetes"
  # The snapshot on a PersistentVolumeClaim instead of the emptyDir (rolling updates keep it).
  printf '  - persistent-snapshot\n' >> "$tmp/kubernetes/kustomization.yaml"
  check "kubectl kustomize with the persistent-snapshot component renders a claim" \
    bash -c "kubectl kustomize '$tmp/kubernetes' | grep -q 'volumeClaimTemplates:'"
else
  echo "SKIP  kubectl kustomize deploy/kubernetes (no kubectl on this machine)"
fi

echo "check-deploy: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
