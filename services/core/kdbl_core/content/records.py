"""The one file record and the one chunk record of the write path, from a source's listing to the rows.

A connector lists a file as a `FileMeta` (its stat: size, mtime, etag, storage class, owner, mode); the
crawl queue keeps it with the queue item (kdbl_worker.jobs: `ItemRow` queues one, `ItemClaim` hands it
back with its lease) and the writer (kdbl_core.content.store) stores it in `files` with the content type
that extraction found. A `Chunk` is what kdbl_worker.chunking cuts and what the writer stores in
`chunks`. Before issue 15 the file was defined four times (RemoteFile, FileMeta, ItemRow, ItemClaim)
and the chunk twice (chunking.Chunk, content.ChunkRow), field for field the same.

Plain dataclasses, standard library only: the sandbox's extraction children import chunking, and with
it this module, without loading the database driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class FileMeta:
    """A file as its source lists it (`content_type` is known once it is extracted; None before)."""

    key: str
    size: int | None = None
    mtime: datetime | None = None
    etag: str | None = None
    storage_class: str | None = None
    owner: str | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    content_type: str | None = None
    # the share's permissions for this file (kdbl_core.access.share_acl.FileAccess), listed for a source
    # whose permissions come from the share; typed loosely: content and access are sibling zones
    access: Any = None
    permission_set: int | None = None  # those permissions' permission_sets.id (kdbl_core.access.share_sets)
    # what says whether those permissions may have changed (an SMB file's change time), and
    # kdbl_core.access.share_acl.UNCHANGED as `access` where the connector did not read them again
    access_stamp: str | None = None


@dataclass(frozen=True, slots=True)
class Chunk:
    """A slice `text[char_start:char_end]` of a file's extracted text, with its page / time locators,
    the heading path above it (`context_header`, "Guide > Install"; None where the format has none) and
    its length in the embedding model's tokens (`text_tokens`, kdbl_worker.token_counts; None: not counted)."""

    seq: int
    text: str
    char_start: int
    char_end: int
    page_no: int | None = None
    ts_start_ms: int | None = None
    ts_end_ms: int | None = None
    context_header: str | None = None
    text_tokens: int | None = None
