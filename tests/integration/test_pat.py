"""PATs: shown once, argon2id-hashed, one-row lookup, expiry and revocation honoured, admin tokens refused."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from helpers import db_of
from kdbl_control import admin
from kdbl_core.access import tokens
from kdbl_core.access.tokens import PatVerifier
from kdbl_core.db import connect
from kdbl_core.db.urls import for_role
from kdbl_core.errors import Forbidden, RateLimited, Unauthenticated


@pytest.fixture
async def verifier(owner_url):
    pool = await connect.async_pool(for_role(owner_url, "kdbl_api"), size=2)
    yield PatVerifier(pool)
    await pool.close()


@pytest.fixture
def tenant(owner_engine, unique):
    return admin.create_tenant(db_of(owner_engine), f"pat-{unique}")


def test_token_format_and_only_a_hash_is_stored(owner_engine, tenant):
    token, row = admin.create_token(db_of(owner_engine), tenant_name=tenant.name, name="ci")
    assert token.startswith("kdblpat_") and len(token) == len("kdblpat_") + 16 + 1 + 43
    with owner_engine.connect() as conn:
        stored = conn.execute(text("SELECT hash, lookup_id FROM tokens WHERE id = :i"), {"i": row.id}).one()
    assert stored.hash.startswith("$argon2id$") and token not in stored.hash
    assert token.split("_")[1] == stored.lookup_id


async def test_valid_token_yields_the_tenant_principal_with_scopes(verifier, owner_engine, tenant):
    token, row = admin.create_token(db_of(owner_engine), tenant_name=tenant.name, name="bot", groups=["eng"],
                                    scopes=["kdbl.search"])
    principal = await verifier.verify(token)
    assert principal.tenant_id == tenant.id and principal.subject == "user:bot"
    assert principal.groups == ("eng",) and principal.scopes == frozenset({"kdbl.search"})
    assert principal.token_id == row.id
    again = await verifier.verify(token)  # second call takes the cached argon2 result
    assert again == principal


async def test_forged_secret_with_a_real_lookup_id_is_rejected(verifier, owner_engine, tenant):
    token, _ = admin.create_token(db_of(owner_engine), tenant_name=tenant.name, name="x")
    await verifier.verify(token)  # warm the cache with the genuine token
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    with pytest.raises(Unauthenticated, match="invalid token"):
        await verifier.verify(forged)


@pytest.mark.parametrize("bad", ["", "Bearer", "kdblpat_nothex_x", "kdblpat_" + "0" * 16 + "_" + "a" * 43])
async def test_malformed_or_unknown_tokens_are_rejected(verifier, bad):
    with pytest.raises(Unauthenticated):
        await verifier.verify(bad)


async def test_expired_token_is_rejected(verifier, owner_engine, tenant):
    token, _ = admin.create_token(db_of(owner_engine), tenant_name=tenant.name, name="old",
                                  expires_at=datetime.now(UTC) - timedelta(seconds=1))
    with pytest.raises(Unauthenticated, match="expired"):
        await verifier.verify(token)


async def test_revocation_takes_effect_immediately_even_when_cached(verifier, owner_engine, tenant):
    token, row = admin.create_token(db_of(owner_engine), tenant_name=tenant.name, name="rev")
    await verifier.verify(token)
    admin.revoke_token(db_of(owner_engine), str(row.id))
    with pytest.raises(Unauthenticated, match="revoked"):
        await verifier.verify(token)


async def test_cluster_admin_token_is_refused_for_mcp(verifier, owner_engine):
    token, _ = admin.create_token(db_of(owner_engine), tenant_name=None, name="root", admin=True)
    assert token.startswith("kdbladm_")
    with pytest.raises(Forbidden, match="tenant-scoped"):
        await verifier.verify(token)


def test_verify_is_a_real_argon2_check():
    new = tokens.generate()
    assert tokens.verify_secret(new.hash, new.token)
    assert not tokens.verify_secret(new.hash, new.token[:-1] + "x")
    assert not tokens.verify_secret("not-a-hash", new.token)


def test_create_tenant_with_exist_ok_returns_a_usable_row(owner_engine, unique):
    first = admin.create_tenant(db_of(owner_engine), f"again-{unique}")
    again = admin.create_tenant(db_of(owner_engine), f"again-{unique}", exist_ok=True)
    assert (again.id, again.name) == (first.id, first.name)


def _forge(token: str, n: int) -> str:
    return token[:-4] + f"{n:04d}"


async def test_wrong_guesses_cost_no_argon2_and_never_lock_out_the_holder_on_a_fresh_process(
        owner_url, owner_engine, tenant, monkeypatch):
    checks = []
    real_verify = tokens.verify_secret
    monkeypatch.setattr(tokens, "verify_secret", lambda h, t: checks.append(t) or real_verify(h, t))
    attacked, fresh = [await connect.async_pool(for_role(owner_url, "kdbl_api"), size=4) for _ in range(2)]
    try:
        token, _ = admin.create_token(db_of(owner_engine), tenant_name=tenant.name, name="flood")
        guesser = PatVerifier(attacked, max_failures=3, failure_window_s=60)
        results = await asyncio.gather(*(guesser.verify(_forge(token, n)) for n in range(50)), return_exceptions=True)
        assert all(isinstance(r, Unauthenticated) and r.message == "invalid token" for r in results)
        assert checks == [], "a wrong secret is refuted by the fingerprint, never by argon2"
        # the genuine holder, on a process that never verified the token, right after the flood
        assert (await PatVerifier(fresh).verify(token)).subject == "user:flood"
        assert (await guesser.verify(token)).subject == "user:flood"  # and on the attacked one too
        assert len(checks) == 2  # one argon2 check per process, for the genuine secret only
    finally:
        await attacked.close()
        await fresh.close()


async def test_a_token_from_before_fingerprints_keeps_the_failure_budget_until_first_verified(
        owner_url, owner_engine, tenant):
    pool = await connect.async_pool(for_role(owner_url, "kdbl_api"), size=2)
    verifier = PatVerifier(pool, max_failures=2, failure_window_s=60)
    try:
        token, row = admin.create_token(db_of(owner_engine), tenant_name=tenant.name, name="legacy")
        with owner_engine.begin() as conn:  # as made before migration 0009
            conn.execute(text("UPDATE tokens SET fingerprint = NULL WHERE id = :id"), {"id": row.id})
        for n in range(2):
            with pytest.raises(Unauthenticated):
                await verifier.verify(_forge(token, n))
        with pytest.raises(RateLimited, match="too many failed attempts"):
            await verifier.verify(_forge(token, 3))  # argon2 work stays bounded for these tokens
        assert (await PatVerifier(pool).verify(token)).subject == "user:legacy"  # another process
        with owner_engine.connect() as conn:
            stored = conn.execute(text("SELECT fingerprint FROM tokens WHERE id = :id"), {"id": row.id}).scalar()
        assert bytes(stored) == tokens.fingerprint(token)  # recorded by the first successful check
        assert (await verifier.verify(token)).subject == "user:legacy"  # the throttled process accepts it now
        fresh = PatVerifier(pool, max_failures=2, failure_window_s=60)
        for n in range(10):
            with pytest.raises(Unauthenticated):
                await fresh.verify(_forge(token, n))
        assert (await fresh.verify(token)).subject == "user:legacy"
    finally:
        await pool.close()
