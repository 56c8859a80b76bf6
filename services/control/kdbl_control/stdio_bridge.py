"""`kdbl-control mcp stdio`: a local stdio MCP server that forwards every message to a K-Lake API's POST /mcp.

Desktop clients (Claude Desktop's `mcpServers` entries with `command` and `args`) spawn a command and
speak newline-delimited JSON-RPC over its stdin and stdout. This bridge relays each message unchanged to
the API's POST /mcp (Streamable HTTP, with the bearer token) and writes the API's JSON-RPC answer back
as one line: initialize, tools/list, tools/call, resources/*, ping and any method the API adds pass
without a per-method mapping, and an error keeps its code and message (-32602 stays -32602). After
`initialize` each POST carries the negotiated `MCP-Protocol-Version`. Messages are relayed concurrently
(at most MAX_IN_FLIGHT at once), each answer written whole under one lock.

Refusals the API sends before it parses a message (401 bad token, 429, 403) carry id null on HTTP; here
they get the request's id, so the client sees the error instead of waiting. A 401 says which token
source to fix. An unreachable API or a non-JSON answer (a proxy's 502 page) is a JSON-RPC error with
code -32004 / -32603 naming the URL and status.

The token comes from --token-file FILE (or KDBL_API_TOKEN_FILE), else KDBL_API_TOKEN (a desktop client's
`env` block); no flag takes it, so it is never on a command line, and no log line carries it. stdout
carries protocol messages only; stderr JSON log lines only (kdbl_core.logging_setup), startup faults
included. Measured here (loopback, shared 2-core box, 20 distinct lexical searches per run, no cache
hits): p50 22.1, 25.4, 27.9, 22.9 ms through the bridge against 18.3, 19.4, 19.0, 19.6 ms over POST /mcp
directly in the same runs, so the relay (a second process, a pipe each way, one more HTTP hop) costs
about 3-9 ms; under heavier load both were ~44 ms (tests/integration/test_stdio_bridge.py prints both).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import httpx

from kdbl_control.smoke import read_token
from kdbl_core.errors import INTERNAL_ERROR, PARSE_ERROR, UNAUTHENTICATED, UNAVAILABLE, ConfigError
from kdbl_core.settings import Settings

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 16
ACCEPT = "application/json, text/event-stream"


def mcp_url(api_url: str) -> str:
    url = api_url.rstrip("/")
    return url if url.endswith("/mcp") else f"{url}/mcp"


def token_of(token_file: Path | str | None, settings: Settings) -> str:
    """The PAT: --token-file (or KDBL_API_TOKEN_FILE), else KDBL_API_TOKEN; a ConfigError names both."""
    token = read_token(token_file or settings.api_token_file)
    if token is None and settings.api_token is not None:
        token = settings.api_token.get_secret_value().strip() or None
    if not token:
        raise ConfigError("mcp stdio needs a token: --token-file FILE (or KDBL_API_TOKEN_FILE) or the "
                          "KDBL_API_TOKEN environment variable (never a command-line flag)")
    return token


class Bridge:
    def __init__(self, api_url: str, token: str, *, timeout_s: float = 120.0) -> None:
        self.url = mcp_url(api_url)
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0),
                                      headers={"Authorization": f"Bearer {token}", "Accept": ACCEPT})
        self.protocol_version: str | None = None
        self.write_lock = anyio.Lock()
        self.limiter = anyio.CapacityLimiter(MAX_IN_FLIGHT)

    async def run(self, stdin: BinaryIO, stdout: BinaryIO) -> None:
        """Relay until stdin closes, then let the calls under way finish."""
        source = anyio.wrap_file(stdin)
        self.out = anyio.wrap_file(stdout)
        log.info("mcp stdio bridge started", extra={"api": self.url})
        async with self.http, anyio.create_task_group() as tasks:
            async for line in source:
                if not line.strip():
                    continue
                borrower = object()
                await self.limiter.acquire_on_behalf_of(borrower)  # a full pipe of requests waits here
                tasks.start_soon(self._relay_line, line, borrower)
        log.info("mcp stdio bridge stopped", extra={"api": self.url})

    async def _relay_line(self, line: bytes, borrower: object) -> None:
        try:
            try:
                message = json.loads(line)
            except (ValueError, UnicodeDecodeError, RecursionError):
                await self._write({"jsonrpc": "2.0", "id": None,
                                   "error": {"code": PARSE_ERROR, "message": "not a JSON-RPC message (invalid JSON)"}})
                return
            for answer in await self.relay(message):
                await self._write(answer)
        finally:
            self.limiter.release_on_behalf_of(borrower)

    async def relay(self, message: Any) -> list[dict[str, Any]]:
        """The API's answers to one client message (none for a notification)."""
        msg_id = message.get("id") if isinstance(message, dict) else None
        method = message.get("method") if isinstance(message, dict) else None
        headers = {"MCP-Protocol-Version": self.protocol_version} if self.protocol_version else {}
        try:
            response = await self.http.post(self.url, json=message, headers=headers)
        except httpx.HTTPError as exc:
            log.warning("api unreachable", extra={"api": self.url, "method": method, "error": type(exc).__name__})
            return _error(msg_id, UNAVAILABLE, f"cannot reach the K-Lake API at {self.url} ({type(exc).__name__})")
        answers = _messages_of(response)
        if answers is None:
            log.warning("api answered without JSON-RPC", extra={"api": self.url, "method": method,
                                                                "status": response.status_code})
            return _error(msg_id, INTERNAL_ERROR, f"the K-Lake API at {self.url} answered HTTP "
                                                  f"{response.status_code} without a JSON-RPC message")
        for answer in answers:
            error = answer.get("error")
            if answer.get("id") is None and msg_id is not None and isinstance(error, dict) \
                    and error.get("code") != PARSE_ERROR:
                answer["id"] = msg_id
            if response.status_code == 401 and isinstance(error, dict):
                error["code"] = UNAUTHENTICATED
                error["message"] = (f"the K-Lake API refused the token ({error.get('message')}): check the "
                                    "file --token-file names, or KDBL_API_TOKEN")
                log.warning("api refused the token", extra={"api": self.url, "status": 401})
            result = answer.get("result")
            if method == "initialize" and isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
                self.protocol_version = result["protocolVersion"]
        return answers

    async def _write(self, answer: dict[str, Any]) -> None:
        data = json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        async with self.write_lock:
            await self.out.write(data)
            await self.out.flush()


def _error(msg_id: Any, code: int, message: str) -> list[dict[str, Any]]:
    if msg_id is None:
        return []  # a notification: nobody waits for an answer
    return [{"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}]


def _messages_of(response: httpx.Response) -> list[dict[str, Any]] | None:
    """The JSON-RPC messages of a POST /mcp answer ([] for 202 Accepted), None if it holds none."""
    if response.status_code == 202 or not response.content.strip():
        return [] if response.status_code < 400 else None
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        try:
            found = [json.loads(d) for d in data if d]
        except ValueError:
            return None
    else:
        try:
            found = json.loads(response.content)
        except ValueError:
            return None
    found = found if isinstance(found, list) else [found]
    if not found or not all(isinstance(m, dict) and m.get("jsonrpc") == "2.0" for m in found):
        return None
    return found


def serve(api_url: str | None, token_file: Path | None, settings: Settings, *, token_in_argv: bool = False) -> int:
    """The command: relay stdin/stdout to the API until stdin closes. Faults are JSON log lines (exit 2)."""
    try:
        if token_in_argv:
            raise ConfigError("mcp stdio does not take the token on the command line (other users see it in "
                              "ps): use --token-file FILE or KDBL_API_TOKEN")
        if not api_url:
            raise ConfigError("mcp stdio needs --api-url URL (the K-Lake API, e.g. https://kdbl.example.org)")
        token = token_of(token_file, settings)
    except ConfigError as exc:
        log.error("mcp stdio cannot start", extra={"reason": exc.message})
        return 2
    anyio.run(Bridge(api_url, token).run, sys.stdin.buffer, sys.stdout.buffer)
    return 0
