"""search_content's response modes and field selection: how much of each hit an agent pays for.

Modes nest (each adds to the one before), so an agent can find with `ids_only`, look with `metadata` or
`preview`, and read with `full` or get_file_window:

- ids_only: chunk_id, rank (1-based position), score (the classic hit's `rank` value)
- metadata: + chunk_uri, source_id, key, uri, title, seq, total_chunks, locators, content_type, mtime,
  token_count (the matched chunk's text in the embedding model's tokens, what reading it costs; an
  estimate where the worker has no model, kdbl_worker.token_counts; null for chunks indexed before 0015),
  duplicates (the other places of the hit's text, collapsed into it: search.duplicates; [] for none)
- preview:  + snippet, preview (the chunk's first ~200 characters), context_header (the heading path
  above the chunk, "Guide > Install": Markdown/HTML/ODT/EPUB headings, DOCX heading styles, the PDF
  outline; null where the file has none or was indexed before 0015)
- full:     + text (the ~1,800-character neighbour window), truncated, url, scores (keyword, vector, fused)

Measured (docs/clients.md, embedding model's tokenizer, 10 hits): ids_only is about a fourteenth of
full's tokens on SciFact. Without response_mode the hit keeps the reference's shape exactly; `fields`
without response_mode picks from full's fields. metadata and up cost one more statement (file facts
and the chunk's head, windows.hit_facts); ids_only none.
"""

from __future__ import annotations

from typing import Any

from kdbl_core.content.uris import chunk_id, chunk_uri, file_uri
from kdbl_core.errors import InvalidArgument
from kdbl_core.search.snippets import preview
from kdbl_core.search.windows import HitFacts

_IDS = ("chunk_id", "rank", "score")
_METADATA = _IDS + ("chunk_uri", "source_id", "key", "uri", "title", "seq", "total_chunks", "page_no",
                    "char_start", "char_end", "ts_start_ms", "ts_end_ms", "content_type", "mtime", "token_count",
                    "duplicates")
_PREVIEW = _METADATA + ("snippet", "preview", "context_header")
_FULL = _PREVIEW + ("text", "truncated", "url", "scores")
MODE_FIELDS: dict[str, tuple[str, ...]] = {"ids_only": _IDS, "metadata": _METADATA, "preview": _PREVIEW,
                                           "full": _FULL}
_LOCATORS = ("seq", "page_no", "char_start", "char_end", "ts_start_ms", "ts_end_ms", "snippet", "text",
             "truncated", "source_id", "key", "uri", "url")


def selection(response_mode: str | None, fields: list[str] | None) -> tuple[str, ...] | None:
    """The hit fields to return, in the mode's order; None for the classic hit. InvalidArgument naming
    `fields` (with the valid ones) for a field the mode does not offer."""
    if response_mode is None and fields is None:
        return None
    offered = MODE_FIELDS[response_mode or "full"]
    if fields is None:
        return offered
    unknown = [f for f in fields if f not in offered]
    if unknown:
        raise InvalidArgument("fields", f"{', '.join(unknown)} not offered by response_mode "
                              f"{response_mode or 'full'}; valid: {', '.join(offered)}")
    wanted = set(fields)
    return tuple(f for f in offered if f in wanted)


def needs_facts(chosen: tuple[str, ...]) -> bool:
    return any(f in chosen for f in ("title", "total_chunks", "content_type", "mtime", "preview",
                                     "context_header", "token_count"))


def shape(hits: list[dict[str, Any]], chosen: tuple[str, ...],
          facts: dict[tuple[str, str, int], HitFacts], *, offset: int = 0) -> list[dict[str, Any]]:
    """Hits as the pipeline returns them (with `explain` when `scores` is chosen), cut to `chosen`.
    `rank` is the 1-based position in the whole ranking: a cursor page starting at `offset` goes on
    from offset + 1."""
    out = []
    for position, hit in enumerate(hits, offset + 1):
        sid, key, seq = hit["source_id"], hit["key"], hit["seq"]
        fact = facts.get((sid, key, seq))
        row: dict[str, Any] = {}
        for name in chosen:
            if name == "chunk_id":
                row[name] = chunk_id(sid, key, seq)
            elif name == "rank":
                row[name] = position
            elif name == "score":
                row[name] = hit["rank"]
            elif name == "chunk_uri":
                row[name] = chunk_uri(sid, key, seq)
            elif name == "uri":
                row[name] = file_uri(sid, key)
            elif name in _LOCATORS:
                row[name] = hit[name]
            elif name == "preview":
                row[name] = preview(fact.head) if fact is not None else ""
            elif name == "scores":
                e = hit.get("explain") or {}
                row[name] = {"keyword": e.get("lexical_score"), "vector": e.get("vector_score"),
                             "fused": e.get("fused", hit["rank"])}
            elif name == "rationale":  # asked for by the tool's `rationale`, not offered by a mode
                row[name] = hit.get("rationale")
            elif name == "duplicates":
                row[name] = hit.get("duplicates") or []
            elif name == "total_chunks":
                row[name] = fact.total_chunks if fact is not None else 0
            else:  # title, content_type, mtime, context_header, token_count
                row[name] = getattr(fact, name) if fact is not None else None
        out.append(row)
    return out
