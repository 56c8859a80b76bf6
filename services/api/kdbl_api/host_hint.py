"""A 421 from /mcp that says what to change.

The MCP SDK's DNS-rebinding protection answers a Host header outside KDBL_ALLOWED_HOSTS with a bare
421 "Invalid Host header"; a chat front end in a container (Host: host.docker.internal) met only that.
This wrapper replaces the body with a JSON-RPC error naming the Host received and the settings that
admit it (`kdbl-control up --host`, KDBL_ALLOWED_HOSTS); the check itself stays the SDK's.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kdbl_core.errors import MisdirectedRequest, jsonrpc_response_of
from kdbl_core.settings import Settings


class HostHint:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.allowed = list(settings.allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] = {}

        async def send_with_hint(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 421:
                held["start"] = message
                return
            if "start" in held and message["type"] == "http.response.body":
                if message.get("more_body"):
                    return
                body = self._body(scope)
                headers = [(k, v) for k, v in held["start"].get("headers", [])
                           if k.lower() not in (b"content-length", b"content-type")]
                headers += [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]
                await send({**held["start"], "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, send_with_hint)

    def _body(self, scope: Scope) -> bytes:
        host = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"host"), "")
        message = (f"Invalid Host header {host!r}: not allowed here (DNS-rebinding protection). "
                   "kdbl-control up: start it with --host NAME (or --host 0.0.0.0 to admit this machine's "
                   "names and addresses); kdbl-api: add the name to KDBL_ALLOWED_HOSTS (comma-separated "
                   "host:port, port may be *).")
        refusal = MisdirectedRequest(message, data={"host": host, "allowed_hosts": self.allowed,
                                                    "settings": ["--host", "KDBL_ALLOWED_HOSTS"]})
        return json.dumps(jsonrpc_response_of(refusal).body).encode()
