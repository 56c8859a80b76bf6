"""Tool inputs and outputs as pydantic models: the JSON Schemas advertised in tools/list derive from them.

Limits and defaults are the skills reference's (search limit 20/100, file text 5000 chunks, ...).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

MAX_FILE_TEXT_CHUNKS = 5000


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)


class SearchContentArgs(_Args):
    query: str = Field(min_length=1, description="What to look for. Lead with the most distinctive terms.")
    source_id: UUID | None = Field(default=None, description="Restrict to one source.")
    limit: int = Field(default=20, ge=1, le=100, description="Number of hits (1-100).")
    mode: Literal["hybrid", "lexical"] = Field(
        default="hybrid", description="hybrid (semantic + keyword, default) or lexical (keyword only).")
    path: str | None = Field(default=None, max_length=4096, description="Only keys starting with this prefix.")
    content_type: str | None = Field(
        default=None, max_length=255, description="MIME type, or a family such as 'text/*' or 'application'.")
    modified_after: datetime | None = Field(default=None, description="ISO 8601; files modified at/after.")
    modified_before: datetime | None = Field(default=None, description="ISO 8601; files modified before.")


class FileRefArgs(_Args):
    source_id: UUID = Field(description="The file's source id (from a hit or list_sources).")
    key: str = Field(min_length=1, max_length=4096, description="The file's key within the source.")


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


class SearchContentResult(BaseModel):
    hits: list[Hit]
    mode: Literal["hybrid", "lexical"] = Field(description="The mode actually used.")
    degraded: bool = Field(description="True when hybrid was requested but lexical served it.")


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


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """A compact JSON Schema (no titles) for tools/list."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if not (k == "title" and isinstance(v, str))}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return strip(model.model_json_schema())
