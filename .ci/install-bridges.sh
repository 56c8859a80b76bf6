#!/usr/bin/env bash
# Install the third-party MCP bridges the tests run against the real API, under <repo>/tools/bridges:
#
#   tools/bridges/bin/mcp-proxy   sparfenyuk's mcp-proxy: a stdio MCP server forwarding to Streamable HTTP/SSE
#   tools/bridges/bin/mcpo        Open WebUI's mcpo: MCP tools as an OpenAPI (REST) server
#
# A venv of their own, from tests/conformance/bridges/requirements.txt (exact pins of everything): mcp-proxy
# 0.13 requires mcp<2 while the project runs mcp 2.x, so they cannot share the project's venv. (mcp-remote,
# the npm bridge, comes with the MCP JavaScript tools: .ci/install-node.sh.) Run by `./dev setup` and
# `./dev test`, never by a test. Idempotent: a stamp (sha256 of the requirements + the Python version) skips
# a current install. Needs Python 3.11-3.13 with venv ($PYTHON, else python3) and PyPI.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
REQUIREMENTS="${REPO_ROOT}/tests/conformance/bridges/requirements.txt"
VENV="${REPO_ROOT}/tools/bridges"
STAMP="${VENV}/.kdbl-install-stamp"
PY="${PYTHON:-python3}"

log() { echo "install-bridges: $*"; }
die() { echo "install-bridges: ERROR: $*" >&2; exit 1; }

[ -f "${REQUIREMENTS}" ] || die "missing ${REQUIREMENTS}"
command -v "${PY}" >/dev/null 2>&1 || die "${PY} not found (set PYTHON=/path/to/python3.x)"
want_stamp="$(sha256sum "${REQUIREMENTS}" | cut -d' ' -f1) $("${PY}" -c 'import sys; print("py%d.%d" % sys.version_info[:2])')"

if [ -f "${STAMP}" ] && [ "$(cat "${STAMP}")" = "${want_stamp}" ] \
   && [ -x "${VENV}/bin/mcp-proxy" ] && [ -x "${VENV}/bin/mcpo" ]; then
  log "bridges already installed for the current requirements"
else
  log "installing mcp-proxy and mcpo into ${VENV}"
  rm -rf "${VENV}"
  "${PY}" -m venv "${VENV}" || die "${PY} -m venv failed (Debian/Ubuntu: apt install python3-venv)"
  "${VENV}/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
      -r "${REQUIREMENTS}" >"${VENV}/install.log" 2>&1 \
    || { tail -25 "${VENV}/install.log" >&2; die "pip install -r ${REQUIREMENTS} failed"; }
  [ -x "${VENV}/bin/mcp-proxy" ] && [ -x "${VENV}/bin/mcpo" ] || die "mcp-proxy or mcpo missing after install"
  echo "${want_stamp}" >"${STAMP}"
fi

echo "mcp-proxy=${VENV}/bin/mcp-proxy ($("${VENV}/bin/python" -m pip show mcp-proxy 2>/dev/null | sed -n 's/^Version: //p'))"
echo "mcpo=${VENV}/bin/mcpo ($("${VENV}/bin/python" -m pip show mcpo 2>/dev/null | sed -n 's/^Version: //p'))"
