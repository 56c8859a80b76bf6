"""GET /api/files/download?t=<signed token>[&dl=1]: the original file, re-checked against RLS.

The token names the principal it was minted for; the file must still be visible to that principal
(404 otherwise). The link is only as good as what minted it: the tenant must still be enabled and
allow downloads (its policy: off / inline / attachment, at most 2 s old), and the PAT that minted
it must still be valid (not revoked, not expired) — 403 otherwise, so revoking a token also ends
the links it minted (issue 13 item 3). Bytes come from the worker's internal fetch endpoint — the
API holds no source
credentials — and stream through. Every download writes one audit row (tool `files/download`, built by
kdbl_api.audit from the facts of how it ended, in its own transaction). Refusals
are kdbl_core.errors classes rendered by `http_response_of` (404 NotFound, 403 Forbidden, 502 UpstreamError).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import UTC, datetime
from urllib.parse import quote

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from kdbl_api import audit
from kdbl_api.audit import AuditFacts
from kdbl_api.observability import Observability
from kdbl_core.access.policy import Policies

from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.access.signing import DownloadClaims, DownloadSigner
from kdbl_core.content import reads
from kdbl_core.db.async_pool import AsyncPool
from kdbl_core.errors import Forbidden, NotFound, UpstreamError, http_response_of
from kdbl_core.settings import Settings

log = logging.getLogger(__name__)
_TOKEN_STATE = "SELECT tenant_id, expires_at, revoked_at FROM kdbl_token_state(%(token)s)"


def _disposition(key: str, attachment: bool) -> str:
    name = key.rsplit("/", 1)[-1] or "file"
    ascii_name = name.encode("ascii", "replace").decode().replace('"', "_").replace("?", "_")
    kind = "attachment" if attachment else "inline"
    return f"{kind}; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name, safe='')}"


class Downloads:
    def __init__(self, settings: Settings, pool: AsyncPool, observability: Observability,
                 policies: Policies) -> None:
        self.enabled = bool(settings.download_signing_secret and settings.api_public_url
                            and settings.internal_fetch_token)
        self.signer = DownloadSigner(settings.download_signing_secret.get_secret_value()) if self.enabled else None
        self._token = settings.internal_fetch_token.get_secret_value() if self.enabled else ""
        self._worker = settings.worker_fetch_url.rstrip("/")
        self._pool = pool
        self._obs = observability
        self._policies = policies
        self._http: httpx.AsyncClient | None = None

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    async def handle(self, request: Request) -> Response:
        if not self.enabled or self.signer is None:
            return http_response_of(NotFound("downloads are not enabled on this server")).response()
        started = time.perf_counter()
        try:
            claims = self.signer.verify(request.query_params.get("t", ""))
        except Forbidden as exc:
            self._obs.downloads.labels("forbidden").inc()
            return http_response_of(exc).response()
        principal = dataclasses.replace(claims.principal(), token_id=claims.token_id)  # audited as the minter
        asked = AuditFacts(source_ids=(str(claims.source_id),), keys=(claims.key,))
        refusal = await self._refusal(claims, request.query_params.get("dl") == "1")
        if refusal is not None:
            await self._audit(principal, claims, asked.failed("denied", refusal), request, started)
            self._obs.downloads.labels("forbidden").inc()
            return http_response_of(Forbidden(refusal)).response()
        async with rls_transaction(self._pool, principal) as conn:
            row = await reads.get_file(conn, claims.source_id, claims.key)
        if row is None:
            await self._audit(principal, claims, asked.failed("error", "not visible"), request, started)
            self._obs.downloads.labels("not_found").inc()
            return http_response_of(NotFound("not found")).response()

        if self._http is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=300.0))
        upstream_request = self._http.build_request(
            "GET", f"{self._worker}/internal/files", params={"source_id": str(claims.source_id), "key": claims.key},
            headers={"Authorization": f"Bearer {self._token}"})
        try:
            upstream = await self._http.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            log.warning("worker fetch failed", extra={"error": type(exc).__name__})
            await self._audit(principal, claims, asked.failed("error", "worker unreachable"), request,
                              started)
            return http_response_of(UpstreamError("file source is unavailable")).response()
        if upstream.status_code != 200:
            await upstream.aclose()
            await self._audit(principal, claims, asked.failed("error", f"worker answered {upstream.status_code}"),
                              request, started)
            failure = (NotFound("not found") if upstream.status_code == 404
                       else UpstreamError("file source is unavailable"))
            return http_response_of(failure).response()
        await self._audit(principal, claims, dataclasses.replace(asked, row_count=1), request, started)
        self._obs.downloads.labels("ok").inc()
        headers = {
            "Content-Disposition": _disposition(claims.key, request.query_params.get("dl") == "1"),
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "sandbox",  # an HTML original must not run script on our origin
            "Cache-Control": "private, no-store",
        }
        if "content-length" in upstream.headers:
            headers["Content-Length"] = upstream.headers["content-length"]
        return StreamingResponse(upstream.aiter_raw(), status_code=200, headers=headers,
                                 media_type=row["content_type"] or upstream.headers.get("content-type"),
                                 background=BackgroundTask(upstream.aclose))

    async def _refusal(self, claims: DownloadClaims, attachment: bool) -> str | None:
        """Why the link may no longer be used (tenant policy, minting token), or None."""
        policy = await self._policies.get(claims.tenant_id)
        if not policy.enabled:
            return f"tenant '{claims.tenant_name}' is disabled"
        if policy.downloads == "off":
            return "downloads are disabled for this tenant"
        if attachment and policy.downloads == "inline":
            return "this tenant allows inline downloads only (drop dl=1)"
        if claims.token_id is None:
            return None
        rows = await self._pool.fetch(_TOKEN_STATE, {"token": claims.token_id})
        row = rows[0] if rows else None
        if row is None or row.tenant_id != claims.tenant_id or row.revoked_at is not None:
            return "the token that minted this link was revoked"
        if row.expires_at is not None and row.expires_at <= datetime.now(UTC):
            return "the token that minted this link has expired"
        return None

    async def _audit(self, principal: Principal, claims: DownloadClaims, facts: AuditFacts, request: Request,
                     started: float) -> None:
        arguments = {"source_id": str(claims.source_id), "key": claims.key,
                     "dl": request.query_params.get("dl") == "1"}
        row = audit.audit_row(principal, request, "files/download", arguments, facts, started)
        await audit.write_alone(self._pool, principal, row, must=True)
