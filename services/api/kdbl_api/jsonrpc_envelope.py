"""The JSON-RPC envelope of a POST /mcp body, checked before the MCP SDK sees it.

The SDK let through, or answered badly, what MCP forbids: a request with `id: null` or an object id
was taken for a notification (HTTP 202, never answered); JSON nested 5,000 deep made the front door's
`json.loads` raise RecursionError (HTTP 500); a non-object body, a bad `jsonrpc`/`method`, or
tools/call and resources/* params of the wrong shape got "Validation error" dumps or -32602 naming no
field. Here one parse (orjson: ~5x the stdlib's speed, and it refuses invalid UTF-8 and lone
surrogates) and a few checks answer each with -32700 or -32600 (HTTP 400) naming the field, or -32602
for params, echoing the request id when it is valid. Legitimate MCP messages nest < 10 levels;
MAX_DEPTH keeps every later recursive step (pydantic, json.dumps of the audit row) far from Python's
recursion limit.
"""

from __future__ import annotations

from typing import Any

import orjson

from kdbl_core.errors import InvalidArgument, KdblError, MalformedMessage

MAX_DEPTH = 32
MAX_METHOD_CHARS = 256
_LIST_METHODS = {"tools/list", "resources/list", "resources/templates/list", "prompts/list"}


class EnvelopeError(KdblError):
    """A refused message: the error it carries (its codes, message and data are this one's), and the
    request id to echo (None when it is unusable)."""

    def __init__(self, error: KdblError, request_id: str | int | None = None) -> None:
        super().__init__(error.message, data=error.data)
        self.jsonrpc_code, self.http_status = error.jsonrpc_code, error.http_status
        self.error, self.request_id = error, request_id


def _too_deep(root: Any, limit: int) -> bool:
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in (node.values() if isinstance(node, dict) else node):
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def _valid_id(value: Any) -> bool:
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def parse(body: bytes) -> dict[str, Any]:
    """The message, or EnvelopeError. Responses and notifications pass to the SDK unchanged."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise EnvelopeError(MalformedMessage("body", f"not valid JSON ({exc})", parse_error=True)) from None
    if not isinstance(message, dict):
        raise EnvelopeError(MalformedMessage("body", "must be one JSON-RPC message object (no batches)"))
    if _too_deep(message, MAX_DEPTH):
        raise EnvelopeError(MalformedMessage("body", f"JSON nested deeper than {MAX_DEPTH} levels",
                                             parse_error=True))
    request_id = message.get("id")
    echo = request_id if _valid_id(request_id) else None
    if message.get("jsonrpc") != "2.0":
        raise EnvelopeError(MalformedMessage("jsonrpc", 'must be "2.0"'), echo)
    if "method" not in message:
        return message  # a response (result/error): the SDK routes it
    method = message["method"]
    if not isinstance(method, str) or not method or len(method) > MAX_METHOD_CHARS or "\x00" in method:
        raise EnvelopeError(MalformedMessage(
            "method", f"must be a method name (1-{MAX_METHOD_CHARS} characters)"), echo)
    if "id" in message and not _valid_id(request_id):
        raise EnvelopeError(MalformedMessage("id", "must be a string or an integer (MCP forbids null); "
                                                   "omit it only for a notification"))
    if "params" in message and not isinstance(message["params"], dict) and message["params"] is not None:
        raise EnvelopeError(InvalidArgument("params", "must be an object"), echo)
    if "id" in message:
        _check_params(method, message.get("params") or {}, request_id)
    return message


def _check_params(method: str, params: dict[str, Any], request_id: str | int) -> None:
    """The params the SDK would refuse with a bare 'Invalid request parameters', refused naming the field."""
    problem: tuple[str, str] | None = None
    if method == "tools/call":
        name, arguments = params.get("name"), params.get("arguments")
        if "name" not in params and not params:
            problem = ("params", "tools/call needs params with the tool's name and arguments")
        elif not isinstance(name, str) or not name:
            problem = ("name", "must be the tool's name (a string)")
        elif arguments is not None and not isinstance(arguments, dict):
            problem = ("arguments", "must be an object of the tool's arguments")
    elif method == "resources/read":
        if not isinstance(params.get("uri"), str):
            problem = ("uri", "must be a kdbl://file/<source_id>/<key> string")
    elif method in _LIST_METHODS:
        cursor = params.get("cursor")
        if cursor is not None and not isinstance(cursor, str):
            problem = ("cursor", "must be the next_cursor string of a previous page")
    if problem:
        raise EnvelopeError(InvalidArgument(*problem), request_id)
