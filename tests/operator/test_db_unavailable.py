"""The operator's database pool: it starts without a database, and a reconcile that cannot reach one
fails as a TemporaryError (kopf retries it) instead of crashing the operator."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from kdbl_core.errors import TemporaryError
from kdbl_operator import handlers, reconcile


def test_the_operator_pool_opens_without_a_database_and_a_reconcile_then_fails_as_temporary(tmp_path: Path):
    # a socket folder where no server listens: every connection attempt is refused at once
    pool = handlers._pool(f"postgresql://kdbl@/kdbl?host={tmp_path}", 2)  # no connection made: no error
    pool.timeout = 0.3  # the reconcile's wait for a connection (10 s in the operator)
    try:
        with pytest.raises(TemporaryError, match="database unavailable"):
            reconcile.active_bootstrap_tokens(pool, uuid.uuid4())
    finally:
        pool.close()
