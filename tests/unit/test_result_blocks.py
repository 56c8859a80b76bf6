"""A tool result's content blocks built in their wire form are what the SDK's models write, and file URIs
remembered per process are the ones quoting gives."""

from __future__ import annotations

import uuid

import mcp_types as types
import pytest

from kdbl_api.tools import blocks
from kdbl_core.content import uris


@pytest.mark.parametrize(("uri", "name", "mime"), [
    ("kdbl://file/s/a.md", "a.md", "text/plain"),
    ("kdbl://file/s/bundle.zip!/docs%2Fa.md", "bundle.zip!/docs/a.md", "text/markdown"),
    ("kdbl://file/s/%E5%8C%97", "北 \"quoted\" <b>", "application/pdf"),
])
def test_a_resource_link_is_the_models_dump(uri: str, name: str, mime: str) -> None:
    model = types.ResourceLink(uri=uri, name=name, mime_type=mime)
    assert blocks.resource_link(uri, name, mime) == model.model_dump(by_alias=True, mode="json", exclude_none=True)


def test_a_search_result_validates_as_the_protocols_call_tool_result() -> None:
    hits = [{"uri": f"kdbl://file/s/{n}.md", "key": f"{n}.md", "text": "t"} for n in (1, 2, 1)] + [{"key": "no-uri"}]
    for how in ("json", "summary", "text"):
        result = blocks.tool_result({"hits": hits}, how, links=blocks.hit_links)
        model = types.CallToolResult.model_validate(result)
        assert [b.type for b in model.content] == ["text", "resource_link", "resource_link"]  # each file once
        assert model.model_dump(by_alias=True, mode="json", exclude_none=True) == result


@pytest.mark.parametrize("key", ["a.md", "dir/sub dir/ü.pdf", "bundle.zip!/docs/a.md", "x" * 300, "%2F!/!/"])
def test_remembered_file_uris_are_the_quoted_ones(key: str) -> None:
    sid = uuid.uuid4()
    for source_id in (sid, str(sid)):
        assert uris.file_uri(source_id, key) == uris.PREFIX + uris._encode(source_id, key)
        assert uris.file_uri(source_id, key) == uris.file_uri(source_id, key)
        assert uris.parse_file_uri(uris.file_uri(source_id, key)) == (sid, key)
