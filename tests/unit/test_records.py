"""One file record and one chunk record for the write path (kdbl_core.content.records), from a connector's
listing through the crawl queue to the rows; extraction children load them without the database driver."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = (REPO / "services", REPO / "operator")


def _dataclasses_with(fields: set[str]) -> set[str]:
    """module:class of every dataclass in the services that declares all of `fields`."""
    found = set()
    for root in ROOTS:
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.ClassDef):
                    continue
                if not any("dataclass" in ast.unparse(d) for d in node.decorator_list):
                    continue
                names = {n.target.id for n in node.body
                         if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
                if fields <= names:
                    found.add(f"{path.relative_to(REPO).as_posix()}:{node.name}")
    return found


def test_a_files_listing_stat_is_declared_once():
    # was RemoteFile (connectors), FileMeta (content), ItemRow, ItemClaim and GivenUp (jobs)
    assert _dataclasses_with({"key", "size", "mtime", "etag"}) == {"services/core/kdbl_core/content/records.py:FileMeta"}


def test_a_chunk_is_declared_once():
    # was chunking.Chunk and content.ChunkRow, field for field the same
    assert _dataclasses_with({"seq", "text", "char_start", "char_end"}) == {
        "services/core/kdbl_core/content/records.py:Chunk"}


def test_chunking_and_the_connectors_load_the_records_without_the_database_driver():
    code = ("import sys, kdbl_worker.chunking, kdbl_worker.connectors.fs, kdbl_worker.sidecars; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'psycopg_pool', 'sqlalchemy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
