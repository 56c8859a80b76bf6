"""The tool table: name, scope, argument/result models, handler (the content blocks: kdbl_api.tools.blocks)."""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from pydantic import BaseModel

from kdbl_api.audit import AuditFacts
from kdbl_api.tools import answer, blocks, browse, contents, entity, files, search, similar
from kdbl_api.tools.context import Services, ToolContext
from kdbl_api.tools.models import (
    AnswerArgs,
    AnswerResult,
    FileMetadataResult,
    FileRefArgs,
    FileTextResult,
    FileWindowArgs,
    FileWindowResult,
    FindEntityArgs,
    FindEntityResult,
    FindSimilarArgs,
    FindSimilarResult,
    GetContentsArgs,
    GetContentsResult,
    ListFilesArgs,
    ListFilesResult,
    ListSourcesArgs,
    ListSourcesResult,
    SearchContentArgs,
    SearchContentResult,
    schema_of,
)
from kdbl_core.access.policy import TenantPolicy
from kdbl_core.access.principal import SCOPE_READ, SCOPE_SEARCH
from kdbl_core.db.async_pool import Statement

# a handler returns its result and what the audit row says it did
Handler = Callable[[ToolContext, Any], Awaitable[tuple[dict[str, Any], AuditFacts]]]
# a handler's first statement, built from its validated arguments before the transaction opens and sent
# with its BEGIN (one round trip fewer); it may refuse the arguments first (InvalidArgument)
Opening = Callable[[Services, TenantPolicy, Any], Statement | None]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    title: str
    description: str
    scope: str
    args: type[BaseModel]
    result: type[BaseModel]
    handler: Handler
    opening: Opening | None = None  # the handler finds the answered statement in ToolContext.opened
    # how this server describes the tool in tools/list, when that depends on what it has (answer without a
    # chat model offers extractive answers only); None: its definition as it is
    offered: Callable[[Services, types.Tool], types.Tool] | None = None
    # sends partial results as progress notifications (ToolContext.progress): a call carrying a progress
    # token is answered on an SSE stream (kdbl_api.front_door.dispatch); every other tool's calls stay one JSON body
    streams: bool = False
    # the result's content blocks (kdbl_api.tools.blocks): its citations beside the JSON block, or blocks of its own
    links: blocks.Links = blocks.file_link
    own_blocks: blocks.Blocks | None = None

    def definition(self) -> types.Tool:
        return types.Tool(
            name=self.name, title=self.title, description=self.description,
            input_schema=schema_of(self.args), output_schema=schema_of(self.result, output=True),
            annotations=types.ToolAnnotations(title=self.title, read_only_hint=True, destructive_hint=False,
                                              idempotent_hint=True, open_world_hint=False),
        )


def _extractive_only(tool: types.Tool) -> types.Tool:
    """answer on a server without a chat model: listed (extractive answers need none, and an agent only calls
    what it is shown), with abstractive left out of answer_type and the description saying why."""
    schema = copy.deepcopy(tool.input_schema)
    kind = schema["properties"]["answer_type"]
    kind["enum"] = ["extractive"]
    kind["description"] = "extractive only: this server has no chat model for abstractive answers."
    return tool.model_copy(update={"input_schema": schema, "description": tool.description + (
        " This server has no chat model: extractive answers only.")})


TOOLS: dict[str, ToolSpec] = {spec.name: spec for spec in (
    ToolSpec(
        name="search_content", title="Search content", scope=SCOPE_SEARCH,
        description=(
            "Search the extracted content you may see (start here). Keyword arm is OR-over-terms weighted by "
            "rarity: lead with the most distinctive terms. Each hit has source_id/key/seq, `text` (the chunk "
            "plus neighbours; answer from it), a <mark> snippet, page/char/time locators and a kdbl:// uri "
            "to cite. If hits do not answer, reformulate with the corpus's own wording and search again. "
            "has_more: pass next_cursor for the next page."),
        args=SearchContentArgs, result=SearchContentResult, handler=search.search_content,
        opening=search.opening, links=blocks.hit_links,
    ),
    ToolSpec(
        name="get_file_text", title="Get file text", scope=SCOPE_READ,
        description=("A file's full extracted text as ordered chunks plus its extraction status "
                     "(ok/partial/failed/skipped). Bounded at 5000 chunks or 1 MB of text (`truncated`; "
                     "continue with get_file_window from `next_start`)."),
        args=FileRefArgs, result=FileTextResult, handler=files.get_file_text, own_blocks=blocks.file_text_blocks,
    ),
    ToolSpec(
        name="get_file_window", title="Read a window of a file", scope=SCOPE_READ,
        description=("A bounded sliding read over a file's chunks: start (0-based chunk, default 0), length "
                     "(default 40, max 200) and max_chars (default 16,000 characters), whichever ends first. "
                     "Returns chunks (text and locators each), total_chunks, window, has_more and next_cursor. "
                     "To read around a search hit, start a few chunks before its seq."),
        args=FileWindowArgs, result=FileWindowResult, handler=files.get_file_window,
    ),
    ToolSpec(
        name="get_file_metadata", title="File metadata", scope=SCOPE_READ,
        description=("Facts about one file: size, mtime, etag, storage class, owner, content type, POSIX "
                     "mode/uid/gid where captured, extraction status."),
        args=FileRefArgs, result=FileMetadataResult, handler=files.get_file_metadata,
    ),
    ToolSpec(
        name="list_sources", title="List sources", scope=SCOPE_READ,
        description="Sources you can access, paginated (limit default 50, max 200; pass next_cursor back).",
        args=ListSourcesArgs, result=ListSourcesResult, handler=browse.list_sources,
    ),
    ToolSpec(
        name="list_files", title="List files", scope=SCOPE_READ,
        description="Files within one source, ordered by key, paginated (limit default 50, max 200).",
        args=ListFilesArgs, result=ListFilesResult, handler=browse.list_files,
    ),
    # beyond the reference's six: listed and callable only where a tenant's allowlist names them
    ToolSpec(
        name="get_contents", title="Get many contents", scope=SCOPE_READ,
        description=("Read up to 100 files or chunks in one call, answered in order: ids are search hits' "
                     "chunk_id, kdbl://chunk/... or kdbl://file/... uris, or {source_id, key[, seq]}. "
                     "expand.neighbours adds chunks either side of a chunk; max_chars_per_item bounds each "
                     "item's text. An id you cannot see answers found=false."),
        args=GetContentsArgs, result=GetContentsResult, handler=contents.get_contents,
    ),
    ToolSpec(
        name="find_similar", title="Find similar", scope=SCOPE_SEARCH,
        description=("More like this: chunks (by='chunks') or files (by='files') similar to a subject — "
                     "{kind:'text', text}, {kind:'chunk', id: chunk_id} or {kind:'file', id: kdbl://file/...} "
                     "— never the subject itself; the search filters apply. `method` says how: the stored "
                     "embeddings (vector) or the subject's most distinctive terms (lexical)."),
        args=FindSimilarArgs, result=FindSimilarResult, handler=similar.find_similar,
    ),
    ToolSpec(
        name="answer", title="Answer with citations", scope=SCOPE_SEARCH,
        description=(
            "A grounded answer to a question from the documents you may see, with citations (file URI, chunk, "
            "exact char range). extractive (default): the sentences that best answer it, quoted verbatim; "
            "abstractive: written by the server's local model from the search's passages only, citing them as "
            "[n]. 'Not found in the sources.' (found=false) when nothing answers. Takes search_content's filters."),
        args=AnswerArgs, result=AnswerResult, handler=answer.answer,
        offered=lambda services, tool: tool if services.chat is not None else _extractive_only(tool), streams=True,
        links=blocks.citation_links,
    ),
    ToolSpec(
        name="find_entity", title="Find an entity", scope=SCOPE_SEARCH,
        description=(
            "Everything the documents you may read say about one named entity (a person, organisation, place, "
            "product, event, date or amount): how often and where it is named, the entities named beside it "
            "(CO_OCCURS relationships, weighted by shared chunks, with those chunks as evidence) and the chunks "
            "to read on. Names match whatever their case, punctuation or legal suffix. response_mode: ids_only, "
            "metadata (default), preview, full. An unknown name is an error with suggestions."),
        args=FindEntityArgs, result=FindEntityResult, handler=entity.find_entity,
    ),
)}


STREAMING_TOOLS = frozenset(spec.name for spec in TOOLS.values() if spec.streams)
