"""Bad input never gives an internal error: a battery of hostile inputs through the real HTTP app.

Every tool, resources/list, resources/read and the raw JSON-RPC envelope get wrong types, NUL and
lone-surrogate characters, huge strings, deep JSON, bad dates, unknown arguments, forged cursors, bad
URIs and out-of-range numbers. The contract: no HTTP 5xx, no JSON-RPC -32603 or code 0, every refusal
names the field (`error.data.field`, or the field's name in the message), every refused tool call
leaves an audit row, and the valid edge cases (a 3,500-snowman path, dates with and without a zone)
succeed. The issue's run counted 11 code-0 errors and 20 refusals naming no field; on the code before
this change this battery found 50 failures in 272 cases. Issue 27 added get_contents, find_similar,
answer and search_content's cursor (551 cases; on the code before it, one failed: an empty cursor).

Issue 27's cases (test_a_value_only_the_database_could_refuse_...) are values that passed validation and
failed inside PostgreSQL (a chunk number past 2**31 - 1: `integer out of range`; `%00` in a chunk id:
NUL), or were read as something the contract does not say (a string of digits as a Unix time, an empty
cursor as "the first page", contradictory arguments): 19 of them, each a -32602 naming its field now.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from helpers import db_of, make_corpus, running_api
from sqlalchemy import text

from kdbl_control import admin
from kdbl_core.access.policy import ALL_TOOLS
from kdbl_core.content.uris import chunk_id, chunk_uri, file_uri
from kdbl_core.settings import Settings

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
NUL, SURROGATE = "a\x00b", "a\ud800b"
HUGE = "x" * 200_000
SNOWMEN = "☃" * 3500  # 3,500 characters, 21,000 once JSON-escaped as \u2603
BAD_STRINGS = [NUL, SURROGATE, 123, True, None, [], {}, 1.5]
INT4_MAX = 2**31 - 1  # chunks.seq is a PostgreSQL integer
BAD_INTS = [True, False, "5", 1.5, -1, 0, 10**30, 2**63, -(2**63) - 1, 1e308, None, [], {}, "", NUL]


@dataclass
class Case:
    """One request: a tools/call (tool + arguments), a resources call, or a raw body; the expected outcome."""

    label: str
    body: bytes
    field: str | None  # the field the refusal must name; None = the call must succeed
    audited: bool = True  # a refusal leaves an audit row (all but the SDK's own "Method not found")
    headers: dict[str, str] = field(default_factory=dict)


def _rpc(method: str, params: Any = None, id_: Any = 1) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode()


def tool_cases(sid: str, other_sid: str) -> list[Case]:
    ref = {"source_id": sid, "key": "notes.md"}
    valid: dict[str, dict[str, Any]] = {
        "search_content": {"query": "okapi"},
        "get_file_text": dict(ref), "get_file_window": dict(ref), "get_file_metadata": dict(ref),
        "list_sources": {}, "list_files": {"source_id": sid},
        "get_contents": {"ids": [f"kdbl://file/{sid}/notes.md"]},
        "find_similar": {"subject": {"kind": "text", "text": "okapi"}}, "answer": {"question": "okapi"},
        "find_entity": {"name": "okapi"},  # this world reads no entities: a well-formed name is unknown (-32602)
    }
    filters = ["path", "content_type", "modified_after", "modified_before", "source_id"]
    strings = {
        "search_content": ["query", "cursor", *filters], "find_similar": filters, "answer": ["question", *filters],
        "get_file_text": ["source_id", "key"], "get_file_window": ["source_id", "key", "cursor"],
        "get_file_metadata": ["source_id", "key"], "list_sources": ["cursor"], "list_files": ["source_id", "cursor"],
        "find_entity": ["name", "type", "response_mode"],
    }
    ints = {"search_content": ["limit"], "get_file_window": ["start", "length"], "list_sources": ["limit"],
            "list_files": ["limit"], "find_similar": ["limit"], "get_contents": ["max_chars_per_item"],
            "answer": ["max_tokens"]}
    cases: list[Case] = []

    def call(tool: str, arguments: Any, expect: str | None, label: str) -> None:
        cases.append(Case(f"{tool}:{label}", _rpc("tools/call", {"name": tool, "arguments": arguments}), expect))

    for tool, base in valid.items():
        call(tool, base, "name" if tool == "find_entity" else None, "valid")
        call(tool, {**base, "bogus": 1}, "bogus", "unknown argument")
        call(tool, {**base, NUL: 1}, NUL, "unknown argument with NUL")
        for name in strings.get(tool, []):
            for bad in BAD_STRINGS + [HUGE, "", "  "]:
                if bad in ("", "  ") and name in ("path", "content_type"):
                    continue  # an empty prefix filter is valid
                if bad is None and name not in base and name != "query":
                    continue  # null is "not given" for an optional argument
                # a lone surrogate is not Unicode: the body is no valid JSON text (RFC 8259 8.2)
                expect = "body" if bad == SURROGATE else name
                call(tool, {**base, name: bad}, expect, f"{name}={str(bad)[:12]!r}")
        for name in ints.get(tool, []):
            for bad in BAD_INTS:
                if bad == 0 and name == "start":
                    continue
                call(tool, {**base, name: bad}, name, f"{name}={str(bad)[:12]!r}")
        if tool in ("get_file_text", "get_file_window", "get_file_metadata"):
            call(tool, {**base, "key": SNOWMEN}, "key", "unknown snowman key")
            call(tool, {**base, "key": "../../etc/passwd"}, "key", "traversal key")
            call(tool, {**base, "source_id": other_sid}, "source_id", "another tenant's source")
            call(tool, {"key": "notes.md"}, "source_id", "missing source_id")
    for bad in ["not-a-cursor", "a.b", "x" * 2048, "eyJ9.eyJ9"]:
        call("list_sources", {"cursor": bad}, "cursor", f"cursor {bad[:8]}")
        call("list_files", {"source_id": sid, "cursor": bad}, "cursor", f"cursor {bad[:8]}")
        call("get_file_window", {**ref, "cursor": bad}, "cursor", f"cursor {bad[:8]}")
    call("list_files", {"source_id": other_sid}, "source_id", "another tenant's source")
    call("get_file_window", {**ref, "start": 10_000}, "start", "start beyond the end")
    search = valid["search_content"]
    call("search_content", {**search, "path": SNOWMEN}, None, "3,500-snowman path")
    call("search_content", {**search, "query": "☃" * 900}, None, "900 snowmen")
    call("search_content", {**search, "explain": "yes"}, "explain", "explain as a string")
    call("search_content", {**search, "explain": 1}, "explain", "explain as a number")
    call("search_content", {**search, "mode": "vector"}, "mode", "unknown mode")
    call("search_content", {**search, "rationale": "yes"}, "rationale", "rationale as a string")
    call("search_content", {**search, "mode": "graph", "query": "Acme Corp " * 99}, None, "graph: 990-character query")
    call("search_content", {**search, "mode": "graph", "rationale": True, "query": "☃ the of ::"}, None,
         "graph: no name in the query")
    call("search_content", {**search, "query": "<script>alert(1)</script>"}, None, "markup query")
    call("search_content", {**search, "query": "!!! &&& ||| ::"}, None, "only operators")
    call("search_content", {**search, "source_id": other_sid}, "source_id", "another tenant's source")
    call("search_content", {**search, "modified_after": "2024-01-01T00:00:00+02:00",
                            "modified_before": "2025-01-01T00:00:00"}, None, "zone and no zone")
    call("search_content", {**search, "modified_after": "2024-01-01", "modified_before": "2025-01-01T00:00:00Z"},
         None, "date and zoned date")
    for extreme in ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"]:  # PostgreSQL's range is wider
        call("search_content", {**search, "modified_after": extreme}, None, f"date {extreme}")
    call("search_content", {**search, "modified_after": "2025-01-01T00:00:00Z",
                            "modified_before": "2024-01-01T00:00:00"}, "modified_after", "after > before")
    for bad in ["last tuesday", "2024-13-01", "2024-02-30T00:00:00Z", "2025-01-01Z", "1" * 40,
                "2024-01-01T25:00:00", "10000-01-01T00:00:00Z"]:
        call("search_content", {**search, "modified_after": bad}, "modified_after", f"date {bad[:16]}")
        call("search_content", {**search, "modified_before": bad}, "modified_before", f"date {bad[:16]}")
    for bad in [[], "str", 5]:
        cases.append(Case(f"tools/call arguments={bad!r}", _rpc("tools/call", {"name": "search_content",
                                                                               "arguments": bad}), "arguments"))
    for bad in ["no_such_tool", NUL, 123, None, "x" * 5000]:
        cases.append(Case(f"tools/call name={str(bad)[:10]!r}", _rpc("tools/call", {"name": bad, "arguments": {}}),
                          "name"))
    return cases


def resource_cases(sid: str, other_sid: str) -> list[Case]:
    cases = [Case("resources/read valid", _rpc("resources/read", {"uri": f"kdbl://file/{sid}/notes.md"}), None),
             Case("resources/list valid", _rpc("resources/list", {}), None),
             Case("resources/templates/list valid", _rpc("resources/templates/list", {}), None)]
    bad_uris: list[Any] = [
        "", "kdbl://file/", f"kdbl://file/{sid}", f"kdbl://file/{sid}/", "kdbl://file/not-a-uuid/x",
        f"kdbl://file/{sid}/%00", f"kdbl://file/{sid}/a%00b", f"kdbl://file/{sid}/%ud800", f"kdbl://file/{sid}/%ZZ",
        f"kdbl://file/{sid}/%ED%A0%80", f"kdbl://file/{sid}/missing.md", f"kdbl://file/{other_sid}/secret.md",
        "http://example.com/x", "file:///etc/passwd", "kdbl://file/" + "%00" * 10, f"kdbl://file/{sid}/" + "x" * 9000,
        f"kdbl://file/{sid}/{NUL}", 123, None, [], {},
    ]
    for uri in bad_uris:
        cases.append(Case(f"resources/read uri={str(uri)[:30]!r}", _rpc("resources/read", {"uri": uri}), "uri"))
    cases.append(Case("resources/read without uri", _rpc("resources/read", {}), "uri"))
    for cursor in ["garbage", "", NUL, "x" * 5000, 5, [], "eyJ9.eyJ9"]:
        cases.append(Case(f"resources/list cursor={str(cursor)[:10]!r}", _rpc("resources/list", {"cursor": cursor}),
                          "cursor"))
    return cases


def raw_cases() -> list[Case]:
    deep_list = b"[" * 5000 + b"]" * 5000
    deep_obj = b'{"a":' * 5000 + b"1" + b"}" * 5000
    deep_args = ('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_content","arguments":'
                 '{"query":' + "[" * 3000 + "]" * 3000 + "}}}").encode()
    medium_args = ('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_content","arguments":'
                   '{"query":"x","path":' + "[" * 20 + "]" * 20 + "}}}").encode()
    envelope = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    cases = [
        Case("not JSON", b"{nope", "body"), Case("empty body", b"", "body"), Case("invalid UTF-8", b'{"a":"\xff"}', "body"),
        Case("JSON null", b"null", "body"), Case("a number", b"5", "body"), Case("a string", b'"x"', "body"),
        Case("an empty batch", b"[]", "body"), Case("a batch", json.dumps([envelope]).encode(), "body"),
        Case("deep array", deep_list, "body"), Case("deep object", deep_obj, "body"),
        Case("deep arguments", deep_args, "body"), Case("20-deep argument", medium_args, "path"),
        Case("trailing garbage", json.dumps(envelope).encode() + b"x", "body"),
        Case("unknown method", _rpc("tools/explode"), "method", audited=False),
        Case("params as a list", _rpc("tools/list", [1]), "params"),
        Case("params as a string", _rpc("tools/call", "x"), "params"),
        Case("tools/call without params", _rpc("tools/call"), "params"),
    ]
    for id_, label in [(None, "null"), ({"a": 1}, "an object"), ([1], "a list"), (1.5, "a float"), (True, "true"),
                       ("x" * 5000, "a 5000-char string")]:
        expect = None if isinstance(id_, str) else "id"
        cases.append(Case(f"id {label}", _rpc("tools/list", None, id_), expect))
    for version in ["1.0", None, 2, ""]:
        cases.append(Case(f"jsonrpc={version!r}", json.dumps({**envelope, "jsonrpc": version}).encode(), "jsonrpc"))
    cases.append(Case("no jsonrpc", json.dumps({"id": 1, "method": "tools/list"}).encode(), "jsonrpc"))
    for method in [None, 5, "", NUL, [], "x" * 5000]:
        cases.append(Case(f"method={str(method)[:10]!r}", json.dumps({**envelope, "method": method}).encode(),
                          "method"))
    cases.append(Case("a response sent to the server", json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}}).encode(),
                      None))
    cases.append(Case("notification", json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode(),
                      None))
    return cases


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    mine = make_corpus(owner_engine, worker_engine, root / "fuzz-docs", {
        "notes.md": "# Notes\n\nThe okapi <script>alert(1)</script> migration & its report.\n",
    }, tenant="fuzz-mine")
    other = make_corpus(owner_engine, worker_engine, root / "fuzz-other", {"secret.md": "okapi secret"},
                        tenant="fuzz-other")
    admin.update_tenant(db_of(owner_engine), "fuzz-mine", tools=",".join(ALL_TOOLS), force=True)
    token, _ = admin.create_token(db_of(owner_engine), tenant_name="fuzz-mine", name="fuzzer")
    settings = Settings(mcp_enabled=True, rate_limit_per_minute=0)
    with running_api(owner_url, settings) as url:
        yield {"url": url, "sid": str(mine.source_id), "other_sid": str(other.source_id), "token": token,
               "tenant_id": mine.tenant_id}


def failure(case: Case, resp: httpx.Response) -> str | None:
    """Why the response breaks the contract, or None."""
    if resp.status_code >= 500:
        return f"HTTP {resp.status_code}"
    try:
        body = resp.json() if resp.content else None
    except ValueError:
        return f"HTTP {resp.status_code}, not JSON: {resp.text[:80]!r}"
    error = body.get("error") if isinstance(body, dict) else None
    if case.field is None:
        if error is not None:
            return f"valid call refused: {error}"
        if resp.status_code not in (200, 202):
            return f"HTTP {resp.status_code}"
        return None
    if error is None:
        return f"accepted (HTTP {resp.status_code}): {resp.text[:120]!r}"
    code, message, data = error.get("code"), error.get("message", ""), error.get("data")
    if code in (0, -32603) or not isinstance(code, int):
        return f"internal error code {code}: {message[:120]!r}"
    named = ((isinstance(data, dict) and data.get("field") == case.field) or f"'{case.field}'" in message
             or (code == -32601 and case.field == "method"))  # "Method not found" names it
    if not named:
        return f"refusal names no field {case.field!r}: {code} {message[:120]!r} data={data!r}"
    return None


async def test_bad_input_never_gives_a_server_error_and_every_refusal_names_its_field(world, owner_engine):
    cases = (tool_cases(world["sid"], world["other_sid"]) + resource_cases(world["sid"], world["other_sid"])
             + raw_cases())
    headers = {**HEADERS, "Authorization": f"Bearer {world['token']}"}
    with owner_engine.connect() as conn:
        before = conn.execute(text("SELECT coalesce(max(id), 0) FROM audit")).scalar_one()
    failures = []
    async with httpx.AsyncClient(timeout=60) as http:
        for case in cases:
            try:
                resp = await http.post(f"{world['url']}/mcp", content=case.body, headers={**headers, **case.headers})
            except httpx.TransportError as exc:
                failures.append(f"{case.label}: connection failed ({type(exc).__name__})")
                continue
            why = failure(case, resp)
            if why:
                failures.append(f"{case.label}: {why}")
    print(f"{len(cases)} cases, {len(failures)} failures")
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures)
    refused = [c for c in cases if c.field is not None and c.audited]
    with owner_engine.connect() as conn:
        rows = conn.execute(text("SELECT tool, status, arguments FROM audit WHERE id > :b AND tenant_id = :t"
                                 " AND status <> 'ok'"), {"b": before, "t": world["tenant_id"]}).all()
    assert len(rows) == len(refused)  # every refusal audited, even those holding NUL or 200,000 characters
    assert all(len(json.dumps(r.arguments, ensure_ascii=False)) <= 20_100 for r in rows)


async def test_a_valid_call_whose_arguments_exceed_the_audit_cap_succeeds_and_is_audited(world, owner_engine):
    body = _rpc("tools/call", {"name": "search_content", "arguments": {"query": "okapi", "path": SNOWMEN}})
    async with httpx.AsyncClient(timeout=60) as http:
        resp = await http.post(f"{world['url']}/mcp", content=body,
                               headers={**HEADERS, "Authorization": f"Bearer {world['token']}"})
    assert resp.status_code == 200 and "error" not in resp.json()
    with owner_engine.connect() as conn:
        row = conn.execute(text("SELECT arguments, status FROM audit WHERE tenant_id = :t ORDER BY id DESC LIMIT 1"),
                           {"t": world["tenant_id"]}).one()
    assert row.status == "ok" and len(json.dumps(row.arguments, ensure_ascii=False)) <= 20_000
    assert row.arguments["query"] == "okapi" and row.arguments["path"].startswith("☃" * 100)


async def test_nul_in_an_argument_is_refused_naming_it_and_audited(world, owner_engine):
    body = _rpc("tools/call", {"name": "search_content", "arguments": {"query": "ok\x00api"}})
    async with httpx.AsyncClient(timeout=60) as http:
        resp = await http.post(f"{world['url']}/mcp", content=body,
                               headers={**HEADERS, "Authorization": f"Bearer {world['token']}"})
    error = resp.json()["error"]
    assert error["code"] == -32602 and error["data"]["field"] == "query"
    with owner_engine.connect() as conn:
        row = conn.execute(text("SELECT arguments, status, error FROM audit WHERE tenant_id = :t"
                                " ORDER BY id DESC LIMIT 1"), {"t": world["tenant_id"]}).one()
    assert row.status == "error" and "'query'" in row.error and row.arguments["query"] == "ok\ufffdapi"


@pytest.mark.parametrize("id_", [None, {"a": 1}])
async def test_a_request_with_a_null_or_object_id_gets_an_invalid_request_error(world, id_):
    async with httpx.AsyncClient(timeout=60) as http:
        resp = await http.post(f"{world['url']}/mcp", content=_rpc("tools/list", None, id_),
                               headers={**HEADERS, "Authorization": f"Bearer {world['token']}"})
    assert resp.status_code == 400
    assert resp.json() == {"jsonrpc": "2.0", "id": None, "error": {
        "code": -32600, "message": resp.json()["error"]["message"], "data": {"field": "id"}}}
    assert "'id'" in resp.json()["error"]["message"]


async def test_json_nested_5000_deep_is_a_400_parse_error(world):
    async with httpx.AsyncClient(timeout=60) as http:
        resp = await http.post(f"{world['url']}/mcp", content=b"[" * 5000 + b"]" * 5000,
                               headers={**HEADERS, "Authorization": f"Bearer {world['token']}"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == -32700


Probe = tuple[str, str, Any, "str | None"]


def database_cases(sid: str) -> list[Probe]:
    """(label, method, params, the field a -32602 must name; None: the call must succeed)."""
    past, huge, last = INT4_MAX + 1, 10**20, INT4_MAX
    nul_chunk = f"{sid}/no%00tes.md/0"
    search, similar = {"query": "okapi"}, {"subject": {"kind": "text", "text": "okapi"}}
    chunk_subject = {"kind": "chunk", "id": chunk_id(sid, "notes.md", 0)}
    year = {"modified_after": "2024-01-01", "modified_before": "2024-01-01T00:00:00Z"}

    def tool(label: str, name: str, arguments: dict[str, Any], field: str | None) -> Probe:
        return f"{name}: {label}", "tools/call", {"name": name, "arguments": arguments}, field

    def read(label: str, uri: str, field: str | None) -> Probe:
        return f"resources/read: {label}", "resources/read", {"uri": uri}, field

    return [
        tool("a chunk id past 2**31 - 1", "get_contents", {"ids": [chunk_id(sid, "notes.md", past)]}, "ids[0]"),
        tool("a chunk uri of 21 digits", "get_contents", {"ids": [f"kdbl://chunk/{sid}/notes.md/{huge}"]}, "ids[0]"),
        tool("an object id's seq past 2**31 - 1", "get_contents",
             {"ids": [{"source_id": sid, "key": "notes.md", "seq": past}]}, "ids.0.object.seq"),
        tool("the last chunk number, with neighbours", "get_contents",
             {"ids": [chunk_id(sid, "notes.md", last)], "expand": {"neighbours": 3}}, None),
        tool("a file uri", "get_contents", {"ids": [file_uri(sid, "notes.md")]}, None),
        read("a chunk uri past 2**31 - 1", chunk_uri(sid, "notes.md", past), "uri"),
        read("the last chunk number is no such chunk", chunk_uri(sid, "notes.md", last), "uri"),
        read("%00 in a chunk uri", f"kdbl://chunk/{nul_chunk}", "uri"),
        tool("%00 in a chunk id", "find_similar", {"subject": {"kind": "chunk", "id": nul_chunk}}, "subject.id"),
        tool("%00 in a file uri", "find_similar", {"subject": {"kind": "file", "id": f"kdbl://file/{sid}/a%00b"}},
             "subject.id"),
        tool("digits as modified_after", "search_content", {**search, "modified_after": "10000000000"},
             "modified_after"),
        tool("digits as modified_before", "find_similar", {**similar, "modified_before": "1700000000"},
             "modified_before"),
        tool("an empty cursor", "search_content", {**search, "cursor": ""}, "cursor"),
        tool("modified_after = modified_before", "find_similar", {**similar, **year}, "modified_after"),
        tool("modified_after > modified_before", "find_similar",
             {**similar, "modified_after": "2025-01-01", "modified_before": "2024-01-01"}, "modified_after"),
        tool("source_id with source_ids", "search_content", {**search, "source_id": sid, "source_ids": [sid]},
             "source_ids"),
        tool("source_id with source_ids", "find_similar", {**similar, "source_id": sid, "source_ids": [sid]},
             "source_ids"),
        tool("content_type with content_types", "answer",
             {"question": "okapi", "content_type": "text/markdown", "content_types": ["text/*"]}, "content_types"),
        tool("a text subject with an id", "find_similar",
             {"subject": {"kind": "text", "text": "okapi", "id": chunk_subject["id"]}}, "subject.id"),
        tool("a chunk subject with a text", "find_similar", {"subject": {**chunk_subject, "text": "okapi"}},
             "subject.text"),
        tool("a valid chunk subject", "find_similar", {"subject": chunk_subject}, None),
    ]


async def test_a_value_only_the_database_could_refuse_or_that_contradicts_another_is_a_32602_naming_it(
        world, owner_engine):
    """Issue 27 §3: each refusal was an internal error (-32603) or an accepted call before; so were the
    two calls at the last chunk number (its neighbours' range overflowed)."""
    headers = {**HEADERS, "Authorization": f"Bearer {world['token']}"}
    audit_since = text("SELECT tool, status, error FROM audit WHERE id > :b AND tenant_id = :t")
    failures = []
    async with httpx.AsyncClient(timeout=60) as http:
        for label, method, params, field in database_cases(world["sid"]):
            with owner_engine.connect() as conn:
                before = conn.execute(text("SELECT coalesce(max(id), 0) FROM audit")).scalar_one()
            resp = await http.post(f"{world['url']}/mcp", content=_rpc(method, params), headers=headers)
            error = resp.json().get("error")
            with owner_engine.connect() as conn:
                rows = conn.execute(audit_since, {"b": before, "t": world["tenant_id"]}).all()
            audited = [(r.tool, r.status) for r in rows]
            tool = params["name"] if method == "tools/call" else method
            if field is None:
                if error is not None:
                    failures.append(f"{label}: refused: {error}")
                elif audited != [(tool, "ok")]:
                    failures.append(f"{label}: audit rows {audited}")
                continue
            named = error is not None and (error.get("data") or {}).get("field") == field
            if not named or error["code"] != -32602:
                failures.append(f"{label}: expected -32602 naming {field!r}, got {error or resp.text[:200]!r}")
            elif audited != [(tool, "error")] or f"'{field}'" not in (rows[0].error or ""):
                failures.append(f"{label}: audit rows {[tuple(r) for r in rows]}")
    assert not failures, "\n".join(failures)
