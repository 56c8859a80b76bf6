"""kdbl-control: the parser and `main`. Errors print one line and exit non-zero.

Each command group is a module that adds its sub-commands and wires each one to its handler with
`set_defaults(func=...)`: up (cli_up), db (cli_db), tenant (cli_tenant), source (cli_source), entity
(entity_commands), crawl (cli_crawl), token (cli_token), grant (cli_grant), mcp (cli_mcp), bench
(bench_commands), eval (cli_eval), formats (cli_formats). `main` parses, loads the settings and exits with
`args.func(args, settings)`; a handler that needs the database opens it (kdbl_control.cli_database).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from kdbl_control import (bench_commands, cli_crawl, cli_db, cli_eval, cli_formats, cli_grant, cli_mcp, cli_source,
                          cli_tenant, cli_token, cli_up, entity_commands)
from kdbl_core.errors import ConfigError, KdblError, Unavailable, exit_line_of
from kdbl_core.settings import load_settings

GROUPS = (cli_up, cli_db, cli_tenant, cli_source, entity_commands, cli_crawl, cli_token, cli_grant, cli_mcp,
          bench_commands, cli_eval, cli_formats)
"""The command groups, in the order `kdbl-control --help` lists them."""


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
    """Every command; each leaf's `func` default is its handler, `func(args, settings)` its exit code."""
    p = _Parser(prog="kdbl-control", description="Administer a K-Lake installation.")
    _add_common(p, top=True)
    sub = p.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_commands(sub)
    for leaf in _leaves(p):
        if leaf is not p:
            _add_common(leaf, top=False)
    return p


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
        sys.exit(args.func(args, settings))
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
