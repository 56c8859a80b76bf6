"""Reading files: get_file_text (whole document, bounded)."""

from __future__ import annotations

from typing import Any

from kdbl_api.tools.context import ToolContext
from kdbl_api.tools.models import MAX_FILE_TEXT_CHUNKS, FileRefArgs, FileTextResult
from kdbl_core.db import reads
from kdbl_core.errors import InvalidArgument
from kdbl_core.uris import file_uri


async def load_visible_file(ctx: ToolContext, args: FileRefArgs) -> dict[str, Any]:
    if await reads.get_source(ctx.conn, args.source_id) is None:
        raise InvalidArgument("source_id", f"unknown source {args.source_id} (or not visible to you)")
    row = await reads.get_file(ctx.conn, args.source_id, args.key)
    if row is None:
        raise InvalidArgument("key", f"no file '{args.key}' in source {args.source_id} (or not visible to you)")
    return row


async def get_file_text(ctx: ToolContext, args: FileRefArgs) -> dict[str, Any]:
    row = await load_visible_file(ctx, args)
    chunks = await reads.file_chunks(ctx.conn, row["id"], limit=MAX_FILE_TEXT_CHUNKS)
    ctx.source_ids.append(str(args.source_id))
    ctx.keys.append(args.key)
    ctx.row_count = len(chunks)
    result = FileTextResult(
        source_id=str(args.source_id), key=args.key, uri=file_uri(args.source_id, args.key),
        status=row["status"], status_reason=row["status_reason"], content_type=row["content_type"],
        title=row["title"], chunks=chunks, total_chunks=row["chunk_count"],
        truncated=row["chunk_count"] > len(chunks),
    )
    return result.model_dump(mode="json")
