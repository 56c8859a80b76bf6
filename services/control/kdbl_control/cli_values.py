"""Option value types of kdbl-control: expiry, audit times and true/false (argparse `type=` functions)."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta

_DURATION = re.compile(r"^(\d+)([hdw])$")


def parse_expiry(value: str) -> datetime:
    """A duration from now (12h, 30d, 4w) or an ISO 8601 timestamp (UTC when no zone is given)."""
    match = _DURATION.match(value)
    if match:
        amount, unit = int(match.group(1)), match.group(2)
        delta = {"h": timedelta(hours=amount), "d": timedelta(days=amount), "w": timedelta(weeks=amount)}[unit]
        return datetime.now(UTC) + delta
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError("use a duration (12h, 30d, 4w) or an ISO 8601 timestamp") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def parse_bool(value: str) -> bool:
    if value.lower() in ("true", "yes", "1", "on"):
        return True
    if value.lower() in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def parse_time(value: str) -> datetime:
    """An ISO time (UTC when no zone is given) or an age before now: 30s, 15m, 2h, 7d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if value[:-1].isdigit() and value[-1:] in units:
        return datetime.now(UTC) - timedelta(seconds=int(value[:-1]) * units[value[-1]])
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO time or an age like 15m, got {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
