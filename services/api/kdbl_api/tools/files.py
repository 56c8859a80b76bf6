"""Reading files: get_file_text (whole, bounded), get_file_window (a sliding read), get_file_metadata.

get_file_window reads `length` chunks (the reference's 40 by default) within `max_chars` characters of text
(16,000 by default, issue 28: 40 chunks were 48 KB of text and answered 214 KB, the text four times), at
least one chunk so that a read always advances; `has_more` and `next_cursor` go on from where the budget
stopped it. Its text is in its chunks, once: the joined `text` beside them repeated every character."""

from __future__ import annotations

from typing import Any

from kdbl_api.audit import AuditFacts
from kdbl_api.tools.context import ToolContext
from kdbl_api.tools.models import (
    MAX_FILE_TEXT_BYTES,
    MAX_FILE_TEXT_CHUNKS,
    FileMetadataResult,
    FileRefArgs,
    FileTextResult,
    FileWindowArgs,
    FileWindowResult,
)
from kdbl_core.content import reads
from kdbl_core.content.uris import file_uri
from kdbl_core.errors import InvalidArgument


async def load_visible_file(ctx: ToolContext, args: FileRefArgs) -> dict[str, Any]:
    if await reads.get_source(ctx.conn, args.source_id) is None:
        raise InvalidArgument("source_id", f"unknown source {args.source_id} (or not visible to you)")
    row = await reads.get_file(ctx.conn, args.source_id, args.key)
    if row is None:
        raise InvalidArgument("key", f"no file '{args.key}' in source {args.source_id} (or not visible to you)")
    return row


def _read(args: FileRefArgs, row_count: int) -> AuditFacts:
    return AuditFacts(source_ids=(str(args.source_id),), keys=(args.key,), row_count=row_count)


def within_chars(chunks: list[dict[str, Any]], max_chars: int) -> list[dict[str, Any]]:
    """The leading chunks whose text fits `max_chars` characters (at least one: a read always advances)."""
    used = 0
    for n, chunk in enumerate(chunks):
        used += len(chunk["text"])
        if used > max_chars and n > 0:
            return chunks[:n]
    return chunks


def within_bytes(chunks: list[dict[str, Any]], max_bytes: int) -> list[dict[str, Any]]:
    """The leading chunks whose text fits `max_bytes` of UTF-8 (at least one: a read always advances)."""
    used = 0
    for n, chunk in enumerate(chunks):
        text = chunk["text"]
        used += len(text) if text.isascii() else len(text.encode("utf-8"))
        if used > max_bytes and n > 0:
            return chunks[:n]
    return chunks


async def file_text(ctx: ToolContext, args: FileRefArgs) -> tuple[dict[str, Any], AuditFacts]:
    row = await load_visible_file(ctx, args)
    chunks = within_bytes(await reads.file_chunks(ctx.conn, row["id"], limit=MAX_FILE_TEXT_CHUNKS),
                          MAX_FILE_TEXT_BYTES)
    truncated = row["chunk_count"] > len(chunks)
    return FileTextResult(
        source_id=str(args.source_id), key=args.key, uri=file_uri(args.source_id, args.key),
        status=row["status"], status_reason=row["status_reason"], content_type=row["content_type"],
        title=row["title"], chunks=chunks, total_chunks=row["chunk_count"], truncated=truncated,
        next_start=chunks[-1]["seq"] + 1 if truncated and chunks else (0 if truncated else None),
    ).model_dump(mode="json"), _read(args, len(chunks))


get_file_text = file_text


async def get_file_window(ctx: ToolContext, args: FileWindowArgs) -> tuple[dict[str, Any], AuditFacts]:
    row = await load_visible_file(ctx, args)
    start = args.start
    listing = f"window:{args.source_id}:{args.key}"
    if args.cursor is not None:
        start = int(ctx.services.cursors.decode(args.cursor, ctx.principal, listing)["start"])
    total = row["chunk_count"]
    if start > total:
        raise InvalidArgument("start", f"beyond the end of the file ({total} chunks)")
    chunks = within_chars(await reads.file_chunks(ctx.conn, row["id"], start=start, limit=args.length),
                          args.max_chars)
    end = start + len(chunks)
    has_more = end < total
    text, placed = _joined(chunks)
    return FileWindowResult(
        source_id=str(args.source_id), key=args.key, uri=file_uri(args.source_id, args.key), chunks=placed,
        total_chunks=total, window={"start": start, "returned": len(chunks), "chars": len(text)},
        has_more=has_more, text=text,
        next_cursor=ctx.services.cursors.encode(ctx.principal, listing, {"start": end}) if has_more else None,
    ).model_dump(mode="json"), _read(args, len(chunks))


WINDOW_SEPARATOR = "\n\n"


def _joined(chunks: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The window's `text` (the contract's field: each chunk's text once, in order) and each chunk's place
    in it; the chunks carry locators, not their text again (a default window was the text three times)."""
    parts, placed, offset = [], [], 0
    for chunk in chunks:
        body = chunk["text"]
        placed.append({**{k: v for k, v in chunk.items() if k != "text"}, "offset": offset, "length": len(body)})
        parts.append(body)
        offset += len(body) + len(WINDOW_SEPARATOR)
    return WINDOW_SEPARATOR.join(parts), placed


async def get_file_metadata(ctx: ToolContext, args: FileRefArgs) -> tuple[dict[str, Any], AuditFacts]:
    row = await load_visible_file(ctx, args)
    return FileMetadataResult(
        source_id=str(args.source_id), key=args.key, uri=file_uri(args.source_id, args.key), size=row["size"],
        mtime=row["mtime"], etag=row["etag"], storage_class=row["storage_class"], owner=row["owner"],
        content_type=row["content_type"], mode=None if row["mode"] is None else f"{row['mode']:04o}",
        uid=row["uid"], gid=row["gid"], title=row["title"], status=row["status"],
        status_reason=row["status_reason"], total_chunks=row["chunk_count"], indexed_at=row["indexed_at"],
        url=ctx.download_url(str(args.source_id), args.key), authors=row["authors"], labels=row["labels"],
    ).model_dump(mode="json"), _read(args, 1)
