"""File names that are not UTF-8: reversible keys, kdbl:// URIs that round-trip, exact bytes on open."""

from __future__ import annotations

import os
import random

import pytest
from kdbl_worker.connectors.fs import FsConnector, key_from_bytes, key_to_bytes

from kdbl_core.content.uris import file_uri, parse_file_uri

NAMES = [b"caf\xe9.txt", b"\xff\xfe.md", b"sp ace.txt", b"hash#1.txt", b"per%cent.txt", b"what?.txt",
         "\u00fcn\u00ef \u6587\u6863.md".encode(), b"dir\xe9/inner \x80.txt", b"a\xed\xb2\x80b.txt",
         "private \uef80\uefff.txt".encode()]


@pytest.mark.parametrize("raw", NAMES)
def test_every_name_has_a_utf8_key_that_maps_back_to_its_bytes(raw):
    key = key_from_bytes(raw)
    key.encode("utf-8")  # valid text for Postgres
    assert key_to_bytes(key) == raw
    source_id, parsed = parse_file_uri(file_uri("6f1c1c1e-3f4e-4d5b-9a7b-1d2e3f4a5b6c", key))
    assert parsed == key and str(source_id) == "6f1c1c1e-3f4e-4d5b-9a7b-1d2e3f4a5b6c"


def test_utf8_names_keep_their_key_and_bad_bytes_become_optu8_private_use_characters():
    assert key_from_bytes("\u00fcn\u00ef/\u6587\u6863 #1?.md".encode()) == "\u00fcn\u00ef/\u6587\u6863 #1?.md"
    assert key_from_bytes(b"caf\xe9.txt") == "caf\uefe9.txt"
    assert key_from_bytes(b"\xff\xfe.md") == "\uefff\ueffe.md"
    # a genuine U+EF80..U+EFFF is written as its UTF-8 bytes, so it cannot be mistaken for a raw byte
    assert key_from_bytes("\uef80".encode()) == "\uefee\uefbe\uef80"


def test_keys_are_one_to_one_over_random_byte_names():
    rng = random.Random(7)
    alphabet = b"ab/.\x80\xc3\xa9\xe2\x82\xac\xee\xbe\xbf\xff"  # ASCII, stray and valid UTF-8 bytes
    names = {bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(5000)}
    keys = {key_from_bytes(n): n for n in names}
    assert len(keys) == len(names)
    assert all(key_to_bytes(k) == n for k, n in keys.items())


def test_the_connector_lists_opens_and_resolves_non_utf8_names(tmp_path):
    root = os.fsencode(tmp_path)
    for raw in NAMES:
        path = os.path.join(root, raw)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            out.write(b"body of " + raw)
    connector = FsConnector(tmp_path)
    keys = {f.key: f for f in connector.walk()}
    assert not connector.problems.items
    assert {key_to_bytes(k) for k in keys} == set(NAMES)
    for key, listed in keys.items():
        raw = key_to_bytes(key)
        with connector.open(key) as stream:
            assert stream.read() == b"body of " + raw
        assert os.fsencode(connector.resolve(key)) == os.path.join(root, raw)
        assert listed.size == len(b"body of " + raw)
    with pytest.raises(FileNotFoundError):
        connector.resolve("../" + key_from_bytes(b"\xff.txt"))
