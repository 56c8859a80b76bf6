"""Internal fetch: original bytes of an indexed file, for the API's signed downloads.

Only the worker holds source credentials, so the API asks here. Every request must carry
`Authorization: Bearer $KDBL_INTERNAL_FETCH_TOKEN` (constant-time compare); with no token configured
the endpoint refuses everything. Only files the index knows are served, streamed in 64 KiB chunks.
"""

from __future__ import annotations

import hmac
import logging
import uuid
from collections.abc import Iterator
from typing import BinaryIO

from sqlalchemy import Engine, text
from starlette.applications import Starlette
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kdbl_core.db.engine import tenant_transaction
from kdbl_core.settings import Settings
from kdbl_worker import extract
from kdbl_worker.connectors import connector_for

log = logging.getLogger(__name__)
CHUNK = 64 * 1024


def _chunks(stream: BinaryIO) -> Iterator[bytes]:
    try:
        while block := stream.read(CHUNK):
            yield block
    finally:
        stream.close()


def create_fetch_app(settings: Settings, engine: Engine) -> Starlette:
    secret = settings.internal_fetch_token.get_secret_value().encode() if settings.internal_fetch_token else None

    def _open(source_id: uuid.UUID, key: str) -> tuple[BinaryIO, int, str | None] | None:
        with engine.connect() as conn:
            source = conn.execute(text("SELECT tenant_id, protocol, config FROM sources WHERE id = :s"),
                                  {"s": source_id}).first()
        if source is None:
            return None
        with tenant_transaction(engine, source.tenant_id) as conn:
            known = conn.execute(text("SELECT content_type FROM files WHERE source_id = :s AND key = :k"),
                                 {"s": source_id, "k": key}).first()
        if known is None:
            return None
        try:
            stream = connector_for(source.protocol, source.config).open(key)
        except (FileNotFoundError, IsADirectoryError):
            return None
        stream.seek(0, 2)
        size = stream.tell()
        stream.seek(0)
        return stream, size, known.content_type or extract.detect(key)[0]

    async def files(request: Request) -> Response:
        if secret is None:
            return JSONResponse({"error": "internal fetch is disabled (KDBL_INTERNAL_FETCH_TOKEN is not set)"},
                                status_code=403)
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented.encode(), secret):
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        try:
            source_id = uuid.UUID(request.query_params.get("source_id", ""))
        except ValueError:
            return JSONResponse({"error": "source_id must be a UUID"}, status_code=400)
        key = request.query_params.get("key")
        if not key:
            return JSONResponse({"error": "key is required"}, status_code=400)
        try:
            opened = await run_in_threadpool(_open, source_id, key)
        except OSError as exc:
            log.warning("fetch failed", extra={"source_id": str(source_id), "error": exc.strerror})
            return JSONResponse({"error": "source unavailable"}, status_code=502)
        if opened is None:
            return JSONResponse({"error": "not found"}, status_code=404)
        stream, size, content_type = opened
        return StreamingResponse(iterate_in_threadpool(_chunks(stream)), media_type=content_type or
                                 "application/octet-stream", headers={"Content-Length": str(size)})

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/internal/files", files, methods=["GET"]),
                             Route("/healthz", healthz, methods=["GET"])])
