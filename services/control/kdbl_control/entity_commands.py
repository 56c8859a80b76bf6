"""`kdbl-control entity ...`: an administrator's corrections to the named entities (issue 31).

`alias` reads one extracted name as another (both keep their type: "Acme Research" as "Acme Corp."), `block`
drops a name everywhere (noise the rules find: a heading word, a product a tenant does not care about),
`rules` lists them, `remove` takes one back. A change makes the worker read every file of the tenant's
entity sources again (the mentions change with it); the answer says how many.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from kdbl_control.cli_database import on_pool
from kdbl_control.cli_output import print_rows
from kdbl_core.content.entities import canonical_key
from kdbl_core.errors import InvalidArgument, NotFound

if TYPE_CHECKING:  # the parser is built for every command: the database driver loads when a rule is set
    from kdbl_core.db.connect import Pool

_TENANT = "SELECT id FROM tenants WHERE name = %s"
_TENANT_HELP = "the tenant's name"
_READ_AGAIN = """
UPDATE files f SET entities_version = NULL FROM sources s
 WHERE s.id = f.source_id AND s.tenant_id = %(t)s AND f.entities_version IS NOT NULL
"""


def add_commands(sub: Any) -> None:
    ent = sub.add_parser("entity", help="an administrator's aliases and blocked names for named entities")
    esub = ent.add_subparsers(dest="action", required=True)
    al = esub.add_parser("alias", help="read one extracted name as another (e.g. a division as its company)")
    al.add_argument("--tenant", required=True, help=_TENANT_HELP)
    al.add_argument("--name", required=True, help="the name as the documents write it")
    al.add_argument("--as", dest="target", required=True, help="the entity's name it stands for")
    al.set_defaults(func=on_pool(_alias))
    bl = esub.add_parser("block", help="drop a name from every file's entities")
    bl.add_argument("--tenant", required=True, help=_TENANT_HELP)
    bl.add_argument("--name", required=True, help="the name as the documents write it")
    bl.set_defaults(func=on_pool(_block))
    rm = esub.add_parser("remove", help="take an alias or a block back")
    rm.add_argument("--tenant", required=True, help=_TENANT_HELP)
    rm.add_argument("--name", required=True, help="the aliased or blocked name")
    rm.set_defaults(func=on_pool(_remove))
    ls = esub.add_parser("rules", help="a tenant's aliases and blocked names")
    ls.add_argument("--tenant", required=True, help=_TENANT_HELP)
    ls.set_defaults(func=on_pool(_rules))


def _tenant(conn: Any, name: str) -> Any:
    row = conn.execute(_TENANT, (name,)).fetchone()
    if row is None:
        raise NotFound(f"no tenant {name}")
    return row.id


def _key(name: str, field: str) -> str:
    key = canonical_key(name)
    if not key:
        raise InvalidArgument(field, "needs letters or digits")
    return key


def set_rule(db: Pool, tenant: str, kind: str, name: str, target: str | None = None) -> dict[str, Any]:
    """Add or replace one rule, and let every entity file of the tenant be read again."""
    key = _key(name, "name")
    target_key = _key(target, "as") if target is not None else None
    if target_key == key:
        raise InvalidArgument("as", "is the same name")
    with db.connection() as conn:
        tenant_id = _tenant(conn, tenant)
        conn.execute("INSERT INTO entity_rules (tenant_id, kind, key, target_key, target_name) VALUES (%s, %s, %s, %s, %s) "
                     "ON CONFLICT (tenant_id, key) DO UPDATE SET kind = EXCLUDED.kind, target_key = EXCLUDED.target_key, "
                     "target_name = EXCLUDED.target_name", (tenant_id, kind, key, target_key, target))
        again = conn.execute(_READ_AGAIN, {"t": tenant_id}).rowcount
    return {"tenant": tenant, "kind": kind, "name": name, "key": key, "as": target, "files_to_read_again": again}


def remove_rule(db: Pool, tenant: str, name: str) -> dict[str, Any]:
    with db.connection() as conn:
        tenant_id = _tenant(conn, tenant)
        gone = conn.execute("DELETE FROM entity_rules WHERE tenant_id = %s AND key = %s",
                            (tenant_id, _key(name, "name"))).rowcount
        if not gone:
            raise NotFound(f"no alias or block for '{name}' in tenant {tenant}")
        again = conn.execute(_READ_AGAIN, {"t": tenant_id}).rowcount
    return {"tenant": tenant, "removed": name, "files_to_read_again": again}


def rules(db: Pool, tenant: str) -> list[dict[str, Any]]:
    from psycopg.rows import dict_row

    with db.connection() as conn:
        tenant_id = _tenant(conn, tenant)
        with conn.cursor(row_factory=dict_row) as cur:
            return cur.execute("SELECT kind, key, target_name AS as_name FROM entity_rules WHERE tenant_id = %s "
                               "ORDER BY kind, key", (tenant_id,)).fetchall()


def _alias(args: argparse.Namespace, db: Pool) -> int:
    print_rows(args, set_rule(db, args.tenant, "alias", args.name, args.target))
    return 0


def _block(args: argparse.Namespace, db: Pool) -> int:
    print_rows(args, set_rule(db, args.tenant, "block", args.name))
    return 0


def _remove(args: argparse.Namespace, db: Pool) -> int:
    print_rows(args, remove_rule(db, args.tenant, args.name))
    return 0


def _rules(args: argparse.Namespace, db: Pool) -> int:
    print_rows(args, rules(db, args.tenant))
    return 0
