"""find_similar: more like this — chunks or files near a text, a chunk or a file (kdbl_core.search.similar
picks the method: stored vectors when the tenant may use them, else a lexical more-like-this), the subject
left out. A subject the caller cannot see is -32602 on `subject.id`, the same as one that does not exist.
A subject names its kind's one field: a text subject with an `id`, or a chunk or file subject with a
`text`, is refused naming the extra field (either could be what the caller meant)."""

from __future__ import annotations

from typing import Any

from kdbl_api.audit import AuditFacts
from kdbl_api.tools.context import ToolContext
from kdbl_api.tools.models import FindSimilarArgs
from kdbl_core.content.uris import CHUNK_PREFIX, PREFIX, chunk_id, chunk_uri, file_uri, parse_chunk_uri, parse_file_uri
from kdbl_core.errors import InvalidArgument
from kdbl_core.search import similar
from kdbl_core.search.snippets import preview


def _subject(args: FindSimilarArgs) -> similar.Subject:
    subject = args.subject
    if subject.kind == "text":
        if subject.text is None or not subject.text.strip():
            raise InvalidArgument("subject.text", "kind 'text' needs a non-blank text")
        if subject.id is not None:
            raise InvalidArgument("subject.id", "kind 'text' takes a text, not an id")
        return similar.Subject("text", text=subject.text)
    if subject.text is not None:
        raise InvalidArgument("subject.text", f"kind '{subject.kind}' takes an id, not a text")
    if subject.id is None:
        raise InvalidArgument("subject.id", f"kind '{subject.kind}' needs an id")
    try:
        if subject.kind == "file":
            source_id, key = parse_file_uri(subject.id)
            return similar.Subject("file", source_id=source_id, key=key)
        value = subject.id if subject.id.startswith(CHUNK_PREFIX) else CHUNK_PREFIX + subject.id
        if subject.id.startswith(PREFIX):
            raise InvalidArgument("uri", "a file uri names a file: use kind 'file'")
        source_id, key, seq = parse_chunk_uri(value)
        return similar.Subject("chunk", source_id=source_id, key=key, seq=seq)
    except InvalidArgument as exc:
        raise InvalidArgument("subject.id", exc.reason) from None


async def find_similar(ctx: ToolContext, args: FindSimilarArgs) -> tuple[dict[str, Any], AuditFacts]:
    subject = _subject(args)
    found = await similar.find(ctx.conn, subject, args.filters(), by=args.by, limit=args.limit,
                               ts_config=ctx.settings.text_search_config,
                               vectors_allowed="hybrid" in ctx.policy.modes, embedder=ctx.services.embedder,
                               exhaustive=ctx.settings.bm25_exhaustive,
                               native=ctx.settings.bm25_native, terms_k=ctx.settings.similar_terms)
    facts = await similar.hit_facts(ctx.conn, found.hits)
    hits = []
    for rank, hit in enumerate(found.hits, 1):
        row = facts[hit.chunk_id]
        hits.append({"rank": rank, "score": round(hit.score, 6), "source_id": str(hit.source_id), "key": hit.key,
                     "uri": file_uri(hit.source_id, hit.key), "title": row.title, "content_type": row.content_type,
                     "chunk_id": chunk_id(hit.source_id, hit.key, hit.seq),
                     "chunk_uri": chunk_uri(hit.source_id, hit.key, hit.seq), "seq": hit.seq,
                     "page_no": row.page_no, "char_start": row.char_start, "char_end": row.char_end,
                     "ts_start_ms": row.ts_start_ms, "ts_end_ms": row.ts_end_ms, "preview": preview(row.head)})
    audit = AuditFacts(source_ids=[h["source_id"] for h in hits], keys=[h["key"] for h in hits],
                       row_count=len(hits), mode=f"find_similar_{found.method}")  # /capacity: its own latency
    return {"hits": hits, "by": args.by, "method": found.method, "method_reason": found.method_reason,
            "terms": found.terms}, audit
