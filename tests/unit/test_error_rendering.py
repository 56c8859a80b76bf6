"""Errors carry their codes, and every transport renders from them (issue 15).

The front door (POST /mcp), downloads, /capacity and the worker's fetch endpoint are driven for real
(uvicorn on loopback, the embedded PostgreSQL); the CLI runs its `main`; the operator's kopf mapping
is the function its handlers raise.
"""

from __future__ import annotations

import uuid

import httpx
import kopf
import pytest
from helpers import db_of, running_api, running_fetch, serving

from kdbl_api.jsonrpc_envelope import EnvelopeError
from kdbl_api.server import mcp_error_of
from kdbl_control import admin
from kdbl_control.cli import main as cli_main
from kdbl_control.loadgen import LoadgenError
from kdbl_core import errors
from kdbl_core.content import store
from kdbl_core.errors import (
    ConfigError, Conflict, DeadlineExceeded, Forbidden, InvalidArgument, KdblError, MalformedMessage, MisdirectedRequest,
    NotFound, PermanentError, RateLimited, ReadBehind, RequestTimeout, RequestTooLarge, TemporaryError, Unauthenticated,
    Unavailable, UpstreamError, http_response_of, jsonrpc_response_of,
)
from kdbl_core.settings import Settings
from kdbl_core.sources.schedule import ScheduleError, parse
from kdbl_operator import k8s
from kdbl_operator.desired import InvalidSpec
from kdbl_operator.kopf_errors import kopf_error_of
from kdbl_worker import jobs
from kdbl_worker.fetch import create_fetch_app

SIGNING = "s" * 48
FETCH_TOKEN = "internal-token-" + "r" * 32

# one instance of every class in the hierarchy (the test below fails when a class is missing here)
SAMPLES: list[KdblError] = [
    KdblError("internal"), InvalidArgument("limit", "must be positive"),
    MalformedMessage("jsonrpc", 'must be "2.0"'), MalformedMessage("body", "not JSON", parse_error=True),
    RequestTooLarge("too large"), RequestTimeout("too slow"),
    MisdirectedRequest("bad host", data={"host": "evil"}),
    NotFound("not found"), Unauthenticated("who are you"),
    Forbidden("no", data={"required_scope": "kdbl.read"}), Conflict("taken"), RateLimited(7),
    DeadlineExceeded("search_content ran past its 10000 ms deadline", deadline_ms=10000),
    ConfigError("KDBL_X is not set"), TemporaryError("blip"), Unavailable("database down", retry_after_sec=2),
    UpstreamError("source unavailable"), PermanentError("unsupported"), ScheduleError("'x': bad"),
    store.FenceLost("fence lost"), jobs.LeaseLost("lease lost"), jobs.TenantDisabled("tenant off"),
    LoadgenError("connection closed"), InvalidSpec("TenantNotFound", "no tenant 'a'"),
    InvalidSpec("InvalidSchedule", "bad"), k8s.NamespaceMissing("team-a"), k8s.KubernetesUnavailable("503"),
    EnvelopeError(InvalidArgument("params", "must be an object"), 7),
    ReadBehind("the replica is behind the cursor", reason="behind"),
]


def _classes(root: type) -> set[type]:
    return {root} | {c for sub in root.__subclasses__() for c in _classes(sub)}


def test_every_error_class_renders_its_own_codes_in_every_transport():
    import kdbl_core.db.embedded_postgres  # noqa: F401 - its DataDirLocked is a class of the hierarchy too
    from kdbl_core.access.tokens import TokenRefused
    from kdbl_worker.connectors import SourceUnavailable
    from kdbl_worker.pipeline import QuotaExceeded
    from kdbl_worker.queue import DatabaseFull

    samples = [*SAMPLES, kdbl_core.db.embedded_postgres.DataDirLocked("locked"), SourceUnavailable("down"),
               QuotaExceeded("full"), DatabaseFull("disk full", cause="SQLSTATE 53100 disk_full: no space")]
    samples.append(TokenRefused("token revoked", tenant_id=None, tenant_name="", subject="",
                                token_id=uuid.uuid4()))
    missing = {c.__qualname__ for c in _classes(KdblError)} - {type(s).__qualname__ for s in samples}
    assert not missing, missing
    for exc in samples:
        front_door = jsonrpc_response_of(exc, request_id=3)
        plain = http_response_of(exc)
        assert front_door.status == plain.status == exc.http_status, exc
        assert front_door.body["error"]["code"] == exc.jsonrpc_code == mcp_error_of(exc).error.code, exc
        assert front_door.body["id"] == 3 and front_door.body["error"]["message"] == exc.message
        assert plain.body == {"error": exc.message, **exc.data}
        retry = exc.data.get("retry_after_sec")
        assert plain.headers.get("Retry-After") == front_door.headers.get("Retry-After") == (
            str(retry) if retry is not None else None)
        line, code = errors.exit_line_of(exc, "kdbl-control")
        assert code == exc.exit_code and "\n" not in line and line == f"kdbl-control: {exc.message}"


def test_the_declared_codes_are_the_ones_clients_always_got():
    assert (Unauthenticated.jsonrpc_code, Unauthenticated.http_status) == (-32001, 401)
    assert (Forbidden.jsonrpc_code, Forbidden.http_status) == (-32003, 403)
    assert (RateLimited.jsonrpc_code, RateLimited.http_status) == (-32029, 429)
    assert (Unavailable.jsonrpc_code, Unavailable.http_status) == (-32004, 503)
    assert (NotFound.jsonrpc_code, NotFound.http_status) == (-32002, 404)
    assert (InvalidArgument.jsonrpc_code, InvalidArgument.http_status) == (-32602, 400)
    not_json = MalformedMessage("b", "x", parse_error=True)
    assert (MalformedMessage.jsonrpc_code, not_json.jsonrpc_code) == (-32600, -32700)
    assert (RequestTooLarge.http_status, RequestTimeout.http_status) == (413, 408)
    assert MisdirectedRequest.http_status == 421
    assert UpstreamError.http_status == 502 and Conflict.http_status == 409


def test_exceptions_that_leave_their_module_are_in_the_hierarchy_and_there_is_one_conflict():
    assert admin.Conflict is Conflict and k8s.Conflict is Conflict
    for cls, base in ((ScheduleError, InvalidArgument), (store.FenceLost, Conflict),
                      (LoadgenError, UpstreamError),
                      (k8s.NamespaceMissing, NotFound), (InvalidSpec, KdblError), (EnvelopeError, KdblError)):
        assert issubclass(cls, base), cls
    with pytest.raises(ScheduleError) as bad:
        parse("61 * * * *")
    assert bad.value.data == {"field": "schedule"} and isinstance(bad.value, ValueError)
    from kdbl_worker.extract import archive, containers, doc, ole, ppt

    private = (archive.PackageError, ole.OleError, doc.DocError, ppt.PptError, containers.Refused)
    assert not any(issubclass(cls, KdblError) for cls in private)  # control flow inside their module


@pytest.fixture(scope="module")
def api(owner_engine, owner_url, worker_engine):
    name = f"render-{uuid.uuid4().hex[:8]}"
    admin.create_tenant(db_of(owner_engine), name)
    token = admin.create_token(db_of(owner_engine), tenant_name=name, name="agent")[0]
    search_only = admin.create_token(db_of(owner_engine), tenant_name=name, name="s",
                                     scopes=["kdbl.search"])[0]
    with running_fetch(worker_engine, FETCH_TOKEN) as fetch:
        settings = Settings(mcp_enabled=True, download_signing_secret=SIGNING,
                            internal_fetch_token=FETCH_TOKEN,
                            worker_fetch_url=fetch, api_public_url="http://public.example:8443",
                            max_request_bytes=4096)
        with running_api(owner_url, settings) as url:
            yield {"url": url, "token": token, "search_only": search_only}


def _assert_jsonrpc(response: httpx.Response, exc_type: type[KdblError], code: int | None = None) -> dict:
    body = response.json()
    assert response.status_code == exc_type.http_status, body
    assert body["error"]["code"] == (code if code is not None else exc_type.jsonrpc_code), body
    return body


def _post(api, body: bytes | dict, token: str | None = None, **headers: str) -> httpx.Response:
    if token:
        headers["Authorization"] = f"Bearer {token}"
    headers.setdefault("Accept", "application/json, text/event-stream")
    kwargs = {"json": body} if isinstance(body, dict) else {"content": body}
    return httpx.post(f"{api['url']}/mcp", headers={"Content-Type": "application/json", **headers}, **kwargs)


def test_the_front_door_answers_each_refusal_with_its_error_classs_codes(api):
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "get_file_text", "arguments": {"source_id": str(uuid.uuid4()), "key": "a.md"}}}
    missing = _post(api, call)
    _assert_jsonrpc(missing, Unauthenticated)
    assert missing.headers["WWW-Authenticate"].startswith('Bearer realm="kdbl"')
    _assert_jsonrpc(_post(api, call, "kdbl_pat_nottherealone"), Unauthenticated)
    scope = _assert_jsonrpc(_post(api, call, api["search_only"]), Forbidden)
    assert scope["error"]["data"] == {"required_scope": "kdbl.read"}
    _assert_jsonrpc(_post(api, b"{not json", api["token"]), MalformedMessage, errors.PARSE_ERROR)
    echoed = _assert_jsonrpc(_post(api, {"jsonrpc": "1.0", "id": 9, "method": "ping"}, api["token"]),
                             MalformedMessage)
    assert echoed["id"] == 9 and echoed["error"]["data"] == {"field": "jsonrpc"}
    oversize = {"jsonrpc": "2.0", "id": 2, "method": "x", "params": {"p": "y" * 5000}}
    _assert_jsonrpc(_post(api, oversize, api["token"]), RequestTooLarge)
    hint = _assert_jsonrpc(_post(api, {"jsonrpc": "2.0", "id": 3, "method": "ping"}, api["token"],
                                 Host="evil.example"), MisdirectedRequest)
    assert hint["error"]["data"]["host"] == "evil.example"
    tool = _post(api, {**call, "params": {"name": "rm_rf", "arguments": {}}}, api["token"]).json()
    assert tool["error"]["code"] == InvalidArgument.jsonrpc_code
    assert tool["error"]["data"] == {"field": "name"}


def test_downloads_and_capacity_answer_with_the_error_classs_status_and_body(api):
    forged = httpx.get(f"{api['url']}/api/files/download", params={"t": "forged"})
    assert forged.status_code == Forbidden.http_status
    assert forged.json() == http_response_of(Forbidden("invalid download link")).body
    anonymous = httpx.get(f"{api['url']}/capacity")
    assert anonymous.status_code == Unauthenticated.http_status and "WWW-Authenticate" in anonymous.headers
    assert anonymous.json() == {"error": "authentication required: send Authorization: Bearer <token>"}


def test_the_worker_fetch_endpoint_answers_with_the_error_classs_status_and_body(worker_engine):
    with running_fetch(worker_engine, FETCH_TOKEN) as url:
        refused = httpx.get(f"{url}/internal/files", headers={"Authorization": "Bearer wrong"})
        assert refused.status_code == Unauthenticated.http_status
        assert refused.json() == http_response_of(Unauthenticated("unauthorized")).body
        auth = {"Authorization": f"Bearer {FETCH_TOKEN}"}
        bad = httpx.get(f"{url}/internal/files", params={"source_id": "nope", "key": "a"}, headers=auth)
        assert bad.status_code == InvalidArgument.http_status
        assert bad.json() == http_response_of(InvalidArgument("source_id", "must be a UUID")).body
        unknown = {"source_id": str(uuid.uuid4()), "key": "a"}
        gone = httpx.get(f"{url}/internal/files", params=unknown, headers=auth)
        assert gone.status_code == NotFound.http_status and gone.json() == {"error": "not found"}
    with serving(create_fetch_app(Settings(), db_of(worker_engine))) as url:
        off = httpx.get(f"{url}/internal/files", headers=auth)
        assert off.status_code == Forbidden.http_status and "KDBL_INTERNAL_FETCH_TOKEN" in off.json()["error"]


def _cli(capsys, *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as done:
        cli_main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("kdbl-control: "), err
    return done.value.code, err


def test_the_cli_prints_one_line_and_exits_with_the_error_classs_code(monkeypatch, capsys, tmp_path,
                                                                      owner_url):
    monkeypatch.setenv("KDBL_API_PORT", "eighty")
    code, err = _cli(capsys, "tenant", "list")
    assert code == ConfigError.exit_code == 2 and "KDBL_API_PORT" in err
    monkeypatch.delenv("KDBL_API_PORT")
    code, err = _cli(capsys, "--data-dir", str(tmp_path / "nowhere"), "tenant", "list")
    assert code == ConfigError.exit_code and "no K-Lake data" in err
    code, err = _cli(capsys, "token", "create", "--expires", "soon")
    assert code == 2 and "--expires" in err
    monkeypatch.setenv("KDBL_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    code, err = _cli(capsys, "tenant", "list")
    assert code == Unavailable.exit_code == 75 and "cannot be reached" in err
    monkeypatch.setenv("KDBL_DATABASE_URL", owner_url)
    code, err = _cli(capsys, "source", "add", "--tenant", "nobody", "--path", str(tmp_path),
                     "--schedule", "61 * * * *")
    assert code == InvalidArgument.exit_code == 1 and "'schedule'" in err


@pytest.mark.parametrize(("exc", "temporary"), [
    (Unavailable("database down"), True), (k8s.KubernetesUnavailable("API server 503"), True),
    (InvalidSpec("TenantNotFound", "no tenant 'a'"), True), (InvalidSpec("NameConflict", "taken"), True),
    (InvalidSpec("InvalidSchedule", "bad cron"), False), (ConfigError("no database URL"), False),
    (PermanentError("unsupported protocol"), False), (k8s.NamespaceMissing("team-a"), False),
])
def test_the_operator_retries_temporary_errors_and_waits_on_permanent_ones(exc, temporary):
    raised = kopf_error_of(exc, delay=4.0)
    assert raised.args[0] == exc.message and exc.temporary is temporary
    if temporary:
        assert isinstance(raised, kopf.TemporaryError) and raised.delay == 4.0
    else:
        assert isinstance(raised, kopf.PermanentError)
