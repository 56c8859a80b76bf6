"""Personal access tokens: `kdblpat_<lookup>_<secret>`, shown once, stored only as an argon2id hash.

The lookup id selects one row, so verification is one hash check, never a scan. Admin tokens use
the `kdbladm_` prefix and carry no tenant.

Each token also has a `fingerprint` (HMAC-SHA256 under a fixed domain key, first 16 bytes, ~1 µs):
the verifier refutes a wrong secret with it instead of argon2 (~20 ms), so guessing needs no
per-token failure budget that would lock the genuine holder out. The secret is 256 random bits, so a
fast fingerprint gives an attacker who reads it nothing to brute-force; a server-held key would add
nothing either, since the API role that reads fingerprints would need to read the key too.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from kdbl_core.errors import Unauthenticated

TENANT_PREFIX = "kdblpat_"
ADMIN_PREFIX = "kdbladm_"
_FORMAT = re.compile(r"^(kdblpat_|kdbladm_)([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")

# Tokens are 256-bit random secrets, not passwords: a light argon2id setting (OWASP's
# m=19 MiB, t=2, p=1) is ample and keeps a cold verification near 20 ms.
_HASHER = PasswordHasher(time_cost=2, memory_cost=19456, parallelism=1, hash_len=32, salt_len=16)


@dataclass(frozen=True, slots=True)
class NewToken:
    token: str  # shown once
    lookup_id: str
    hash: str
    fingerprint: bytes


@dataclass(frozen=True, slots=True)
class ParsedToken:
    prefix: str
    lookup_id: str

    @property
    def is_admin(self) -> bool:
        return self.prefix == ADMIN_PREFIX


def generate(*, admin: bool = False) -> NewToken:
    lookup_id = secrets.token_hex(8)
    token = f"{ADMIN_PREFIX if admin else TENANT_PREFIX}{lookup_id}_{secrets.token_urlsafe(32)}"
    return NewToken(token=token, lookup_id=lookup_id, hash=_HASHER.hash(token), fingerprint=fingerprint(token))


_FINGERPRINT_KEY = b"kdbl-token-fingerprint-v1"


def fingerprint(token: str) -> bytes:
    return hmac.new(_FINGERPRINT_KEY, token.encode(), hashlib.sha256).digest()[:16]


def looks_like_pat(token: str) -> bool:
    return token.startswith((TENANT_PREFIX, ADMIN_PREFIX))


def parse(token: str) -> ParsedToken:
    match = _FORMAT.match(token)
    if not match:
        raise Unauthenticated("malformed token")
    return ParsedToken(prefix=match.group(1), lookup_id=match.group(2))


def verify(stored_hash: str, token: str) -> bool:
    """Constant-time argon2id verification (argon2 compares digests in constant time)."""
    try:
        return _HASHER.verify(stored_hash, token)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False
