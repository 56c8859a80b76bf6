"""The API application: /mcp, downloads, capacity, metrics, health and protected-resource metadata.

Exposure (issue 13 item 12): /mcp, downloads and /capacity need a valid token — /capacity shows the
caller's tenant only (its embedding progress, its rate limits). /metrics is not on the API port: it is
served on KDBL_METRICS_PORT for the cluster's Prometheus (no tenant data in any metric), which the
chart's NetworkPolicy opens to the monitoring namespace only. /healthz, /readyz and the protected-
resource metadata stay open (probes and OAuth discovery need them; they reveal no data).
While the database is unreachable every request that needs it gets 503 with `Retry-After` at once
(kdbl_core.errors.Unavailable, raised by the request path's pool), and /readyz says so.
Everything the app reads or writes goes through one psycopg pool (kdbl_core.db.async_pool.AsyncPool,
`settings.db_pool_size` connections, opened in the lifespan): tool calls, token and OIDC tenant
lookups, policies, rate limits, downloads, audit rows, readiness, /capacity and the start-up checks —
unless KDBL_DATABASE_READ_URL names a read replica: then MCP calls read there (kdbl_api.read_route) and
everything else stays on the primary.
"""

from __future__ import annotations

import contextlib

from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
from mcp.server.lowlevel import Server

from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from kdbl_api.bearer import SdkTokenVerifier
from kdbl_api.downloads import Downloads
from kdbl_api.fair_share import FairShare
from kdbl_api.front_door import PRM_PATH, McpFrontDoor
from kdbl_api.front_door.single_exchange import SingleExchange
from kdbl_api.host_hint import HostHint
from kdbl_api.legacy_sse import MESSAGES_PATH, SSE_PATH, LegacySse
from kdbl_api.observability import MetricsPort
from kdbl_api.ratelimit import RateLimiter
from kdbl_api import routes
from kdbl_api.read_route import ReadRoute
from kdbl_api.routes import ApiParts
from kdbl_api.server import AppState, build_server
from kdbl_api.tools.context import Services
from kdbl_core.access.oidc import OidcVerifier
from kdbl_core.access.policy import Policies
from kdbl_core.access.tokens import BearerVerifier, PatVerifier
from kdbl_core.content import reads
from kdbl_core.db import connect
from kdbl_core.db.async_pool import AsyncPool
from kdbl_core.chat import ChatModel
from kdbl_core.embedder import Embedder
from kdbl_core.errors import TemporaryError, http_response_of, jsonrpc_response_of
from kdbl_core.access.signing import CursorCodec
from kdbl_core.search.cache import ResultCache
from kdbl_core.settings import Settings


# POST /mcp answers compressed when the client accepts gzip (the MCP SDKs' HTTP clients do: httpx, undici)
# and the body is worth it; event streams (a streamed answer, the legacy SSE bridge) pass unbuffered.
# Level 1 (issue 33): a default 20-hit search's 94 KB of JSON compresses to 29 KB in 0.69 ms of CPU; level 4
# took 1.16 ms for 26 KB — more than a search's keyword arm, for 13% fewer bytes on what is mostly an in-cluster
# hop (level 4 on 37 KB -> 6.8 KB took 0.24 ms, 520 KB -> 149 KB 8.7 ms; 6: 2.2x level 4's CPU). Bodies over
# 128 KiB are compressed off the event loop (Starlette).
GZIP_MIN_BYTES = 4096
GZIP_LEVEL = 1

ROUTES = [  # kdbl_api.routes: module-level handlers over the app's ApiParts
    Route("/capacity", routes.capacity, methods=["GET"]),
    Route("/healthz", routes.healthz, methods=["GET"]),
    Route("/readyz", routes.readyz, methods=["GET"]),
    Route(PRM_PATH, routes.protected_resource, methods=["GET"]),
    Route(PRM_PATH + "/mcp", routes.protected_resource, methods=["GET"]),
]


def unavailable(request: Request, exc: Exception) -> Response:
    """A TemporaryError that escaped a handler (the database is down: 503 + Retry-After), rendered from
    its class: JSON-RPC shaped on /mcp, plain JSON elsewhere."""
    assert isinstance(exc, TemporaryError)
    rendered = jsonrpc_response_of(exc) if request.url.path == "/mcp" else http_response_of(exc)
    return rendered.response()


def _oidc(settings: Settings, pool: AsyncPool) -> OidcVerifier | None:
    if not settings.oidc_jwks_file:
        return None
    if not (settings.oidc_issuer and settings.oidc_audience):
        from kdbl_core.errors import ConfigError

        raise ConfigError("KDBL_OIDC_JWKS_FILE needs KDBL_OIDC_ISSUER and KDBL_OIDC_AUDIENCE too")
    return OidcVerifier(pool, issuer=settings.oidc_issuer, audience=settings.oidc_audience,
                        jwks_file=settings.oidc_jwks_file, tenant_claim=settings.oidc_tenant_claim,
                        groups_claim=settings.oidc_groups_claim)


def load_embedder(settings: Settings) -> Embedder | None:
    """The query embedder, when a model is configured (a configured but unusable model is an error)."""
    if not settings.embed_model_path:
        return None
    return Embedder(settings.embed_model_path, n_threads=settings.embed_threads,
                    max_tokens=settings.embed_max_tokens, query_cache_size=settings.query_cache_size,
                    gpu_layers=settings.embed_gpu_layers)


def load_chat_model(settings: Settings) -> ChatModel | None:
    """The answer tool's chat model, when one is configured (a configured but unusable model is an error)."""
    if not settings.chat_model_path:
        return None
    return ChatModel(settings.chat_model_path, n_ctx=settings.chat_ctx, n_threads=settings.chat_threads)


def _security(settings: Settings) -> TransportSecuritySettings:
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=list(settings.allowed_hosts),
                                     allowed_origins=list(settings.allowed_origins))


def _session_manager(server: Server[Any], settings: Settings, json_response: bool) -> StreamableHTTPSessionManager:
    return StreamableHTTPSessionManager(app=server, json_response=json_response, stateless=True,
                                        security_settings=_security(settings),
                                        max_request_body_size=settings.max_request_bytes)


def _pools(settings: Settings, database_url: str, read_url: str | None) -> tuple[AsyncPool, AsyncPool | None]:
    """The primary's pool (opened by the lifespan) and the read replica's, if any (opened at its first call).
    Every statement is bounded, also outside a call's own deadline (the front door's token, policy and rate
    limit lookups, downloads' token state, /readyz): a call's transaction sets its own with SET LOCAL."""
    timeout_ms = round(settings.call_timeout_s * 1000)
    pool = AsyncPool(connect.conninfo(database_url), settings.db_pool_size, name="kdbl-api",
                     statement_timeout_ms=timeout_ms)
    replica = AsyncPool(connect.conninfo(read_url), settings.read_pool_size or settings.db_pool_size,
                        name="kdbl-api-reads", statement_timeout_ms=timeout_ms) if read_url else None
    return pool, replica


def _middleware(settings: Settings, state: AppState) -> list[Middleware]:
    """/metrics on its own port; X-Forwarded-* believed from the trusted proxies only (never by default)."""
    middleware = [Middleware(MetricsPort, port=settings.metrics_port, observability=state.observability)]
    if settings.trusted_proxies:
        middleware.append(Middleware(ProxyHeadersMiddleware, trusted_hosts=list(settings.trusted_proxies)))
    return middleware


def create_app(settings: Settings, database_url: str, embedder: Embedder | None = None,
               chat: ChatModel | None = None, read_url: str | None = None) -> Starlette:
    """The API on the database at `database_url` (the kdbl_api role's), MCP calls reading at `read_url` (a
    replica, as kdbl_api) when given. `embedder` (and `chat`) let a process that already loaded the model
    share it (kdbl-control up, tests)."""
    state = AppState()
    pool, replica = _pools(settings, database_url, read_url)
    route = ReadRoute(pool, replica, max_lag_s=settings.read_max_lag_s, observability=state.observability)
    server = build_server(route, state)
    # Every call is answered with one JSON body, except a tools/call that carries a progress token: that one
    # gets an SSE response (its progress notifications, then the result), from a second manager the front
    # door picks after reading the body (kdbl_api.front_door.dispatch).
    manager, streaming = _session_manager(server, settings, True), _session_manager(server, settings, False)
    single = SingleExchange(server, _security(settings))  # most calls: the SDK's handlers without a transport
    verifier = BearerVerifier(PatVerifier(pool), _oidc(settings, pool))
    policies = Policies(pool, settings)
    limiter = RateLimiter(pool)
    share = FairShare(state.observability, pool_size=settings.db_pool_size)  # each tenant's calls in flight
    mcp_app = HostHint(StreamableHTTPASGIApp(manager), settings)  # a 421 names --host / KDBL_ALLOWED_HOSTS
    front_door = McpFrontDoor(mcp_app, SdkTokenVerifier(verifier), settings, limiter, state.observability,
                              policies, pool, streaming_app=HostHint(StreamableHTTPASGIApp(streaming), settings),
                              share=share, single=single)
    downloads = Downloads(settings, pool, state.observability, policies)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await pool.open()
            await connect.assert_runtime_role(pool, allow_privileged=settings.allow_privileged_db_role)
            cursor_key = await reads.server_key(pool, "cursor")
            loaded = embedder or await anyio.to_thread.run_sync(load_embedder, settings)
            chat_model = chat or await anyio.to_thread.run_sync(load_chat_model, settings)
            state.services = Services(settings=settings, cursors=CursorCodec(cursor_key), downloads=downloads.signer,
                                      embedder=loaded, search_cache=ResultCache(
                                          settings.search_cache_bytes, settings.search_cache_ttl_seconds),
                                      chat=chat_model)
            await route.start()
            async with manager.run(), streaming.run(), single.run():
                yield
        finally:
            await downloads.aclose()
            await route.stop()
            await pool.close()

    table = [Route("/mcp", GZipMiddleware(front_door, minimum_size=GZIP_MIN_BYTES, compresslevel=GZIP_LEVEL),
                   methods=["GET", "POST", "DELETE", "PUT", "PATCH"]),
             Route("/api/files/download", downloads.handle, methods=["GET"]), *ROUTES]
    if settings.legacy_sse_enabled:  # opt-in; off, /sse and /messages are 404
        legacy = LegacySse(front_door, settings)
        table += [Route(SSE_PATH, HostHint(legacy.stream, settings), methods=["GET"]),
                  Route(MESSAGES_PATH, HostHint(legacy.messages, settings), methods=["POST"])]
    app = Starlette(routes=table, lifespan=lifespan, middleware=_middleware(settings, state),
                    exception_handlers={TemporaryError: unavailable})
    app.state.kdbl = ApiParts(settings=settings, route=route, state=state, front_door=front_door, policies=policies,
                              share=share, downloads=downloads)
    return app
