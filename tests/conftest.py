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
from skip_policy import pytest_runtest_makereport  # noqa: F401 - the hook: a skip fails unless opted in

from kdbl_core.db.embedded import EmbeddedDatabase
from kdbl_core.db.engine import sync_engine
from kdbl_core.db.urls import for_role

REPO = Path(__file__).resolve().parents[1]

SHARED = REPO.parent / "shared"


def pg_data_dir(prefix: str) -> Path:
    """A fresh 0700 data dir outside pytest's temp root (which pytest prunes while another session runs)."""
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
    from helpers import close_pools

    close_pools()  # the psycopg pools product functions got for this database (helpers.db_of)
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


@pytest.fixture(scope="session")
def embedder(embed_model_path):
    """One loaded embedding model for the session (a load costs ~0.5 s and ~90 MB)."""
    from kdbl_core.embed import Embedder

    model = Embedder(embed_model_path)
    yield model
    model.close()
