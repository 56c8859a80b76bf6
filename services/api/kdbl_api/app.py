"""The API application: /mcp, health, readiness and protected-resource metadata."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from kdbl_api.http_auth import PRM_PATH, McpFrontDoor, public_base
from kdbl_api.server import build_server
from kdbl_core.auth.verifier import PatVerifier
from kdbl_core.db.engine import assert_runtime_role
from kdbl_core.principal import ALL_SCOPES
from kdbl_core.settings import Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings, engine: AsyncEngine) -> Starlette:
    server = build_server(engine, settings)
    manager = StreamableHTTPSessionManager(
        app=server, json_response=True, stateless=True,
        security_settings=TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=list(settings.allowed_hosts),
            allowed_origins=list(settings.allowed_origins)),
        max_request_body_size=settings.max_request_bytes,
    )
    front_door = McpFrontDoor(StreamableHTTPASGIApp(manager), PatVerifier(engine), settings)

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> JSONResponse:
        try:
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception as exc:  # noqa: BLE001 - readiness reports any database failure
            log.warning("database not reachable", extra={"error": type(exc).__name__})
            return JSONResponse({"status": "unavailable", "database": "unreachable"}, status_code=503)
        return JSONResponse({"status": "ok", "database": "ok"})

    async def protected_resource(request: Request) -> JSONResponse:
        base = public_base(request, settings)
        return JSONResponse({
            "resource": f"{base}/mcp",
            "authorization_servers": [],
            "scopes_supported": list(ALL_SCOPES),
            "bearer_methods_supported": ["header"],
            "resource_name": "K-Lake Context Lake MCP",
        }, headers={"Cache-Control": "public, max-age=300"})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await assert_runtime_role(engine, allow_privileged=settings.allow_privileged_db_role)
            async with manager.run():
                yield
        finally:
            await engine.dispose()

    routes = [
        Route("/mcp", front_door, methods=["GET", "POST", "DELETE", "PUT", "PATCH"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route(PRM_PATH, protected_resource, methods=["GET"]),
        Route(PRM_PATH + "/mcp", protected_resource, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
