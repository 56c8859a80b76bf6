"""Which database the CLI administers: the embedded one in --data-dir, or KDBL_DATABASE_URL."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from kdbl_core.db.embedded_postgres import EmbeddedDatabase
from kdbl_core.errors import ConfigError
from kdbl_core.settings import Settings


@contextlib.contextmanager
def owner_url(settings: Settings, data_dir: Path | None) -> Iterator[str]:
    if data_dir is not None:
        if not (data_dir / "pgdata" / "PG_VERSION").exists():
            raise ConfigError(f"no K-Lake data in {data_dir} (run `kdbl-control up --data-dir {data_dir}` first)")
        # Attaches to the server a running `up` owns (and leaves it running);
        # with no `up`, starts and stops its own.
        db = EmbeddedDatabase(data_dir, lock=False, settings=settings)
        url = db.start()
        try:
            yield url
        finally:
            db.stop()
        return
    if settings.database_url is None:
        raise ConfigError("no database: pass --data-dir DIR or set KDBL_DATABASE_URL")
    yield settings.database_url.get_secret_value()
