"""Response-mode field selection, the chunk URI and the plain preview, without a server."""

from __future__ import annotations

import uuid

import pytest

from kdbl_api.tools.hit_fields import MODE_FIELDS, selection
from kdbl_core.content.uris import chunk_id, chunk_uri, parse_chunk_uri
from kdbl_core.errors import InvalidArgument
from kdbl_core.search.snippets import preview

SID = uuid.UUID("6f1c1c1e-3f4e-4d5b-9a7b-1d2e3f4a5b6c")


def test_each_mode_offers_every_field_of_the_mode_before_it():
    order = ["ids_only", "metadata", "preview", "full"]
    for smaller, larger in zip(order, order[1:]):
        assert MODE_FIELDS[larger][:len(MODE_FIELDS[smaller])] == MODE_FIELDS[smaller]


def test_no_mode_and_no_fields_means_the_classic_hit_and_fields_alone_pick_from_full():
    assert selection(None, None) is None
    assert selection(None, ["url", "chunk_id"]) == ("chunk_id", "url")
    assert selection("ids_only", None) == ("chunk_id", "rank", "score")


def test_a_field_outside_the_mode_is_refused_naming_fields_with_the_valid_list():
    with pytest.raises(InvalidArgument) as err:
        selection("metadata", ["snippet"])
    assert err.value.field == "fields" and "valid: chunk_id, rank, score, chunk_uri" in str(err.value)


@pytest.mark.parametrize("key", ["guide.md", "a/b c/ü#?.pdf", "bundle.zip!/docs/a.md", "x/12", "a!b/c"])
def test_a_chunk_uri_gives_back_its_source_key_and_seq(key):
    uri = chunk_uri(SID, key, 12)
    assert uri == "kdbl://chunk/" + chunk_id(SID, key, 12)
    assert parse_chunk_uri(uri) == (SID, key, 12)


@pytest.mark.parametrize("uri", ["kdbl://file/x/y", f"kdbl://chunk/{SID}/a.md", f"kdbl://chunk/{SID}/a.md/-1",
                                 f"kdbl://chunk/{SID}/a.md/1.5", "kdbl://chunk/not-a-uuid/a.md/1"])
def test_a_malformed_chunk_uri_is_refused_naming_uri(uri):
    with pytest.raises(InvalidArgument) as err:
        parse_chunk_uri(uri)
    assert err.value.field == "uri"


def test_the_preview_folds_whitespace_and_cuts_at_a_word_within_200_characters():
    text = "Intro line\n\n" + "word " * 100
    out = preview(text)
    assert out.startswith("Intro line word word") and out.endswith("word…") and len(out) <= 201
    assert preview("short\ntext") == "short text"
