"""How a tool result becomes MCP content: structuredContent and the content blocks, per client (issue 28).

Every result is a JSON object that holds each text once (a window's or get_contents' text lives in its
chunks, never also joined beside them). Which blocks carry it depends on what the client reads:

- ``json`` (the default): structuredContent, validated against the tool's outputSchema, and its compact
  JSON as one text block — the MCP spec's backwards-compatible mirror (2025-06-18 on: a tool with an
  outputSchema SHOULD also return the serialized JSON as text) and all that Open WebUI, LibreChat, mcpo
  and most chat front ends hand their model — plus resource links: each cited file once (search_content,
  answer) or the file read. get_file_text's block is the exception: a summary without the chunk texts,
  and the text itself once as an embedded resource (the JSON repeating it made a 3 MB file 9.5 MB).
  The text travels twice, once for each kind of client, because the server cannot tell which kind it has.
- ``summary``: structuredContent and a short text block (the result's counts and small fields, long
  strings and lists left to structuredContent) plus the same resource links, no embedded resource: each
  text once per response. For clients that read structuredContent; a client asks for it with the request
  header ``X-Kdbl-Text-Block: summary`` (Claude Code, VS Code, Cursor, Open WebUI and LibreChat can all
  send a configured header). Nothing guesses it: a client that only reads text would get a summary.
- ``text``: a client that negotiated a protocol before 2025-06-18 (``MCP-Protocol-Version: 2025-03-26``
  or ``2024-11-05``), where structuredContent and outputSchema do not exist: neither is sent (tools/list
  leaves outputSchema out too) and the ``json`` blocks carry the result alone, each text once.

Why not client info: in the handshake era (up to 2025-11-25) clientInfo comes in `initialize` only, which
a stateless server never sees again on a tools/call; and no client the project knows of hands its model
structuredContent instead of the text, so a list of names would be a guess that costs a wrong guess its
information. A request without ``MCP-Protocol-Version`` (curl, scripts: the spec says to assume
2025-03-26) gets ``json``: sending both costs bytes, never information. Measured bytes per call:
docs/clients.md ("Result sizes").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import mcp_types as types
import orjson
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS, is_version_at_least

HEADER = "x-kdbl-text-block"
STRUCTURED_SINCE = "2025-06-18"  # structuredContent and outputSchema appear in this revision
SUMMARY_STRING = 512  # a summary keeps strings up to this long (ids, cursors, reasons), not texts

Rendering = Literal["json", "summary", "text"]


def rendering(headers: Mapping[str, str] | None) -> Rendering:
    """What this request's client reads: the negotiated protocol first, then its explicit choice."""
    if headers is None:
        return "json"
    version = headers.get("mcp-protocol-version")
    if version in KNOWN_PROTOCOL_VERSIONS and not is_version_at_least(version, STRUCTURED_SINCE):
        return "text"
    return "summary" if headers.get(HEADER, "").strip().lower() == "summary" else "json"


def text_mime_type(content_type: str | None) -> str:
    """The MIME type of a file's extracted text: markdown stays markdown, everything else is plain text.

    resources/list, resources/read and get_file_text's embedded resource all use it, so a client that
    renders by MIME type sees the same type for the same text."""
    return "text/markdown" if content_type == "text/markdown" else "text/plain"


def _json(value: Any) -> types.TextContent:
    return types.TextContent(text=orjson.dumps(value).decode())


def summary_of(structured: dict[str, Any]) -> dict[str, Any]:
    """The result without its texts: lists as their lengths, long strings as theirs, small fields as they are."""
    out: dict[str, Any] = {"result": "in structuredContent"}
    for key, value in structured.items():
        if isinstance(value, list):
            out[key] = len(value)
        elif isinstance(value, str) and len(value) > SUMMARY_STRING:
            out[key] = f"{len(value):,} characters"
        else:
            out[key] = value
    return out


def file_text_blocks(structured: dict[str, Any], how: Rendering) -> list[types.ContentBlock]:
    """get_file_text's text once: the embedded resource carries it, the JSON block everything else.

    The JSON block used to repeat every chunk's text, and the resource the whole text again (a 3 MB file
    answered 9.5 MB). A client without structuredContent reads the text from the resource, one with it
    from `chunks` (and asking for `summary` gets no resource)."""
    chunks = structured["chunks"]
    summary = {k: v for k, v in structured.items() if k != "chunks"}
    summary["chunks_returned"] = len(chunks)
    if how == "summary":
        return [_json({"result": "in structuredContent", **summary})]
    summary["text"] = "in the embedded resource below" + (
        " (structuredContent.chunks has it chunk by chunk)" if how == "json" else "")
    body = "\n\n".join(c["text"] for c in chunks)
    return [_json(summary), types.EmbeddedResource(resource=types.TextResourceContents(
        uri=structured["uri"], mime_type=text_mime_type(structured["content_type"]), text=body))]


# Citations, per tool (registry.ToolSpec.links): each cited file once, or the file a tool read, as resource
# links in their wire form (`resource_link`: the dict a ResourceLink model dumps to, built without the model:
# ~2 µs a link, 20 a search; the SDK validates the whole result against the protocol's CallToolResult anyway)
Links = Callable[[dict[str, Any]], list[dict[str, Any]]]
# A tool's own blocks, replacing the JSON block and the links (registry.ToolSpec.blocks: get_file_text)
Blocks = Callable[[dict[str, Any], Rendering], list[types.ContentBlock]]


def resource_link(uri: str, name: str, mime_type: str) -> dict[str, Any]:
    """A ResourceLink content block as `model_dump(by_alias=True, mode="json", exclude_none=True)` writes it."""
    return {"name": name, "uri": uri, "mimeType": mime_type, "type": "resource_link"}


def hit_links(structured: dict[str, Any]) -> list[dict[str, Any]]:
    """search_content: each hit's file once (a response_mode or `fields` may leave the uri out)."""
    links: list[dict[str, Any]] = []
    seen: set[str] = set()
    for hit in structured["hits"]:
        uri = hit.get("uri")
        if uri is None or uri in seen:
            continue
        seen.add(uri)
        links.append(resource_link(uri, hit.get("key", uri), "text/plain"))
    return links


def citation_links(structured: dict[str, Any]) -> list[dict[str, Any]]:
    """answer: each cited file once."""
    return [resource_link(uri, key, "text/plain")
            for uri, key in dict.fromkeys((c["uri"], c["key"]) for c in structured["citations"])]


def file_link(structured: dict[str, Any]) -> list[dict[str, Any]]:
    """The file a tool read, when its result names one (the default)."""
    if "uri" not in structured:
        return []
    return [resource_link(structured["uri"], structured["key"], structured.get("content_type") or "text/plain")]


def tool_result(structured: dict[str, Any], how: Rendering, *, links: Links = file_link,
                own: Blocks | None = None) -> dict[str, Any]:
    """A tool's CallToolResult as the client reads it (module docstring): its own blocks when it has them,
    else the JSON block (or its summary) and its links. Returned in its wire shape (a dict the SDK takes as
    it is and checks against the protocol version's CallToolResult once, in its own serialisation): built as
    a CallToolResult model, the ~46 KB of a 20-hit search was walked once more (model_dump) before the SDK's
    own walks."""
    if own is not None:
        content = [block.model_dump(by_alias=True, mode="json", exclude_none=True) for block in own(structured, how)]
    else:  # the JSON block in its wire form ({"type": "text", "text": ...}), then the links (already wire form)
        content = [{"type": "text", "text": orjson.dumps(summary_of(structured) if how == "summary" else structured
                                                         ).decode()}, *links(structured)]
    result: dict[str, Any] = {"content": content}
    if how != "text":
        result["structuredContent"] = structured
    return {**result, **_RESULT_FIELDS}


# The fields a CallToolResult model adds by default (isError false, and whatever this SDK's protocol
# revisions require, e.g. resultType), read from the SDK once.
_RESULT_FIELDS = {key: value for key, value in types.CallToolResult(content=[]).model_dump(
    by_alias=True, mode="json", exclude_none=True).items() if key not in ("content", "structuredContent")}


def listed(tool: types.Tool, how: Rendering) -> types.Tool:
    """A tool as tools/list shows it to this client: no outputSchema where the protocol has none."""
    return tool.model_copy(update={"output_schema": None}) if how == "text" else tool
