"""One error hierarchy for every K-Lake component, and the one place errors become answers.

Each error class carries what every transport sends for it, and the transports render from it:

- `jsonrpc_code` and `http_status`: the MCP front door (`jsonrpc_response_of`, a JSON-RPC error object
  sent with the class's HTTP status), tool and resource calls inside the SDK (`jsonrpc_error_of`),
  downloads, /capacity and the worker's internal fetch endpoint (`http_response_of`, `{"error": message,
  **data}`). `retry_after_sec` in `data` adds `Retry-After`. The codes are the ones clients saw before
  rendering moved here (401 answered -32001 although `Unauthenticated` declared -32600: the wire won).
- `exit_code`: kdbl-control prints `kdbl-control: <message>` and exits with it (1; 2 for a configuration
  fault, as argparse and kdbl-operator do; 75, EX_TEMPFAIL, for a temporary one: worth running again).
- `temporary`: kdbl-operator turns a temporary error into kopf.TemporaryError (retry with backoff) and
  any other into kopf.PermanentError (wait for the spec to change).

Which exception classes belong here: every class that crosses a module boundary or reaches a user is a
KdblError (ScheduleError, FenceLost, LoadgenError, the operator's InvalidSpec and NamespaceMissing, the
lease and admin conflicts: one `Conflict`; the front door's refusals). Classes that never leave the
extractor or connector raising them stay plain `Exception`s, because they are control flow, not answers:
DocError, PptError and webdav's `_Skip` are caught in their own module; archive's PackageError (caught
by the OOXML and EPUB extractors), ole's OleError (doc, ppt) and containers.Refused (containers,
sevenzip) never leave the `extract` package — each ends as a file status, since an extractor never
raises for bad content — and `_Skip` ends one listing branch inside the WebDAV connector.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.responses import JSONResponse

# JSON-RPC 2.0 codes
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# K-Lake server-defined codes (the -32000..-32099 range is reserved for servers)
UNAUTHENTICATED = -32001
RESOURCE_NOT_FOUND = -32002
FORBIDDEN = -32003
UNAVAILABLE = -32004
DEADLINE_EXCEEDED = -32008
CONFLICT = -32009
RATE_LIMITED = -32029

# kdbl-control exit codes
EXIT_ERROR = 1
EXIT_CONFIG = 2
EXIT_TEMPORARY = 75  # sysexits.h EX_TEMPFAIL


class KdblError(Exception):
    """Base of every error K-Lake raises on purpose."""

    jsonrpc_code: int = INTERNAL_ERROR
    http_status: int = 500
    exit_code: int = EXIT_ERROR
    temporary: bool = False

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
        self.reason = message  # without the field: what a caller re-raising it for another field says


class MalformedMessage(KdblError):
    """A POST body that is not one valid JSON-RPC message: -32700 (not JSON) or -32600; names the field."""

    jsonrpc_code = INVALID_REQUEST
    http_status = 400

    def __init__(self, field: str, message: str, *, parse_error: bool = False) -> None:
        super().__init__(f"invalid request '{field}': {message}", data={"field": field})
        self.field = field
        if parse_error:
            self.jsonrpc_code = PARSE_ERROR


class RequestTooLarge(KdblError):
    """A request body over KDBL_MAX_REQUEST_BYTES."""

    jsonrpc_code = INVALID_REQUEST
    http_status = 413


class RequestTimeout(KdblError):
    """A request body that did not arrive within KDBL_BODY_READ_TIMEOUT_S."""

    jsonrpc_code = INVALID_REQUEST
    http_status = 408


class DeadlineExceeded(KdblError):
    """A call ran past its deadline (its tenant's per-tool timeout, else KDBL_CALL_TIMEOUT_S): its statement was
    cancelled, its transaction rolled back. HTTP 504, -32008; not temporary: the same call under the same
    deadline fails again, so the message says what to change (a narrower call, or a longer deadline)."""

    jsonrpc_code = DEADLINE_EXCEEDED
    http_status = 504

    def __init__(self, message: str, *, deadline_ms: int) -> None:
        super().__init__(message, data={"deadline_ms": deadline_ms})
        self.deadline_ms = deadline_ms


class MisdirectedRequest(KdblError):
    """A Host header outside KDBL_ALLOWED_HOSTS (the SDK's DNS-rebinding protection)."""

    jsonrpc_code = INVALID_REQUEST
    http_status = 421


class NotFound(KdblError):
    jsonrpc_code = RESOURCE_NOT_FOUND
    http_status = 404


class Unauthenticated(KdblError):
    """No credentials, or credentials that prove nothing (wrong, revoked, expired)."""

    jsonrpc_code = UNAUTHENTICATED
    http_status = 401


class Forbidden(KdblError):
    jsonrpc_code = FORBIDDEN
    http_status = 403


class Conflict(KdblError):
    """The change collides with the current state (a name taken, a row another owner manages, a lease
    another holder took)."""

    jsonrpc_code = CONFLICT
    http_status = 409


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

    exit_code = EXIT_CONFIG

    @classmethod
    def of_settings(cls, exc: Exception, program: str = "settings") -> "ConfigError":
        """One line out of pydantic's multi-line ValidationError: each bad variable and why."""
        errors = getattr(exc, "errors", None)
        if not callable(errors):
            return cls(f"invalid {program}: {exc}")
        parts = []
        for error in errors():
            name = "_".join(str(p) for p in error.get("loc", ())) or "value"  # env_nested_delimiter "_"
            parts.append(f"KDBL_{name.upper()}: {error.get('msg', 'invalid value')}")
        return cls(f"invalid {program}: {'; '.join(parts)}")


class TemporaryError(KdblError):
    """Worth retrying later (network blip, lock timeout, throttling)."""

    http_status = 503
    jsonrpc_code = UNAVAILABLE
    exit_code = EXIT_TEMPORARY
    temporary = True


class Unavailable(TemporaryError):
    """A dependency (the database) cannot be reached now: HTTP 503 with `Retry-After`, JSON-RPC UNAVAILABLE."""

    def __init__(self, message: str, *, retry_after_sec: int = 1) -> None:
        super().__init__(message, data={"retry_after_sec": retry_after_sec})
        self.retry_after_sec = retry_after_sec


class ReadBehind(TemporaryError):
    """A read replica has not replayed what a call depends on (past KDBL_READ_MAX_LAG_S, or behind the index
    state a cursor was cut from): the API runs the call on the primary instead (kdbl_api.read_route); it
    reaches a client only if the primary itself is behind the cursor (a failover to a lagging standby).
    `reason`: 'lag' (past the bound) or 'behind' (behind a cursor)."""

    def __init__(self, message: str, *, reason: str = "behind") -> None:
        super().__init__(message)
        self.reason = reason


class UpstreamError(TemporaryError):
    """A service behind this one failed or answered nonsense (a file source, the worker's fetch endpoint, a
    server under load test): HTTP 502 Bad Gateway, no `Retry-After`."""

    http_status = 502


class PermanentError(KdblError):
    """Retrying will not help (bad spec, unsupported protocol)."""


# ------------------------------------------------------------------------------------------------
# rendering: one function per transport
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Rendered:
    """An HTTP answer: status, JSON body and headers (`response()` makes the Starlette response)."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)

    def response(self) -> "JSONResponse":
        from starlette.responses import JSONResponse  # lazy: the CLI and the operator never need it

        return JSONResponse(self.body, status_code=self.status, headers=self.headers or None)


def _headers(exc: KdblError, headers: dict[str, str] | None) -> dict[str, str]:
    retry = exc.data.get("retry_after_sec")
    return {**(headers or {}), **({"Retry-After": str(retry)} if retry is not None else {})}


def jsonrpc_error_of(exc: KdblError) -> dict[str, Any]:
    """The JSON-RPC error object: code, message and (when there is any) data."""
    error: dict[str, Any] = {"code": exc.jsonrpc_code, "message": exc.message}
    if exc.data:
        error["data"] = exc.data
    return error


def jsonrpc_response_of(exc: KdblError, request_id: str | int | None = None,
                        headers: dict[str, str] | None = None) -> Rendered:
    """The MCP front door's answer: a JSON-RPC error response with the class's HTTP status."""
    return Rendered(exc.http_status, {"jsonrpc": "2.0", "id": request_id, "error": jsonrpc_error_of(exc)},
                    _headers(exc, headers))


def http_response_of(exc: KdblError, headers: dict[str, str] | None = None) -> Rendered:
    """A plain HTTP endpoint's answer (downloads, /capacity, the worker's fetch endpoint)."""
    return Rendered(exc.http_status, {"error": exc.message, **exc.data}, _headers(exc, headers))


def exit_line_of(exc: KdblError, program: str) -> tuple[str, int]:
    """kdbl-control's answer: one line for stderr and the exit code."""
    return f"{program}: {' '.join(exc.message.split())}", exc.exit_code
