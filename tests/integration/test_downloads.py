"""Signed downloads: API re-checks RLS, fetches bytes from the worker's internal endpoint, audits."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from urllib.parse import parse_qs, urlparse

import httpx
import jwt
import pytest
from helpers import crawl, db_of, make_corpus, running_api, running_fetch
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from kdbl_control import admin
from kdbl_core.settings import Settings
from kdbl_worker.fetch import create_fetch_app

SIGNING = "s" * 48
FETCH_TOKEN = "internal-token-" + "x" * 32
PDF_BYTES = b"%PDF-1.4 not really a pdf but bytes are bytes \x00\xff"


@pytest.fixture(scope="module")
def fetch_url(worker_engine):
    with running_fetch(worker_engine, FETCH_TOKEN) as url:
        yield url


@pytest.fixture(scope="module")
def env(owner_engine, worker_engine, owner_url, fetch_url, tmp_path_factory):
    root = tmp_path_factory.mktemp("dl")
    corpus = make_corpus(owner_engine, worker_engine, root / "dl-src", {
        "report.md": "# Pangolin report\n\nThe pangolin census.", "raw.bin.txt": "pangolin raw",
        "sub/ünïcode name.md": "pangolin unicode"}, tenant="dl")
    (corpus.root / "secret.md").write_text("pangolin secret")
    token = admin.create_token(db_of(owner_engine), tenant_name="dl", name="d")[0]
    settings = Settings(mcp_enabled=True, download_signing_secret=SIGNING, internal_fetch_token=FETCH_TOKEN,
                        worker_fetch_url=fetch_url, api_public_url="http://public.example:8443")
    with running_api(owner_url, settings) as url:
        yield {"url": url, "corpus": corpus, "token": token, "fetch": fetch_url}


@asynccontextmanager
async def mcp(env):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {env['token']}"})
    async with http, Client(streamable_http_client(f"{env['url']}/mcp", http_client=http)) as client:
        yield client


def _local(env, url: str) -> str:
    parsed = urlparse(url)
    assert f"{parsed.scheme}://{parsed.netloc}" == "http://public.example:8443"
    return f"{env['url']}{parsed.path}?{parsed.query}"


async def _hit_url(env, query: str) -> tuple[dict, str]:
    async with mcp(env) as client:
        hits = (await client.call_tool("search_content", {"query": query})).structured_content["hits"]
    return hits[0], hits[0]["url"]


async def test_hit_url_streams_the_original_bytes_inline_and_as_attachment(env, owner_engine):
    hit, url = await _hit_url(env, "pangolin census")
    assert hit["key"] == "report.md" and url.startswith("http://public.example:8443/api/files/download?t=")
    async with httpx.AsyncClient() as http:
        inline = await http.get(_local(env, url))
        attached = await http.get(_local(env, url) + "&dl=1")
    original = (env["corpus"].root / "report.md").read_bytes()
    assert inline.status_code == 200 and inline.content == original
    assert inline.headers["content-disposition"].startswith("inline;")
    assert inline.headers["content-type"].startswith("text/markdown")
    assert inline.headers["content-security-policy"] == "sandbox"
    assert attached.headers["content-disposition"].startswith('attachment; filename="report.md"')
    rows = admin.audit_rows(db_of(owner_engine), tool="files/download", tenant_name="dl", limit=5)
    assert rows[0]["status"] == "ok" and rows[0]["keys"] == ["report.md"]


async def test_unicode_keys_download_with_an_rfc6266_filename(env):
    hit, url = await _hit_url(env, "pangolin unicode")
    async with httpx.AsyncClient() as http:
        resp = await http.get(_local(env, url) + "&dl=1")
    assert resp.status_code == 200 and resp.content == "pangolin unicode".encode()
    assert "filename*=UTF-8''%C3%BCn%C3%AFcode%20name.md" in resp.headers["content-disposition"]


async def test_tampered_expired_and_missing_tokens_get_403_never_bytes(env):
    _, url = await _hit_url(env, "pangolin census")
    token = parse_qs(urlparse(url).query)["t"][0]
    claims = jwt.decode(token, options={"verify_signature": False})
    forged_key = jwt.encode({**claims, "key": "secret.md"}, "wrong-secret-" + "y" * 40, algorithm="HS256")
    expired = jwt.encode({**claims, "exp": int(time.time()) - 5}, SIGNING, algorithm="HS256")
    async with httpx.AsyncClient() as http:
        for bad in (token[:-3] + "abc", forged_key, expired, ""):
            resp = await http.get(f"{env['url']}/api/files/download", params={"t": bad})
            assert resp.status_code == 403 and b"pangolin" not in resp.content


async def test_a_file_no_longer_visible_is_404(env, owner_engine):
    _, url = await _hit_url(env, "pangolin raw")
    admin.set_source_acl(db_of(owner_engine), env["corpus"].source_id, restricted=True)
    try:
        async with httpx.AsyncClient() as http:
            resp = await http.get(_local(env, url))
        assert resp.status_code == 404 and b"pangolin" not in resp.content
    finally:
        admin.set_source_acl(db_of(owner_engine), env["corpus"].source_id, restricted=False)


async def test_internal_fetch_requires_the_token(env):
    params = {"source_id": str(env["corpus"].source_id), "key": "report.md"}
    async with httpx.AsyncClient() as http:
        none = await http.get(f"{env['fetch']}/internal/files", params=params)
        wrong = await http.get(f"{env['fetch']}/internal/files", params=params,
                               headers={"Authorization": "Bearer " + FETCH_TOKEN[:-1] + "?"})
        ok = await http.get(f"{env['fetch']}/internal/files", params=params,
                            headers={"Authorization": f"Bearer {FETCH_TOKEN}"})
        unindexed = await http.get(f"{env['fetch']}/internal/files", headers={"Authorization": f"Bearer {FETCH_TOKEN}"},
                                   params={**params, "key": "secret.md"})
        escape = await http.get(f"{env['fetch']}/internal/files", headers={"Authorization": f"Bearer {FETCH_TOKEN}"},
                                params={**params, "key": "../../../etc/passwd"})
    assert none.status_code == 401 and wrong.status_code == 401
    assert ok.status_code == 200 and ok.headers["content-length"] == str(len(ok.content))
    assert unindexed.status_code == 404 and escape.status_code == 404


def test_internal_fetch_refuses_everything_without_a_configured_token(worker_engine):
    from starlette.testclient import TestClient

    with TestClient(create_fetch_app(Settings(), db_of(worker_engine))) as client:
        resp = client.get("/internal/files", params={"source_id": "x", "key": "y"},
                          headers={"Authorization": "Bearer "})
    assert resp.status_code == 403 and "disabled" in resp.json()["error"]


async def test_downloads_off_means_null_urls_and_a_404_route(owner_url, owner_engine, worker_engine, tmp_path):
    make_corpus(owner_engine, worker_engine, tmp_path / "nodl", {"a.md": "wombat"}, tenant="nodl")
    token = admin.create_token(db_of(owner_engine), tenant_name="nodl", name="n")[0]
    with running_api(owner_url) as url:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:
            hits = (await client.call_tool("search_content", {"query": "wombat"})).structured_content["hits"]
        async with httpx.AsyncClient() as plain:
            resp = await plain.get(f"{url}/api/files/download", params={"t": "x"})
    assert hits[0]["url"] is None and resp.status_code == 404


async def test_internal_fetch_refuses_an_indexed_key_that_is_now_a_symlink_out_of_the_root(env, worker_engine,
                                                                                           tmp_path):
    outside = tmp_path / "outside-the-root.txt"
    outside.write_text("never served: outside the source's root")
    swapped = env["corpus"].root / "swapped.md"
    swapped.write_text("pangolin swap candidate")
    crawl(worker_engine, env["corpus"])
    params = {"source_id": str(env["corpus"].source_id), "key": "swapped.md"}
    headers = {"Authorization": f"Bearer {FETCH_TOKEN}"}
    async with httpx.AsyncClient() as http:
        before = await http.get(f"{env['fetch']}/internal/files", params=params, headers=headers)
        swapped.unlink()
        swapped.symlink_to(outside)  # the stored key names a link out of the root now (issue 27)
        after = await http.get(f"{env['fetch']}/internal/files", params=params, headers=headers)
    assert before.status_code == 200 and before.content == b"pangolin swap candidate"
    assert after.status_code == 404 and b"never served" not in after.content
