"""Fixtures for checking /mcp from outside with the official MCP JavaScript tools.

* `mcp_js` — Node 22 plus the pinned conformance suite, Inspector and mcp-remote under tools/ (see
  .ci/install-node.sh). When they are missing or were installed from another lockfile the script is run
  once; if it cannot install, the tests FAIL: a conformance suite that silently skips proves nothing.
* `mcp_server` — the real API (`running_api`) with a crawled tenant and a PAT, plus `AuthProxy`, a tiny
  loopback reverse proxy that adds `Authorization: Bearer <PAT>`, because the conformance CLI sends no
  credentials. The proxy forwards every other header unchanged, Host and Origin included, so the API's
  DNS-rebinding protection sees exactly what the client sent.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from helpers import Corpus, db_of, make_corpus, running_api

from kdbl_control import admin
from kdbl_core.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO_ROOT / ".ci" / "install-node.sh"
JS_SRC = Path(__file__).resolve().parent / "js"
NODE_VERSION = re.search(r'^NODE_VERSION="([^"]+)"$', INSTALL_SCRIPT.read_text(), re.M).group(1)
NODE = REPO_ROOT / "tools" / "node" / "bin" / "node"
JS_DIR = REPO_ROOT / "tools" / "mcp-js"
MCP_PACKAGES = JS_DIR / "node_modules" / "@modelcontextprotocol"
CONFORMANCE = MCP_PACKAGES / "conformance" / "dist" / "index.js"
INSPECTOR = MCP_PACKAGES / "inspector" / "clients" / "launcher" / "build" / "index.js"
MCP_REMOTE = JS_DIR / "node_modules" / "mcp-remote" / "dist" / "proxy.js"
STAMP = JS_DIR / ".kdbl-install-stamp"


@dataclass(frozen=True)
class McpJs:
    node: Path
    conformance: Path
    inspector: Path
    mcp_remote: Path  # the npm stdio -> Streamable HTTP bridge (test_bridges.py)


def _installed_stamp_is_current() -> bool:
    """The installer's stamp: sha256 of package.json + package-lock.json, and the node version."""
    digest = hashlib.sha256((JS_SRC / "package.json").read_bytes()
                            + (JS_SRC / "package-lock.json").read_bytes())
    want = f"{digest.hexdigest()} node-{NODE_VERSION}"
    return STAMP.is_file() and STAMP.read_text().strip() == want


@pytest.fixture(scope="session")
def mcp_js() -> McpJs:
    installed = all(p.is_file() for p in (NODE, CONFORMANCE, INSPECTOR, MCP_REMOTE))
    if not (installed and _installed_stamp_is_current()):
        try:
            proc = subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{INSTALL_SCRIPT} timed out after {exc.timeout}s; the conformance tests need "
                        "Node 22 and the MCP tools", pytrace=False)
        if proc.returncode != 0:
            pytest.fail(f"{INSTALL_SCRIPT} failed (rc={proc.returncode}); the conformance tests need "
                        f"Node 22 and the MCP tools.\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    missing = [str(p) for p in (NODE, CONFORMANCE, INSPECTOR, MCP_REMOTE) if not p.is_file()]
    if missing or not _installed_stamp_is_current():
        pytest.fail(f"after {INSTALL_SCRIPT}: missing {missing} or a stale install stamp", pytrace=False)
    return McpJs(NODE, CONFORMANCE, INSPECTOR, MCP_REMOTE)


# --- the auth-adding reverse proxy -------------------------------------------------------------------

# Hop-by-hop headers (RFC 9110 §7.6.1) are the proxy's own business; content-length is recomputed.
_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade", "content-length"}


@dataclass
class Exchange:
    method: str
    path: str
    request_headers: dict[str, str]  # lower-cased names
    request_body: bytes
    status: int = 0
    response_headers: dict[str, str] = field(default_factory=dict)
    response_body: bytes = b""


class AuthProxy:
    """Forwards every request to `upstream` unchanged except for an added `Authorization` header.

    The Host header is passed through as received (not rewritten to the upstream's), so DNS-rebinding
    checks reach the API intact. Responses are streamed back; every exchange is kept in `exchanges` so a
    failing test can show what the server actually answered.
    """

    def __init__(self, upstream: str, token: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.token = token
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._http = httpx.Client(timeout=httpx.Timeout(60.0), trust_env=False)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP]
                if not any(k.lower() == "authorization" for k, _ in headers):
                    headers.append(("Authorization", f"Bearer {proxy.token}"))
                exchange = Exchange(self.command, self.path, {k.lower(): v for k, v in headers}, body)
                with proxy._lock:
                    proxy.exchanges.append(exchange)
                try:
                    request = proxy._http.build_request(self.command, proxy.upstream + self.path,
                                                        headers=headers, content=body)
                    response = proxy._http.send(request, stream=True)
                except httpx.HTTPError as exc:
                    exchange.status = 502
                    self.send_error(502, f"upstream unreachable: {type(exc).__name__}")
                    return
                try:
                    exchange.status = response.status_code
                    exchange.response_headers = dict(response.headers)
                    self.send_response(response.status_code)
                    for key, value in response.headers.multi_items():
                        if key.lower() not in _HOP:
                            self.send_header(key, value)
                    declared = response.headers.get("content-length")
                    if declared is not None:
                        self.send_header("Content-Length", declared)
                    else:  # a stream of unknown length: delimit it by closing the connection
                        self.send_header("Connection", "close")
                        self.close_connection = True
                    self.end_headers()
                    for chunk in response.iter_raw():
                        exchange.response_body += chunk
                        self.wfile.write(chunk)
                        self.wfile.flush()
                finally:
                    response.close()

            do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = do_OPTIONS = do_HEAD = _forward

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="auth-proxy", daemon=True)

    def __enter__(self) -> AuthProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        self._http.close()

    def describe(self, last: int = 8) -> str:
        """The last few exchanges, for assertion messages."""
        lines = []
        with self._lock:
            recent = self.exchanges[-last:]
        for ex in recent:
            sent = {k: v for k, v in ex.request_headers.items() if k.lower() != "authorization"}
            lines.append(f"> {ex.method} {ex.path} {sent} {ex.request_body[:400]!r}")
            lines.append(f"< {ex.status} {ex.response_headers} {ex.response_body[:800]!r}")
        return "\n".join(lines)


class _QuietServer(ThreadingHTTPServer):
    """A client that drops a kept-alive connection (the conformance CLI does, between scenarios) is not an
    error worth a traceback on stderr; anything else still is."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionResetError | BrokenPipeError):
            super().handle_error(request, client_address)


# --- the server under test ---------------------------------------------------------------------------

# The API under test: the rate limiter on, its tiers far above what a run sends (the full 2025-11-25 run is
# ~125 requests in ~3 s, ~35 of them counted; the default burst is 60 per token), so a suite that grows
# never turns into 429s. A test setting, not a weaker default.
CONFORMANCE_RATE_LIMIT = 100_000
CONFORMANCE_SETTINGS = dict(mcp_enabled=True, rate_limit_per_minute=CONFORMANCE_RATE_LIMIT,
                            rate_limit_burst=CONFORMANCE_RATE_LIMIT)


@dataclass(frozen=True)
class McpServer:
    api_url: str      # the API itself: requests need their own Authorization header
    proxy: AuthProxy  # the API behind the auth-adding proxy
    token: str
    corpus: Corpus
    rate_limit: int = CONFORMANCE_RATE_LIMIT  # the test API's burst (its RateLimit-Limit)

    @property
    def proxy_mcp_url(self) -> str:
        return f"{self.proxy.url}/mcp"

    @property
    def api_mcp_url(self) -> str:
        return f"{self.api_url}/mcp"


@pytest.fixture(scope="module")
def mcp_server(owner_url, owner_engine, worker_engine, tmp_path_factory) -> Iterator[McpServer]:
    tenant = f"conformance-{uuid.uuid4().hex[:8]}"
    corpus = make_corpus(owner_engine, worker_engine, tmp_path_factory.mktemp("conformance") / "docs", {
        "handbook.md": "# Handbook\n\nThe quarterly okapi migration report is due in March.\n",
        "policy/travel.md": "Travel policy: economy class for flights under six hours.",
    }, tenant=tenant)
    token, _ = admin.create_token(db_of(owner_engine), tenant_name=tenant, name="conformance")
    settings = Settings(**CONFORMANCE_SETTINGS)
    with running_api(owner_url, settings) as api_url, AuthProxy(api_url, token) as proxy:
        yield McpServer(api_url, proxy, token, corpus)
