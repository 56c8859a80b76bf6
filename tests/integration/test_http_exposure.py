"""What the API exposes over real HTTP, served exactly as `kdbl-api` serves it (kdbl_api.main).

Issue 13: X-Forwarded-For was believed from loopback (an audit row recorded 6.6.6.6, item 11);
/capacity and /metrics answered without a token (item 12); a stalled request body held a connection
open > 25 s (item 8).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from helpers import db_of, free_port, make_corpus

from kdbl_api import main
from kdbl_api.app import create_app
from kdbl_control import admin
from kdbl_core.db.urls import for_role
from kdbl_core.settings import Settings

HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
SEARCH = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
          "params": {"name": "search_content", "arguments": {"query": "okapi"}}}


@contextmanager
def kdbl_api(owner_url: str, **overrides) -> Iterator[Settings]:
    """create_app on the API port and the metrics port, with kdbl-api's uvicorn options."""
    settings = Settings(mcp_enabled=True, api_host="127.0.0.1", api_port=free_port(),
                        metrics_port=free_port(), db_pool_size=2, **overrides)
    app = create_app(settings, for_role(owner_url, "kdbl_api"))
    server = uvicorn.Server(uvicorn.Config(app, **main.SERVER_OPTIONS))
    sockets = main.listen_sockets(settings)
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # fails at once if the thread ends; the bound is for a loaded machine
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "API did not start"
        time.sleep(0.05)
    try:
        yield settings
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def base(settings: Settings, port: int | None = None) -> str:
    return f"http://127.0.0.1:{port or settings.api_port}"


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, tmp_path_factory):
    root = tmp_path_factory.mktemp("exposure")
    make_corpus(owner_engine, worker_engine, root / "one", {"a.md": "The okapi report is due in March."},
                tenant="expo-one")
    make_corpus(owner_engine, worker_engine, root / "two", {
        f"{i}.md": f"Note {i} about the okapi migration." for i in range(3)}, tenant="expo-two")
    return {"one": admin.create_token(db_of(owner_engine), tenant_name="expo-one", name="agent")[0],
            "two": admin.create_token(db_of(owner_engine), tenant_name="expo-two", name="agent")[0]}


def _client_ip_of_a_search(owner_engine, settings: Settings, token: str, forwarded_for: str) -> str:
    with httpx.Client() as http:
        response = http.post(f"{base(settings)}/mcp", json=SEARCH, headers={
            **HEADERS, "Authorization": f"Bearer {token}", "X-Forwarded-For": forwarded_for})
    assert response.status_code == 200 and "result" in response.json()
    [row] = admin.audit_rows(db_of(owner_engine), tenant_name="expo-one", tool="search_content", limit=1)
    return row["client_ip"]


@pytest.mark.parametrize("trusted", [[], ["10.0.0.0/8"]], ids=["no proxy configured", "another proxy"])
def test_a_forwarded_for_header_from_a_peer_that_is_not_a_trusted_proxy_is_not_recorded(
        owner_url, owner_engine, world, trusted):
    with kdbl_api(owner_url, trusted_proxies=trusted) as settings:
        recorded = _client_ip_of_a_search(owner_engine, settings, world["one"], "6.6.6.6")
    assert recorded == "127.0.0.1"


def test_a_configured_proxys_forwarded_for_header_is_recorded(owner_url, owner_engine, world):
    with kdbl_api(owner_url, trusted_proxies=["127.0.0.1/32"]) as settings:
        recorded = _client_ip_of_a_search(owner_engine, settings, world["one"], "203.0.113.7, 6.6.6.6")
    assert recorded == "6.6.6.6"  # the nearest hop the trusted proxy saw, not what the client claimed


def test_a_trusted_proxy_that_is_not_an_address_is_a_clear_settings_error():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="KDBL_TRUSTED_PROXIES"):
        Settings(trusted_proxies="ingress-nginx")
    assert Settings(trusted_proxies="10.0.0.1, 192.168.0.0/16").trusted_proxies == ["10.0.0.1/32", "192.168.0.0/16"]


def test_metrics_are_served_only_on_the_metrics_port_and_name_no_tenant(owner_url, world):
    with kdbl_api(owner_url) as settings, httpx.Client() as http:
        assert http.post(f"{base(settings)}/mcp", json=SEARCH,
                         headers={**HEADERS, "Authorization": f"Bearer {world['one']}"}).status_code == 200
        on_api_port = http.get(f"{base(settings)}/metrics")
        metrics = http.get(f"{base(settings, settings.metrics_port)}/metrics")
        others = [http.get(f"{base(settings, settings.metrics_port)}{path}").status_code
                  for path in ("/capacity", "/healthz", "/api/files/download")]
        mcp = http.post(f"{base(settings, settings.metrics_port)}/mcp", json=SEARCH,
                        headers={**HEADERS, "Authorization": f"Bearer {world['one']}"})
    assert on_api_port.status_code == 404
    assert metrics.status_code == 200
    assert 'kdbl_mcp_calls_total{status="ok",tool="search_content"}' in metrics.text
    assert "expo-" not in metrics.text and "tenant" not in metrics.text
    assert others == [404, 404, 404] and mcp.status_code == 404


def test_capacity_takes_tokens_through_the_one_front_door_refusals_audited_and_counted(owner_url, owner_engine):
    db = db_of(owner_engine)
    admin.create_tenant(db, "expo-three", exist_ok=True)
    token = admin.create_token(db, tenant_name="expo-three", name="to-revoke")[0]
    assert admin.revoke_token(db, token) == 1
    with kdbl_api(owner_url) as settings, httpx.Client() as http:
        revoked = http.get(f"{base(settings)}/capacity", headers={"Authorization": f"Bearer {token}"})
        metrics = http.get(f"{base(settings, settings.metrics_port)}/metrics").text
    assert revoked.status_code == 401 and "error" in revoked.json()  # a plain HTTP answer, not JSON-RPC
    assert 'invalid_token' in revoked.headers["www-authenticate"]
    assert 'kdbl_auth_failures_total{reason="invalid"} 1.0' in metrics
    [row] = admin.audit_rows(db_of(owner_engine), tenant_name="expo-three", tool="/capacity", limit=5)
    assert row["status"] == "unauthenticated" and "revoked" in row["error"]


def test_capacity_needs_a_valid_token_and_shows_only_the_callers_tenant(owner_url, world):
    with kdbl_api(owner_url) as settings, httpx.Client() as http:
        anonymous = http.get(f"{base(settings)}/capacity")
        forged = http.get(f"{base(settings)}/capacity", headers={"Authorization": "Bearer kdblpat_forged"})
        one = http.get(f"{base(settings)}/capacity", headers={"Authorization": f"Bearer {world['one']}"})
        two = http.get(f"{base(settings)}/capacity", headers={"Authorization": f"Bearer {world['two']}"})
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Bearer ")
    assert forged.status_code == 401
    assert one.status_code == 200 and two.status_code == 200
    # each tenant's embedding progress counts its own chunks: one file against three
    progress_one = one.json()["modes"]["hybrid"]["embedding_progress"]
    progress_two = two.json()["modes"]["hybrid"]["embedding_progress"]
    # (no embedder in this API: no rate, no ETA)
    assert progress_one == {"hybrid_chunks": 1, "embedded_chunks": 0, "chunks_per_s": None, "eta_s": None}
    assert progress_two == {"hybrid_chunks": 3, "embedded_chunks": 0, "chunks_per_s": None, "eta_s": None}


def test_a_stalled_request_body_gets_408_and_the_connection_is_closed(owner_url, world):
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}'
    with kdbl_api(owner_url, body_read_timeout_s=0.5) as settings, \
            socket.create_connection(("127.0.0.1", settings.api_port), timeout=10) as sock:
        sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\n"
                     + f"Authorization: Bearer {world['one']}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                     + body[:20])  # half a body, then nothing
        started = time.monotonic()
        received = b""
        while chunk := sock.recv(65536):  # until the server closes the connection
            received += chunk
        waited = time.monotonic() - started
    status_line = received.split(b"\r\n", 1)[0]
    assert status_line == b"HTTP/1.1 408 Request Timeout"
    assert b"request body not received within 0.5 s" in received
    assert 0.4 < waited < 5
