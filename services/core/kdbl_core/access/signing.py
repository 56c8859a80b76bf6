"""Opaque, tamper-evident pagination cursors and short-lived signed download tokens.

Cursors are `base64url(json) . base64url(hmac-sha256)`, bound to the tenant, the subject and the
listing they page; anything altered, or presented by another principal, is rejected as invalid.
Download tokens are HS256 JWTs (~15 min, or the tenant's link_ttl_seconds) naming the principal,
tenant, source and key, and the PAT that minted them (`tok`), which the download re-checks.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import jwt

from kdbl_core.access.principal import Principal
from kdbl_core.errors import Forbidden, InvalidArgument

DOWNLOAD_AUDIENCE = "kdbl-download"
DOWNLOAD_TTL_SECONDS = 15 * 60


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class CursorCodec:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < 32:
            raise ValueError("cursor secret must be at least 32 bytes")
        self._secret = secret

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._secret, payload, hashlib.sha256).digest()[:16]

    def encode(self, principal: Principal, listing: str, position: dict[str, Any]) -> str:
        payload = json.dumps({"t": str(principal.tenant_id), "u": principal.subject, "l": listing,
                              "p": position}, separators=(",", ":"), sort_keys=True).encode()
        return f"{_b64(payload)}.{_b64(self._mac(payload))}"

    def decode(self, cursor: str, principal: Principal, listing: str, field: str = "cursor") -> dict[str, Any]:
        try:
            body, mac = cursor.split(".")
            payload = _unb64(body)
            valid = hmac.compare_digest(self._mac(payload), _unb64(mac))
        except (ValueError, TypeError):
            valid = False
        if not valid:
            raise InvalidArgument(field, "malformed or tampered cursor (pass back next_cursor unchanged)")
        data = json.loads(payload)
        if data.get("t") != str(principal.tenant_id) or data.get("u") != principal.subject:
            raise InvalidArgument(field, "cursor was issued to another principal")
        if data.get("l") != listing:
            raise InvalidArgument(field, "cursor belongs to another listing")
        return data["p"]


@dataclass(frozen=True, slots=True)
class DownloadClaims:
    tenant_id: uuid.UUID
    tenant_name: str
    subject: str
    groups: tuple[str, ...]
    source_id: uuid.UUID
    key: str
    token_id: uuid.UUID | None = None  # the PAT the link was minted with (None: an OIDC principal)

    def principal(self) -> Principal:
        return Principal(tenant_id=self.tenant_id, tenant_name=self.tenant_name, subject=self.subject,
                         groups=self.groups, scopes=frozenset())


class DownloadSigner:
    def __init__(self, secret: str, ttl_seconds: int = DOWNLOAD_TTL_SECONDS) -> None:
        if len(secret.encode()) < 32:
            raise ValueError("KDBL_DOWNLOAD_SIGNING_SECRET must be at least 32 bytes")
        self._secret = secret
        self._ttl = ttl_seconds

    def sign(self, principal: Principal, source_id: uuid.UUID | str, key: str, *, ttl_seconds: int | None = None) -> str:
        now = int(time.time())
        claims = {
            "aud": DOWNLOAD_AUDIENCE, "iat": now, "exp": now + (ttl_seconds or self._ttl), "sub": principal.subject,
            "tid": str(principal.tenant_id), "tnm": principal.tenant_name, "grp": list(principal.groups),
            "sid": str(source_id), "key": key,
        }
        if principal.token_id is not None:
            claims["tok"] = str(principal.token_id)
        return jwt.encode(claims, self._secret, algorithm="HS256")

    def verify(self, token: str) -> DownloadClaims:
        try:
            claims = jwt.decode(token, self._secret, algorithms=["HS256"], audience=DOWNLOAD_AUDIENCE,
                                options={"require": ["exp", "iat", "sub", "tid", "sid", "key"]})
            return DownloadClaims(uuid.UUID(claims["tid"]), claims.get("tnm", ""), claims["sub"],
                                  tuple(claims.get("grp", [])), uuid.UUID(claims["sid"]), claims["key"],
                                  uuid.UUID(claims["tok"]) if claims.get("tok") else None)
        except jwt.ExpiredSignatureError:
            raise Forbidden("download link expired; search again for a fresh link") from None
        except (jwt.InvalidTokenError, ValueError, KeyError):
            raise Forbidden("invalid download link") from None
