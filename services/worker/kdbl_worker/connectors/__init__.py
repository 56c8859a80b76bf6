"""Source connectors: one module per protocol, the same small interface (list, stat, open)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import BinaryIO, Protocol


@dataclass(frozen=True, slots=True)
class RemoteFile:
    key: str
    size: int
    mtime: datetime | None = None
    etag: str | None = None
    storage_class: str | None = None
    owner: str | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None


@dataclass(slots=True)
class ListingProblems:
    """Entries a listing could not use: recorded, never fatal."""

    items: list[tuple[str, str]] = field(default_factory=list)

    def add(self, where: str, why: str) -> None:
        self.items.append((where, why))


class Connector(Protocol):
    problems: ListingProblems

    def walk(self) -> Iterator[RemoteFile]: ...

    def open(self, key: str) -> BinaryIO: ...

    def check(self) -> None:
        """Raise SourceUnavailable when the source cannot be reached at all."""


def connector_for(protocol: str, config: dict) -> Connector:
    if protocol == "fs":
        from kdbl_worker.connectors.fs import FsConnector

        return FsConnector(config["root"])
    from kdbl_core.errors import PermanentError

    raise PermanentError(f"protocol '{protocol}' is not supported by this worker yet")
