#!/usr/bin/env bash
# apt-get install PACKAGE... for the install-*.sh scripts, as root or through `sudo -n`, without letting a
# package's maintainer scripts start a system-wide service (a temporary policy-rc.d that exits 101): the
# tests start their own servers on free loopback ports.
#
#   .ci/apt-install.sh TAG PACKAGE...   (TAG prefixes the messages, e.g. install-samba)
#
# Fails (exit 1) when it cannot install (no root, no package mirror).
set -euo pipefail

TAG="$1"
shift
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "${TAG}: need root (or sudo) for apt-get install $*" >&2; exit 1; }
  SUDO="sudo -n"
fi
echo "${TAG}: apt-get install $*" >&2
export DEBIAN_FRONTEND=noninteractive
${SUDO} apt-get update -qq >/dev/null || { echo "${TAG}: apt-get update failed" >&2; exit 1; }
POLICY=/usr/sbin/policy-rc.d
ADDED_POLICY=""
if [ ! -e "${POLICY}" ]; then
  printf '#!/bin/sh\nexit 101\n' | ${SUDO} tee "${POLICY}" >/dev/null
  ${SUDO} chmod 0755 "${POLICY}"
  ADDED_POLICY=1
fi
rc=0
${SUDO} apt-get install -y -qq --no-install-recommends "$@" >/dev/null || rc=$?
[ -n "${ADDED_POLICY}" ] && ${SUDO} rm -f "${POLICY}"
[ "${rc}" -eq 0 ] || { echo "${TAG}: apt-get install failed (${rc})" >&2; exit 1; }
