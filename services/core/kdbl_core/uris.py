"""Stable file URIs: kdbl://file/<url-encoded source_id>/<url-encoded key>."""

from __future__ import annotations

import uuid
from urllib.parse import quote, unquote

from kdbl_core.errors import InvalidArgument

PREFIX = "kdbl://file/"


def file_uri(source_id: uuid.UUID | str, key: str) -> str:
    return f"{PREFIX}{quote(str(source_id), safe='')}/{quote(key, safe='')}"


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
