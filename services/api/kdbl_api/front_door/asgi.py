"""The ASGI plumbing the front door's parts share: headers added to a response, a body read once replayed."""

from __future__ import annotations

from starlette.types import Message, Receive, Send


def with_headers(send: Send, headers: dict[str, str] | None) -> Send:
    """`send` with `headers` added to the response's start (`send` itself when there are none)."""
    if not headers:
        return send
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *raw]}
        await send(message)

    return wrapped


def replay(body: bytes, then: Receive | None = None) -> Receive:
    """The body read once, again; after it a disconnect at once, or `then`'s messages."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive
