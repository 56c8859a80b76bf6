"""`kdbl-control token create | list | revoke`: personal access tokens (PATs) for MCP clients and admins."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from kdbl_control.cli_database import on_pool
from kdbl_control.cli_output import print_rows
from kdbl_control.cli_values import parse_expiry
from kdbl_core.access.principal import ALL_SCOPES
from kdbl_core.errors import ConfigError

if TYPE_CHECKING:
    from kdbl_core.db.connect import Pool


def add_commands(sub: Any) -> None:
    token = sub.add_parser("token", help="personal access tokens: mint, list and revoke them")
    actions = token.add_subparsers(dest="action", required=True)
    tk = actions.add_parser("create", help="mint a PAT (printed once)")
    tk.add_argument("--tenant", help="the tenant whose files the token reads (or --admin)")
    tk.add_argument("--admin", action="store_true", help="cluster-admin token (MCP rejects it)")
    tk.add_argument("--name", default="cli", help="the token's name (default cli)")
    tk.add_argument("--scope", action="append", choices=list(ALL_SCOPES),
                    help="a scope the token gets (repeatable; default: every scope)")
    tk.add_argument("--principal", help="user name the token acts as (default: the token name)")
    tk.add_argument("--group", action="append", default=[],
                    help="a group the token's principal is in, for grants (repeatable)")
    tk.add_argument("--expires", type=parse_expiry, help="12h, 30d, 4w or an ISO timestamp")
    tk.set_defaults(func=on_pool(_create))
    tl = actions.add_parser("list", help="the tokens with their tenant, principal, scopes and expiry")
    tl.add_argument("--tenant", help="only this tenant's tokens")
    tl.set_defaults(func=on_pool(_list))
    tr = actions.add_parser("revoke", help="revoke a token")
    tr.add_argument("token", help="token id, lookup id, or the token itself")
    tr.add_argument("--force", action="store_true", help="even an operator-managed token")
    tr.set_defaults(func=on_pool(_revoke))


def _create(args: argparse.Namespace, db: Pool) -> int:
    from kdbl_control import admin

    if args.admin == bool(args.tenant):
        raise ConfigError("token create needs exactly one of --tenant NAME or --admin")
    token, row = admin.create_token(
        db, tenant_name=args.tenant, name=args.name, scopes=args.scope,
        subject=f"user:{args.principal}" if args.principal else None, groups=args.group,
        expires_at=args.expires, admin=args.admin)
    print(token)
    print(f"(token id {row.id}; shown once — store it now)", file=sys.stderr)
    return 0


def _list(args: argparse.Namespace, db: Pool) -> int:
    from kdbl_control import admin

    print_rows(args, admin.list_tokens(db, args.tenant), ["id", "tenant", "name", "subject", "scopes",
                                                          "expires_at", "revoked_at"])
    return 0


def _revoke(args: argparse.Namespace, db: Pool) -> int:
    from kdbl_control import admin

    admin.revoke_token(db, args.token, force=args.force)
    print("revoked")
    return 0
