"""OIDC access tokens verified offline against a JWKS file: issuer, audience, expiry, tenant, scopes."""

from __future__ import annotations

import json
import time

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from helpers import make_corpus, running_api
from jwt.algorithms import RSAAlgorithm

from kdbl_core.settings import Settings

ISSUER, AUDIENCE = "https://idp.internal/realms/k", "kdbl-api"


def _key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def keys():
    return {"good": _key(), "rogue": _key()}


@pytest.fixture(scope="module")
def env(owner_url, owner_engine, worker_engine, tmp_path_factory, keys):
    root = tmp_path_factory.mktemp("oidc")
    make_corpus(owner_engine, worker_engine, root / "o-src", {"a.md": "the narwhal migration"}, tenant="oidc-t")
    jwk = json.loads(RSAAlgorithm.to_jwk(keys["good"].public_key()))
    jwks = root / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}))
    settings = Settings(mcp_enabled=True, oidc_issuer=ISSUER, oidc_audience=AUDIENCE, oidc_jwks_file=str(jwks))
    with running_api(owner_url, settings) as url:
        yield url


def token(keys, *, key="good", kid="k1", **overrides):
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "iat": now, "exp": now + 300,
              "kdbl_tenant": "oidc-t", "scope": "openid kdbl.search kdbl.read", "groups": ["eng"]}
    claims.update(overrides)
    claims = {k: v for k, v in claims.items() if v is not None}
    return jwt.encode(claims, keys[key], algorithm="RS256", headers={"kid": kid})


async def _search(url, bearer):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "search_content", "arguments": {"query": "narwhal"}}}
    async with httpx.AsyncClient() as http:
        return await http.post(f"{url}/mcp", json=body, headers={
            "Authorization": f"Bearer {bearer}", "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-11-25"})


async def test_a_valid_oidc_token_searches_its_tenant(env, keys):
    resp = await _search(env, token(keys))
    assert resp.status_code == 200, resp.text
    hits = resp.json()["result"]["structuredContent"]["hits"]
    assert [h["key"] for h in hits] == ["a.md"]


@pytest.mark.parametrize("overrides, status, words", [
    ({"aud": "someone-else"}, 401, "audience"),
    ({"iss": "https://evil.example"}, 401, "issuer"),
    ({"exp": int(time.time()) - 120}, 401, "expired"),
    ({"key": "rogue"}, 401, "signature"),
    ({"kid": "unknown"}, 401, "unknown key"),
    ({"kdbl_tenant": None}, 403, "tenant"),
    ({"kdbl_tenant": "no-such-tenant"}, 403, "unknown tenant"),
    ({"kdbl_role": "cluster-admin"}, 403, "tenant-scoped"),
    ({"scope": "openid kdbl.read"}, 403, "kdbl.search"),
])
async def test_bad_oidc_tokens_are_refused_precisely(env, keys, overrides, status, words):
    key = overrides.pop("key", "good")
    kid = overrides.pop("kid", "k1")
    resp = await _search(env, token(keys, key=key, kid=kid, **overrides))
    assert resp.status_code == status
    assert words in resp.json()["error"]["message"].lower()


async def test_hs256_tokens_signed_with_the_public_key_are_refused(env, keys):
    forged = jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "exp": int(time.time()) + 60,
                         "kdbl_tenant": "oidc-t"}, "s" * 40, algorithm="HS256", headers={"kid": "k1"})
    assert (await _search(env, forged)).status_code == 401


@pytest.mark.parametrize("overrides, claim", [
    ({"sub": "alice\x1fgroup:admins"}, "sub"),
    ({"sub": "ali\x00ce"}, "sub"),
    ({"groups": ["eng\x1fuser:bob"]}, "groups"),
    ({"groups": ["e\x00ng"]}, "groups"),
    ({"groups": [{"name": "eng"}]}, "groups"),
    ({"kdbl_tenant": "oidc-t\x00"}, "kdbl_tenant"),
])
async def test_a_separator_or_nul_in_a_subject_claim_is_a_401_naming_the_claim(env, keys, overrides, claim):
    resp = await _search(env, token(keys, **overrides))
    assert resp.status_code == 401, resp.text
    assert f"claim '{claim}'" in resp.json()["error"]["message"]
    assert 'error="invalid_token"' in resp.headers["www-authenticate"]
