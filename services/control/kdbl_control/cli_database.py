"""The database a kdbl-control command administers: --data-dir's embedded one, or KDBL_DATABASE_URL.

Only the commands that need it open it (kdbl_control.target.owner_url), so `--help`, `up`, `eval`, `bench`
and the rest run without one; the database driver is imported when a command opens it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from kdbl_core.settings import Settings

if TYPE_CHECKING:
    from kdbl_core.db.connect import Pool

Handler = Callable[[argparse.Namespace, Settings], int]
"""What `parser.set_defaults(func=...)` holds: run the parsed command, return its exit code."""


@contextlib.contextmanager
def open_pool(args: argparse.Namespace, settings: Settings, *, size: int = 2,
              name: str = "kdbl-control") -> Iterator[Pool]:
    """A pool of `size` owner connections to the administered database, for the command's duration."""
    from kdbl_control.target import owner_url
    from kdbl_core.db.connect import sync_pool

    with owner_url(settings, args.data_dir) as url, sync_pool(url, size=size, name=name) as db:
        yield db


def on_pool(handler: Callable[[argparse.Namespace, Pool], int]) -> Handler:
    """`handler(args, db)` as a command's func: it runs on a 2-connection pool of the administered database."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace, settings: Settings) -> int:
        with open_pool(args, settings) as db:
            return handler(args, db)

    return run
