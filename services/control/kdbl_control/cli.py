"""kdbl-control: argument parsing and dispatch. Errors print one line and exit non-zero."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

from kdbl_control import entity_commands
from kdbl_core.access.principal import ALL_SCOPES
from kdbl_core.access.share_acl import PERMISSION_MODES
from kdbl_core.sources.config import PERMISSION_CHECKS
from kdbl_core.errors import ConfigError, KdblError, Unavailable, exit_line_of
from kdbl_core.settings import Settings, load_settings, named_env

_DURATION = re.compile(r"^(\d+)([hdw])$")


def parse_expiry(value: str) -> datetime:
    match = _DURATION.match(value)
    if match:
        amount, unit = int(match.group(1)), match.group(2)
        delta = {"h": timedelta(hours=amount), "d": timedelta(days=amount), "w": timedelta(weeks=amount)}[unit]
        return datetime.now(UTC) + delta
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError("use a duration (12h, 30d, 4w) or an ISO 8601 timestamp") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _bool_arg(value: str) -> bool:
    if value.lower() in ("true", "yes", "1", "on"):
        return True
    if value.lower() in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def parse_time(value: str) -> datetime:
    """An ISO time (UTC when no zone is given) or an age before now: 30s, 15m, 2h, 7d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if value[:-1].isdigit() and value[-1:] in units:
        return datetime.now(UTC) - timedelta(seconds=int(value[:-1]) * units[value[-1]])
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO time or an age like 15m, got {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _add_common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """Global options, accepted before or after the sub-command (`up --data-dir D` and `--data-dir D up`)."""
    default = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    parser.add_argument("--data-dir", type=Path, default=default(None),
                        help="embedded database directory (`up`: default .kdbl in the current directory; "
                             "other commands: default KDBL_DATABASE_URL)")
    parser.add_argument("--api-url", default=default(None), help="K-Lake API base URL, for `mcp smoke` and `mcp stdio`")
    parser.add_argument("--api-token", default=default(None),
                        help="a tenant PAT, for `mcp smoke` (visible in ps: prefer --api-token-file)")
    parser.add_argument("--api-token-file", type=Path, default=default(None),
                        help="file holding the PAT, for `mcp smoke` (default: KDBL_API_TOKEN_FILE)")
    parser.add_argument("--json", action="store_true", default=default(False), help="machine-readable output")


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    return [leaf for a in subs for child in a.choices.values() for leaf in _leaves(child)]


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one `kdbl-control: ...` line (exit 2) like every other fault."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("kdbl-control").strip()
        where = f"{command}: " if command else ""
        self.exit(2, f"kdbl-control: {where}{message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kdbl-control", description="Administer a K-Lake installation.")
    _add_common(p, top=True)
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run everything locally: embedded Postgres, crawl, MCP on localhost")
    up.add_argument("folders", nargs="*", type=Path, help="folders to index (default: the repo's docs/)")
    up.add_argument("--port", type=int, default=8080, help="port to serve MCP on (default 8080)")
    up.add_argument("--host", default="127.0.0.1",
                    help="address to serve on (default 127.0.0.1; 0.0.0.0 serves every interface and admits "
                         "this machine's names and addresses as Host headers; KDBL_ALLOWED_HOSTS adds more)")
    up.add_argument("--legacy-sse", action="store_true",
                    help="also serve the 2024-11-05 HTTP+SSE transport (GET /sse, POST /messages) for clients "
                         "that speak only it (KDBL_LEGACY_SSE_ENABLED)")

    db = sub.add_parser("db", help="database schema").add_subparsers(dest="action", required=True)
    mig = db.add_parser("migrate", help="apply migrations (owner URL); let runtime roles log in")
    mig.add_argument("--api-password-env", default="KDBL_API_DB_PASSWORD")
    mig.add_argument("--worker-password-env", default="KDBL_WORKER_DB_PASSWORD")
    db.add_parser("compact", help="after a large crawl or an upgrade: pack every tenant's keyword lists "
                  "again (kdbl_bm25 extension; the packed postings rows are deleted), VACUUM the keyword tables "
                  "and rebuild their B-trees (REINDEX CONCURRENTLY: searches and crawls go on)")

    tenant = sub.add_parser("tenant").add_subparsers(dest="action", required=True)
    tc = tenant.add_parser("create")
    tc.add_argument("name")
    tc.add_argument("--display-name")
    tc.add_argument("--no-hybrid", action="store_true")
    tenant.add_parser("list")
    tshow = tenant.add_parser("show", help="the tenant's effective policy")
    tshow.add_argument("name")
    tu = tenant.add_parser("update", help="change the tenant's policy (running APIs apply it within ~2 s)")
    tu.add_argument("name")
    tu.add_argument("--enabled", type=_bool_arg, help="true|false: false refuses every token of the tenant")
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

    source = sub.add_parser("source").add_subparsers(dest="action", required=True)
    sa = source.add_parser("add", help="register a source (prints its id)")
    sa.add_argument("--tenant", required=True)
    sa.add_argument("--protocol", default="fs", choices=["fs", "s3", "smb", "webdav", "http"])
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
    sa.add_argument("--no-verify-tls", action="store_true")
    sa.add_argument("--ca-file")
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
    sa.add_argument("--name")
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
    sa.add_argument("--no-hybrid", action="store_true")
    sa.add_argument("--force", action="store_true", help="even in a tenant the operator manages")
    su = source.add_parser("update", help="change a source's labels (its files are relabelled at once)")
    su.add_argument("--source", type=uuid.UUID, required=True)
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
    entity_commands.add_parser(sub)
    sl = source.add_parser("list")
    sl.add_argument("--tenant")
    sf = source.add_parser("files", help="what the crawl made of each file: statuses and grouped reasons")
    sf_scope = sf.add_mutually_exclusive_group()
    sf_scope.add_argument("--tenant")
    sf_scope.add_argument("--source", type=uuid.UUID)
    sf.add_argument("--status", choices=["ok", "partial", "failed", "skipped", "pending"],
                    help="list the files with this status instead of the summary")

    crawl = sub.add_parser("crawl", help="index sources now (blocks until done)")
    group = crawl.add_mutually_exclusive_group()
    group.add_argument("--tenant")
    group.add_argument("--source", type=uuid.UUID)
    crawl.add_argument("--queue", action="store_true", help="queue runs for the kdbl-worker replicas")
    crawl.add_argument("--no-wait", action="store_true", help="with --queue: print run ids and return")
    crawl.add_argument("--timeout", type=float, help="with --queue: stop waiting after SECONDS")

    token = sub.add_parser("token").add_subparsers(dest="action", required=True)
    tk = token.add_parser("create", help="mint a PAT (printed once)")
    tk.add_argument("--tenant")
    tk.add_argument("--admin", action="store_true", help="cluster-admin token (MCP rejects it)")
    tk.add_argument("--name", default="cli")
    tk.add_argument("--scope", action="append", choices=list(ALL_SCOPES))
    tk.add_argument("--principal", help="user name the token acts as (default: the token name)")
    tk.add_argument("--group", action="append", default=[])
    tk.add_argument("--expires", type=parse_expiry, help="12h, 30d, 4w or an ISO timestamp")
    tl = token.add_parser("list")
    tl.add_argument("--tenant")
    tr = token.add_parser("revoke")
    tr.add_argument("token", help="token id, lookup id, or the token itself")
    tr.add_argument("--force", action="store_true", help="even an operator-managed token")

    grant = sub.add_parser("grant", help="per-source / per-file access for a user or group")
    gsub = grant.add_subparsers(dest="action", required=True)
    ga = gsub.add_parser("add")
    ga.add_argument("--source", type=uuid.UUID, required=True)
    ga.add_argument("--key", help="one file (default: the whole source)")
    who = ga.add_mutually_exclusive_group(required=True)
    who.add_argument("--user")
    who.add_argument("--group")
    ga.add_argument("--force", action="store_true", help="even on an operator-managed source")
    gl = gsub.add_parser("list")
    gl.add_argument("--source", type=uuid.UUID)
    gr = gsub.add_parser("revoke")
    gr.add_argument("id", type=int)
    gr.add_argument("--force", action="store_true", help="even an operator-managed grant")
    ge = gsub.add_parser("explain", help="whether a principal may read a file, and which grant or share "
                         "permission decides it")
    ge.add_argument("--source", type=uuid.UUID, required=True)
    ge.add_argument("--file", required=True, help="the file's key in the source")
    ge.add_argument("--principal", required=True,
                    help="user:NAME (an OIDC subject or a token's principal), or NAME")
    ge.add_argument("--group", action="append", default=[], help="a group claim of the principal (repeatable)")
    gm = gsub.add_parser("restrict", help="make a source visible only to granted principals")
    gm.add_argument("--source", type=uuid.UUID, required=True)
    gm.add_argument("--open", action="store_true", help="the reverse: visible to the whole tenant")
    gm.add_argument("--force", action="store_true")

    mcp = sub.add_parser("mcp").add_subparsers(dest="action", required=True)
    sm = mcp.add_parser("smoke", help="initialize → tools/list → tools/call against --api-url")
    sm.add_argument("--query", default="search")
    ms = mcp.add_parser("stdio", help="a stdio MCP server for desktop clients, forwarding to --api-url's POST /mcp")
    ms.add_argument("--token-file", type=Path,
                    help="file holding the PAT (else KDBL_API_TOKEN_FILE, else the KDBL_API_TOKEN variable)")
    au = mcp.add_parser("audit", help="recent MCP calls")
    au.add_argument("--tool")
    au.add_argument("--tenant")
    au.add_argument("--status", choices=["ok", "error", "denied", "rate_limited", "timeout", "unauthenticated"])
    au.add_argument("--principal", help="user:NAME, group:NAME or NAME")
    au.add_argument("--since", type=parse_time, help="ISO time (e.g. 2026-01-31T12:00Z) or an age: 15m, 2h, 1d")
    au.add_argument("--until", type=parse_time, help="same forms as --since")
    au.add_argument("--request-id", help="one call's id (its X-Request-Id response header, meta.request_id)")
    au.add_argument("--limit", type=int, default=50)
    bench = sub.add_parser("bench", help="benchmarks (numbers for docs/benchmarks.md)")
    bsub = bench.add_subparsers(dest="action", required=True)
    bs = bsub.add_parser("search", help="search_content latency via HTTP vs the SQL floor, and throughput")
    bs.add_argument("--dataset", type=Path, default=Path(__file__).resolve().parents[3].parent / "shared" / "data"
                    / "scifact", help="BEIR folder (corpus.jsonl, queries.jsonl)")
    bs.add_argument("--clients", type=int, default=16)
    bs.add_argument("--seconds", type=float, default=20.0)
    bs.add_argument("--queries", type=int, default=300)
    bs.add_argument("--work-dir", type=Path, help="where documents and the embedded database go")
    bs.add_argument("--mode", choices=["lexical", "hybrid"], default="lexical",
                    help="search mode measured (hybrid needs an embedding model: --model or KDBL_EMBED_MODEL_PATH)")
    bs.add_argument("--model", type=Path, help="GGUF embedding model for --mode hybrid (default: the cached one)")
    bs.add_argument("--response-modes", action="store_true",
                    help="instead: each response_mode's latency, bytes and tokens per 10 hits (1 client, limit 10); "
                    "--dataset may then be any folder of documents")
    bs.add_argument("--cache", action="store_true",
                    help="instead: the result cache through HTTP: miss and hit p50/p95 and a replayed agent "
                    "session's hit rate (lexical, limit 10, --queries queries; default 300 -> use ~100)")
    bs.add_argument("--queries-file", type=Path, help="with --response-modes on a plain folder: one query per line "
                    "(default: its Markdown headings)")
    sc = bsub.add_parser("scale", help="lexical and hybrid latency on a synthetic corpus at growing sizes, the "
                         "keyword arm beside exhaustive BM25 (top-10 agreement), bytes per chunk, load rates")
    sc.add_argument("--dataset", type=Path, default=bs.get_default("dataset"),
                    help="BEIR folder whose token distribution and queries are used")
    sc.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated chunk counts")
    sc.add_argument("--queries", type=int, default=200)
    sc.add_argument("--clients", type=int, default=1, help="also measure N concurrent clients when > 1")
    sc.add_argument("--seconds", type=float, default=10.0)
    sc.add_argument("--model", type=Path, help="GGUF embedding model (default: the cached one)")
    sc.add_argument("--work-dir", type=Path, help="where the embedded database goes (default: /tmp/kdbl-scale)")
    sc.add_argument("--lexical-only", action="store_true",
                    help="chunks without vectors, no HNSW, lexical search alone (e.g. the 10M run)")
    sc.add_argument("--writers", type=int, help="connections writing the load at once "
                    "(default: KDBL_WRITE_CONNECTIONS, as the worker)")
    sc.add_argument("--no-lists-build", action="store_true",
                    help="search the keyword lists as the writers packed them (no full build after the load)")
    sc.add_argument("--exhaustive-queries", type=int, help="the exhaustive reference on the first N queries "
                    "only (default: all; at 10M chunks each takes seconds)")
    ve = bsub.add_parser("vectors", help="the vector arm on a bench scale tenant (--data-dir): HNSW size, "
                         "ef_search vs recall, iterative scans under RLS, halfvec / binary quantisation")
    ve.add_argument("--dataset", type=Path, default=bs.get_default("dataset"),
                    help="BEIR folder whose queries are embedded as query vectors")
    ve.add_argument("--queries", type=int, default=100, help="dataset queries (embedded by the model)")
    ve.add_argument("--random-queries", type=int, default=50, help="random unit query vectors too")
    ve.add_argument("--tenant", default="bench-scale", help="the tenant bench scale wrote")
    ve.add_argument("--no-quantisation", action="store_true", help="skip the halfvec / binary indexes (built, "
                    "measured and dropped: minutes at 1M chunks)")
    ve.add_argument("--model", type=Path, help="GGUF embedding model (default: the cached one)")
    bp = bsub.add_parser("permissions", help="what permissions from the share cost: crawl and re-crawl files/s, "
                         "a permission change's delay, keyword search under RLS, tenant vs from-source (root)")
    bp.add_argument("--files", type=int, default=1000, help="generated files (default 1,000)")
    bp.add_argument("--queries", type=int, default=100, help="searches per mode")
    bp.add_argument("--work-dir", type=Path, help="where the folder and the embedded database go")
    be = bsub.add_parser("entities", help="the entity extractor: precision and recall on labelled sentences, "
                         "and chunks a second over a folder of text")
    be.add_argument("--labeled", type=Path, default=Path("tests/data/entities/labeled.jsonl"),
                    help="JSON lines of {id, text, entities: [[start, end, TYPE], ...]}")
    be.add_argument("--text-dir", type=Path, help="a folder of Markdown / text / HTML to time extraction on "
                    "(default: the labelled sentences)")
    bg = bsub.add_parser("entity-graph", help="the entity graph at scale: the worker's entity stage against the "
                         "crawl, the graph's bytes a chunk, find_entity p50 / p95 per response mode")
    bg.add_argument("--files", type=int, default=1000, help="generated files (default 1,000)")
    bg.add_argument("--chunks", type=int, default=10, help="chunks of ~900 characters a file (default 10)")
    bg.add_argument("--queries", type=int, default=100, help="find_entity calls per response mode")
    bg.add_argument("--work-dir", type=Path, help="where the folder and the embedded database go")
    br = bsub.add_parser("replica", help="searches reading on a hot standby of the embedded database beside the "
                         "same searches on the primary, the standby's lag during a bulk crawl, WAL bytes a chunk")
    br.add_argument("--dataset", type=Path, default=bs.get_default("dataset"), help="BEIR folder to crawl and query")
    br.add_argument("--clients", type=int, default=16, help="concurrent clients of the throughput run")
    br.add_argument("--seconds", type=float, default=20.0, help="length of each throughput run")
    br.add_argument("--queries", type=int, default=300, help="queries of the 1-client run")
    br.add_argument("--work-dir", type=Path, help="where the documents, the database and its standby go")
    bm = bsub.add_parser("smb-permissions", help="what reading NT ACLs costs a listing of a real SMB share: "
                         "files/s and messages a file with and without descriptors, and with unchanged change times")
    bm.add_argument("--server", required=True, help="file server host")
    bm.add_argument("--share", required=True, help="share name")
    bm.add_argument("--path", default="", help="a folder in the share (default: its root)")
    bm.add_argument("--port", type=int, default=445)
    bm.add_argument("--credentials-env", required=True, metavar="username=VAR,password=VAR",
                    help="the environment variables holding the account's name and password")
    bm.add_argument("--runs", type=int, default=3, help="listings per mode (the median is reported)")
    si = bsub.add_parser("similar", help="find_similar's recall@10 on SciFact's multi-citation claims (vector, "
                         "lexical MLT, exact dense reference) and its latency")
    si.add_argument("--dataset", type=Path, default=bs.get_default("dataset"), help="BEIR folder with qrels")
    si.add_argument("--split", default="train", help="qrels split whose claims cite several documents")
    si.add_argument("--model", type=Path, help="GGUF embedding model (default: the cached one)")
    si.add_argument("--work-dir", type=Path, help="where documents and the embedded database go")
    si.add_argument("--terms", default="25", help="KDBL_SIMILAR_TERMS values for the lexical method, e.g. 12,25,40")
    an = bsub.add_parser("answer", help="the answer tool: extractive latency on a SciFact-like slice, and with "
                         "--chat-model abstractive tokens/s")
    an.add_argument("--dataset", type=Path, default=bs.get_default("dataset"), help="BEIR folder with qrels")
    an.add_argument("--split", default="train", help="qrels split the questions (claims) come from")
    an.add_argument("--queries", type=int, default=30, help="questions (claims with judged abstracts)")
    an.add_argument("--docs", type=int, default=1000, help="abstracts beside the judged ones")
    an.add_argument("--chat-model", type=Path, help="GGUF chat model: also measure abstractive answers")
    an.add_argument("--max-tokens", type=int, default=128, help="abstractive max_tokens")
    an.add_argument("--work-dir", type=Path, help="where documents and the embedded database go")
    fa = bsub.add_parser("fairness", help="a quiet tenant's search p95 alone and beside a noisy tenant's heavy "
                         "calls (long searches, answers, find_similar; goal <= 2x)")
    fa.add_argument("--dataset", type=Path, default=bs.get_default("dataset"), help="BEIR folder (both tenants)")
    fa.add_argument("--seconds", type=float, default=20.0, help="each phase's length")
    fa.add_argument("--noisy-clients", type=int, default=8, help="the noisy tenant's concurrent clients")
    fa.add_argument("--queries", type=int, default=100, help="distinct queries each side cycles through")
    fa.add_argument("--noisy-max-in-flight", type=int, help="the noisy tenant's concurrency (default: the "
                    "installation's); a large value, with KDBL_DB_POOL_SIZE raised, shows it without fair share")
    fa.add_argument("--chat-model", type=Path, help="GGUF chat model: the noisy answers are abstractive")
    fa.add_argument("--work-dir", type=Path, help="where documents and the embedded database go")
    ev = sub.add_parser("eval", help="retrieval quality on a BEIR folder (nDCG, recall, MRR, latency), or on a "
                        "folder of long documents with --questions (right file and page: hit@k, MRR)")
    ev.add_argument("dataset", type=Path, help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv; "
                    "with --questions, the folder of documents they ask about")
    ev.add_argument("--questions", type=Path, help="JSON lines of {id, question, file, pages, kind} (e.g. "
                    "docs/eval/longdocs/questions.jsonl; a manifest.json beside it pins the documents)")
    ev.add_argument("--embedded-share", type=float, action="append", metavar="S",
                    help="with --questions: also run hybrid with only this share (0-1) of the chunks embedded, "
                    "as while the worker is still embedding (repeatable)")
    ev.add_argument("--unanswerable", type=Path, help="with --questions: JSON lines of {id, question} the documents "
                    "do not answer (e.g. docs/eval/longdocs/unanswerable.jsonl); the answer tool is judged on both")
    ev.add_argument("--split", default="train", help="qrels/<split>.tsv to score against (default: train)")
    ev.add_argument("--mode", action="append", choices=["lexical", "semantic", "hybrid"],
                    help="repeatable; default: all three (semantic and hybrid need an embedding model)")
    ev.add_argument("--max-queries", type=int, help="only the first N judged queries")
    ev.add_argument("--model", type=Path, help="GGUF embedding model (default: KDBL_EMBED_MODEL_PATH, else the "
                    "cached default model if present)")
    ev.add_argument("--work-dir", type=Path, help="documents and embedded database (default: /tmp/kdbl-eval)")
    ev.add_argument("--limit", type=int, help="search_content limit, chunks per query (1-100; default 100 for a "
                    "BEIR folder, 10 with --questions)")
    ev.add_argument("--no-references", action="store_true", help="skip the bm25s and exact dense references")
    ev.add_argument("--plot", type=Path, help="also write a PNG bar chart (needs matplotlib installed)")
    fm = sub.add_parser("formats", help="the file formats the worker reads, from its format table")
    fm.add_argument("--markdown", action="store_true", help="print README's supported-formats section")
    for leaf in _leaves(p):
        if leaf is not p:
            _add_common(leaf, top=False)
    return p


def _print(args: argparse.Namespace, rows: Any, columns: list[str] | None = None) -> None:
    if args.json:
        print(json.dumps(rows, default=str, indent=2))
        return
    if isinstance(rows, dict):
        for key, value in rows.items():
            print(f"{key}: {value}")
        return
    if not rows:
        print("(none)")
        return
    columns = columns or list(rows[0].keys())
    widths = {c: min(60, max(len(c), *(len(str(r.get(c, ""))) for r in rows))) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row.get(c, ""))[:60].ljust(widths[c]) for c in columns))


def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.command == "up":
        from kdbl_control.up import run_up

        if args.legacy_sse:
            settings = settings.model_copy(update={"legacy_sse_enabled": True})
        return run_up(args.folders, (args.data_dir or Path(".kdbl")).resolve(), args.port, args.host, settings)
    if args.command == "mcp" and args.action == "stdio":  # stdout is the protocol's: JSON logs on stderr only
        from kdbl_control import stdio_bridge
        from kdbl_core import logging_setup

        logging_setup.configure(settings.log_level, "json")
        return stdio_bridge.serve(args.api_url, args.token_file or args.api_token_file, settings,
                                  token_in_argv=args.api_token is not None)
    if args.command == "mcp" and args.action == "smoke":
        from kdbl_control.smoke import read_token, run_smoke

        token = args.api_token or read_token(args.api_token_file or settings.api_token_file)
        if not args.api_url or not token:
            raise ConfigError("mcp smoke needs --api-url URL and --api-token-file PATH (or --api-token PAT)")
        report = asyncio.run(run_smoke(args.api_url, token, args.query))
        _print(args, report)
        return 0

    if args.command == "formats":
        from kdbl_control import compose

        if args.markdown:
            print(compose.format_markdown(), end="")
        else:
            _print(args, compose.format_rows(), ["label", "extensions", "content_type", "requires"])
        return 0
    if args.command == "bench":
        from kdbl_control.bench_commands import run_bench

        return run_bench(args, settings)
    if args.command == "eval":
        if args.questions is not None:
            from kdbl_control.eval_docs import cli_eval_docs

            return cli_eval_docs(args, settings)
        from kdbl_control.evaluate import cli_eval

        return cli_eval(args, settings)

    from kdbl_control import admin
    from kdbl_control.target import owner_url
    from kdbl_core.db.connect import sync_pool

    with owner_url(settings, args.data_dir) as url:
        if args.command == "db" and args.action == "compact":
            from kdbl_core.db.compact import compact

            from kdbl_core.content import bm25_lists

            def say(line: str) -> None:
                print(line, file=sys.stderr, flush=True)

            lists = bm25_lists.build_all(url, log=say)  # first: it deletes the postings rows it packs
            report = compact(url, log=say)
            print(json.dumps({"indexes": report, "keyword_lists": lists}, default=str))
            return 0
        if args.command == "db":
            from kdbl_core.db import migrate

            migrate.upgrade(url)
            migrate.enable_login(url, {"kdbl_api": named_env(args.api_password_env),
                                       "kdbl_worker": named_env(args.worker_password_env)})
            print(f"migrated to revision {migrate.current_revision(url)}")
            return 0
        if args.command == "crawl":  # the queue loop, heartbeat, deadline watchdog, writers' bookkeeping
            with sync_pool(url, size=6, name="kdbl-control-crawl") as crawl_db:
                return _crawl(args, settings, crawl_db)
        with sync_pool(url, size=2, name="kdbl-control") as db:
            return _dispatch(args, settings, db, admin)


def source_config(args: argparse.Namespace) -> dict[str, Any]:
    """The sources.config for `source add` (kdbl_core.sources.build: the schema the operator and the
    connectors use): connection details and a credentials *reference* only. Validates --schedule too."""
    from kdbl_core import sources
    from kdbl_core.errors import InvalidArgument

    if args.schedule is not None:
        sources.parse_schedule(args.schedule)  # ScheduleError: an InvalidArgument naming 'schedule'
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
    if args.protocol == "fs":
        if not args.path:
            raise InvalidArgument("path", "--path is required for protocol fs")
        connection: dict[str, Any] = {"root": str(Path(args.path).expanduser().resolve())}
    elif args.protocol == "s3":
        connection = {"bucket": args.bucket, "prefix": args.prefix, "endpoint_url": args.endpoint,
                      "region": args.region, "path_style": args.path_style}
    elif args.protocol == "smb":
        connection = {"server": args.server, "share": args.share, "path": args.path, "port": args.port,
                      "domain": args.domain}
    else:
        connection = {"url": args.url}
    return sources.build(args.protocol, **connection, credentials=credentials,
                         verify_tls=not args.no_verify_tls, ca_file=args.ca_file, include=args.include,
                         exclude=args.exclude, ocr=not args.no_ocr, labels=args.label,
                         label_globs=label_globs(args) or None, follow_symlinks=args.follow_symlinks,
                         permission_checks=args.permission_checks, entities=args.entities or None).stored


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


def _crawl(args: argparse.Namespace, settings: Settings, db: Any) -> int:
    from kdbl_control import compose

    sources = compose.load_sources(db, tenant=args.tenant, source_id=args.source)
    if not sources:
        raise ConfigError("no matching source")
    from kdbl_control.progress import queue_progress
    from kdbl_control.signals import stop_on_signals

    if args.queue:
        ids = compose.enqueue(db, [s.id for s in sources])
        print(" ".join(map(str, ids)), flush=True)  # at once: a script may read them while this waits
        if args.no_wait:
            return 0
        try:
            with stop_on_signals() as stop:
                statuses = compose.wait_for(db, ids, timeout_s=args.timeout, poll_s=1.0, stop=stop,
                                            on_progress=queue_progress(settings.progress_interval_s))
        except TimeoutError as exc:
            print(f"kdbl-control: {exc}", file=sys.stderr)
            return 3
        if stop.is_set():
            print("kdbl-control: stopped waiting; the runs go on in the workers", file=sys.stderr)
            return stop.exit_code
        for st in statuses.values():
            print(f"run {st.id} (source {st.source_id}): {st.state}, {st.listed} listed, {st.indexed} indexed, "
                  f"{st.unchanged} unchanged, {st.deleted} deleted, {st.failed} failed"
                  + (f": {st.last_error}" if st.last_error else ""), file=sys.stderr)
        return 1 if any(st.state == "failed" for st in statuses.values()) else 0
    from kdbl_control.progress import crawl_with_progress

    indexer = compose.indexer(db, settings)
    try:
        with stop_on_signals() as stop:
            for source in sources:
                if crawl_with_progress(indexer, source, stop=stop).stopped:
                    print("kdbl-control: crawl stopped; run it again to go on", file=sys.stderr)
                    return stop.exit_code
            from kdbl_control.progress import entity_progress

            read = compose.extract_entities(db, stop=stop, progress=entity_progress(settings.progress_interval_s))
            if read:
                print(f"kdbl-control: named entities read from {read} files", file=sys.stderr)
    finally:
        indexer.close()
    return 0


def _dispatch(args: argparse.Namespace, settings: Settings, db: Any, admin: Any) -> int:
    cmd, action = args.command, getattr(args, "action", None)
    if cmd == "tenant" and action == "create":
        tenant = admin.create_tenant(db, args.name, display_name=args.display_name, hybrid=not args.no_hybrid)
        _print(args, {"id": str(tenant.id), "name": tenant.name})
    elif cmd == "tenant" and action == "show":
        _print(args, admin.show_tenant(db, args.name))
    elif cmd == "tenant" and action == "update":
        _print(args, admin.update_tenant(
            db, args.name, enabled=args.enabled, tools=args.tools, modes=args.modes, rate_limit=args.rate_limit,
            tenant_rate_limit=args.tenant_rate_limit, downloads=args.downloads, max_in_flight=args.max_in_flight,
            queue_ms=args.queue_ms, timeout=args.timeout, force=args.force))
    elif cmd == "tenant":
        _print(args, admin.list_tenants(db), ["name", "display_name", "sources", "files", "hybrid_enabled",
                                              "managed_by"])
    elif cmd == "source" and action == "add":
        source = admin.add_source(db, args.tenant, protocol=args.protocol, config=source_config(args),
                              name=args.name, restricted=args.restricted, hybrid=not args.no_hybrid,
                              schedule=source_schedule(args), force=args.force, permissions=args.permissions,
                              permission_map=_permission_map_file(args.permission_map))
        print(source.id)
    elif cmd == "source" and action == "update":
        if args.permissions or args.permission_map or args.permission_checks:
            if args.permissions is None:
                raise ConfigError("--permission-map and --permission-checks go with --permissions from-source")
            _print(args, admin.set_source_permissions(db, args.source, args.permissions,
                                                      permission_map=_permission_map_file(args.permission_map),
                                                      checks=args.permission_checks, force=args.force))
        if args.entities is not None:
            _print(args, admin.set_source_entities(db, args.source, args.entities, force=args.force))
        if args.label or args.label_glob or args.no_labels or args.object_tags is not None \
                or not (args.permissions or args.permission_map or args.permission_checks or args.entities is not None):
            globs = label_globs(args)
            _print(args, admin.update_source_labels(
                db, args.source, labels=[] if args.no_labels else args.label,
                label_globs={} if args.no_labels else (globs or None), object_tags=args.object_tags,
                force=args.force))
    elif cmd == "entity":
        _print(args, entity_commands.run(args, db))
    elif cmd == "source" and action == "files":
        from kdbl_control import file_report

        if args.status:
            _print(args, file_report.listing(db, status=args.status, source_id=args.source, tenant=args.tenant),
                   ["key", "status", "reason", "content_type", "size", "chunks"])
        else:
            report = file_report.summary(db, source_id=args.source, tenant=args.tenant)
            print(json.dumps(report, indent=2, default=str) if args.json else file_report.render(report))
    elif cmd == "source":
        _print(args, admin.list_sources(db, args.tenant), ["id", "tenant", "name", "protocol", "enabled",
                                                           "acl_mode", "files", "last_indexed_at", "last_run"])
    elif cmd == "token" and action == "create":
        if args.admin == bool(args.tenant):
            raise ConfigError("token create needs exactly one of --tenant NAME or --admin")
        token, row = admin.create_token(
            db, tenant_name=args.tenant, name=args.name, scopes=args.scope,
            subject=f"user:{args.principal}" if args.principal else None, groups=args.group,
            expires_at=args.expires, admin=args.admin)
        print(token)
        print(f"(token id {row.id}; shown once — store it now)", file=sys.stderr)
    elif cmd == "token" and action == "list":
        _print(args, admin.list_tokens(db, args.tenant), ["id", "tenant", "name", "subject", "scopes",
                                                          "expires_at", "revoked_at"])
    elif cmd == "token":
        admin.revoke_token(db, args.token, force=args.force)
        print("revoked")
    elif cmd == "grant" and action == "add":
        subject = f"user:{args.user}" if args.user else f"group:{args.group}"
        grant = admin.add_grant(db, source_id=args.source, subject=subject, file_key=args.key, force=args.force)
        print(grant.id)
    elif cmd == "grant" and action == "list":
        _print(args, admin.list_grants(db, args.source))
    elif cmd == "grant" and action == "explain":
        from kdbl_control import grant_explain

        report = grant_explain.explain(db, args.source, args.file, args.principal, args.group)
        print(json.dumps(report, indent=2, default=str) if args.json else grant_explain.render(report))
        return 0 if report["readable"] else 1
    elif cmd == "grant" and action == "revoke":
        admin.revoke_grant(db, args.id, force=args.force)
        print("revoked")
    elif cmd == "grant":
        admin.set_source_acl(db, args.source, restricted=not args.open, force=args.force)
        print("open to the tenant" if args.open else "restricted to granted principals")
    elif cmd == "mcp" and action == "audit":
        _print(args, admin.audit_rows(db, tool=args.tool, tenant_name=args.tenant, status=args.status,
                                  principal=args.principal, since=args.since, until=args.until,
                                  request_id=args.request_id, limit=args.limit),
               ["ts", "request_id", "principal", "tool", "status", "row_count", "source_ids", "duration_ms",
                "client_ip", "error", "arguments"])
    return 0


def _fault(exc: Exception) -> KdblError | None:
    """A third-party exception that is a known configuration or environment fault, as a KdblError (so it
    prints one line, not a traceback); None for anything else (a bug: the traceback is wanted)."""
    import psycopg

    # psycopg's OperationalError (server down, refused, bad password), raised directly or as the cause of
    # a wrapper's error; a URL that cannot be used is a ConfigError already (kdbl_core.db.urls).
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, psycopg.OperationalError):
        cause = cause.__cause__
    if cause is not None:
        reason = str(cause).strip().splitlines()
        return Unavailable(f"the database cannot be reached: {reason[0] if reason else type(cause).__name__}")
    if isinstance(exc, OSError) and exc.strerror:
        return KdblError(f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror)
    return None


def _fail(exc: KdblError) -> NoReturn:
    line, code = exit_line_of(exc, "kdbl-control")
    print(line, file=sys.stderr)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Every fault ends the CLI as one `kdbl-control: <message>` line and its error class's exit code."""
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
    except KdblError as exc:
        _fail(exc)
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError: one line naming each bad variable
        _fail(ConfigError.of_settings(exc))
    try:
        sys.exit(_run(args, settings))
    except KdblError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        known = _fault(exc)
        if known is None:
            raise
        _fail(known)


if __name__ == "__main__":
    main()
