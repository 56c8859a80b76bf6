"""A tenant's policy: tenants.settings (jsonb) parsed into one typed, validated `TenantPolicy`.

The operator (from the Tenant resource) and `kdbl-control tenant update` write the settings; the API
(tools, modes, rate limits, downloads, `enabled`), the worker (`enabled`, `quotas`) and the CLI read
them through `parse`, so every reader applies the same defaults:

    enabled        true
    mcp.tools      the six tools (an allowlist may add get_contents, find_similar, answer, find_entity);  mcp.modes  lexical + hybrid (hybrid also allows the semantic mode)
    rate_limit     per token: per_minute/per_hour/per_day (+ burst, the minute bucket's size);
                   rate_limit.tenant: the same tiers for all of the tenant's tokens together.
                   Absent per-token tiers fall back to the installation default (KDBL_RATE_LIMIT_*).
    downloads      mode off | inline | attachment (inline + attachment); `enabled: false` (the older
                   field) means off; link_ttl_seconds (default 900)
    quotas         max_sources / max_files / max_bytes (absent = unlimited)
    concurrency    max_in_flight: cost units the tenant may have in flight per API process (a call costs
                   1-4: kdbl_api.fair_share.cost); queue_ms: how long a call over it waits for a slot
                   before 429 + Retry-After. Absent: KDBL_TENANT_MAX_IN_FLIGHT / KDBL_TENANT_QUEUE_S.
    deadlines      default_ms and tools {tool: ms}: each call's deadline (every SQL statement's
                   statement_timeout, and the call as a whole in Python); absent: KDBL_CALL_TIMEOUT_S.

`parse` never fails on stored settings (a reader must not break a tenant over a bad value: unknown
tools and modes are dropped, bad numbers ignored); `validate_update` is the strict path for writers.

`Policies` is each tenant's policy as a serving process (the API) sees it: tenants.settings, re-read
after `TTL_S` seconds.

A change (operator or `kdbl-control tenant update`) takes effect on every running replica within
`TTL_S` without a restart; the read is one statement per tenant per process per `TTL_S` (nothing on
the request path in between). Two seconds bounds how long a disabled tenant keeps working.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from kdbl_core.db.async_pool import AsyncPool
from kdbl_core.errors import InvalidArgument
from kdbl_core.settings import Settings

TOOLS = ("search_content", "get_file_text", "get_file_window", "get_file_metadata", "list_sources", "list_files")
# Tools beyond the reference's six: off unless a tenant's allowlist names them (issue 17).
OPTIONAL_TOOLS = ("get_contents", "find_similar", "answer", "find_entity")
ALL_TOOLS = TOOLS + OPTIONAL_TOOLS
MODES = ("lexical", "hybrid")
DOWNLOAD_MODES = ("off", "inline", "attachment")
DEFAULT_LINK_TTL_S = 15 * 60
PERIODS = {"minute": 60, "hour": 3600, "day": 86400}
_UNIT = {"s": None, "m": "minute", "min": "minute", "minute": "minute", "h": "hour", "hour": "hour",
         "d": "day", "day": "day"}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*([a-z]+)\s*$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min)?\s*$")
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000}
# What a writer may set (the CRD's bounds are the same): a deadline from 100 ms to an hour, 1-1000 slots,
# a queue of at most a minute.
DEADLINE_MS_RANGE = (100, 3_600_000)
IN_FLIGHT_RANGE = (1, 1000)
QUEUE_MS_RANGE = (0, 60_000)


@dataclass(frozen=True, slots=True)
class Tier:
    """A token bucket: `limit` requests per `period_s`, holding at most `burst` at once."""

    limit: int
    period_s: int
    burst: int

    @property
    def name(self) -> str:
        return next(k for k, v in PERIODS.items() if v == self.period_s)

    @property
    def rate_per_s(self) -> float:
        return self.limit / self.period_s


@dataclass(frozen=True, slots=True)
class Limits:
    """Fair share and deadlines (issue 27): the installation's (from Settings: `Limits.of`) or a tenant's."""

    max_in_flight: int = 4
    queue_ms: int = 2000
    timeout_ms: int = 10_000
    tool_timeouts_ms: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(max_in_flight=settings.tenant_max_in_flight, queue_ms=round(settings.tenant_queue_s * 1000),
                   timeout_ms=round(settings.call_timeout_s * 1000))

    def deadline_ms(self, tool: str) -> int:
        """The deadline of a call of `tool` (a tool or resources/...): its own, else the default."""
        return self.tool_timeouts_ms.get(tool, self.timeout_ms)


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    enabled: bool = True
    tools: frozenset[str] = frozenset(TOOLS)
    modes: frozenset[str] = frozenset(MODES)
    token_tiers: tuple[Tier, ...] = ()
    tenant_tiers: tuple[Tier, ...] = ()
    downloads: str = "attachment"
    link_ttl_s: int = DEFAULT_LINK_TTL_S
    quotas: Mapping[str, int] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)

    def allows_tool(self, name: str) -> bool:
        return name in self.tools

    def describe(self) -> dict[str, Any]:
        """The effective policy as JSON (for `tenant show` and /capacity)."""
        return {
            "enabled": self.enabled, "tools": [t for t in ALL_TOOLS if t in self.tools],
            "modes": [m for m in MODES if m in self.modes],
            "rate_limit": {"per_token": _tiers_json(self.token_tiers), "tenant": _tiers_json(self.tenant_tiers)},
            "downloads": self.downloads, "link_ttl_seconds": self.link_ttl_s, "quotas": dict(self.quotas),
            "concurrency": {"max_in_flight": self.limits.max_in_flight, "queue_ms": self.limits.queue_ms},
            "deadlines": {"default_ms": self.limits.timeout_ms, "tools": dict(self.limits.tool_timeouts_ms)},
        }


def _tiers_json(tiers: tuple[Tier, ...]) -> dict[str, Any]:
    return {f"per_{t.name}": t.limit for t in tiers} | (
        {"burst": t.burst for t in tiers if t.period_s == 60})


def _int(value: Any, low: int = 0) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        return None
    return value


def tiers(spec: Mapping[str, Any] | None, *, default_per_minute: int | None = None,
          default_burst: int | None = None) -> tuple[Tier, ...]:
    """Tiers from {per_minute, per_hour, per_day, burst}; a limit of 0 (or none) means no such tier."""
    spec = spec if isinstance(spec, Mapping) else {}
    per_minute = _int(spec.get("per_minute"))
    burst = _int(spec.get("burst"), low=1)
    if per_minute is None and not any(_int(spec.get(f"per_{p}")) for p in ("hour", "day")):
        per_minute = default_per_minute
        burst = burst or default_burst
    out = []
    for period, seconds in PERIODS.items():
        limit = per_minute if period == "minute" else _int(spec.get(f"per_{period}"))
        if limit:
            out.append(Tier(limit, seconds, burst if period == "minute" and burst else limit))
    return tuple(out)


def _in(value: Any, bounds: tuple[int, int]) -> int | None:
    number = _int(value, low=bounds[0])
    return number if number is not None and number <= bounds[1] else None


def limits(concurrency: Any, deadlines: Any, default: Limits) -> Limits:
    """The tenant's `concurrency` and `deadlines` over the installation's `default` (a bad value: the default)."""
    concurrency = concurrency if isinstance(concurrency, Mapping) else {}
    deadlines = deadlines if isinstance(deadlines, Mapping) else {}
    tools = deadlines.get("tools") if isinstance(deadlines.get("tools"), Mapping) else {}
    own = {t: ms for t, v in tools.items() if t in ALL_TOOLS and (ms := _in(v, DEADLINE_MS_RANGE)) is not None}
    return Limits(
        max_in_flight=_in(concurrency.get("max_in_flight"), IN_FLIGHT_RANGE) or default.max_in_flight,
        queue_ms=q if (q := _in(concurrency.get("queue_ms"), QUEUE_MS_RANGE)) is not None else default.queue_ms,
        timeout_ms=_in(deadlines.get("default_ms"), DEADLINE_MS_RANGE) or default.timeout_ms,
        tool_timeouts_ms={**default.tool_timeouts_ms, **own})


def parse(settings: Mapping[str, Any] | None, *, default_per_minute: int | None = None,
          default_burst: int | None = None, default_limits: Limits | None = None) -> TenantPolicy:
    """The effective policy of stored settings (lenient: see the module docstring)."""
    s = settings if isinstance(settings, Mapping) else {}
    mcp = s.get("mcp") if isinstance(s.get("mcp"), Mapping) else {}
    tools = mcp.get("tools")
    modes = mcp.get("modes")
    rate = s.get("rate_limit") if isinstance(s.get("rate_limit"), Mapping) else {}
    downloads = s.get("downloads") if isinstance(s.get("downloads"), Mapping) else {}
    mode = downloads.get("mode")
    if mode not in DOWNLOAD_MODES:
        mode = "off" if downloads.get("enabled") is False else "attachment"
    quotas = s.get("quotas") if isinstance(s.get("quotas"), Mapping) else {}
    return TenantPolicy(
        enabled=s.get("enabled") is not False,
        tools=frozenset(t for t in tools if t in ALL_TOOLS) if isinstance(tools, list) else frozenset(TOOLS),
        modes=frozenset(m for m in modes if m in MODES) if isinstance(modes, list) else frozenset(MODES),
        token_tiers=tiers(rate, default_per_minute=default_per_minute, default_burst=default_burst),
        tenant_tiers=tiers(rate.get("tenant")),
        downloads=mode,
        link_ttl_s=_int(downloads.get("link_ttl_seconds"), low=10) or DEFAULT_LINK_TTL_S,
        quotas={k: v for k in ("max_sources", "max_files", "max_bytes")
                if (v := _int(quotas.get(k))) is not None},
        limits=limits(s.get("concurrency"), s.get("deadlines"), default_limits or Limits()),
    )


# ------------------------------------------------------------------------------------------------
# writers: strict parsing of what an administrator typed
# ------------------------------------------------------------------------------------------------
def parse_rate(text: str, field_name: str = "rate-limit") -> dict[str, int]:
    """'60/m,1000/h,5000/d' -> {per_minute: 60, per_hour: 1000, per_day: 5000}; '0' or 'off' -> {}."""
    if text.strip().lower() in ("0", "off", "none", ""):
        return {}
    out: dict[str, int] = {}
    for part in text.split(","):
        match = _RATE.match(part.lower())
        unit = _UNIT.get(match.group(2)) if match else None
        if match is None or unit is None:
            raise InvalidArgument(field_name, f"'{part.strip()}' is not N/m, N/h or N/d (e.g. 60/m,1000/h)")
        key = f"per_{unit}"
        if key in out:
            raise InvalidArgument(field_name, f"the {unit} tier is given twice")
        out[key] = int(match.group(1))
    return out


def parse_list(text: str, allowed: tuple[str, ...], field_name: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in items if t not in allowed]
    if unknown:
        raise InvalidArgument(field_name, f"unknown {', '.join(unknown)} (known: {', '.join(allowed)})")
    if not items:
        raise InvalidArgument(field_name, "name at least one")
    return [t for t in allowed if t in items]


def parse_duration_ms(text: str, field_name: str) -> int:
    """'250ms', '2s', '1.5s', '2m' (a bare number is seconds) -> milliseconds within DEADLINE_MS_RANGE."""
    match = _DURATION.match(text.lower())
    if match is None:
        raise InvalidArgument(field_name, f"'{text.strip()}' is not a duration (e.g. 500ms, 10s, 2m)")
    ms = round(float(match.group(1)) * _DURATION_MS[match.group(2) or "s"])
    low, high = DEADLINE_MS_RANGE
    if not low <= ms <= high:
        raise InvalidArgument(field_name, f"{text.strip()} is outside {low} ms to {high // 60_000} minutes")
    return ms


def parse_deadlines(text: str) -> dict[str, Any]:
    """'10s' (every tool), 'answer=90s,search_content=5s' (those tools) or both ('10s,answer=90s') -> the
    settings' `deadlines` ({default_ms, tools}); 'default' -> {} (the installation default everywhere)."""
    if text.strip().lower() in ("default", ""):
        return {}
    out: dict[str, Any] = {}
    tools: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        tool, sep, value = part.partition("=")
        if not sep:
            if "default_ms" in out:
                raise InvalidArgument("timeout", "the default deadline is given twice")
            out["default_ms"] = parse_duration_ms(part, "timeout")
            continue
        tool = tool.strip()
        if tool not in ALL_TOOLS:
            raise InvalidArgument("timeout", f"unknown tool '{tool}' (known: {', '.join(ALL_TOOLS)})")
        if tool in tools:
            raise InvalidArgument("timeout", f"{tool} is given twice")
        tools[tool] = parse_duration_ms(value, "timeout")
    if tools:
        out["tools"] = {t: tools[t] for t in ALL_TOOLS if t in tools}
    return out


def parse_count(text: str, bounds: tuple[int, int], field_name: str) -> int | None:
    """An integer within `bounds`; 'default' -> None (the installation default)."""
    if text.strip().lower() == "default":
        return None
    if not text.strip().isdigit() or not bounds[0] <= int(text) <= bounds[1]:
        raise InvalidArgument(field_name, f"use an integer from {bounds[0]} to {bounds[1]}, or 'default'")
    return int(text)


_UNSET: Any = object()


def apply_update(settings: Mapping[str, Any], *, enabled: bool | None = None, tools: list[str] | None = None,
                 modes: list[str] | None = None, rate: dict[str, int] | None = None,
                 tenant_rate: dict[str, int] | None = None, downloads: str | None = None,
                 max_in_flight: int | None = _UNSET, queue_ms: int | None = _UNSET,
                 deadlines: dict[str, Any] | None = None) -> dict[str, Any]:
    """New settings with the given fields changed (the keys the operator writes; the rest is kept).
    `max_in_flight` / `queue_ms` None: back to the installation default; `deadlines` {}: the same."""
    out = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in settings.items()}
    if enabled is not None:
        out["enabled"] = enabled
    if tools is not None or modes is not None:
        mcp = out.setdefault("mcp", {})
        if tools is not None:
            mcp["tools"] = tools
        if modes is not None:
            mcp["modes"] = modes
    if rate is not None or tenant_rate is not None:
        old = out.get("rate_limit") or {}
        new = {k: v for k, v in old.items() if k == "tenant"} if rate is not None else dict(old)
        if rate is not None:
            new.update(rate if rate else {"per_minute": 0})  # 0 = no per-token limit (not the default)
        if tenant_rate is not None:
            new.pop("tenant", None)
            if tenant_rate:
                new["tenant"] = tenant_rate
        out["rate_limit"] = new
    if downloads is not None:
        if downloads not in DOWNLOAD_MODES:
            raise InvalidArgument("downloads", f"use one of {', '.join(DOWNLOAD_MODES)}")
        out["downloads"] = {**(out.get("downloads") or {}), "mode": downloads, "enabled": downloads != "off"}
    for key, value, bounds in (("max_in_flight", max_in_flight, IN_FLIGHT_RANGE), ("queue_ms", queue_ms, QUEUE_MS_RANGE)):
        if value is _UNSET:
            continue
        concurrency = out.setdefault("concurrency", {})
        if value is None:
            concurrency.pop(key, None)
        elif _in(value, bounds) is None:
            raise InvalidArgument(key.replace("_", "-"), f"use an integer from {bounds[0]} to {bounds[1]}")
        else:
            concurrency[key] = value
        if not concurrency:
            out.pop("concurrency")
    if deadlines is not None:
        if deadlines:
            out["deadlines"] = deadlines
        else:
            out.pop("deadlines", None)
    return out


TTL_S = 2.0
_READ = "SELECT settings FROM kdbl_tenant_settings(%(tenant)s)"


class Policies:
    """Per-tenant `TenantPolicy` cache of one process (one statement per tenant per `TTL_S`)."""

    def __init__(self, pool: AsyncPool, settings: Settings, *, ttl_s: float = TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._pool, self._ttl, self._clock = pool, ttl_s, clock
        self._defaults = {"default_per_minute": settings.rate_limit_per_minute,
                          "default_burst": settings.rate_limit_burst, "default_limits": Limits.of(settings)}
        self._cache: dict[UUID, tuple[float, TenantPolicy]] = {}

    async def get(self, tenant_id: UUID) -> TenantPolicy:
        hit = self._cache.get(tenant_id)
        now = self._clock()
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        rows = await self._pool.fetch(_READ, {"tenant": tenant_id})
        parsed = parse(rows[0].settings if rows else None, **self._defaults)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[tenant_id] = (now, parsed)
        return parsed
