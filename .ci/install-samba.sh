#!/usr/bin/env bash
# Install Samba (smbd, smbpasswd), its VFS modules (acl_xattr: NT ACLs kept in an extended attribute) and its
# command-line clients (smbcacls, smbclient) for the SMB connector's tests (tests/integration/
# test_connectors_smb.py, test_smb_permissions.py), which start their own smbd on loopback;
# test_smb_permissions.py sets NT ACLs on the share's files through smbcacls. Idempotent; returns at once when
# all are present.
#
#   Debian: samba samba-vfs-modules smbclient
#
# Fails (exit 1) when it cannot be installed (no root, no package mirror).
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
have_acl_xattr() { compgen -G "/usr/lib*/samba/vfs/acl_xattr.so" >/dev/null ||
  compgen -G "/usr/lib/*/samba/vfs/acl_xattr.so" >/dev/null; }

if have smbd && have smbpasswd && have smbcacls && have smbclient && have_acl_xattr; then
  exit 0
fi

"$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" install-samba samba samba-vfs-modules smbclient
have smbd && have smbpasswd || { echo "install-samba: smbd still missing" >&2; exit 1; }
have smbcacls && have smbclient || { echo "install-samba: smbcacls or smbclient still missing" >&2; exit 1; }
have_acl_xattr || { echo "install-samba: the acl_xattr VFS module is still missing" >&2; exit 1; }
echo "install-samba: smbd, its VFS modules and smbcacls ready" >&2
