"""Tool inputs and outputs as pydantic models: the JSON Schemas advertised in tools/list derive from them.

Limits and defaults are the skills reference's (search limit 20/100, file text 5000 chunks, ...).

Arguments are checked strictly: numbers must be JSON integers and flags JSON booleans (`limit: true`,
`limit: "5"` and `explain: "yes"` are refused, not coerced); dates must be ISO 8601 strings (a number,
or a string of digits such as "10000000000", is not read as a Unix time), and one without a zone is
read as UTC, so a call may mix both; no text argument may hold NUL or a lone surrogate (PostgreSQL text
cannot store either: the call used to fail inside the database); every integer that reaches SQL has an
upper bound within its column's type (a chunk number past 2**31 - 1 gave `integer out of range`); a
cursor is never empty (an empty one used to read as "the first page"). Arguments that contradict each
other are refused naming one of them (raised as InvalidArgument from the model's validator, which
pydantic lets through): an empty date range, `source_id` with `source_ids`, `content_type` with
`content_types`.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, StrictBool, StrictInt, Tag,
    model_validator,
)

from kdbl_core.content.uris import MAX_SEQ
from kdbl_core.errors import InvalidArgument
from kdbl_core.search.answer import DEFAULT_MAX_TOKENS
from kdbl_core.search.lexical import Filters

MAX_FILE_TEXT_CHUNKS = 5000
# get_file_text's bound in UTF-8 bytes of chunk text (~250k tokens; a 3 MB file used to answer 9.5 MB):
# beyond it the result is `truncated` with `next_start` for get_file_window
MAX_FILE_TEXT_BYTES = 1_000_000
# get_file_window's default text budget in characters (~4,000 tokens): an agent's read, not a whole file. 40
# chunks (the reference's default length) were 48 KB of text in issue 28's corpus and answered 214 KB; a
# local 8k-context model could not take them, and Claude Code warns past 10,000 tokens of tool output.
WINDOW_CHARS = 16_000


def _storable(value: str) -> str:
    """Text PostgreSQL can store: no NUL, no lone surrogate (neither can reach a text column)."""
    if "\x00" in value:
        raise ValueError("must not contain NUL (\\u0000) characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("must not contain lone surrogate characters") from None
    return value


_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def _iso_string(value: Any) -> Any:
    # pydantic would read a number, or a string of digits, as a Unix timestamp; the contract says ISO 8601
    if not isinstance(value, str) or not _ISO_DATE.match(value):
        raise ValueError("must be an ISO 8601 date or date-time string (YYYY-MM-DD[THH:MM:SS[zone]])")
    return value


def _utc_if_naive(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


Text = Annotated[str, AfterValidator(_storable)]
IsoDateTime = Annotated[datetime, BeforeValidator(_iso_string), AfterValidator(_utc_if_naive)]
Cursor = Field(default=None, min_length=1, max_length=2048,
               description="Opaque next_cursor from a previous page.")


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)


class RequestMeta(BaseModel):
    """Every tool result's `meta` (kdbl_api.request_meta fills it; the server adds it to each result)."""

    # parts and their meaning: docs/clients.md ("What clients get back"); kept short, every outputSchema holds it
    request_id: str = Field(description="The X-Request-Id response header; quote it when reporting a problem.")
    took_ms: dict[str, float] = Field(description="Server milliseconds by part, and total.")
    cache_hit: bool


def _meta_required(schema: dict[str, Any]) -> None:
    schema.setdefault("required", []).append("meta")


class _Result(BaseModel):
    """A tool result: the server sets `meta` on every one (handlers leave it None)."""

    model_config = ConfigDict(json_schema_extra=_meta_required)
    meta: RequestMeta | None = None


SearchMode = Literal["hybrid", "lexical", "semantic", "graph"]
ResponseMode = Literal["ids_only", "metadata", "preview", "full"]


class SearchFilters(_Args):
    """The filters every searching tool takes (search_content, find_similar, answer); `filters()` gives the
    search pipeline's Filters. All apply inside each arm, before its top-N."""

    source_id: UUID | None = Field(default=None, description="Restrict to one source.")
    path: Text | None = Field(default=None, max_length=4096, description="Only keys starting with this prefix.")
    content_type: Text | None = Field(
        default=None, max_length=255, description="MIME type, or a family such as 'text/*' or 'application'.")
    source_ids: list[UUID] | None = Field(
        default=None, min_length=1, max_length=100, description="Restrict to any of these sources.")
    content_types: list[Annotated[Text, Field(min_length=1, max_length=255)]] | None = Field(
        default=None, min_length=1, max_length=32, description="Any of these MIME types or families.")
    authors: list[Annotated[Text, Field(min_length=1, max_length=200)]] | None = Field(
        default=None, min_length=1, max_length=32, description="Files by any of these authors (a whole name or "
        "e-mail address, case-insensitive).")
    labels: list[Annotated[Text, Field(min_length=1, max_length=200)]] | None = Field(
        default=None, min_length=1, max_length=32, description="Files carrying any of these labels (exact).")
    modified_after: IsoDateTime | None = Field(
        default=None, description="ISO 8601; files modified at/after (no zone: UTC).")
    modified_before: IsoDateTime | None = Field(
        default=None, description="ISO 8601; files modified before (no zone: UTC).")

    @model_validator(mode="after")
    def _consistent(self) -> SearchFilters:
        if self.modified_after and self.modified_before and self.modified_after >= self.modified_before:
            raise InvalidArgument("modified_after", "must be earlier than modified_before")
        if self.source_id is not None and self.source_ids is not None:
            raise InvalidArgument("source_ids", "give source_id or source_ids, not both")
        if self.content_type is not None and self.content_types is not None:
            raise InvalidArgument("content_types", "give content_type or content_types, not both")
        return self

    def filters(self) -> Filters:
        return Filters(source_id=self.source_id, path=self.path, content_type=self.content_type,
                       modified_after=self.modified_after, modified_before=self.modified_before,
                       source_ids=tuple(self.source_ids or ()), content_types=tuple(self.content_types or ()),
                       authors=tuple(self.authors or ()), labels=tuple(self.labels or ()))


class SearchContentArgs(SearchFilters):
    query: Text = Field(min_length=1, description="What to look for. Lead with the most distinctive terms; "
                        "a \"quoted phrase\" must occur as written (words adjacent, in order).")
    limit: StrictInt = Field(default=20, ge=1, le=100, description="Number of hits (1-100).")
    mode: SearchMode = Field(
        default="hybrid", description="hybrid (semantic + keyword, fused; default), lexical (keyword only: "
        "faster, exact terms), semantic (meaning only: embeddings, no keyword match needed) or graph (keywords + "
        "the chunks naming the entities the query names).")
    explain: StrictBool = Field(default=False, description="Add each hit's per-arm ranks and scores.")
    rationale: StrictBool | None = Field(default=None, description=(
        "Say why each hit matched (query words and entities it holds, each arm's rank). Default: on for graph."))
    response_mode: ResponseMode | None = Field(
        default=None, description="How much of each hit: ids_only (chunk_id, rank, score), metadata (+ file, "
        "uri, title, seq, total_chunks, locators, content_type, mtime, token_count), preview (+ snippet, "
        "~200-character preview, context_header) or full (+ window text, url, per-arm scores). Omitted: the "
        "classic hit (text, snippet, locators, url, rank).")
    fields: list[Text] | None = Field(
        default=None, min_length=1, max_length=32, description="Only these hit fields (a whitelist from the "
        "response_mode's fields; without response_mode, from full's).")
    cursor: Text | None = Field(default=None, min_length=1, max_length=2048, description=(
        "next_cursor of the previous page of this same search (limit may change). Refused as 'stale: ...' once "
        "the index changed: start over without it."))


class FileRefArgs(_Args):
    source_id: UUID = Field(description="The file's source id (from a hit or list_sources).")
    key: Text = Field(min_length=1, max_length=4096, description=(
        "The file's key within the source; an archive member or e-mail attachment is "
        "'<parent key>!/<member path>', e.g. 'bundle.zip!/docs/a.md'."))


class FileWindowArgs(FileRefArgs):
    start: StrictInt = Field(default=0, ge=0, le=10_000_000, description="0-based chunk index to start at.")
    length: StrictInt = Field(default=40, ge=1, le=200, description="Chunks to return at most (1-200).")
    max_chars: StrictInt = Field(default=WINDOW_CHARS, ge=100, le=MAX_FILE_TEXT_BYTES, description=(
        f"Characters of text at most (default {WINDOW_CHARS:,}, ~{WINDOW_CHARS // 4:,} tokens; at least one chunk)."))
    cursor: Text | None = Field(default=None, min_length=1, max_length=2048,
                               description="next_cursor of a previous window; overrides start.")


class ListSourcesArgs(_Args):
    cursor: Text | None = Cursor
    limit: StrictInt = Field(default=50, ge=1, le=200, description="Sources per page (1-200).")


class ListFilesArgs(_Args):
    source_id: UUID = Field(description="The source to browse (see list_sources).")
    cursor: Text | None = Cursor
    limit: StrictInt = Field(default=50, ge=1, le=200, description="Files per page (1-200).")


class HitExplain(BaseModel):
    lexical_rank: int | None
    lexical_score: float | None
    vector_rank: int | None
    vector_score: float | None
    graph_rank: int | None = None
    graph_score: float | None = None
    fused: float
    pinned_identifier: bool


class RationaleEntity(BaseModel):
    name: str
    type: str


class ArmRanks(BaseModel):
    keyword: int | None
    vector: int | None
    graph: int | None


class HitRationale(BaseModel):
    """The query's words and entities the chunk holds; its rank in each arm (null: not a candidate)."""

    terms: list[str]
    entities: list[RationaleEntity]
    ranks: ArmRanks
    pinned_identifier: bool


class Duplicate(BaseModel):
    """Another place of a hit's text (the same text, white space and case aside)."""

    source_id: str
    key: str
    uri: str
    seq: int
    page_no: int | None


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
    duplicates: list[Duplicate] | None = Field(default=None, description=(
        "Other places of this hit's text (copies), not listed as hits."))
    explain: HitExplain | None = Field(default=None, description="Present when explain=true.")
    rationale: HitRationale | None = None


class HitScores(BaseModel):
    keyword: float | None = Field(description="The BM25 arm's score (None: not in its candidates).")
    vector: float | None = Field(description="The vector arm's cosine similarity (None: not in its candidates).")
    fused: float = Field(description="The score the hits are ordered by.")


class ModeHit(BaseModel):
    """A hit of an explicit response_mode: the mode's fields (kdbl_api.tools.hit_fields), or the `fields`
    chosen from them; every field is optional here because `fields` may leave any out."""

    model_config = ConfigDict(extra="forbid")
    chunk_id: str = Field(default=None, description="Stable: <source_id>/<encoded key>/<seq>.")
    rank: int = Field(default=None, description="1-based position in this result.")
    score: float = Field(default=None, description="Relevance (the classic hit's `rank`).")
    chunk_uri: str = Field(default=None, description="kdbl://chunk/<source_id>/<encoded key>/<seq>.")
    source_id: str = None  # type: ignore[assignment]
    key: str = None  # type: ignore[assignment]
    uri: str = Field(default=None, description="The file's kdbl://file/ URI.")
    title: str | None = None
    seq: int = Field(default=None, description="The chunk's 0-based index in its file.")
    total_chunks: int = Field(default=None, description="The file's chunk count.")
    page_no: int | None = None
    char_start: int = None  # type: ignore[assignment]
    char_end: int = None  # type: ignore[assignment]
    ts_start_ms: int | None = None
    ts_end_ms: int | None = None
    content_type: str | None = None
    mtime: str | None = Field(default=None, description="ISO 8601.")
    token_count: int | None = Field(default=None, description=(
        "The matched chunk's text in the embedding model's tokens (an estimate where the indexer has no "
        "model): what reading it costs. Null for chunks indexed before token counts existed."))
    duplicates: list[Duplicate] = Field(default=None, description=(
        "Other places of this hit's text (copies), not listed as hits; [] for none."))
    snippet: str = None  # type: ignore[assignment]
    preview: str = Field(default=None, description="The chunk's first ~200 characters, plain text.")
    context_header: str | None = Field(default=None, description=(
        "The heading path above the chunk, outermost first, joined by ' > ' (Markdown/HTML headings, DOCX "
        "heading styles, the PDF outline); null when the file has none."))
    text: str = None  # type: ignore[assignment]
    truncated: bool = None  # type: ignore[assignment]
    url: str | None = None
    scores: HitScores = None  # type: ignore[assignment]
    rationale: HitRationale = None  # type: ignore[assignment]


class SearchContentResult(_Result):
    hits: list[Hit | ModeHit] = Field(description="Classic hits, or response_mode hits when one was asked for.")
    mode: SearchMode = Field(description="The mode actually used.")
    degraded: bool = Field(description=(
        "True when lexical served a semantic mode, or hybrid ranked candidates without a vector by keywords."))
    degraded_reason: str | None = Field(default=None, description="Why, when degraded.")
    has_more: bool = Field(default=False, description="More hits follow: pass next_cursor to get them.")
    next_cursor: str | None = Field(default=None, description="The next page's cursor (null on the last page).")
    total_available: int = Field(default=0, description=(
        "Hits this search can page through: exact when total_available_is_exact, else a lower bound."))
    total_available_is_exact: bool = Field(default=True, description="Whether total_available is exact.")
    capped: bool = Field(default=False, description=(
        "Paging stops here at the candidate cap (KDBL_HYBRID_DEPTH hits): deeper hits are not served; "
        "narrow the query or the filters instead."))


AnswerType = Literal["extractive", "abstractive"]


class AnswerArgs(SearchFilters):
    question: Text = Field(min_length=1, description="The question, in the corpus's own words where you can.")
    answer_type: AnswerType = Field(default="extractive", description=(
        "extractive (default: no model, fast, every sentence quoted verbatim from a source with its exact "
        "range) or abstractive (a local chat model writes the answer from the numbered passages the search "
        "returned, citing them as [n]; only where the server has a chat model)."))
    max_tokens: StrictInt = Field(default=DEFAULT_MAX_TOKENS, ge=16, le=4096, description=(
        "Longest answer in tokens (16-4096; extractive estimates 4 characters a token)."))
    citations: StrictBool = Field(default=True, description="Cite the sources ([n] markers and `citations`).")


class Citation(BaseModel):
    n: int = Field(description="The [n] marker in the answer.")
    source_id: str
    key: str
    uri: str = Field(description="The file's kdbl://file/ URI.")
    chunk_id: str
    chunk_uri: str = Field(description="kdbl://chunk/<source_id>/<encoded key>/<seq>.")
    seq: int
    char_start: int = Field(description="Offset in the file's extracted text (get_file_text's text).")
    char_end: int = Field(description="End offset: text[char_start:char_end] is `text`.")
    page_no: int | None
    ts_start_ms: int | None
    ts_end_ms: int | None
    text: str = Field(description="The cited text: the sentence (extractive) or the passage (abstractive).")
    url: str | None = Field(description="A signed download link to the original, when downloads are on.")


class AnswerResult(_Result):
    answer: str = Field(description="The answer; 'Not found in the sources.' when nothing answers.")
    answer_type: AnswerType
    found: bool = Field(description="False when the sources hold no answer (then no citations).")
    citations: list[Citation]
    finish_reason: Literal["stop", "length", "timeout", "cancelled"] = Field(description=(
        "stop: complete; length: cut at max_tokens; timeout: KDBL_CHAT_TIMEOUT_S ran out (abstractive)."))
    tokens: int = Field(description="The answer's tokens (the model's; extractive: estimated).")
    model: str | None = Field(description="The chat model (abstractive), else null.")
    mode: SearchMode = Field(description="The search mode that found the sources.")
    degraded: bool
    degraded_reason: str | None


class ChunkOut(BaseModel):
    seq: int
    text: str
    page_no: int | None
    char_start: int
    char_end: int
    ts_start_ms: int | None
    ts_end_ms: int | None


class FileTextResult(_Result):
    source_id: str
    key: str
    uri: str
    status: Literal["pending", "ok", "partial", "failed", "skipped"]
    status_reason: str | None
    content_type: str | None
    title: str | None
    chunks: list[ChunkOut]
    total_chunks: int
    truncated: bool = Field(description="More chunks exist than returned (5000 chunks or 1 MB of text).")
    next_start: int | None = Field(
        default=None, description="When truncated: the seq to continue from with get_file_window's `start`.")


class WindowChunk(BaseModel):
    seq: int
    offset: int = Field(description="Where this chunk's text starts in `text`.")
    length: int
    page_no: int | None
    char_start: int
    char_end: int
    ts_start_ms: int | None
    ts_end_ms: int | None


class WindowInfo(BaseModel):
    start: int
    returned: int
    chars: int = Field(description="Characters of text returned (max_chars bounds it).")


class FileWindowResult(_Result):
    source_id: str
    key: str
    uri: str
    chunks: list[WindowChunk] = Field(description="Each chunk's place in `text` and in the document.")
    total_chunks: int
    window: WindowInfo
    has_more: bool
    next_cursor: str | None
    text: str = Field(description="The window's chunks, in order, separated by a blank line.")


class FileMetadataResult(_Result):
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
    authors: list[str] = Field(description="Who wrote it, from the document's own properties (PDF Author, "
                               "Office/EPUB creator, e-mail From name and address, HTML meta author).")
    labels: list[str] = Field(description="Its source's labels (config labels, label_globs) and its own tags "
                              "(Markdown front matter).")


class EmbeddingProgress(BaseModel):
    embedded: int = Field(description="Chunks embedded with the API's current model.")
    total: int
    active: bool = Field(description="Hybrid is on for this source and an embedder is deployed.")
    chunks_per_s: float | None = Field(default=None, description=(
        "How fast the tenant's embedders wrote vectors over the last two minutes (all its sources); null "
        "when none is running."))
    eta_s: float | None = Field(default=None, description=(
        "Seconds until every chunk of the tenant's hybrid sources, this one's included, is embedded at "
        "that rate: 0 when none is pending, null when no embedder is running."))


class SourceOut(BaseModel):
    source_id: str
    name: str
    protocol: str
    enabled: bool
    hybrid_enabled: bool
    last_indexed_at: datetime | None
    file_count: int
    embedding: EmbeddingProgress


class ListSourcesResult(_Result):
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


class ListFilesResult(_Result):
    source_id: str
    files: list[FileOut]
    next_cursor: str | None


# ---- get_contents (issue 17) ------------------------------------------------------------------------
class ContentRef(_Args):
    """A file (source_id + key) or, with seq, one of its chunks."""

    source_id: UUID
    key: Text = Field(min_length=1, max_length=4096)
    seq: StrictInt | None = Field(default=None, ge=0, le=MAX_SEQ,
                                  description="A chunk of the file (0-based); omit for the file.")


class Expand(_Args):
    neighbours: StrictInt = Field(default=0, ge=0, le=10, description="Chunks either side of a chunk id (0-10).")
    graph: StrictInt = Field(default=0, ge=0, le=2, description=(
        "Named entities around each item (0-2 hops): 1, the entities it names (up to 25) and the relations its "
        "sentences state; 2, also each entity's 3 closest partners elsewhere (CO_OCCURS, with evidence)."))


def _id_form(value: Any) -> str:
    return "object" if isinstance(value, dict) else "string"


# Tagged by the JSON type, so a refusal names the form that was sent ("ids.0.object.seq: less than or equal
# to 2147483647"), not the first of both forms' errors ("ids.0.<validator chain>: a valid string").
ContentId = Annotated[Annotated[Annotated[Text, Field(min_length=1, max_length=8192)], Tag("string")]
                      | Annotated[ContentRef, Tag("object")], Discriminator(_id_form)]


class GetContentsArgs(_Args):
    ids: list[ContentId] = Field(
        min_length=1, max_length=100, description=(
            "1-100 ids, answered in this order: a file (kdbl://file/... uri, or {source_id, key}) or a chunk "
            "(chunk_id from a search hit, kdbl://chunk/... uri, or {source_id, key, seq})."))
    expand: Expand | None = Field(default=None, description=(
        "neighbours: chunks either side of each chunk id; graph: the named entities around each item (0-2 hops)."))
    max_chars_per_item: StrictInt = Field(default=4000, ge=100, le=100_000, description=(
        "Characters of text per item (100-100,000; all items together at most 1,000,000: the effective "
        "value is in the result). A file gives its leading chunks, a chunk itself then its neighbours."))


class ContentItem(BaseModel):
    id: str = Field(description="The id as given (an object id: its kdbl:// uri).")
    found: bool = Field(description="False when it does not exist or you may not see it (the two look alike).")
    kind: Literal["file", "chunk"]
    reason: str | None = None
    source_id: str | None = None
    key: str | None = None
    uri: str | None = None
    chunk_id: str | None = None
    chunk_uri: str | None = None
    seq: int | None = None
    title: str | None = None
    content_type: str | None = None
    status: str | None = None
    total_chunks: int | None = None
    mtime: str | None = Field(default=None, description="ISO 8601.")
    chunks: list[ChunkOut] | None = Field(default=None, description="The text, chunk by chunk.")
    truncated: bool | None = Field(default=None, description="The budget (or the read's bound) cut it.")
    next_start: int | None = Field(default=None, description="A file's: get_file_window start to read on.")
    graph: ContentGraph | None = Field(default=None, description="expand.graph: the entities around it.")


class GetContentsResult(_Result):
    items: list[ContentItem]
    found: int = Field(description="Items found (visible).")
    max_chars_per_item: int = Field(description="The budget each item had (the asked one, or less for many ids).")


# ---- find_similar (issue 17) ------------------------------------------------------------------------
class SimilarSubject(_Args):
    kind: Literal["text", "chunk", "file"]
    text: Text | None = Field(default=None, min_length=1, max_length=20_000, description="kind text: the text.")
    id: Text | None = Field(default=None, min_length=1, max_length=8192, description=(
        "kind chunk: a chunk_id or kdbl://chunk/... uri; kind file: a kdbl://file/... uri."))


class FindSimilarArgs(SearchFilters):
    subject: SimilarSubject = Field(description=(
        "What to find more of: {kind: 'text', text}, {kind: 'chunk', id} or {kind: 'file', id}."))
    by: Literal["chunks", "files"] = Field(default="chunks", description="Rank chunks, or files (best chunk each).")
    limit: StrictInt = Field(default=10, ge=1, le=100, description="Number of hits (1-100).")


class SimilarHit(BaseModel):
    rank: int
    score: float = Field(description="Cosine similarity (method vector) or BM25 (lexical).")
    source_id: str
    key: str
    uri: str
    title: str | None
    content_type: str | None
    chunk_id: str = Field(description="The matching chunk (by files: the file's best).")
    chunk_uri: str
    seq: int
    page_no: int | None
    char_start: int
    char_end: int
    ts_start_ms: int | None
    ts_end_ms: int | None
    preview: str = Field(description="The chunk's first ~200 characters.")


class FindSimilarResult(_Result):
    hits: list[SimilarHit]
    by: Literal["chunks", "files"]
    method: Literal["vector", "lexical"] = Field(description=(
        "vector: the subject's embedding; lexical: more-like-this over its most distinctive terms."))
    method_reason: str | None = Field(description="Why lexical, when vectors were not used.")
    terms: list[str] = Field(description="The lexical method's terms (indexed form); empty for vector.")


EntityType = Literal["PERSON", "ORG", "PLACE", "PRODUCT", "EVENT", "DATE", "MONEY"]


class FindEntityArgs(_Args):
    name: Text = Field(min_length=1, max_length=200, description=(
        "The entity's name (case, punctuation and legal suffixes do not matter: 'Acme Corp.' = 'ACME Corporation')."))
    type: EntityType | None = Field(default=None, description="Only an entity of this type (needed when a name "
                                    "has several, e.g. a PERSON and a PLACE).")
    response_mode: ResponseMode = Field(default="metadata", description=(
        "ids_only (entity and relationship ids), metadata (statistics and type distributions, the top 3 chunks), "
        "preview (+ the 5 closest entities and relationships, 5 chunks) or full (up to 100 entities and 500 "
        "relationships with evidence, 10 chunks)."))
    include_relationships: StrictBool = Field(default=True, description="Include relationships (and their ids).")


class EntityRef(BaseModel):
    entity_id: str
    name: str
    entity_type: EntityType
    shared_chunks: int | None = Field(default=None, description="Chunks naming both it and the entity asked for.")


class EntityEvidence(BaseModel):
    chunk_id: str
    chunk_uri: str
    uri: str = Field(description="The file's kdbl:// uri.")


class EntityRelationship(BaseModel):
    relationship_id: str
    source_id: str = Field(description="One entity's entity_id.")
    target_id: str = Field(description="The other's entity_id.")
    relationship_type: Literal["ACQUIRED", "PARTNERS_WITH", "COMPETES_WITH", "LOCATED_IN", "WORKS_FOR", "CO_OCCURS"] = \
        Field(description="A relation a sentence states (source_id is its subject: source ACQUIRED target), or "
              "CO_OCCURS: named in the same chunks.")
    weight: int = Field(description="Chunks stating it (typed) or naming both (CO_OCCURS).")
    evidence: list[EntityEvidence] = Field(description="Those chunks (up to 3).")


class EntityStatistics(BaseModel):
    mentions: int
    chunks: int
    files: int
    related_from_chunks: int = Field(description=(
        "The chunks entity_count and the CO_OCCURS relationships were counted over: all of them, or the 1,000 "
        "most recent for a name in more."))
    entity_count: int = Field(description="Entities named in the same chunks.")
    relationship_count: int
    entity_type_distribution: dict[str, int]
    relationship_type_distribution: dict[str, int]


class EntityChunk(BaseModel):
    chunk_id: str
    chunk_uri: str
    uri: str
    source_id: str
    key: str
    seq: int
    page_no: int | None
    mentions: int
    preview: str


class FindEntityResult(_Result):
    name: str = Field(description="The name asked for.")
    response_mode: ResponseMode
    entity: EntityRef
    entity_ids: list[str] | None = Field(description="ids_only: the entity's and its related entities' ids.")
    relationship_ids: list[str] | None
    statistics: EntityStatistics | None
    entities: list[EntityRef] | None = Field(description="preview / full: the closest related entities.")
    relationships: list[EntityRelationship] | None
    top_chunks: list[EntityChunk] | None = Field(description="Chunks naming the entity, most mentions first: read on "
                                                 "with get_file_window or get_contents.")


class ContentGraph(BaseModel):
    entities: list[EntityRef] = Field(description="Named here (shared_chunks: its mentions here), then their "
                                      "partners elsewhere (hop 2; shared_chunks null).")
    relationships: list[EntityRelationship] = Field(description="Stated in this item's sentences; hop 2: CO_OCCURS.")


ContentItem.model_rebuild()
GetContentsResult.model_rebuild()


def _nullable(node: dict[str, Any], output: bool) -> dict[str, Any]:
    """pydantic's `anyOf: [X, {type: null}]` of an optional field, shorter. An argument: X alone (leaving it
    out is how a client says "none"; the server still takes an explicit null). A result field: X's type
    widened to [T, "null"] where X is one plain type, else the anyOf as it was."""
    options = node.get("anyOf")
    if not (isinstance(options, list) and len(options) == 2 and {"type": "null"} in options):
        return node
    [inner] = [o for o in options if o != {"type": "null"}]
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    if not output:
        return {**inner, **rest}
    if isinstance(inner.get("type"), str) and "$ref" not in inner:
        return {**inner, "type": [inner["type"], "null"], **rest}
    return node


def _noise(key: str, value: Any, output: bool) -> bool:
    """What tools/list need not carry: titles, `default: null`, and a result's descriptions (clients validate
    results against the schema; models read the arguments' descriptions, and the fields of a result are
    described in docs/clients.md)."""
    if key == "title" or (output and key == "description"):
        return isinstance(value, str)
    return key == "default" and value is None


def schema_of(model: type[BaseModel], *, output: bool = False) -> dict[str, Any]:
    """A compact JSON Schema for tools/list (issue 28: tools/list was 26-28 KB): no titles, no `default: null`
    (_noise), optional fields without pydantic's anyOf-with-null (_nullable); required properties first (a
    model that takes shared filters, SearchFilters, lists its own `query` before them: a reader sees what it
    must send). `output`: a result's schema (nullable fields stay nullable, no descriptions)."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return _nullable({k: strip(v) for k, v in node.items() if not _noise(k, v, output)}, output)
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    schema = strip(model.model_json_schema())
    if output and "meta" in schema.get("properties", {}):  # the server sets it on every result
        schema["properties"]["meta"] = {"$ref": "#/$defs/RequestMeta"}
    required = schema.get("required") or []
    if isinstance(schema.get("properties"), dict) and required:
        props = schema["properties"]
        schema["properties"] = {k: props[k] for k in required if k in props} | {
            k: v for k, v in props.items() if k not in required}
    return schema
