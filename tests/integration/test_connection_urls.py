"""Roles whose password holds URL-reserved characters log in through the URLs kdbl_core.db.urls writes."""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from kdbl_core.db.connect import sync_pool
from kdbl_core.db.urls import for_role, libpq, socket_url

SPECIAL = "p@ss:/w%rd?#&= ü"


def test_a_password_with_reserved_characters_logs_in_through_socket_and_role_urls(owner_url, unique) -> None:
    server = conninfo_to_dict(libpq(owner_url))
    first, second = f"kdbl_url_a_{unique}", f"kdbl_url_b_{unique}"
    with psycopg.connect(libpq(owner_url), autocommit=True) as owner:
        for role in (first, second):  # the same password, as the embedded server's runtime roles share one
            owner.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), SPECIAL))
    try:
        url = socket_url(first, server["dbname"], server["host"], SPECIAL)
        with sync_pool(url, size=1) as pool, pool.connection() as conn:
            assert conn.execute("SELECT current_user AS u").fetchone().u == first
        with sync_pool(for_role(url, second), size=1) as pool, pool.connection() as conn:
            assert conn.execute("SELECT current_user AS u").fetchone().u == second
    finally:
        with psycopg.connect(libpq(owner_url), autocommit=True) as owner:
            for role in (first, second):
                owner.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
