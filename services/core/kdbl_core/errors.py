"""One error hierarchy for every K-Lake component.

Each error knows the JSON-RPC code and the HTTP status it maps to, so the API,
the worker's fetch endpoint and the CLI all answer bad input the same way.
Retryable errors (worth another attempt later) and permanent ones are distinct
types, as kopf's TemporaryError / PermanentError.
"""

from __future__ import annotations

from typing import Any

# JSON-RPC 2.0 codes
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# K-Lake server-defined codes (the -32000..-32099 range is reserved for servers)
RESOURCE_NOT_FOUND = -32002
RATE_LIMITED = -32029
FORBIDDEN = -32003
UNAVAILABLE = -32004


class KdblError(Exception):
    """Base of every error K-Lake raises on purpose."""

    jsonrpc_code: int = INTERNAL_ERROR
    http_status: int = 500

    def __init__(self, message: str, *, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data or {}


class InvalidArgument(KdblError):
    """A caller sent a value that cannot be used; names the field."""

    jsonrpc_code = INVALID_PARAMS
    http_status = 400

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"invalid argument '{field}': {message}", data={"field": field})
        self.field = field


class MalformedMessage(KdblError):
    """A POST body that is not one valid JSON-RPC message: -32700 (not JSON) or -32600; names the field."""

    jsonrpc_code = INVALID_REQUEST
    http_status = 400

    def __init__(self, field: str, message: str, *, parse_error: bool = False) -> None:
        super().__init__(f"invalid request '{field}': {message}", data={"field": field})
        self.field = field
        if parse_error:
            self.jsonrpc_code = PARSE_ERROR


class NotFound(KdblError):
    jsonrpc_code = RESOURCE_NOT_FOUND
    http_status = 404


class Unauthenticated(KdblError):
    jsonrpc_code = INVALID_REQUEST
    http_status = 401


class Forbidden(KdblError):
    jsonrpc_code = FORBIDDEN
    http_status = 403


class RateLimited(KdblError):
    jsonrpc_code = RATE_LIMITED
    http_status = 429

    def __init__(self, retry_after_sec: int, message: str | None = None) -> None:
        super().__init__(
            message or f"rate limit exceeded; retry after {retry_after_sec} s",
            data={"retry_after_sec": retry_after_sec},
        )
        self.retry_after_sec = retry_after_sec


class ConfigError(KdblError):
    """The process is misconfigured; it should not start."""


class TemporaryError(KdblError):
    """Worth retrying later (network blip, lock timeout, throttling)."""

    http_status = 503
    jsonrpc_code = UNAVAILABLE


class Unavailable(TemporaryError):
    """A dependency (the database) cannot be reached now: HTTP 503 with `Retry-After`, JSON-RPC UNAVAILABLE."""

    def __init__(self, message: str, *, retry_after_sec: int = 1) -> None:
        super().__init__(message, data={"retry_after_sec": retry_after_sec})
        self.retry_after_sec = retry_after_sec


class PermanentError(KdblError):
    """Retrying will not help (bad spec, unsupported protocol)."""
