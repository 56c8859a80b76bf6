"""Typed settings: the one place that reads the process environment.

`Settings` holds every KDBL_* variable; the operator's are its `operator` section (env names unchanged:
KDBL_OPERATOR_NAMESPACE is `settings.operator.namespace`). Each entry point reads them once with
`load_settings()` and passes them down; code without a Settings in reach asks `get_settings()` for the
same object (read on first use by processes that have no entry point of ours, e.g. `kopf run`).
Two helpers cover the environment reads that are not fixed settings: `named_env` (a variable whose
name is data: a CLI flag, a source's credentials reference) and `child_env` (a child process's
environment, built from this one's). tests/unit/test_settings_single_source.py fails on any other
`os.environ` read in services/ or operator/.

Secrets are `SecretStr` so they never print in logs, reprs or tracebacks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict
from typing_extensions import Annotated, Literal


def _split_csv(value: object) -> object:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class OperatorSettings(BaseModel):
    """The `operator` section: KDBL_OPERATOR_<NAME> sets `<name>` (KUBECONFIG sets `kubeconfig`)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    namespace: str = Field(
        default="default", description="Where the operator runs: its leader Lease, and the default home "
        "namespace of tenants (bootstrap Secrets).")
    health_port: int = Field(default=8080, ge=1, le=65535)
    health_host: str = "0.0.0.0"
    resync_seconds: float = Field(
        default=300.0, gt=0, description="Every resource is re-converged this often (drift correction).")
    retry_base_seconds: float = Field(default=5.0, gt=0)
    retry_max_seconds: float = Field(default=300.0, gt=0)
    delete_batch: int = Field(default=500, ge=1, description="Files deleted per transaction.")
    delete_batches_per_pass: int = Field(
        default=20, ge=1, description="Batches per handler run; the finalizer then reports progress and resumes.")
    credentials_root: str = Field(
        default="/var/run/secrets/kdbl/sources",
        description="Where the worker mounts Source credential Secrets (<root>/<namespace>/<secret>/<key>).")
    lease_name: str = "kdbl-operator"
    lease_seconds: float = Field(default=15.0, ge=2)
    lease_renew_seconds: float = Field(default=5.0, gt=0)
    db_pool_size: int = Field(default=2, ge=1, le=20)
    kubeconfig: str | None = Field(default=None, description=(
        "Outside a cluster: the kubeconfig file ($KUBECONFIG, as kubectl reads it, or --kubeconfig); "
        "unset: ~/.kube/config."))

    def backoff(self, retry: int) -> float:
        """Delay before the next attempt of a failing handler: exponential, capped."""
        return min(self.retry_base_seconds * (2 ** min(retry, 16)), self.retry_max_seconds)


class _PlatformEnv(PydanticBaseSettingsSource):
    """Variables other tools define, read under their own names (after KDBL_* ones): KUBECONFIG and
    XDG_RUNTIME_DIR."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        if os.environ.get("XDG_RUNTIME_DIR"):
            values["runtime_dir"] = os.environ["XDG_RUNTIME_DIR"]
        if os.environ.get("KUBECONFIG"):
            values["operator"] = {"kubeconfig": os.environ["KUBECONFIG"]}
        return values


class Settings(BaseSettings):
    # KDBL_OPERATOR_HEALTH_PORT -> operator.health_port: split once after the section's name.
    model_config = SettingsConfigDict(env_prefix="KDBL_", extra="ignore", frozen=True,
                                      env_nested_delimiter="_", env_nested_max_split=1)

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _PlatformEnv(settings_cls), dotenv_settings, file_secret_settings

    # --- database -------------------------------------------------------------------
    database_url: SecretStr | None = Field(
        default=None,
        description="SQLAlchemy/libpq URL. Runtime services connect as a non-owner role "
        "(kdbl_api / kdbl_worker); migrations and kdbl-control connect as the owner.",
    )
    db_pool_size: int = Field(default=10, ge=1, le=200, description=(
        "Database connections per process for the request path (kdbl-api: one pool per worker process, "
        "which also serves readiness, /capacity and the start-up checks)."))
    database_read_url: SecretStr | None = Field(default=None, description=(
        "kdbl-api only: where MCP calls read (a streaming replica: CloudNativePG's <cluster>-ro Service), as "
        "kdbl_api. Tokens, tenant policy, the rate limit, audit rows and downloads' token state stay on "
        "KDBL_DATABASE_URL (the primary). Unset: everything on KDBL_DATABASE_URL."))
    read_max_lag_s: float = Field(default=10.0, gt=0, le=3600, description=(
        "A replica further behind the primary than this (seconds of the primary's WAL) is not read: the call "
        "runs on the primary instead (counted in /metrics, reported by /readyz)."))
    read_pool_size: int | None = Field(default=None, ge=1, le=200, description=(
        "Connections per API process to KDBL_DATABASE_READ_URL (default: KDBL_DB_POOL_SIZE; the primary's "
        "pool then carries the front door, audit rows and fallbacks)."))
    text_search_config: str = Field(default="english", pattern=r"^[a-z_]+$")
    allow_privileged_db_role: bool = Field(
        default=False,
        description="Let a runtime service connect as a superuser/BYPASSRLS role. Off: such a "
        "role would silently disable row-level security, so the service refuses to start.",
    )

    # --- API / MCP ---------------------------------------------------------------------
    mcp_enabled: bool = False
    api_host: str = "0.0.0.0"
    api_port: int = Field(default=8080, ge=1, le=65535)
    api_workers: int = Field(default=1, ge=1, le=64, description=(
        "kdbl-api processes sharing the port, each with its own SO_REUSEPORT socket. The API's event loop "
        "uses one core; on 2 cores beside Postgres, 2 processes served 217 instead of 176 searches/s "
        "(docs/benchmarks.md)."))
    api_public_url: str | None = None
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["127.0.0.1:*", "localhost:*", "[::1]:*"],
        description="Host header values accepted by /mcp (DNS-rebinding protection); "
        "add in-cluster names such as kdbl-api.kdbl.svc.cluster.local.",
    )
    allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
    )
    max_request_bytes: int = Field(default=1_000_000, ge=1024)
    max_query_chars: int = Field(default=1000, ge=16, le=100_000)
    rate_limit_per_minute: int = Field(
        default=600, ge=0, description="Per-token minute tier of tenants whose policy sets none (buckets shared "
                                       "by every replica, kdbl_api.ratelimit); 0 disables.")
    rate_limit_burst: int = Field(default=60, ge=1)
    tenant_max_in_flight: int = Field(default=4, ge=1, le=1000, description=(
        "Fair share between tenants (kdbl_api.fair_share): cost units of calls one tenant may have in flight "
        "per API process, unless its policy sets concurrency.max_in_flight. A call costs 1 (a search, a read) "
        "to 4 (an abstractive answer); never more than KDBL_DB_POOL_SIZE - 1, so one tenant cannot hold "
        "every database connection. 4 keeps one tenant to about the two cores of the reference box."))
    tenant_queue_s: float = Field(default=2.0, ge=0, le=60, description=(
        "How long a call over its tenant's in-flight limit waits for a slot (first come, first served) "
        "before it is refused with 429 + Retry-After; 0 refuses at once."))
    call_timeout_s: float = Field(default=10.0, ge=0.1, le=3600, description=(
        "Every MCP call's deadline, unless its tenant's policy sets one (deadlines.default_ms, per tool "
        "deadlines.tools): each SQL statement's statement_timeout, and the call as a whole in Python (1 s "
        "later, so that a slow statement is cancelled by the server first); `answer` adds "
        "KDBL_CHAT_TIMEOUT_S for its generation. Past it the call answers -32008 naming the deadline. 10 s is "
        "5x the slowest search measured (naive OR BM25 at 100k chunks: p95 1.8 s)."))
    body_read_timeout_s: float = Field(default=10.0, gt=0, le=600, description=(
        "A /mcp request body must arrive within this many seconds of its headers, else 408 and the "
        "connection is closed (a stalled body used to hold a connection and its slot open > 25 s)."))
    trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list, description=(
        "CIDRs of reverse proxies whose X-Forwarded-For / X-Forwarded-Proto are believed (audit rows "
        "record the client they name). Empty: none, not even loopback: the peer address is recorded."))
    metrics_port: int = Field(default=9464, ge=0, le=65535, description=(
        "kdbl-api serves GET /metrics (Prometheus) on this port only, not on the API port, so a "
        "NetworkPolicy can limit it to the monitoring namespace. 0: no metrics listener."))
    legacy_sse_enabled: bool = Field(default=False, description=(
        "Also serve the 2024-11-05 HTTP+SSE transport for clients that speak only it: GET /sse opens a "
        "session, POST /messages?session_id=... carries its requests through the /mcp path (kdbl_api."
        "legacy_sse). Off: both are 404. Needs KDBL_API_WORKERS=1 (a POST must reach its stream's process)."))
    legacy_sse_keepalive_s: float = Field(default=15.0, gt=0, le=300, description=(
        "An idle SSE session gets a comment line this often, well inside the 60 s idle timeouts of common "
        "proxies and load balancers, so it survives between searches."))
    legacy_sse_send_timeout_s: float = Field(default=30.0, gt=0, le=600, description=(
        "An SSE client that stops reading (its connection open, its buffers full) is disconnected when one "
        "event waits this long to be sent, which frees its session slot (kdbl_api.legacy_sse)."))
    legacy_sse_max_sessions: int = Field(default=256, ge=1, le=100_000, description=(
        "Open SSE sessions per API process; one more is refused with 503."))
    legacy_sse_max_sessions_per_token: int = Field(default=8, ge=1, le=10_000, description=(
        "Open SSE sessions per token (an OIDC subject: per subject); one more is refused with 429."))

    # --- OIDC access tokens, verified offline against a JWKS file (no IdP call at request time) ---
    oidc_issuer: str | None = None
    oidc_audience: str | None = None
    oidc_jwks_file: str | None = None
    oidc_tenant_claim: str = "kdbl_tenant"
    oidc_groups_claim: str = "groups"

    # --- downloads / internal fetch -------------------------------------------------------
    download_signing_secret: SecretStr | None = None
    internal_fetch_token: SecretStr | None = None
    worker_fetch_url: str = "http://127.0.0.1:8081"
    fetch_host: str = "0.0.0.0"
    fetch_port: int = Field(default=8081, ge=1, le=65535)

    # --- worker ------------------------------------------------------------------------
    max_file_bytes: int = Field(default=512 * 1024 * 1024, ge=1)
    extract_timeout_s: float = Field(default=120.0, gt=0, description="Per file; the child is killed after it.")
    extract_memory_mb: int | None = Field(default=2048, ge=64, description="Address-space cap of an extractor child.")
    extract_processes: int | None = Field(default=None, ge=0, le=64,
                                          description="Extractor children (default by cores; 0 = in-process).")
    write_connections: int = Field(default=2, ge=1, le=32)
    job_lease_s: float = Field(default=60.0, ge=5)
    file_deadline_s: float = Field(default=300.0, gt=0, description=(
        "Per file: its write transaction is ended after this long (statement/transaction timeouts, then "
        "the worker terminates it) and the file is recorded failed with the reason; the crawl goes on."))
    progress_interval_s: float = Field(default=5.0, gt=0, description=(
        "Seconds between the progress lines `crawl` and `up` log when stderr is not a terminal."))
    durable_file_commits: bool = Field(
        default=False, description="Wait for the WAL flush on every file commit. Off: a Postgres crash may lose "
        "the last ~0.6 s of indexed files (each still all-or-nothing; their queue items are redone).")
    chunk_target_chars: int = Field(default=1200, ge=100, le=8000)
    chunk_max_chars: int = Field(default=1800, ge=200, le=16000)
    transcriber_model: str | None = Field(
        default=None, description="Folder of a faster-whisper (CTranslate2) model, e.g. from the airgap "
        "bundle: audio/video without subtitle sidecars is transcribed with it (needs the optional "
        "faster-whisper package). Unset: such files are skipped.")
    ocr_max_pages: int = Field(default=200, ge=0, le=100_000, description=(
        "Per file: images' pages and PDF pages without a text layer read by OCR (the `ocr` extra; "
        "a source turns OCR off with its config key `ocr: false`). Pages past it stay unread and the "
        "file is `partial` with the reason; OCR also stops after 3/4 of KDBL_EXTRACT_TIMEOUT_S."))
    container_max_depth: int = Field(default=3, ge=0, le=16, description=(
        "Archives and e-mails are indexed with their members as child files (`a.zip!/docs/b.md`); members "
        "nested deeper than this many levels are not expanded."))
    container_max_members: int = Field(default=1000, ge=0, description="Members indexed per top-level file, "
                                       "all levels together; the rest are refused with a reason.")
    container_max_member_bytes: int = Field(default=64 * 1024 * 1024, ge=0, description=(
        "A member larger than this (uncompressed) is refused with a reason."))
    container_max_expanded_bytes: int = Field(default=512 * 1024 * 1024, ge=0, description=(
        "Bytes expanded per top-level file, all levels together (zip bombs stop here)."))

    # --- embeddings / hybrid retrieval ----------------------------------------------------
    embed_model_path: str | None = Field(
        default=None, description="GGUF embedding model; unset = no embedder, hybrid degrades to lexical.")
    model_dir: Path = Field(default=Path("~/.cache/kdbl/models"), description=(
        "Where airgap/model/build_model.py caches the default model; `up`, eval and bench use the "
        "default model from there when KDBL_EMBED_MODEL_PATH is unset."))
    embed_threads: int = Field(default=2, ge=1, le=64)
    embed_gpu_layers: int = Field(default=0, ge=-1, le=1000, description=(
        "Layers of the embedding model llama.cpp offloads to a GPU (-1: all; 0: CPU only). For GPU nodes "
        "(the chart's worker.gpu); needs a llama-cpp-python built with a GPU backend, else a warning says "
        "the model runs on the CPU."))
    embed_batch: int = Field(default=32, ge=1, le=512, description="Chunks per embedding batch (worker).")
    embed_max_tokens: int = Field(default=256, ge=16, le=8192)
    query_cache_size: int = Field(default=1024, ge=0)
    bm25_exhaustive: bool = Field(default=False, description=(
        "Read every posting of every query term (the evaluation reference) instead of the MaxScore top-k, "
        "which returns the same ranking reading less (kdbl_core.search.bm25_topk, docs/benchmarks.md)."))
    bm25_native: bool = Field(default=True, description=(
        "Rank keywords over the packed posting lists of the kdbl_bm25 extension when the database has it "
        "(kdbl_core.search.bm25_native; the same ranking as the SQL top-k, read from ~4 bytes a posting); "
        "false: always the SQL top-k."))
    bm25_build_part_postings: int = Field(default=40_000_000, ge=100_000, description=(
        "A build of the packed keyword lists sorts at most about this many postings at once (~60 bytes of "
        "temporary disk each: 40M = 2.4 GB); more are packed in parts, one hash partition of the terms each, "
        "every part reading the chunks again (kdbl_core.content.bm25_lists). Raise it where temporary disk "
        "is plenty and builds should read less."))
    similar_terms: int = Field(default=25, ge=1, le=100, description=(
        "find_similar's lexical more-like-this: the subject's most distinctive terms it searches with "
        "(kdbl_core.search.similar; recall and latency per value in docs/benchmarks.md)."))
    hybrid_depth: int = Field(default=100, ge=10, le=1000, description="Candidates per arm before fusion.")
    hybrid_rrf_k: int = Field(default=60, ge=1, le=1000)
    hybrid_vector_weight: float = Field(default=1.0, ge=0.0, le=10.0)
    hybrid_max_per_file: int = Field(default=3, ge=1, le=100)
    hybrid_rerank: Literal["none", "scores"] = Field(
        default="scores", description="After RRF: rerank the candidates by a convex combination of their "
                                      "exact BM25 and cosine scores (see docs/benchmarks.md), or not.")
    hybrid_rerank_lexical_weight: float = Field(default=0.5, ge=0.0, le=1.0)
    search_cache_bytes: int = Field(default=32 * 1024 * 1024, ge=0, description=(
        "Search results cached per API process (kdbl_core.search.cache), by estimated bytes, least "
        "recently used out first; 0 disables the cache. Keyed by the index state: never stale."))
    search_cache_ttl_seconds: float = Field(default=300.0, gt=0, le=86_400, description=(
        "A cached search result older than this is a miss (memory hygiene: the key already makes it exact)."))

    # --- the `answer` tool's local chat model (kdbl_core.chat) ----------------------------
    chat_model_path: str | None = Field(default=None, description=(
        "GGUF instruct/chat model for `answer` with answer_type abstractive (never downloaded: the airgap "
        "bundle's chat slot, docs/clients.md); unset = abstractive is off and `answer` offers extractive only."))
    chat_ctx: int = Field(default=4096, ge=512, le=131_072, description=(
        "The chat model's context in tokens: the numbered passages plus the answer must fit."))
    chat_threads: int = Field(default=2, ge=1, le=64)
    chat_timeout_s: float = Field(default=60.0, gt=0, le=3600, description=(
        "An abstractive answer stops after this many seconds (the text so far is returned, finish_reason "
        "'timeout'); checked between tokens."))

    # --- kdbl-control client -----------------------------------------------------------
    api_token_file: str | None = Field(default=None, description=(
        "File holding the PAT `kdbl-control mcp smoke` sends (--api-token-file); a file, not argv, so the "
        "token stays out of ps and shell history."))
    api_token: SecretStr | None = Field(default=None, description=(
        "The PAT `kdbl-control mcp stdio` sends when no --token-file is given (KDBL_API_TOKEN, e.g. from a "
        "desktop client's `env` block); never a command-line flag, never logged."))

    # --- embedded PostgreSQL ----------------------------------------------------------------
    runtime_dir: str | None = Field(default=None, description=(
        "XDG_RUNTIME_DIR: the embedded server's socket folder goes there (else the temp folder)."))
    embedded_shared_buffers_mb: int = Field(default=0, ge=0, le=1024 * 1024, description=(
        "The embedded server's shared_buffers in MB; 0 (default) = a quarter of this machine's memory, "
        "128 MB to 8 GB (PostgreSQL's own default, 128 MB, kept the 2 GB HNSW graph of 1M chunks out: "
        "every hybrid search copied its pages from the OS cache; docs/benchmarks.md)."))

    # --- kdbl-operator (KDBL_OPERATOR_*) ------------------------------------------------------
    operator: OperatorSettings = Field(default_factory=OperatorSettings)

    # --- logging -----------------------------------------------------------------------
    log_level: str = "INFO"
    log_format: str = Field(default="json", pattern=r"^(json|text)$")

    _split_hosts = field_validator("allowed_hosts", "allowed_origins", "trusted_proxies",
                                   mode="before")(_split_csv)

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        import ipaddress

        try:
            return [str(ipaddress.ip_network(item, strict=False)) for item in value]
        except ValueError as exc:
            raise ValueError(f"KDBL_TRUSTED_PROXIES: {exc}") from None

    @field_validator("model_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    def require_database_url(self, hint: str = "or use kdbl-control --data-dir DIR") -> str:
        if self.database_url is None:
            from kdbl_core.errors import ConfigError

            raise ConfigError(f"KDBL_DATABASE_URL is not set ({hint})")
        return self.database_url.get_secret_value()


_current: Settings | None = None


def load_settings(**overrides: Any) -> Settings:
    """Read the environment now (an entry point, once at start), with `overrides` winning; later
    `get_settings()` calls return the result."""
    global _current
    _current = Settings(**overrides)
    return _current


def get_settings() -> Settings:
    """The process's settings: what the entry point loaded, else the environment read on this first call."""
    return _current if _current is not None else load_settings()


def named_env(name: str) -> str | None:
    """The variable a CLI flag or a source's `credentials.env` names (its name is data, not a setting);
    read when asked, so a value set after start (a mounted Secret's env in tests) is seen."""
    return os.environ.get(name)


def set_library_default(name: str, value: str) -> None:
    """Give a variable a default in this process's environment for a C library that reads it from there when
    it loads (OMP_THREAD_LIMIT for libtesseract); a value the operator set stays. Writing, not configuration."""
    os.environ.setdefault(name, value)


def child_env(extra: Mapping[str, str] | None = None, *, keep: Callable[[str], bool] | None = None) -> dict[str, str]:
    """The environment for a child process: this one's (only the names `keep` accepts, when given) plus
    `extra`. Handing variables on is not configuration; it lives here so that no other module reads
    os.environ."""
    return {**{k: v for k, v in os.environ.items() if keep is None or keep(k)}, **(extra or {})}
