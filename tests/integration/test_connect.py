"""The psycopg pools the CLI (and, step by step, the worker and operator) run on (kdbl_core.db.connect)."""

from __future__ import annotations

import time

import numpy as np
import psycopg
import pytest
from pgvector import Vector

from kdbl_core.db.connect import POOL_TIMEOUT_S, sync_pool
from kdbl_core.db.urls import for_role


def test_vectors_travel_through_pgvectors_adapter_in_binary(owner_url) -> None:
    with sync_pool(for_role(owner_url, "kdbl_worker"), size=1) as pool, pool.connection() as conn:
        cur = conn.cursor(binary=True)
        [value] = cur.execute("SELECT %b::vector", (np.array([0.25, -1.0, 3.5], dtype=np.float32),)).fetchone()
        # without the adapter a binary cursor hands back raw bytes and cannot send an ndarray at all
        assert isinstance(value, Vector) and value.to_list() == [0.25, -1.0, 3.5]
        [text] = conn.execute("SELECT %s::vector::text", (Vector([1.0, 2.0]),)).fetchone()
        assert text == "[1,2]"


def test_rows_have_attribute_access_and_a_block_is_one_transaction(owner_url) -> None:
    with sync_pool(owner_url, size=1) as pool:
        with pool.connection() as conn:
            row = conn.execute("SELECT 1 AS one, 'x' AS name").fetchone()
            assert (row.one, row.name) == (1, "x")
        with pytest.raises(psycopg.errors.DivisionByZero), pool.connection() as conn:
            conn.execute("CREATE TEMP TABLE t_connect (v int)")
            conn.execute("SELECT 1 / 0")
        with pool.connection() as conn:  # the failed block was rolled back, not half-kept
            assert conn.execute("SELECT to_regclass('pg_temp.t_connect')").fetchone()[0] is None


def test_an_unreachable_database_fails_at_once_with_its_reason() -> None:
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError, match="127.0.0.1"):
        sync_pool("postgresql://nobody@127.0.0.1:1/none")
    assert time.monotonic() - started < POOL_TIMEOUT_S / 2  # not the pool's wait for a first connection
