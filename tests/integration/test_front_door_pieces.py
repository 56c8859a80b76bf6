"""The MCP front door as small pieces (issue 15): one scope check for every entry, handlers that return
their audit facts, and one function that builds the audit row of every tool call, resource read,
download and refusal (one row each, same columns as before)."""

from __future__ import annotations

import ast
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
from helpers import make_corpus, running_api, running_fetch
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, BearerAuthBackend
from sqlalchemy import text
from starlette.requests import HTTPConnection

import kdbl_api
from kdbl_api import scope_check
from kdbl_api.audit import AuditFacts
from kdbl_api.bearer import SdkTokenVerifier
from kdbl_api.tools import files
from kdbl_api.tools.context import Services, ToolContext
from kdbl_api.tools.models import FileRefArgs
from kdbl_control import admin
from kdbl_core.access.policy import TenantPolicy
from kdbl_core.access.principal import ALL_SCOPES, SCOPE_READ, SCOPE_SEARCH, Principal, rls_transaction
from kdbl_core.access.signing import CursorCodec
from kdbl_core.access.tokens import BearerVerifier, PatVerifier
from kdbl_core.db import connect
from kdbl_core.db.urls import for_role
from kdbl_core.settings import Settings

try:  # admin's functions take a psycopg pool once the database code moves to psycopg (issue 15)
    from helpers import db_of
except ImportError:  # before that they take the SQLAlchemy engine itself
    def db_of(engine):
        return engine

SIGNING = "f" * 48
FETCH_TOKEN = "door-fetch-" + "z" * 32
PUBLIC = "http://public.example:8443"
ACCEPT = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
API = Path(kdbl_api.__file__).parent
COLUMNS = "tool, status, error, source_ids, keys, row_count, token_id, client_ip, principal"


@pytest.fixture(scope="module")
def door(owner_engine, worker_engine, owner_url, tmp_path_factory):
    corpus = make_corpus(owner_engine, worker_engine, tmp_path_factory.mktemp("door") / "door-src", {
        "guide.md": "# Guide\n\nThe narwhal inventory lists every tusk.", "notes.md": "narwhal notes"},
        tenant="door")
    names = {ALL_SCOPES: "all", (SCOPE_READ,): "reader", (SCOPE_SEARCH,): "searcher"}
    db = db_of(owner_engine)
    tokens = {scopes: admin.create_token(db, tenant_name="door", name=name, scopes=list(scopes))[0]
              for scopes, name in names.items()}
    settings = Settings(mcp_enabled=True, download_signing_secret=SIGNING, internal_fetch_token=FETCH_TOKEN,
                        api_public_url=PUBLIC)
    with running_fetch(worker_engine, FETCH_TOKEN) as fetch:
        settings = settings.model_copy(update={"worker_fetch_url": fetch})
        with running_api(owner_url, settings) as url:
            yield {"url": url, "corpus": corpus, "tokens": tokens,
                   "token_ids": {s: _token_id(owner_engine, name) for s, name in names.items()}}


def _token_id(owner_engine, name: str):
    with owner_engine.connect() as conn:
        return conn.execute(text("SELECT k.id FROM tokens k JOIN tenants t ON t.id = k.tenant_id"
                                 " WHERE t.name = 'door' AND k.name = :n"), {"n": name}).scalar_one()


def _rpc(method: str, params: dict | None = None) -> dict:
    return {"jsonrpc": "2.0", "id": 7, "method": method, **({"params": params} if params is not None else {})}


def _call(name: str, arguments: dict) -> dict:
    return _rpc("tools/call", {"name": name, "arguments": arguments})


async def _post(door, scopes: tuple[str, ...] | str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.post(f"{door['url']}/mcp", json=body, headers={
            **ACCEPT, "Authorization": f"Bearer {door['tokens'][scopes]}"})


def _last_id(owner_engine) -> int:
    with owner_engine.connect() as conn:
        return conn.execute(text("SELECT coalesce(max(id), 0) FROM audit")).scalar_one()


def _rows_since(owner_engine, last: int) -> list[dict]:
    with owner_engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(
            f"SELECT {COLUMNS} FROM audit a JOIN tenants t ON t.id = a.tenant_id"
            " WHERE a.id > :last AND t.name = 'door' ORDER BY a.id"), {"last": last})]


def _entries(door) -> list[tuple[str, str, dict]]:
    """Every entry that needs a scope: (method, tool name or method, params)."""
    ref = {"source_id": str(door["corpus"].source_id), "key": "guide.md"}
    uri = f"kdbl://file/{door['corpus'].source_id}/guide.md"
    tools = {"search_content": {"query": "narwhal"}, "get_file_text": ref, "get_file_window": ref,
             "get_file_metadata": ref, "list_sources": {}, "list_files": {"source_id": ref["source_id"]}}
    return ([("tools/call", name, {"name": name, "arguments": args}) for name, args in tools.items()]
            + [("resources/list", "resources/list", {}), ("resources/read", "resources/read", {"uri": uri}),
               ("resources/templates/list", "resources/templates/list", {})])


async def test_every_entry_without_its_scope_is_refused_the_same_way_by_the_one_scope_check(
        door, owner_engine):
    entries = _entries(door)
    assert len(entries) == 9
    for method, name, params in entries:
        needed = scope_check.required_scope(method, name, TenantPolicy())
        assert needed in ALL_SCOPES, (method, name)
        lacking = (SCOPE_READ,) if needed == SCOPE_SEARCH else (SCOPE_SEARCH,)
        last = _last_id(owner_engine)
        resp = await _post(door, lacking, _rpc(method, params))
        message = f"insufficient scope: this call needs '{needed}'"
        assert resp.status_code == 403, (name, resp.text)
        assert resp.json()["error"] == {"code": -32003, "message": message,
                                        "data": {"required_scope": needed}}
        challenge = resp.headers["www-authenticate"]
        assert 'error="insufficient_scope"' in challenge and f'scope="{needed}"' in challenge
        [row] = _rows_since(owner_engine, last)
        assert (row["tool"], row["status"], row["error"], row["row_count"]) == (name, "denied", message, 0)
        assert row["token_id"] == door["token_ids"][lacking] and row["client_ip"] == "127.0.0.1"
        # the same entry with the scope it needs passes the check
        assert (await _post(door, (needed,), _rpc(method, params))).status_code == 200


def _scope_tests(path: Path) -> list[int]:
    """Lines where a module tests a token's scopes (`x in <...>.scopes`, `has_scope`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "has_scope":
            found.append(node.lineno)
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            for side in node.comparators:
                if (isinstance(side, ast.Attribute) and side.attr == "scopes") or (
                        isinstance(side, ast.Name) and side.id == "scopes"):
                    found.append(node.lineno)
    return found


def test_no_module_of_the_api_but_scope_check_tests_a_tokens_scopes():
    checks = {str(p.relative_to(API)): lines for p in sorted(API.rglob("*.py")) if (lines := _scope_tests(p))}
    assert list(checks) == ["scope_check.py"]


def test_only_the_audit_module_writes_audit_rows():
    """Tools, resources, downloads and the front door's refusals all go through kdbl_api.audit (audit_row,
    write, write_alone): no other module of the API holds the INSERT or calls the function that runs it."""
    writers = set()
    for path in sorted(API.rglob("*.py")):
        source = path.read_text()
        if "INSERT INTO audit" in source:
            writers.add(path.name)
        for node in ast.walk(ast.parse(source)):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in ("record_and_commit", "record", "record_refusal"):
                writers.add(path.name)
    assert writers == {"audit.py"}


async def test_a_tool_handler_returns_its_audit_facts_instead_of_filling_the_context(door, owner_url):
    pool = await connect.async_pool(for_role(owner_url, "kdbl_api"), size=1)
    corpus = door["corpus"]
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name="door", subject="user:handler",
                          scopes=frozenset(ALL_SCOPES))
    try:
        async with rls_transaction(pool, principal) as conn:
            ctx = ToolContext(conn=conn, principal=principal, services=Services(
                settings=Settings(), cursors=CursorCodec(b"k" * 32)))
            result, facts = await files.get_file_metadata(ctx, FileRefArgs(source_id=corpus.source_id,
                                                                          key="guide.md"))
    finally:
        await pool.close()
    assert result["key"] == "guide.md"
    assert facts == AuditFacts(source_ids=(str(corpus.source_id),), keys=("guide.md",), row_count=1)
    assert not hasattr(ctx, "row_count") and not hasattr(ctx, "source_ids")


async def test_each_call_download_and_refusal_leaves_exactly_one_audit_row_from_its_facts(door, owner_engine):
    sid, everything = str(door["corpus"].source_id), tuple(ALL_SCOPES)
    uri = f"kdbl://file/{sid}/guide.md"
    ref = {"source_id": sid, "key": "guide.md"}
    cases = [  # (request, tool, status, source_ids, keys, row_count, error fragment)
        (_call("search_content", {"query": "narwhal inventory", "limit": 1}), "search_content", "ok", [sid],
         ["guide.md"], 1, None),
        (_call("get_file_text", ref), "get_file_text", "ok", [sid], ["guide.md"], 1, None),
        (_call("get_file_window", {**ref, "start": 5}), "get_file_window", "error", [], [], 0,
         "beyond the end"),
        (_call("list_files", {"source_id": sid}), "list_files", "ok", [sid], ["guide.md", "notes.md"], 2,
         None),
        (_call("list_sources", {}), "list_sources", "ok", [sid], [], 1, None),
        (_call("no_such_tool", {}), "no_such_tool", "error", [], [], 0, "unknown tool"),
        (_call("search_content", {"query": "x", "limit": 0}), "search_content", "error", [], [], 0, "limit"),
        (_rpc("resources/list", {}), "resources/list", "ok", [], [], 2, None),
        (_rpc("resources/read", {"uri": uri}), "resources/read", "ok", [sid], ["guide.md"], 1, None),
        (_rpc("resources/read", {"uri": f"kdbl://file/{sid}/absent.md"}), "resources/read", "error", [], [],
         0, "no file"),
    ]
    link = None
    for body, tool, status, source_ids, keys, row_count, error in cases:
        last = _last_id(owner_engine)
        resp = await _post(door, everything, body)
        assert resp.status_code == 200, resp.text
        if tool == "search_content" and status == "ok":
            link = resp.json()["result"]["structuredContent"]["hits"][0]["url"]
        [row] = _rows_since(owner_engine, last)
        assert (row["tool"], row["status"], row["row_count"]) == (tool, status, row_count), row
        assert [str(s) for s in row["source_ids"]] == source_ids and list(row["keys"]) == keys, row
        assert (row["error"] is None) if error is None else (error in row["error"]), row
        assert row["token_id"] == door["token_ids"][everything] and row["client_ip"] == "127.0.0.1"
        assert row["principal"] == "user:all"

    local = f"{door['url']}{urlparse(link).path}?{urlparse(link).query}"
    async with httpx.AsyncClient() as http:
        for query in ("", "&dl=1"):
            last = _last_id(owner_engine)
            resp = await http.get(local + query)
            assert resp.status_code == 200 and b"narwhal" in resp.content
            [row] = _rows_since(owner_engine, last)
            assert (row["tool"], row["status"], row["error"], row["row_count"]) == (
                "files/download", "ok", None, 1)
            assert [str(s) for s in row["source_ids"]] == [sid] and list(row["keys"]) == ["guide.md"]
            assert row["token_id"] == door["token_ids"][everything]  # the token that minted the link

        minter = admin.create_token(db_of(owner_engine), tenant_name="door", name="minter")[0]
        door["tokens"]["minter"] = minter
        minted = (await _post(door, "minter", _call("get_file_metadata", ref))).json()
        url = minted["result"]["structuredContent"]["url"]
        admin.revoke_token(db_of(owner_engine), minter)
        last = _last_id(owner_engine)
        resp = await http.get(f"{door['url']}{urlparse(url).path}?{urlparse(url).query}")
    assert resp.status_code == 403 and "revoked" in resp.json()["error"]
    [row] = _rows_since(owner_engine, last)  # a refused download: one row, naming what it asked for
    assert (row["tool"], row["status"], row["row_count"], row["principal"]) == (
        "files/download", "denied", 0, "user:minter")
    assert row["error"] == "the token that minted this link was revoked"
    assert [str(s) for s in row["source_ids"]] == [sid] and list(row["keys"]) == ["guide.md"]
    assert row["token_id"] == _token_id(owner_engine, "minter")


async def test_our_pat_verifier_plugs_into_the_sdks_bearer_auth_backend_and_carries_the_principal(
        door, owner_url):
    pool = await connect.async_pool(for_role(owner_url, "kdbl_api"), size=1)
    backend = BearerAuthBackend(SdkTokenVerifier(BearerVerifier(PatVerifier(pool))))

    def connection(token: str) -> HTTPConnection:
        return HTTPConnection({"type": "http", "headers": [(b"authorization", f"Bearer {token}".encode())]})

    try:
        credentials, user = await backend.authenticate(connection(door["tokens"][(SCOPE_READ,)]))
        refused = await backend.authenticate(connection(door["tokens"][(SCOPE_READ,)][:-4] + "zzzz"))
    finally:
        await pool.close()
    assert isinstance(user, AuthenticatedUser) and credentials.scopes == [SCOPE_READ]
    principal = user.access_token.principal
    assert (principal.subject, principal.tenant_id) == ("user:reader", door["corpus"].tenant_id)
    assert user.access_token.token == str(principal.token_id)  # the token's id, never its secret
    assert refused is None  # the protocol's answer to a wrong secret (the front door keeps the reason)
