"""`kdbl-control source add | update | list | files`: sources, their configs, labels and permissions.

`source_config` turns `source add`'s options into the stored sources.config (kdbl_core.sources.build):
connection details and a credentials *reference* only, never a secret.
"""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kdbl_control.cli_database import on_pool
from kdbl_control.cli_output import print_report, print_rows
from kdbl_core.access.share_acl import PERMISSION_MODES
from kdbl_core.errors import ConfigError
from kdbl_core.sources.config import PERMISSION_CHECKS

if TYPE_CHECKING:
    from kdbl_core.db.connect import Pool


def add_commands(sub: Any) -> None:
    source = sub.add_parser("source", help="sources: register, change and list them, and what their crawls made "
                            "of each file").add_subparsers(dest="action", required=True)
    _add_add(source)
    _add_update(source)
    sl = source.add_parser("list", help="every source with its files and its latest crawl run")
    sl.add_argument("--tenant", help="only this tenant's sources")
    sl.set_defaults(func=on_pool(_list))
    sf = source.add_parser("files", help="what the crawl made of each file: statuses and grouped reasons")
    sf_scope = sf.add_mutually_exclusive_group()
    sf_scope.add_argument("--tenant", help="only this tenant's files")
    sf_scope.add_argument("--source", type=uuid.UUID, help="only this source's files (its id)")
    sf.add_argument("--status", choices=["ok", "partial", "failed", "skipped", "pending"],
                    help="list the files with this status instead of the summary")
    sf.set_defaults(func=on_pool(_files))


def _add_add(source: Any) -> None:
    sa = source.add_parser("add", help="register a source (prints its id)")
    sa.add_argument("--tenant", required=True, help="the tenant whose source it is")
    sa.add_argument("--protocol", default="fs", choices=["fs", "s3", "smb", "webdav", "http"],
                    help="how its files are read (default fs: a local or mounted folder)")
    sa.add_argument("--path", help="fs: root folder; smb: folder inside the share")
    sa.add_argument("--bucket", help="s3: bucket")
    sa.add_argument("--prefix", help="s3: key prefix (a folder)")
    sa.add_argument("--endpoint", help="s3: custom endpoint URL (MinIO, Ceph RGW)")
    sa.add_argument("--region", help="s3: region (default us-east-1)")
    sa.add_argument("--path-style", action=argparse.BooleanOptionalAction, default=None, help="s3: path-style URLs")
    sa.add_argument("--url", help="webdav/http: base collection URL")
    sa.add_argument("--server", help="smb: file server host")
    sa.add_argument("--share", help="smb: share name")
    sa.add_argument("--port", type=int, help="smb: port (default 445)")
    sa.add_argument("--domain", help="smb: NTLM domain")
    sa.add_argument("--credentials-env", metavar="NAME=VAR,...",
                    help="credentials from environment variables the worker has (names, never values)")
    sa.add_argument("--credentials-dir", help="credentials from a mounted Secret directory (one file per name)")
    sa.add_argument("--anonymous", action="store_true", help="s3: unsigned requests")
    sa.add_argument("--no-verify-tls", action="store_true",
                    help="s3/webdav/http: accept any TLS certificate the server shows (tests; not for production)")
    sa.add_argument("--ca-file", help="s3/webdav/http: a CA bundle (PEM) to verify the server's certificate with")
    sa.add_argument("--include", action="append", help="glob of keys to index (repeatable)")
    sa.add_argument("--exclude", action="append", help="glob of keys to skip (repeatable)")
    sa.add_argument("--no-ocr", action="store_true",
                    help="leave images and PDF pages without a text layer unread (OCR costs CPU)")
    sa.add_argument("--follow-symlinks", action="store_true",
                    help="fs: follow symbolic links that stay inside the root (default: none; a link out of the "
                         "root is never followed)")
    sa.add_argument("--label", action="append", help="a label every file of the source gets (repeatable)")
    sa.add_argument("--label-glob", action="append", metavar="GLOB=LABEL[,LABEL]",
                    help="labels for the keys a glob matches (repeatable)")
    sa.add_argument("--schedule", help="crawl schedule, e.g. '@every 15m', '@hourly'")
    sa.add_argument("--name", help="the source's name in its tenant (default: the folder, bucket, share or the "
                    "URL's last segment)")
    sa.add_argument("--restricted", action="store_true", help="only granted principals see it "
                    "(the same as --permissions grants)")
    sa.add_argument("--permissions", choices=list(PERMISSION_MODES),
                    help="who reads its files: the whole tenant (default), granted principals, or whoever the "
                    "share's own permissions allow (fs: POSIX bits and ACLs; smb: NTFS access lists)")
    sa.add_argument("--permission-map", type=Path, metavar="FILE",
                    help="from-source: a JSON object mapping 'uid:N', 'gid:N' and SIDs to 'user:NAME', "
                    "'group:NAME' or '*' (unmapped ids are looked up on the crawling host, else kept numeric)")
    sa.add_argument("--permission-checks", choices=list(PERMISSION_CHECKS),
                    help="smb from-source: read each file's security descriptor at every crawl (default), or only "
                    "when its change time moved and all of them once a day (Windows servers; not Samba)")
    sa.add_argument("--entities", action="store_true", help="read the named entities of its chunks (people, "
                    "organisations, places, products, events, dates, money) behind the crawl")
    sa.add_argument("--no-hybrid", action="store_true",
                    help="no embeddings for its chunks: its files are found by lexical search")
    sa.add_argument("--force", action="store_true", help="even in a tenant the operator manages")
    sa.set_defaults(func=on_pool(_add))


def _add_update(source: Any) -> None:
    su = source.add_parser("update", help="change a source's labels (its files are relabelled at once)")
    su.add_argument("--source", type=uuid.UUID, required=True, help="the source's id (see source list)")
    su.add_argument("--label", action="append", help="a label every file gets (repeatable; replaces the list)")
    su.add_argument("--label-glob", action="append", metavar="GLOB=LABEL[,LABEL]",
                    help="labels for the keys a glob matches (repeatable; replaces the globs)")
    su.add_argument("--no-labels", action="store_true", help="remove the source's labels and label globs")
    su.add_argument("--object-tags", action=argparse.BooleanOptionalAction, default=None,
                    help="s3: object tags become labels (reaches a file at its next re-index)")
    su.add_argument("--permissions", choices=list(PERMISSION_MODES),
                    help="who reads its files (see source add); from-source applies from the next crawl")
    su.add_argument("--permission-map", type=Path, metavar="FILE",
                    help="from-source: replace the id / SID map (a JSON object; see source add)")
    su.add_argument("--permission-checks", choices=list(PERMISSION_CHECKS),
                    help="smb from-source: when descriptors are read again (see source add)")
    su.add_argument("--entities", action=argparse.BooleanOptionalAction, default=None,
                    help="read its named entities (on: every file is read behind the crawl; off: they are gone at once)")
    su.add_argument("--force", action="store_true", help="even for a source the operator manages")
    su.set_defaults(func=on_pool(_update))


def _add(args: argparse.Namespace, db: Pool) -> int:
    from kdbl_control import admin

    source = admin.add_source(db, args.tenant, protocol=args.protocol, config=source_config(args),
                              name=args.name, restricted=args.restricted, hybrid=not args.no_hybrid,
                              schedule=source_schedule(args), force=args.force, permissions=args.permissions,
                              permission_map=_permission_map_file(args.permission_map))
    print(source.id)
    return 0


def _changes_permissions(args: argparse.Namespace) -> bool:
    return bool(args.permissions or args.permission_map or args.permission_checks)


def _changes_labels(args: argparse.Namespace) -> bool:
    """Labels are what `source update` changes when no permission or entity option is given."""
    asked = args.label or args.label_glob or args.no_labels or args.object_tags is not None
    return bool(asked or not (_changes_permissions(args) or args.entities is not None))


def _update(args: argparse.Namespace, db: Pool) -> int:
    from kdbl_control import admin

    if _changes_permissions(args):
        if args.permissions is None:
            raise ConfigError("--permission-map and --permission-checks go with --permissions from-source")
        print_rows(args, admin.set_source_permissions(db, args.source, args.permissions,
                                                      permission_map=_permission_map_file(args.permission_map),
                                                      checks=args.permission_checks, force=args.force))
    if args.entities is not None:
        print_rows(args, admin.set_source_entities(db, args.source, args.entities, force=args.force))
    if _changes_labels(args):
        globs = label_globs(args)
        print_rows(args, admin.update_source_labels(
            db, args.source, labels=[] if args.no_labels else args.label,
            label_globs={} if args.no_labels else (globs or None), object_tags=args.object_tags,
            force=args.force))
    return 0


def _list(args: argparse.Namespace, db: Pool) -> int:
    from kdbl_control import admin

    print_rows(args, admin.list_sources(db, args.tenant), ["id", "tenant", "name", "protocol", "enabled",
                                                           "acl_mode", "files", "last_indexed_at", "last_run"])
    return 0


def _files(args: argparse.Namespace, db: Pool) -> int:
    from kdbl_control import file_report

    if args.status:
        print_rows(args, file_report.listing(db, status=args.status, source_id=args.source, tenant=args.tenant),
                   ["key", "status", "reason", "content_type", "size", "chunks"])
    else:
        print_report(args, file_report.summary(db, source_id=args.source, tenant=args.tenant), file_report.render)
    return 0


def source_config(args: argparse.Namespace) -> dict[str, Any]:
    """The sources.config for `source add` (kdbl_core.sources.build: the schema the operator and the
    connectors use): connection details and a credentials *reference* only. Validates --schedule too."""
    from kdbl_core import sources

    if args.schedule is not None:
        sources.parse_schedule(args.schedule)  # ScheduleError: an InvalidArgument naming 'schedule'
    credentials = _credentials(args)
    return sources.build(args.protocol, **_connection(args), credentials=credentials,
                         verify_tls=not args.no_verify_tls, ca_file=args.ca_file, include=args.include,
                         exclude=args.exclude, ocr=not args.no_ocr, labels=args.label,
                         label_globs=label_globs(args) or None, follow_symlinks=args.follow_symlinks,
                         permission_checks=args.permission_checks, entities=args.entities or None).stored


def _credentials(args: argparse.Namespace) -> dict[str, Any] | None:
    """--credentials-env, --credentials-dir or --anonymous as the config's `credentials` (a reference)."""
    from kdbl_core.errors import InvalidArgument

    credentials: dict[str, Any] | None = None
    if args.credentials_env:
        pairs = [item.split("=", 1) for item in args.credentials_env.split(",") if item]
        if any(len(p) != 2 or not p[0] or not p[1] for p in pairs):
            raise InvalidArgument("credentials-env", "use NAME=ENV_VAR[,NAME=ENV_VAR...]")
        credentials = {"env": dict(pairs)}
    elif args.credentials_dir:
        credentials = {"dir": args.credentials_dir}
    if args.anonymous:
        if credentials is not None:
            raise InvalidArgument("anonymous", "--anonymous cannot be combined with a credentials reference")
        credentials = {"anonymous": True}  # the form the s3 schema reads
    return credentials


def _connection(args: argparse.Namespace) -> dict[str, Any]:
    """The protocol's connection fields of the config."""
    from kdbl_core.errors import InvalidArgument

    if args.protocol == "fs":
        if not args.path:
            raise InvalidArgument("path", "--path is required for protocol fs")
        return {"root": str(Path(args.path).expanduser().resolve())}
    if args.protocol == "s3":
        return {"bucket": args.bucket, "prefix": args.prefix, "endpoint_url": args.endpoint,
                "region": args.region, "path_style": args.path_style}
    if args.protocol == "smb":
        return {"server": args.server, "share": args.share, "path": args.path, "port": args.port,
                "domain": args.domain}
    return {"url": args.url}


def _permission_map_file(path: Path | None) -> dict[str, str] | None:
    """`--permission-map FILE`: a JSON object of strings (kdbl_core.access.share_acl.PrincipalMap)."""
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"--permission-map {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"--permission-map {path} is not JSON ({exc}): want an object such as "
                          '{"uid:1000": "user:alice", "gid:100": "group:staff"}') from exc
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise ConfigError(f"--permission-map {path}: want a JSON object of strings, e.g. "
                          '{"uid:1000": "user:alice", "gid:100": "group:staff", "S-1-5-21-1-2-3-1104": "user:bob"}')
    return data


def label_globs(args: argparse.Namespace) -> dict[str, list[str]]:
    """--label-glob GLOB=LABEL[,LABEL...] options as the stored `label_globs` (a glob given twice: one entry)."""
    from kdbl_core.errors import InvalidArgument

    out: dict[str, list[str]] = {}
    for spec in args.label_glob or ():
        glob, _, labels = spec.partition("=")
        if not glob or not labels:
            raise InvalidArgument("label-glob", "use GLOB=LABEL[,LABEL...]")
        out.setdefault(glob, []).extend(label.strip() for label in labels.split(","))
    return out


def source_schedule(args: argparse.Namespace) -> str | None:
    """The `sources.schedule` for `source add`: the normalised text the operator stores for the same
    schedule; None (no --schedule) stores NULL, the default."""
    from kdbl_core.sources import parse_schedule

    return None if args.schedule is None else parse_schedule(args.schedule).text
