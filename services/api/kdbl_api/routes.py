"""The API's plain HTTP routes, module-level (issue 33: out of create_app): /healthz, /readyz, /capacity and the
OAuth protected-resource metadata. Each reads the app's parts from `request.app.state.kdbl` (`ApiParts`, set
by kdbl_api.app.create_app); /capacity takes its token through the one front door (McpFrontDoor.authenticate).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kdbl_api.call_runner import AppState
from kdbl_api.downloads import Downloads
from kdbl_api.fair_share import FairShare
from kdbl_api.front_door import McpFrontDoor, public_base
from kdbl_api.observability import Observability
from kdbl_api.read_route import ReadRoute
from kdbl_core.access.policy import Policies, TenantPolicy
from kdbl_core.access.principal import ALL_SCOPES, rls_transaction
from kdbl_core.chat import ChatModel
from kdbl_core.content import vectors
from kdbl_core.embedder import Embedder
from kdbl_core.errors import TemporaryError
from kdbl_core.settings import Settings

log = logging.getLogger("kdbl_api.app")


@dataclass(frozen=True, slots=True)
class ApiParts:
    """What the routes share, built once by create_app."""

    settings: Settings
    route: ReadRoute
    state: AppState
    front_door: McpFrontDoor
    policies: Policies
    share: FairShare
    downloads: Downloads


def _parts(request: Request) -> ApiParts:
    return request.app.state.kdbl


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> JSONResponse:
    """Through the request path's pool: what requests would get (a probe also reopens it)."""
    parts = _parts(request)
    try:
        await parts.route.primary.ping()
    except Exception as exc:  # noqa: BLE001 - readiness reports any database failure
        log.warning("database not reachable", extra={"error": type(exc).__name__})
        reason = exc.message if isinstance(exc, TemporaryError) else f"database check failed ({type(exc).__name__})"
        return JSONResponse({"status": "unavailable", "database": "unreachable", "reason": reason},
                            status_code=503, headers={"Retry-After": "1"})
    return JSONResponse({"status": "ok", "database": "ok", "reads": parts.route.describe()})


async def protected_resource(request: Request) -> JSONResponse:
    settings = _parts(request).settings
    return JSONResponse({
        "resource": f"{public_base(request, settings)}/mcp",
        "authorization_servers": [settings.oidc_issuer] if settings.oidc_issuer else [],
        "scopes_supported": list(ALL_SCOPES),
        "bearer_methods_supported": ["header"],
        "resource_name": "K-Lake Context Lake MCP",
    }, headers={"Cache-Control": "public, max-age=300"})


def _modes(obs: Observability, embedder: Embedder | None, progress: Any) -> dict[str, Any]:
    hybrid = {"available": embedder is not None, "latency": obs.mode_latency("hybrid"),
              "embedding_progress": progress,
              "cost": "query embedding (~4 ms CPU, cached) + BM25 + HNSW scan + fusion"}
    if embedder is None:
        hybrid.update(reason="no embedder deployed (KDBL_EMBED_MODEL_PATH unset)", served_as="lexical")
    else:
        hybrid.update(model=embedder.model_id, dimensions=embedder.dim,
                      note="per tenant/source toggles may still degrade a request to lexical")
    return {
        "lexical": {"available": True, "cost": "one SQL query: BM25 over the query terms' postings",
                    "latency": obs.mode_latency("lexical")},
        "hybrid": hybrid,
        "semantic": {**hybrid, "latency": obs.mode_latency("semantic"),
                     "cost": "query embedding (~4 ms CPU, cached) + HNSW scan"},
        "graph": {"available": True, "latency": obs.mode_latency("graph"),
                  "cost": "BM25 + the chunks naming the query's entities, fused",
                  "note": "needs sources with entities on; a query naming no entity is served as lexical"},
    }


def _tools(policy: TenantPolicy, obs: Observability, chat: ChatModel | None) -> dict[str, Any]:
    """The tools beyond the six: only where the tenant's allowlist names them."""
    tools: dict[str, Any] = {}
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
        tools["answer"] = {
            "extractive": {"available": True, "latency": obs.mode_latency("answer_extractive"),
                           "cost": "one search + sentence scoring (no model)"},
            "abstractive": {"available": chat is not None, "latency": obs.mode_latency("answer_abstractive"),
                            "model": chat.model_id if chat else None,
                            "cost": "one search + local chat model generation (one answer at a time)"},
        }
    return tools


async def capacity(request: Request) -> Response:
    """The caller's view: service-wide modes and latency, its tenant's embedding progress."""
    parts = _parts(request)
    access = await parts.front_door.authenticate(request, route="/capacity")  # the one front door for tokens
    if isinstance(access, Response):
        return access
    principal, services, obs = access.principal, parts.state.services, parts.state.observability
    embedder = services.embedder if services else None
    async with rls_transaction(parts.route.primary, principal) as conn:
        progress = await vectors.backlog(conn, embedder.model_id if embedder else None)
    policy = await parts.policies.get(principal.tenant_id)
    body: dict[str, object] = {
        "mcp_enabled": parts.settings.mcp_enabled, "downloads_enabled": parts.downloads.enabled,
        "modes": _modes(obs, embedder, progress), "rate_limit": await parts.front_door.quota(principal),
        "concurrency": {"max_in_flight": parts.share.limit(policy.limits),
                        "in_flight": parts.share.in_flight(principal.tenant_id),
                        "queue_ms": policy.limits.queue_ms, "scope": "per API process (cost units)"},
        "deadlines": policy.describe()["deadlines"]}
    if tools := _tools(policy, obs, services.chat if services else None):
        body["tools"] = tools
    return JSONResponse(body)
