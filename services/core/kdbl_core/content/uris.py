"""Stable file URIs, kdbl://file/<url-encoded source_id>/<url-encoded key>, and chunk URIs,
kdbl://chunk/<url-encoded source_id>/<url-encoded key>/<seq>.

A container member's key is its parent's key + "!/" + member path (`bundle.zip!/docs/a.md`); its URI
keeps that separator literal, so it reads as the parent's URI + "!/" + the encoded member path
(`kdbl://file/<sid>/bundle.zip!/docs%2Fa.md`). Every other `!` and `/` is encoded as before, and
unquoting gives the key back exactly, whatever it holds.

A chunk's id is built from (source_id, key, seq), not from the chunks row id: a file's chunk rows are
replaced whenever the file is rewritten (a re-index after a touch, a model change), so a row id would
change under an agent that kept it, while (source_id, key, seq) names the same place in an unchanged
file across re-crawls and re-indexes, and can be resolved without a lookup table (get_file_window with
`start` = seq). The id is the chunk URI without its scheme: `<sid>/<encoded key>/<seq>`; the encoded
key holds no bare "/" except the member separator, so the last "/" separates the seq.

Parsing refuses (InvalidArgument on `uri`) what could only fail inside PostgreSQL: a seq past MAX_SEQ
(chunks.seq is an integer: `integer out of range`) and a key holding NUL once unescaped (`%00`: text
cannot store it), so every caller — get_contents, find_similar, resources/read — gets -32602.
"""

from __future__ import annotations

import uuid
from functools import lru_cache
from urllib.parse import quote, unquote

from kdbl_core.errors import InvalidArgument

PREFIX = "kdbl://file/"
CHUNK_PREFIX = "kdbl://chunk/"
MEMBER_SEP = "!/"  # as kdbl_worker.extract.containers.MEMBER_SEP
MAX_SEQ = 2**31 - 1  # chunks.seq is a PostgreSQL integer


# A key up to this long is remembered encoded, the last 4,096 of them: ~1 MB a process for typical keys, at
# most ~17 MB for keys of 256 four-byte characters (each quoted as 12).
_CACHED_KEY_CHARS = 256


def _encoded(source_id: uuid.UUID | str, key: str) -> str:
    """Quoting costs ~2 µs a hit (20 a search) and the same files come back search after search."""
    return _remembered(source_id, key) if len(key) <= _CACHED_KEY_CHARS else _encode(source_id, key)


def _encode(source_id: uuid.UUID | str, key: str) -> str:
    encoded = MEMBER_SEP.join(quote(part, safe="") for part in key.split(MEMBER_SEP))
    return f"{quote(str(source_id), safe='')}/{encoded}"


_remembered = lru_cache(maxsize=4096)(_encode)


def file_uri(source_id: uuid.UUID | str, key: str) -> str:
    return PREFIX + _encoded(source_id, key)


def chunk_id(source_id: uuid.UUID | str, key: str, seq: int) -> str:
    """The stable id of chunk `seq` of a file (module docstring: why not the row id)."""
    return f"{_encoded(source_id, key)}/{seq}"


def chunk_uri(source_id: uuid.UUID | str, key: str, seq: int) -> str:
    return CHUNK_PREFIX + chunk_id(source_id, key, seq)


def parse_chunk_uri(uri: str) -> tuple[uuid.UUID, str, int]:
    """(source_id, key, seq) of a kdbl://chunk/ URI; InvalidArgument naming `uri` when malformed."""
    if not uri.startswith(CHUNK_PREFIX):
        raise InvalidArgument("uri", f"expected {CHUNK_PREFIX}<source_id>/<key>/<seq>")
    rest, sep, seq = uri[len(CHUNK_PREFIX):].rpartition("/")
    if not sep or not seq.isdecimal() or not seq.isascii():
        raise InvalidArgument("uri", f"expected {CHUNK_PREFIX}<source_id>/<key>/<seq>")
    digits = seq.lstrip("0") or "0"  # int() of over 4,300 digits raises ValueError: compare lengths first
    if len(digits) > len(str(MAX_SEQ)) or int(digits) > MAX_SEQ:
        raise InvalidArgument("uri", f"the seq part is past the largest chunk number ({MAX_SEQ})")
    source_id, key = parse_file_uri(PREFIX + rest)
    return source_id, key, int(digits)


def parse_file_uri(uri: str) -> tuple[uuid.UUID, str]:
    if not uri.startswith(PREFIX):
        raise InvalidArgument("uri", f"expected {PREFIX}<source_id>/<key>")
    rest = uri[len(PREFIX):]
    sid, sep, key = rest.partition("/")
    if not sep or not key:
        raise InvalidArgument("uri", f"expected {PREFIX}<source_id>/<key>")
    try:
        source_id = uuid.UUID(unquote(sid))
    except ValueError:
        raise InvalidArgument("uri", "source_id part is not a UUID") from None
    key = unquote(key)
    if "\x00" in key:
        raise InvalidArgument("uri", "the key part holds NUL (%00), which no key can hold")
    return source_id, key
