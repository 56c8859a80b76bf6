"""`kdbl-control grant add | list | revoke | explain | restrict`: who reads a restricted source's files."""

from __future__ import annotations

import argparse
import uuid
from typing import TYPE_CHECKING, Any

from kdbl_control.cli_database import on_pool
from kdbl_control.cli_output import print_report, print_rows

if TYPE_CHECKING:
    from kdbl_core.db.connect import Pool


def add_commands(sub: Any) -> None:
    grant = sub.add_parser("grant", help="per-source / per-file access for a user or group")
    actions = grant.add_subparsers(dest="action", required=True)
    ga = actions.add_parser("add", help="let a user or a group read a source, or one file of it (prints the "
                            "grant's id)")
    ga.add_argument("--source", type=uuid.UUID, required=True, help="the source's id")
    ga.add_argument("--key", help="one file (default: the whole source)")
    who = ga.add_mutually_exclusive_group(required=True)
    who.add_argument("--user", help="the user name the grant is for")
    who.add_argument("--group", help="the group the grant is for")
    ga.add_argument("--force", action="store_true", help="even on an operator-managed source")
    ga.set_defaults(func=on_pool(_add))
    gl = actions.add_parser("list", help="the grants with their source, file and principal")
    gl.add_argument("--source", type=uuid.UUID, help="only this source's grants (its id)")
    gl.set_defaults(func=on_pool(_list))
    gr = actions.add_parser("revoke", help="take a grant back")
    gr.add_argument("id", type=int, help="the grant's id (see grant list)")
    gr.add_argument("--force", action="store_true", help="even an operator-managed grant")
    gr.set_defaults(func=on_pool(_revoke))
    ge = actions.add_parser("explain", help="whether a principal may read a file, and which grant or share "
                            "permission decides it")
    ge.add_argument("--source", type=uuid.UUID, required=True, help="the source's id")
    ge.add_argument("--file", required=True, help="the file's key in the source")
    ge.add_argument("--principal", required=True,
                    help="user:NAME (an OIDC subject or a token's principal), or NAME")
    ge.add_argument("--group", action="append", default=[], help="a group claim of the principal (repeatable)")
    ge.set_defaults(func=on_pool(_explain))
    gm = actions.add_parser("restrict", help="make a source visible only to granted principals")
    gm.add_argument("--source", type=uuid.UUID, required=True, help="the source's id")
    gm.add_argument("--open", action="store_true", help="the reverse: visible to the whole tenant")
    gm.add_argument("--force", action="store_true", help="even on an operator-managed source")
    gm.set_defaults(func=on_pool(_restrict))


def _add(args: argparse.Namespace, db: Pool) -> int:
    from kdbl_control import admin

    subject = f"user:{args.user}" if args.user else f"group:{args.group}"
    grant = admin.add_grant(db, source_id=args.source, subject=subject, file_key=args.key, force=args.force)
    print(grant.id)
    return 0


def _list(args: argparse.Namespace, db: Pool) -> int:
    from kdbl_control import admin

    print_rows(args, admin.list_grants(db, args.source))
    return 0


def _revoke(args: argparse.Namespace, db: Pool) -> int:
    from kdbl_control import admin

    admin.revoke_grant(db, args.id, force=args.force)
    print("revoked")
    return 0


def _explain(args: argparse.Namespace, db: Pool) -> int:
    """Exit 0 when the principal may read the file, 1 when not."""
    from kdbl_control import grant_explain

    report = grant_explain.explain(db, args.source, args.file, args.principal, args.group)
    print_report(args, report, grant_explain.render)
    return 0 if report["readable"] else 1


def _restrict(args: argparse.Namespace, db: Pool) -> int:
    from kdbl_control import admin

    admin.set_source_acl(db, args.source, restricted=not args.open, force=args.force)
    print("open to the tenant" if args.open else "restricted to granted principals")
    return 0
