"""A lean HTTP/1.1 load generator for `kdbl-control bench search`.

On a 2-core machine the load generator shares the CPU with the API and Postgres, so its own cost per
request is part of what is measured. httpx spends ~3 ms of CPU per 36 KB search response; this client
pre-encodes each request, keeps one connection per client and parses only the status line, the headers
and the JSON body (~0.4 ms), so the numbers describe the server rather than the client.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from kdbl_core.errors import UpstreamError


class LoadgenError(UpstreamError):
    """The server closed the connection or answered something that is not HTTP/1.1 (bench reads it)."""


@dataclass(slots=True)
class Outcome:
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)

    def record(self, ms: float, error: str | None) -> None:
        self.latencies_ms.append(ms)
        if error is not None:
            self.errors += 1
            if len(self.error_samples) < 5:
                self.error_samples.append(error)


def encode_post(url: str, body: bytes, headers: dict[str, str]) -> bytes:
    parts = urlsplit(url)
    head = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json",
            f"Content-Length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class Connection:
    """One keep-alive HTTP/1.1 connection; `post` sends pre-encoded bytes and returns (status, body)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, request: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
        assert self.reader is not None
        self.writer.write(request)
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            await self.close()
            raise LoadgenError(f"connection closed: {exc}") from None
        lines = head.decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            await self.close()
            raise LoadgenError(f"not an HTTP response: {lines[0][:80]!r}") from None
        length, chunked, close = 0, False, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        body = await (self._read_chunked() if chunked else self.reader.readexactly(length))
        if close:
            await self.close()
        return status, body

    async def _read_chunked(self) -> bytes:
        assert self.reader is not None
        out = bytearray()
        while True:
            size = int((await self.reader.readline()).split(b";")[0], 16)
            if size == 0:
                await self.reader.readline()
                return bytes(out)
            out += await self.reader.readexactly(size)
            await self.reader.readexactly(2)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except ConnectionError:
                pass
        self.reader = self.writer = None


def jsonrpc_error(status: int, body: bytes) -> str | None:
    """None for a successful tools/call answer, else a short description of what went wrong."""
    if status != 200:
        return f"HTTP {status}"
    try:
        message = json.loads(body)
    except ValueError:
        return "response is not JSON"
    if "error" in message:
        return f"JSON-RPC error {message['error'].get('code')}: {message['error'].get('message', '')[:80]}"
    if message.get("result", {}).get("isError"):
        return "tool error"
    return None


Record = Callable[[float, int | None, str | None], None]  # (milliseconds, HTTP status, error)


async def run_clients(url: str, requests: list[bytes], *, clients: int, seconds: float,
                      record: Record | None = None) -> tuple[Outcome, float]:
    """`clients` connections sending `requests` round-robin for `seconds`; returns (outcome, elapsed s).
    `record` also sees each call (with its HTTP status, None when the connection failed)."""
    outcome = Outcome()
    deadline = time.monotonic() + seconds

    async def client(offset: int) -> None:
        conn = Connection(url)
        i = offset
        try:
            while time.monotonic() < deadline:
                start = time.perf_counter()
                status: int | None = None
                try:
                    status, body = await conn.post(requests[i % len(requests)])
                    error = jsonrpc_error(status, body)
                except (LoadgenError, OSError) as exc:
                    error = str(exc)
                ms = (time.perf_counter() - start) * 1000
                outcome.record(ms, error)
                if record is not None:
                    record(ms, status, error)
                i += clients
        finally:
            await conn.close()

    started = time.monotonic()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return outcome, time.monotonic() - started
