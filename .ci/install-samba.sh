#!/usr/bin/env bash
# Install Samba (smbd, smbpasswd) for the SMB connector's tests (tests/integration/test_connectors_smb.py),
# which start their own smbd on a free loopback port. Idempotent; returns at once when smbd is present.
#
#   Debian: samba
#
# Fails (exit 1) when it cannot be installed (no root, no package mirror).
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }

if have smbd && have smbpasswd; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-samba: need root (or sudo) for apt-get install samba" >&2; exit 1; }
  SUDO="sudo -n"
fi
echo "install-samba: apt-get install samba" >&2
export DEBIAN_FRONTEND=noninteractive
${SUDO} apt-get update -qq >/dev/null || { echo "install-samba: apt-get update failed" >&2; exit 1; }
# A temporary policy-rc.d (exit 101) keeps the package from starting system-wide smbd/nmbd on :445;
# the tests start their own.
POLICY=/usr/sbin/policy-rc.d
ADDED_POLICY=""
if [ ! -e "${POLICY}" ]; then
  printf '#!/bin/sh\nexit 101\n' | ${SUDO} tee "${POLICY}" >/dev/null
  ${SUDO} chmod 0755 "${POLICY}"
  ADDED_POLICY=1
fi
rc=0
${SUDO} apt-get install -y -qq --no-install-recommends samba >/dev/null || rc=$?
[ -n "${ADDED_POLICY}" ] && ${SUDO} rm -f "${POLICY}"
[ "${rc}" -eq 0 ] || { echo "install-samba: apt-get install samba failed (${rc})" >&2; exit 1; }
have smbd && have smbpasswd || { echo "install-samba: smbd still missing" >&2; exit 1; }
echo "install-samba: smbd ready" >&2
