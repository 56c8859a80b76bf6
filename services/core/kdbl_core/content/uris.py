"""Stable file URIs: kdbl://file/<url-encoded source_id>/<url-encoded key>.

A container member's key is its parent's key + "!/" + member path (`bundle.zip!/docs/a.md`); its URI
keeps that separator literal, so it reads as the parent's URI + "!/" + the encoded member path
(`kdbl://file/<sid>/bundle.zip!/docs%2Fa.md`). Every other `!` and `/` is encoded as before, and
unquoting gives the key back exactly, whatever it holds.
"""

from __future__ import annotations

import uuid
from urllib.parse import quote, unquote

from kdbl_core.errors import InvalidArgument

PREFIX = "kdbl://file/"
MEMBER_SEP = "!/"  # as kdbl_worker.extract.containers.MEMBER_SEP


def file_uri(source_id: uuid.UUID | str, key: str) -> str:
    encoded = MEMBER_SEP.join(quote(part, safe="") for part in key.split(MEMBER_SEP))
    return f"{PREFIX}{quote(str(source_id), safe='')}/{encoded}"


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
    return source_id, unquote(key)
