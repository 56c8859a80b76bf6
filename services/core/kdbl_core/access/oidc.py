"""OIDC access tokens verified offline: signature against a JWKS file, issuer, audience, expiry.

The JWKS comes from a file (a mounted Secret/ConfigMap) and is re-read when the file changes, so key
rotation needs no restart and no request ever calls the identity provider. The tenant comes from a
claim (default `kdbl_tenant`), groups from `groups`, scopes from `scope`/`scp`.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from pathlib import Path

import jwt
from kdbl_core.access.principal import ALL_SCOPES, Principal
from kdbl_core.access.tokens import ADMIN_REJECTED
from kdbl_core.db.async_pool import AsyncPool
from kdbl_core.errors import ConfigError, Forbidden, Unauthenticated

ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
ADMIN_ROLES = {"cluster-admin", "kdbl-cluster-admin"}


def _claim_text(value: object, claim: str) -> str:
    """A subject, group or tenant name as the RLS settings carry it: a non-empty string without control
    characters. The subjects travel to PostgreSQL joined by U+001F, and text cannot hold NUL: a `sub` or
    group with either failed the request inside the database (HTTP 500) instead of refusing the token."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise Unauthenticated(f"invalid token: claim '{claim}' must be a string")
    text = str(value)
    if not text or len(text) > 1024 or any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise Unauthenticated(f"invalid token: claim '{claim}' must be 1-1024 characters, no control characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise Unauthenticated(f"invalid token: claim '{claim}' is not valid Unicode") from None
    return text


class OidcVerifier:
    def __init__(self, pool: AsyncPool, *, issuer: str, audience: str, jwks_file: str,
                 tenant_claim: str = "kdbl_tenant", groups_claim: str = "groups") -> None:
        self._pool = pool
        self.issuer, self.audience = issuer, audience
        self._path = Path(jwks_file)
        self._tenant_claim, self._groups_claim = tenant_claim, groups_claim
        self._lock = threading.Lock()
        self._stamp: tuple[float, int] | None = None
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._tenants: dict[str, uuid.UUID] = {}
        self._load()

    def _load(self) -> None:
        try:
            st = os.stat(self._path)
        except OSError as exc:
            raise ConfigError(f"OIDC JWKS file {self._path} cannot be read: {exc.strerror}") from exc
        stamp = (st.st_mtime, st.st_size)
        with self._lock:
            if stamp == self._stamp:
                return
            try:
                keyset = jwt.PyJWKSet.from_dict(json.loads(self._path.read_text()))
            except (ValueError, jwt.PyJWKSetError) as exc:
                raise ConfigError(f"OIDC JWKS file {self._path} is not a valid JWK set: {exc}") from exc
            self._keys = {key.key_id: key for key in keyset.keys}
            self._stamp = stamp

    def _key_for(self, token: str) -> jwt.PyJWK:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise Unauthenticated("malformed token") from None
        if header.get("alg") not in ALGORITHMS:
            raise Unauthenticated(f"token algorithm {header.get('alg')!r} is not accepted")
        self._load()
        kid = header.get("kid")
        key = self._keys.get(kid) or (next(iter(self._keys.values())) if len(self._keys) == 1 and not kid else None)
        if key is None:
            raise Unauthenticated("token signed by an unknown key")
        return key

    async def verify(self, token: str) -> Principal:
        key = self._key_for(token)
        try:
            claims = jwt.decode(token, key, algorithms=ALGORITHMS, audience=self.audience, issuer=self.issuer,
                                options={"require": ["exp", "iss", "aud", "sub"]}, leeway=30)
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("token expired") from None
        except jwt.InvalidTokenError as exc:
            raise Unauthenticated(f"invalid token: {exc}") from None
        subject = _claim_text(claims["sub"], "sub")
        roles = claims.get("kdbl_role") or claims.get("roles") or []
        roles = {roles} if isinstance(roles, str) else set(roles)
        if roles & ADMIN_ROLES:
            raise Forbidden(ADMIN_REJECTED)
        tenant_name = claims.get(self._tenant_claim)
        if not isinstance(tenant_name, str) or not tenant_name:
            raise Forbidden(f"token carries no '{self._tenant_claim}' claim; MCP tools are tenant-scoped")
        _claim_text(tenant_name, self._tenant_claim)
        tenant_id = await self._tenant_id(tenant_name)
        raw_scopes = claims.get("scope", "")
        scopes = set(raw_scopes.split()) if isinstance(raw_scopes, str) else set()
        scp = claims.get("scp", [])
        scopes |= set(scp.split() if isinstance(scp, str) else scp)
        groups = claims.get(self._groups_claim) or []
        return Principal(
            tenant_id=tenant_id, tenant_name=tenant_name, subject=f"user:{subject}",
            groups=tuple(_claim_text(g, self._groups_claim)
                         for g in (groups if isinstance(groups, list) else [groups])),
            scopes=frozenset(scopes & set(ALL_SCOPES)), token_id=None,
        )

    async def _tenant_id(self, name: str) -> uuid.UUID:
        if name in self._tenants:
            return self._tenants[name]
        rows = await self._pool.fetch("SELECT id FROM kdbl_tenant_by_name(%(n)s)", {"n": name})
        if not rows:
            raise Forbidden(f"unknown tenant '{name}' in token")
        self._tenants[name] = rows[0].id
        return rows[0].id
