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

import anyio.to_thread
import logging
from collections.abc import AsyncIterator

from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from kdbl_api.bearer import SdkTokenVerifier
from kdbl_api.downloads import Downloads
from kdbl_api.fair_share import FairShare
from kdbl_api.host_hint import HostHint
from kdbl_api.http_auth import PRM_PATH, McpFrontDoor, public_base
from kdbl_api.legacy_sse import MESSAGES_PATH, SSE_PATH, LegacySse
from kdbl_api.observability import MetricsPort
from kdbl_api.ratelimit import RateLimiter
from kdbl_api.read_route import ReadRoute
from kdbl_api.server import AppState, build_server
from kdbl_api.tools.context import Services
from kdbl_core.access.oidc import OidcVerifier
from kdbl_core.access.policy import Policies
from kdbl_core.access.principal import rls_transaction
from kdbl_core.access.tokens import BearerVerifier, PatVerifier
from kdbl_core.content import reads, vectors
from kdbl_core.db import connect
from kdbl_core.db.async_pool import AsyncPool
from kdbl_core.chat import ChatModel
from kdbl_core.embedder import Embedder
from kdbl_core.errors import TemporaryError, http_response_of, jsonrpc_response_of
from kdbl_core.access.principal import ALL_SCOPES
from kdbl_core.access.signing import CursorCodec
from kdbl_core.search.cache import ResultCache
from kdbl_core.settings import Settings

log = logging.getLogger(__name__)

# POST /mcp answers compressed when the client accepts gzip (the MCP SDKs' HTTP clients do: httpx, undici)
# and the body is worth it; event streams (a streamed answer, the legacy SSE bridge) pass unbuffered.
# Level 4: measured on result JSON, 37 KB -> 6.8 KB in 0.24 ms and 520 KB -> 149 KB in 8.7 ms (level 6:
# 4% smaller, 1.7x the CPU; 9: 8x); bodies over 128 KiB are compressed off the event loop (Starlette).
GZIP_MIN_BYTES = 4096
GZIP_LEVEL = 4

# hybrid-enabled sources of the caller's tenant (RLS: only those the principal sees)
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


def create_app(settings: Settings, database_url: str, embedder: Embedder | None = None,
               chat: ChatModel | None = None, read_url: str | None = None) -> Starlette:
    """The API on the database at `database_url` (the kdbl_api role's), MCP calls reading at `read_url` (a
    replica, as kdbl_api) when given. `embedder` (and `chat`) let a process that already loaded the model
    share it (kdbl-control up, tests)."""
    state = AppState()
    # every statement bounded, also outside a call's own deadline (the front door's token, policy and rate
    # limit lookups, downloads' token state, /readyz): a call's transaction sets its own with SET LOCAL
    pool = AsyncPool(connect.conninfo(database_url), settings.db_pool_size, name="kdbl-api",
                     statement_timeout_ms=round(settings.call_timeout_s * 1000))  # opened below
    replica = AsyncPool(connect.conninfo(read_url), settings.read_pool_size or settings.db_pool_size,
                        name="kdbl-api-reads", statement_timeout_ms=round(settings.call_timeout_s * 1000)
                        ) if read_url else None  # opened at its first call
    route = ReadRoute(pool, replica, max_lag_s=settings.read_max_lag_s, observability=state.observability)
    server = build_server(route, state)

    def session_manager(json_response: bool) -> StreamableHTTPSessionManager:
        return StreamableHTTPSessionManager(
            app=server, json_response=json_response, stateless=True,
            security_settings=TransportSecuritySettings(
                enable_dns_rebinding_protection=True, allowed_hosts=list(settings.allowed_hosts),
                allowed_origins=list(settings.allowed_origins)),
            max_request_body_size=settings.max_request_bytes,
        )

    # Every call is answered with one JSON body, except a tools/call that carries a progress token: that one
    # gets an SSE response (its progress notifications, then the result), from a second manager the front
    # door picks after reading the body (kdbl_api.http_auth).
    manager, streaming = session_manager(True), session_manager(False)
    verifier = BearerVerifier(PatVerifier(pool), _oidc(settings, pool))
    policies = Policies(pool, settings)
    limiter = RateLimiter(pool)
    share = FairShare(state.observability, pool_size=settings.db_pool_size)  # each tenant's calls in flight
    mcp_app = HostHint(StreamableHTTPASGIApp(manager), settings)  # a 421 names --host / KDBL_ALLOWED_HOSTS
    front_door = McpFrontDoor(mcp_app, SdkTokenVerifier(verifier), settings, limiter, state.observability,
                              policies, pool, streaming_app=HostHint(StreamableHTTPASGIApp(streaming), settings),
                              share=share)
    downloads = Downloads(settings, pool, state.observability, policies)

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> JSONResponse:
        """Through the request path's pool: what requests would get (a probe also reopens it)."""
        try:
            await pool.ping()
        except Exception as exc:  # noqa: BLE001 - readiness reports any database failure
            log.warning("database not reachable", extra={"error": type(exc).__name__})
            reason = (exc.message if isinstance(exc, TemporaryError)
                      else f"database check failed ({type(exc).__name__})")
            return JSONResponse({"status": "unavailable", "database": "unreachable", "reason": reason},
                                status_code=503, headers={"Retry-After": "1"})
        return JSONResponse({"status": "ok", "database": "ok", "reads": route.describe()})

    async def protected_resource(request: Request) -> JSONResponse:
        base = public_base(request, settings)
        return JSONResponse({
            "resource": f"{base}/mcp",
            "authorization_servers": [settings.oidc_issuer] if settings.oidc_issuer else [],
            "scopes_supported": list(ALL_SCOPES),
            "bearer_methods_supported": ["header"],
            "resource_name": "K-Lake Context Lake MCP",
        }, headers={"Cache-Control": "public, max-age=300"})

    async def capacity(request: Request) -> Response:
        """The caller's view: service-wide modes and latency, its tenant's embedding progress."""
        access = await front_door.authenticate(request, route="/capacity")  # the one front door for tokens
        if isinstance(access, Response):
            return access
        principal = access.principal
        obs = state.observability
        embedder = state.services.embedder if state.services else None
        async with rls_transaction(pool, principal) as conn:
            progress = await vectors.backlog(conn, embedder.model_id if embedder else None)
        hybrid = {"available": embedder is not None, "latency": obs.mode_latency("hybrid"),
                  "embedding_progress": progress,
                  "cost": "query embedding (~4 ms CPU, cached) + BM25 + HNSW scan + fusion"}
        if embedder is None:
            hybrid.update(reason="no embedder deployed (KDBL_EMBED_MODEL_PATH unset)", served_as="lexical")
        else:
            hybrid.update(model=embedder.model_id, dimensions=embedder.dim,
                          note="per tenant/source toggles may still degrade a request to lexical")
        body: dict[str, object] = {
            "mcp_enabled": settings.mcp_enabled,
            "downloads_enabled": downloads.enabled,
            "modes": {
                "lexical": {"available": True, "cost": "one SQL query: BM25 over the query terms' postings",
                            "latency": obs.mode_latency("lexical")},
                "hybrid": hybrid,
                "semantic": {**hybrid, "latency": obs.mode_latency("semantic"),
                             "cost": "query embedding (~4 ms CPU, cached) + HNSW scan"},
                "graph": {"available": True, "latency": obs.mode_latency("graph"),
                          "cost": "BM25 + the chunks naming the query's entities, fused",
                          "note": "needs sources with entities on; a query naming no entity is served as lexical"},
            },
            "rate_limit": await front_door.quota(principal),
        }
        policy = await policies.get(principal.tenant_id)
        body["concurrency"] = {"max_in_flight": share.limit(policy.limits), "in_flight": share.in_flight(
            principal.tenant_id), "queue_ms": policy.limits.queue_ms, "scope": "per API process (cost units)"}
        body["deadlines"] = policy.describe()["deadlines"]
        tools: dict[str, object] = {}  # tools beyond the six: only where the tenant's allowlist names them
        if policy.allows_tool("get_contents"):
            tools["get_contents"] = {"latency": obs.mode_latency("get_contents"),
                                     "cost": "one statement for all ids (files: leading chunks; chunks: neighbours)"}
        if policy.allows_tool("find_similar"):
            tools["find_similar"] = {
                "vector": {"available": True, "latency": obs.mode_latency("find_similar_vector"),
                           "cost": "the subject's stored (or embedded) vector + one HNSW scan"},
                "lexical": {"available": True, "latency": obs.mode_latency("find_similar_lexical"),
                            "cost": "the subject's distinctive terms + one BM25 query"}}
        if policy.allows_tool("answer"):
            chat = state.services.chat if state.services else None
            tools["answer"] = {
                "extractive": {"available": True, "latency": obs.mode_latency("answer_extractive"),
                               "cost": "one search + sentence scoring (no model)"},
                "abstractive": {"available": chat is not None, "latency": obs.mode_latency("answer_abstractive"),
                                "model": chat.model_id if chat else None,
                                "cost": "one search + local chat model generation (one answer at a time)"},
            }
        if tools:
            body["tools"] = tools
        return JSONResponse(body)

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
            async with manager.run(), streaming.run():
                yield
        finally:
            await downloads.aclose()
            await route.stop()
            await pool.close()

    routes = [
        Route("/mcp", GZipMiddleware(front_door, minimum_size=GZIP_MIN_BYTES, compresslevel=GZIP_LEVEL),
              methods=["GET", "POST", "DELETE", "PUT", "PATCH"]),
        Route("/api/files/download", downloads.handle, methods=["GET"]),
        Route("/capacity", capacity, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route(PRM_PATH, protected_resource, methods=["GET"]),
        Route(PRM_PATH + "/mcp", protected_resource, methods=["GET"]),
    ]
    if settings.legacy_sse_enabled:  # opt-in; off, /sse and /messages are 404
        legacy = LegacySse(front_door, settings)
        routes += [Route(SSE_PATH, HostHint(legacy.stream, settings), methods=["GET"]),
                   Route(MESSAGES_PATH, HostHint(legacy.messages, settings), methods=["POST"])]
    middleware = [Middleware(MetricsPort, port=settings.metrics_port, observability=state.observability)]
    if settings.trusted_proxies:  # X-Forwarded-* from these peers only (never by default, not even loopback)
        middleware.append(Middleware(ProxyHeadersMiddleware, trusted_hosts=list(settings.trusted_proxies)))
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                     exception_handlers={TemporaryError: unavailable})
