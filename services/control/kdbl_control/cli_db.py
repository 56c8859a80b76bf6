"""`kdbl-control db migrate | compact`: the schema and the keyword tables' upkeep, on the owner URL."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kdbl_core.settings import Settings, named_env


def add_commands(sub: Any) -> None:
    db = sub.add_parser("db", help="database schema").add_subparsers(dest="action", required=True)
    mig = db.add_parser("migrate", help="apply migrations (owner URL); let runtime roles log in")
    mig.add_argument("--api-password-env", default="KDBL_API_DB_PASSWORD",
                     help="environment variable holding the kdbl_api role's password (default KDBL_API_DB_PASSWORD; "
                     "unset: the role logs in without one)")
    mig.add_argument("--worker-password-env", default="KDBL_WORKER_DB_PASSWORD",
                     help="environment variable holding the kdbl_worker role's password "
                     "(default KDBL_WORKER_DB_PASSWORD)")
    mig.set_defaults(func=_migrate)
    compact = db.add_parser("compact", help="after a large crawl or an upgrade: pack every tenant's keyword lists "
                            "again (kdbl_bm25 extension; the packed postings rows are deleted), VACUUM the keyword "
                            "tables and rebuild their B-trees (REINDEX CONCURRENTLY: searches and crawls go on)")
    compact.set_defaults(func=_compact)


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control.target import owner_url
    from kdbl_core.db import migrate

    with owner_url(settings, args.data_dir) as url:
        migrate.upgrade(url)
        migrate.enable_login(url, {"kdbl_api": named_env(args.api_password_env),
                                   "kdbl_worker": named_env(args.worker_password_env)})
        print(f"migrated to revision {migrate.current_revision(url)}")
    return 0


def _compact(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control.target import owner_url
    from kdbl_core.content import bm25_lists
    from kdbl_core.db.compact import compact

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with owner_url(settings, args.data_dir) as url:
        lists = bm25_lists.build_all(url, log=say)  # first: it deletes the postings rows it packs
        report = compact(url, log=say)
        print(json.dumps({"indexes": report, "keyword_lists": lists}, default=str))
    return 0
