"""`kdbl-control formats`: the file formats the worker reads, from its format table."""

from __future__ import annotations

import argparse
from typing import Any

from kdbl_control.cli_output import print_rows
from kdbl_core.settings import Settings


def add_commands(sub: Any) -> None:
    fm = sub.add_parser("formats", help="the file formats the worker reads, from its format table")
    fm.add_argument("--markdown", action="store_true", help="print README's supported-formats section")
    fm.set_defaults(func=_formats)


def _formats(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control import compose

    if args.markdown:
        print(compose.format_markdown(), end="")
    else:
        print_rows(args, compose.format_rows(), ["label", "extensions", "content_type", "requires"])
    return 0
