"""Tool inputs and outputs as pydantic models: the JSON Schemas advertised in tools/list derive from them.

Limits and defaults are the skills reference's (search limit 20/100, file text 5000 chunks, ...).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

MAX_FILE_TEXT_CHUNKS = 5000
Cursor = Field(default=None, max_length=2048, description="Opaque next_cursor from a previous page.")


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)


class SearchContentArgs(_Args):
    query: str = Field(min_length=1, description="What to look for. Lead with the most distinctive terms.")
    source_id: UUID | None = Field(default=None, description="Restrict to one source.")
    limit: int = Field(default=20, ge=1, le=100, description="Number of hits (1-100).")
    mode: Literal["hybrid", "lexical", "vector"] = Field(
        default="hybrid", description="hybrid (semantic + keyword, fused; default), lexical (keyword only: "
        "faster, exact terms) or vector (semantic arm only, for evaluation).")
    path: str | None = Field(default=None, max_length=4096, description="Only keys starting with this prefix.")
    content_type: str | None = Field(
        default=None, max_length=255, description="MIME type, or a family such as 'text/*' or 'application'.")
    modified_after: datetime | None = Field(default=None, description="ISO 8601; files modified at/after.")
    modified_before: datetime | None = Field(default=None, description="ISO 8601; files modified before.")
    explain: bool = Field(default=False, description="Add each hit's per-arm ranks and scores.")


class FileRefArgs(_Args):
    source_id: UUID = Field(description="The file's source id (from a hit or list_sources).")
    key: str = Field(min_length=1, max_length=4096, description="The file's key within the source.")


class FileWindowArgs(FileRefArgs):
    start: int = Field(default=0, ge=0, le=10_000_000, description="0-based chunk index to start at.")
    length: int = Field(default=40, ge=1, le=200, description="Chunks to return (1-200).")
    cursor: str | None = Field(default=None, max_length=2048,
                               description="next_cursor of a previous window; overrides start.")


class ListSourcesArgs(_Args):
    cursor: str | None = Cursor
    limit: int = Field(default=50, ge=1, le=200, description="Sources per page (1-200).")


class ListFilesArgs(_Args):
    source_id: UUID = Field(description="The source to browse (see list_sources).")
    cursor: str | None = Cursor
    limit: int = Field(default=50, ge=1, le=200, description="Files per page (1-200).")


class HitExplain(BaseModel):
    lexical_rank: int | None
    lexical_score: float | None
    vector_rank: int | None
    vector_score: float | None
    fused: float
    pinned_identifier: bool


class Hit(BaseModel):
    source_id: str
    key: str
    seq: int
    uri: str
    text: str
    truncated: bool
    snippet: str
    page_no: int | None
    char_start: int
    char_end: int
    ts_start_ms: int | None
    ts_end_ms: int | None
    url: str | None
    rank: float
    explain: HitExplain | None = Field(default=None, description="Present when explain=true.")


class SearchContentResult(BaseModel):
    hits: list[Hit]
    mode: Literal["hybrid", "lexical", "vector"] = Field(description="The mode actually used.")
    degraded: bool = Field(description="True when a semantic mode was requested but lexical served it.")
    degraded_reason: str | None = Field(default=None, description="Why, when degraded.")


class ChunkOut(BaseModel):
    seq: int
    text: str
    page_no: int | None
    char_start: int
    char_end: int
    ts_start_ms: int | None
    ts_end_ms: int | None


class FileTextResult(BaseModel):
    source_id: str
    key: str
    uri: str
    status: Literal["pending", "ok", "partial", "failed", "skipped"]
    status_reason: str | None
    content_type: str | None
    title: str | None
    chunks: list[ChunkOut]
    total_chunks: int
    truncated: bool


class WindowInfo(BaseModel):
    start: int
    returned: int


class FileWindowResult(BaseModel):
    source_id: str
    key: str
    uri: str
    chunks: list[ChunkOut]
    total_chunks: int
    window: WindowInfo
    has_more: bool
    next_cursor: str | None
    text: str


class FileMetadataResult(BaseModel):
    source_id: str
    key: str
    uri: str
    size: int | None
    mtime: datetime | None
    etag: str | None
    storage_class: str | None
    owner: str | None
    content_type: str | None
    mode: str | None = Field(description="POSIX permission bits in octal, e.g. '0644', where captured.")
    uid: int | None
    gid: int | None
    title: str | None
    status: str
    status_reason: str | None
    total_chunks: int
    indexed_at: datetime | None
    url: str | None


class EmbeddingProgress(BaseModel):
    embedded: int = Field(description="Chunks embedded with the API's current model.")
    total: int
    active: bool = Field(description="Hybrid is on for this source and an embedder is deployed.")


class SourceOut(BaseModel):
    source_id: str
    name: str
    protocol: str
    enabled: bool
    hybrid_enabled: bool
    last_indexed_at: datetime | None
    file_count: int
    embedding: EmbeddingProgress


class ListSourcesResult(BaseModel):
    sources: list[SourceOut]
    next_cursor: str | None


class FileOut(BaseModel):
    key: str
    uri: str
    size: int | None
    mtime: datetime | None
    content_type: str | None
    status: str
    total_chunks: int


class ListFilesResult(BaseModel):
    source_id: str
    files: list[FileOut]
    next_cursor: str | None


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """A compact JSON Schema (no titles) for tools/list."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if not (k == "title" and isinstance(v, str))}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return strip(model.model_json_schema())
