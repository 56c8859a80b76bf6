"""`kdbl-control tenant create | list | show | update`: tenants and their policy."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from kdbl_control.cli_database import on_pool
from kdbl_control.cli_output import print_rows
from kdbl_control.cli_values import parse_bool

if TYPE_CHECKING:
    from kdbl_core.db.connect import Pool


def add_commands(sub: Any) -> None:
    tenant = sub.add_parser("tenant", help="tenants: create and list them, show and change their policy")
    actions = tenant.add_subparsers(dest="action", required=True)
    tc = actions.add_parser("create", help="create a tenant (prints its id and name)")
    tc.add_argument("name", help="the tenant's name: 1-63 lower-case letters, digits and '-'")
    tc.add_argument("--display-name", help="a longer name for people (default: none)")
    tc.add_argument("--no-hybrid", action="store_true",
                    help="no embeddings for its chunks: its searches are lexical")
    tc.set_defaults(func=on_pool(_create))
    tl = actions.add_parser("list", help="every tenant with its sources and files")
    tl.set_defaults(func=on_pool(_list))
    tshow = actions.add_parser("show", help="the tenant's effective policy")
    tshow.add_argument("name", help="the tenant's name")
    tshow.set_defaults(func=on_pool(_show))
    _add_update(actions)


def _add_update(actions: Any) -> None:
    tu = actions.add_parser("update", help="change the tenant's policy (running APIs apply it within ~2 s)")
    tu.add_argument("name", help="the tenant's name")
    tu.add_argument("--enabled", type=parse_bool, help="true|false: false refuses every token of the tenant")
    tu.add_argument("--tools", help="allowed tools, comma-separated (e.g. search_content,list_sources)")
    tu.add_argument("--modes", help="allowed search modes: lexical or lexical,hybrid")
    tu.add_argument("--rate-limit", help="per token: e.g. 60/m,1000/h,10000/d (0 = unlimited)")
    tu.add_argument("--tenant-rate-limit", help="all tokens of the tenant together, same syntax")
    tu.add_argument("--downloads", choices=["off", "inline", "attachment"],
                    help="download links: off, inline only, or inline + attachment")
    tu.add_argument("--max-in-flight", help="cost units of calls in flight per API process (a search 1-3, an answer "
                    "2-4; kdbl_api.fair_share), 1-1000, or 'default' (KDBL_TENANT_MAX_IN_FLIGHT)")
    tu.add_argument("--queue-ms", help="how long a call over --max-in-flight waits for a slot before 429, "
                    "0-60000, or 'default' (KDBL_TENANT_QUEUE_S)")
    tu.add_argument("--timeout", help="call deadlines: '10s' (every tool), 'answer=90s,search_content=2s', both "
                    "('10s,answer=90s'), or 'default' (KDBL_CALL_TIMEOUT_S)")
    tu.add_argument("--force", action="store_true", help="even for a tenant the operator manages")
    tu.set_defaults(func=on_pool(_update))


def _create(args: argparse.Namespace, db: Pool) -> int:
    from kdbl_control import admin

    tenant = admin.create_tenant(db, args.name, display_name=args.display_name, hybrid=not args.no_hybrid)
    print_rows(args, {"id": str(tenant.id), "name": tenant.name})
    return 0


def _list(args: argparse.Namespace, db: Pool) -> int:
    from kdbl_control import admin

    print_rows(args, admin.list_tenants(db), ["name", "display_name", "sources", "files", "hybrid_enabled",
                                             "managed_by"])
    return 0


def _show(args: argparse.Namespace, db: Pool) -> int:
    from kdbl_control import admin

    print_rows(args, admin.show_tenant(db, args.name))
    return 0


def _update(args: argparse.Namespace, db: Pool) -> int:
    from kdbl_control import admin

    print_rows(args, admin.update_tenant(
        db, args.name, enabled=args.enabled, tools=args.tools, modes=args.modes, rate_limit=args.rate_limit,
        tenant_rate_limit=args.tenant_rate_limit, downloads=args.downloads, max_in_flight=args.max_in_flight,
        queue_ms=args.queue_ms, timeout=args.timeout, force=args.force))
    return 0
