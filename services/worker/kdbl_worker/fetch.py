"""Internal fetch: original bytes of an indexed file, for the API's signed downloads.

Only the worker holds source credentials, so the API asks here. Every request must carry
`Authorization: Bearer $KDBL_INTERNAL_FETCH_TOKEN` (constant-time compare); with no token configured
the endpoint refuses everything. Only files the index knows are served, streamed in 64 KiB chunks.
The stored key is not trusted to still name what was indexed: each request opens it through the
source's connector, whose open re-checks containment at the open itself (a key that has since become a
symbolic link out of an fs root, a redirect off a WebDAV base, a reparse point: kdbl_worker.connectors),
and such a refusal is answered 404 like a file that is gone.

A container member (`bundle.zip!/docs/a.md`, a row with parent_id: migration 0010) is read from its
listed file, the only one the connector can open, one level at a time (`containers.read_member`); the
nested containers on the way are the member rows whose key followed by "!/" starts the requested key.
A member is at most KDBL_CONTAINER_MAX_MEMBER_BYTES (larger ones were never indexed), held in memory.
"""

from __future__ import annotations

import hmac
import logging
import uuid
from collections.abc import Iterator
from io import BytesIO
from typing import BinaryIO

from starlette.applications import Starlette
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kdbl_core.access.principal import tenant_transaction

from kdbl_core.db.connect import Pool
from kdbl_core.errors import (
    Forbidden, InvalidArgument, KdblError, NotFound, Unauthenticated, UpstreamError, http_response_of,
)
from kdbl_core.settings import Settings
from kdbl_worker import extract
from kdbl_worker.connectors import OutsideSource, connector_for
from kdbl_worker.extract import containers

log = logging.getLogger(__name__)
CHUNK = 64 * 1024


def _refuse(exc: KdblError) -> Response:
    """An error answered with its class's HTTP status and `{"error": message, **data}` (kdbl_core.errors)."""
    return http_response_of(exc).response()


def _chunks(stream: BinaryIO) -> Iterator[bytes]:
    try:
        while block := stream.read(CHUNK):
            yield block
    finally:
        stream.close()


def _member(stream: BinaryIO, chain: list[str], bounds: containers.Bounds) -> bytes | None:
    """The bytes of the last key of `chain` (a listed file, the containers within it, the member), read
    level by level from the listed file's stream; None when a level no longer holds the next."""
    data: bytes | None = None
    for container, member in zip(chain, chain[1:], strict=False):
        source = stream if data is None else BytesIO(data)
        try:
            path = member[len(container) + len(containers.MEMBER_SEP):]
            data = containers.read_member(container, source, path, bounds)
        except NotFound:  # the file changed since it was indexed
            return None
        except Exception as exc:  # noqa: BLE001 - a container that cannot be read: the source's problem
            raise OSError(f"member unreadable: {type(exc).__name__}") from exc
    return data


def create_fetch_app(settings: Settings, pool: Pool) -> Starlette:
    secret = settings.internal_fetch_token.get_secret_value().encode() if settings.internal_fetch_token else None
    bounds = containers.Bounds(max_member_bytes=settings.container_max_member_bytes)  # as the crawl refused

    def _open(source_id: uuid.UUID, key: str) -> tuple[BinaryIO, int, str | None] | None:
        with pool.connection() as conn:
            source = conn.execute("SELECT tenant_id, protocol, config FROM sources WHERE id = %s",
                                  (source_id,)).fetchone()
        if source is None:
            return None
        with tenant_transaction(pool, source.tenant_id) as conn:
            known = conn.execute(
                "SELECT f.content_type, p.key AS top FROM files f LEFT JOIN files p ON p.id = f.parent_id "
                "WHERE f.source_id = %(s)s AND f.key = %(k)s", {"s": source_id, "k": key}).fetchone()
            chain = [] if known is None or known.top is None else [row.key for row in conn.execute(
                "SELECT key FROM files WHERE parent_id = (SELECT id FROM files WHERE source_id = %(s)s "
                "AND key = %(t)s AND parent_id IS NULL) AND starts_with(%(k)s, key || '!/') ORDER BY length(key)",
                {"s": source_id, "t": known.top, "k": key})]
        if known is None:
            return None
        content_type = known.content_type or extract.detect(key)[0]
        try:
            stream = connector_for(source.protocol, source.config).open(known.top or key)
        except (FileNotFoundError, IsADirectoryError):
            return None
        except OutsideSource as exc:
            log.warning("fetch refused a file outside its source",
                        extra={"source_id": str(source_id), "reason": exc.strerror})
            return None
        if known.top is not None:
            with stream:
                data = _member(stream, [known.top, *chain, key], bounds)
            return (None if data is None else BytesIO(data)), len(data or b""), content_type
        stream.seek(0, 2)
        size = stream.tell()
        stream.seek(0)
        return stream, size, content_type

    async def files(request: Request) -> Response:
        if secret is None:
            return _refuse(Forbidden("internal fetch is disabled (KDBL_INTERNAL_FETCH_TOKEN is not set)"))
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented.encode(), secret):
            return _refuse(Unauthenticated("unauthorized"))
        try:
            source_id = uuid.UUID(request.query_params.get("source_id", ""))
        except ValueError:
            return _refuse(InvalidArgument("source_id", "must be a UUID"))
        key = request.query_params.get("key")
        if not key:
            return _refuse(InvalidArgument("key", "is required"))
        try:
            opened = await run_in_threadpool(_open, source_id, key)
        except OSError as exc:
            log.warning("fetch failed", extra={"source_id": str(source_id), "error": exc.strerror})
            return _refuse(UpstreamError("source unavailable"))
        if opened is None or opened[0] is None:
            return _refuse(NotFound("not found"))
        stream, size, content_type = opened
        return StreamingResponse(iterate_in_threadpool(_chunks(stream)), media_type=content_type or
                                 "application/octet-stream", headers={"Content-Length": str(size)})

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/internal/files", files, methods=["GET"]),
                             Route("/healthz", healthz, methods=["GET"])])
