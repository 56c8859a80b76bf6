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

"$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" install-samba samba
have smbd && have smbpasswd || { echo "install-samba: smbd still missing" >&2; exit 1; }
echo "install-samba: smbd ready" >&2
