"""What a tool handler gets: the open RLS connection, the principal, its tenant's policy and settings.

A handler returns its result and its `kdbl_api.audit.AuditFacts`; nothing here collects them. `meta` is the
call's kdbl_api.request_meta.CallMeta: a handler adds the time of its parts (took_ms) and a cache sets
`cache_hit`; the server puts it in the result."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kdbl_api.request_meta import CallMeta
from kdbl_core.access.policy import TenantPolicy
from kdbl_core.access.principal import Principal
from kdbl_core.access.signing import CursorCodec, DownloadSigner
from kdbl_core.chat import ChatModel
from kdbl_core.db.async_pool import Connection, Statement
from kdbl_core.embedder import Embedder
from kdbl_core.search.cache import ResultCache
from kdbl_core.settings import Settings


@dataclass(frozen=True, slots=True)
class Services:
    """Process-wide helpers the tools share (built once at start-up)."""

    settings: Settings
    cursors: CursorCodec
    downloads: DownloadSigner | None = None
    embedder: Embedder | None = None
    search_cache: ResultCache | None = None  # search_content's results (kdbl_core.search.cache); None: off
    chat: ChatModel | None = None  # the answer tool's local chat model (KDBL_CHAT_MODEL_PATH); None: extractive only


@dataclass(slots=True)
class ToolContext:
    conn: Connection  # psycopg's, in the call's RLS transaction (kdbl_core.access.principal.rls_transaction)
    principal: Principal
    services: Services
    policy: TenantPolicy = field(default_factory=TenantPolicy)
    meta: CallMeta = field(default_factory=CallMeta.begin)
    opened: Statement | None = None  # the tool's opening statement, answered with BEGIN (registry.Opening)
    # sends partial output as an MCP progress notification (message, progress, total) when the client
    # asked for progress (params._meta.progressToken); None when it did not
    progress: Callable[[str, float, float | None], Awaitable[None]] | None = None

    @property
    def settings(self) -> Settings:
        return self.services.settings

    def download_url(self, source_id: str, key: str) -> str | None:
        """A short-lived signed link to the original file, when downloads are enabled here and for the tenant."""
        signer, base = self.services.downloads, self.settings.api_public_url
        if signer is None or not base or self.policy.downloads == "off":
            return None
        link = signer.sign(self.principal, source_id, key, ttl_seconds=self.policy.link_ttl_s)
        return f"{base.rstrip('/')}/api/files/download?t={link}"
