"""Shared fixtures: one real embedded PostgreSQL 18 (+pgvector) per test session, migrated once.

Each test gets fresh tenants with unique names, so tests do not depend on one another.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from leftover_processes import (  # noqa: F401 - hooks: no process a test starts outlives the session
    pytest_configure, pytest_runtest_setup, pytest_sessionfinish)
from skip_policy import pytest_runtest_makereport  # noqa: F401 - the hook: a skip fails unless opted in
from sqlalchemy import create_engine

from kdbl_core.db.connect import async_pool
from kdbl_core.db.embedded_postgres import EmbeddedDatabase
from kdbl_core.db.urls import for_role, normalise

REPO = Path(__file__).resolve().parents[1]

SHARED = REPO.parent / "shared"


def pg_data_dir(prefix: str) -> Path:
    """A fresh 0700 data dir outside pytest's temp root (which pytest prunes while another session runs)."""
    return Path(tempfile.mkdtemp(prefix=prefix))


@pytest.fixture(scope="session", autouse=True)
def shared_sandboxes() -> Iterator[None]:
    """The extraction sandboxes tests start in this process end with the session, not at interpreter exit
    (after the leftover-process check)."""
    yield
    from kdbl_worker import sandbox

    sandbox.close_shared()


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


def _engine(url: str):
    """A SQLAlchemy engine for a test's own ad-hoc SQL (product code runs on psycopg pools: helpers.db_of)."""
    return create_engine(normalise(url), pool_size=5, max_overflow=5, pool_pre_ping=True)


@pytest.fixture(scope="session")
def owner_engine(owner_url: str):
    engine = _engine(owner_url)
    yield engine
    from helpers import close_pools

    close_pools()  # the psycopg pools product functions got for this database (helpers.db_of)
    engine.dispose()


@pytest.fixture(scope="session")
def worker_engine(owner_url: str):
    engine = _engine(for_role(owner_url, "kdbl_worker"))
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def api_sync_engine(owner_url: str):
    """The API's database role, through a synchronous engine, for direct RLS probes."""
    engine = _engine(for_role(owner_url, "kdbl_api"))
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
async def api_pool(owner_url: str):
    """The API role's AsyncPool (kdbl_core.db.connect), what the search functions' transactions come from:
    `async with rls_transaction(api_pool, principal) as conn`."""
    pool = await async_pool(for_role(owner_url, "kdbl_api"), size=2, name="kdbl-test-api")
    yield pool
    await pool.close()


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


@pytest.fixture(scope="session")
def embedder(embed_model_path):
    """One loaded embedding model for the session (a load costs ~0.5 s and ~90 MB)."""
    from kdbl_core.embedder import Embedder

    model = Embedder(embed_model_path)
    yield model
    model.close()
