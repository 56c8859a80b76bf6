"""Crawling a folder whose file names are not all UTF-8: every file indexed, URIs round-trip, exact bytes."""

from __future__ import annotations

import os

import pytest
from helpers import crawl, db_of, make_corpus
from sqlalchemy import text
from starlette.testclient import TestClient

from kdbl_core.content.uris import file_uri, parse_file_uri
from kdbl_core.settings import Settings
from kdbl_worker.connectors import connector_for
from kdbl_worker.connectors.fs import key_from_bytes, key_to_bytes
from kdbl_worker.fetch import create_fetch_app

TOKEN = "fetch-token-" + "n" * 32
NAMES = [b"caf\xe9.txt", b"\xff\xfe.md", b"sp ace.txt", b"hash#1.txt", b"per%cent 100%.txt", b"what?.txt",
         "\u00fcn\u00ef/\u6587\u6863.md".encode(), b"r\xe9sum\xe9s/cv \xff.txt"]


def body(raw: bytes) -> bytes:
    return b"marmot notes for " + raw.hex().encode()


@pytest.fixture
def corpus(owner_engine, worker_engine, tmp_path, unique):
    root = tmp_path / f"names-{unique}"
    for raw in NAMES:
        path = os.path.join(os.fsencode(root), raw)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            out.write(body(raw))
    return make_corpus(owner_engine, worker_engine, root, {}, tenant=f"names-{unique}")


def _indexed(owner_engine, corpus) -> dict[str, tuple[str, str]]:
    with owner_engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT f.key, f.status, (SELECT string_agg(c.text, ' ') FROM chunks c WHERE c.file_id = f.id) AS body "
            "FROM files f WHERE f.source_id = :s"), {"s": corpus.source_id}).all()
    return {r.key: (r.status, r.body) for r in rows}


def test_every_name_is_indexed_under_a_reversible_key(owner_engine, worker_engine, corpus):
    files = _indexed(owner_engine, corpus)
    assert {key_to_bytes(k) for k in files} == set(NAMES)
    assert files[key_from_bytes(b"caf\xe9.txt")] == ("ok", "marmot notes for 636166e92e747874")
    for key, (status, _) in files.items():
        assert status == "ok", key
        assert parse_file_uri(file_uri(corpus.source_id, key)) == (corpus.source_id, key)
    stats = crawl(worker_engine, corpus)  # an unchanged re-crawl: nothing re-indexed, no problems
    assert (stats.listed, stats.indexed, stats.problems) == (len(NAMES), 0, [])


def test_open_and_internal_fetch_return_the_exact_bytes(owner_engine, worker_engine, corpus):
    connector = connector_for("fs", {"root": str(corpus.root)})
    client = TestClient(create_fetch_app(Settings(internal_fetch_token=TOKEN), db_of(worker_engine)))
    for key in _indexed(owner_engine, corpus):
        expected = body(key_to_bytes(key))
        with connector.open(key) as stream:
            assert stream.read() == expected
        _, parsed = parse_file_uri(file_uri(corpus.source_id, key))
        response = client.get("/internal/files", params={"source_id": str(corpus.source_id), "key": parsed},
                              headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 200 and response.content == expected, key
