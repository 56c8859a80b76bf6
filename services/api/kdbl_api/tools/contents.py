"""get_contents: many files and chunks hydrated in one call (kdbl_core.content.contents: one statement).

Ids come as the other tools hand them out — a search hit's chunk_id, kdbl://chunk/ and kdbl://file/ uris —
or as objects {source_id, key[, seq]}. A malformed id is -32602 naming `ids[i]`; an id that is well formed
but missing or hidden is an item with found=false and the same reason either way (no existence oracle:
tests/integration/test_get_contents.py probes it across tenants and per-file grants). All items together
hold at most TOTAL_CHARS characters of text: many ids get a smaller budget each, said in the result.
An item's text is in its chunks, once (issue 28: the joined `text` beside them sent every character twice).
"""

from __future__ import annotations

from typing import Any

from kdbl_api.audit import AuditFacts
from kdbl_api.tools import entity
from kdbl_api.tools.context import ToolContext
from kdbl_api.tools.models import ContentRef, GetContentsArgs
from kdbl_core.content import contents
from kdbl_core.content.uris import CHUNK_PREFIX, PREFIX, chunk_id, chunk_uri, file_uri, parse_chunk_uri, parse_file_uri
from kdbl_core.errors import InvalidArgument
from kdbl_core.search import entity_graph

TOTAL_CHARS = 1_000_000  # as get_file_text's bound (MAX_FILE_TEXT_BYTES)
NOT_FOUND = "not found (or not visible to you)"


def _ref(value: str | ContentRef, neighbours: int, field: str) -> tuple[contents.Ref, str, str]:
    """(the reference, its id as answered, its kind); InvalidArgument naming `field` when malformed."""
    if isinstance(value, ContentRef):
        ref = contents.Ref(value.source_id, value.key, value.seq, neighbours if value.seq is not None else 0)
        shown = file_uri(ref.source_id, ref.key) if ref.seq is None else chunk_uri(ref.source_id, ref.key, ref.seq)
        return ref, shown, "file" if ref.seq is None else "chunk"
    try:
        if value.startswith(PREFIX):
            source_id, key = parse_file_uri(value)
            ref = contents.Ref(source_id, key)
        else:
            source_id, key, seq = parse_chunk_uri(value if value.startswith(CHUNK_PREFIX) else CHUNK_PREFIX + value)
            ref = contents.Ref(source_id, key, seq, neighbours)
    except InvalidArgument as exc:
        raise InvalidArgument(field, f"{exc.reason} (a chunk_id, a kdbl://chunk/ or kdbl://file/ uri, or an "
                                     "object {source_id, key, seq})") from None
    if len(ref.key) > 4096:  # NUL and a seq past int4: refused by the parsers (kdbl_core.content.uris)
        raise InvalidArgument(field, "the key part is longer than 4096 characters")
    return ref, value, "file" if ref.seq is None else "chunk"


async def get_contents(ctx: ToolContext, args: GetContentsArgs) -> tuple[dict[str, Any], AuditFacts]:
    neighbours = args.expand.neighbours if args.expand else 0
    parsed = [_ref(value, neighbours, f"ids[{i}]") for i, value in enumerate(args.ids)]
    budget = min(args.max_chars_per_item, TOTAL_CHARS // len(parsed))
    found = await contents.read(ctx.conn, [p[0] for p in parsed], budget=budget)
    items: list[dict[str, Any]] = []
    for (ref, shown, kind), item in zip(parsed, found):
        if item is None:
            items.append({"id": shown, "found": False, "kind": kind, "reason": NOT_FOUND})
            continue
        entry = {"id": shown, "found": True, "kind": kind, **item, "uri": file_uri(ref.source_id, ref.key)}
        if kind == "chunk":
            entry.update(chunk_id=chunk_id(ref.source_id, ref.key, ref.seq),
                         chunk_uri=chunk_uri(ref.source_id, ref.key, ref.seq), seq=ref.seq)
        if entry["mtime"] is not None:
            entry["mtime"] = entry["mtime"].isoformat()
        if args.expand is not None and args.expand.graph:
            entry["graph"] = entity.around_out(await entity_graph.around(ctx.conn, ref.source_id, ref.key, ref.seq,
                                                              args.expand.graph))
        items.append(entry)
    seen = [i for i in items if i["found"]]
    facts = AuditFacts(source_ids=[i["source_id"] for i in seen], keys=[i["key"] for i in seen], row_count=len(seen),
                       mode="get_contents")  # /capacity: its latency
    return {"items": items, "found": len(seen), "max_chars_per_item": budget}, facts
