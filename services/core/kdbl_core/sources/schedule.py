"""The one crawl-schedule parser (`sources.schedule`), for kdbl-control, the operator and the worker.

Accepted forms (times are UTC; the union of what the CLI/worker and the operator accepted before):

- `@every <duration>`: whole units in the order `d`, `h`, `m`, `s`, each at most once (`@every 15m`,
  `@every 1h30m`, `@every 1d`; spaces inside the duration are dropped), at least 1 minute. Slots are
  aligned to the Unix epoch, so every replica computes the same ones.
- `@hourly`, `@daily` (= `@midnight`), `@weekly` (Sunday 00:00), `@monthly`, `@yearly` (= `@annually`).
- A 5-field cron expression `minute hour day-of-month month day-of-week` with `*`, numbers, ranges
  `a-b`, lists `a,b`, steps `*/n`, `a/n` and `a-b/n`; months `JAN`-`DEC` and days `SUN`-`SAT` by name
  too (any case); day-of-week 0-7 (0 and 7 are Sunday). When both day fields are restricted a day
  matching either one fires (as in cron). No `L`/`W`/`#`.
- `manual` (also `off`, `never`, `@manual`, `@never`): never scheduled; only `kdbl-control crawl` runs it.
- Unset (None): `DEFAULT_SCHEDULE`, as the Source CRD's default.

`parse` is for what a person writes (CLI `--schedule`, a Source's `spec.schedule`): it refuses an empty
string and a value that is not text, and returns the normalised text that is stored (single spaces,
lower-case macros and durations: the CLI and the operator store the same text for the same intent).
`parse_stored` reads a `sources.schedule` column: NULL or empty is the default, and intervals down to
10 s (what kdbl-control accepted before the two parsers became one) keep running; the worker's
scheduler wakes every 15 s, so a shorter interval than 1 minute was never kept anyway.

Errors are `ScheduleError`, an InvalidArgument naming the field `schedule` (JSON-RPC -32602).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kdbl_core.errors import InvalidArgument

__all__ = ["DEFAULT_SCHEDULE", "MIN_INTERVAL", "Schedule", "ScheduleError", "parse", "parse_stored"]

DEFAULT_SCHEDULE = "@every 1h"  # the Source CRD's default
MIN_INTERVAL = timedelta(minutes=1)  # the Source CRD's documented minimum
STORED_MIN_INTERVAL = timedelta(seconds=10)  # rows kdbl-control stored before the parsers were merged

MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}
MANUAL = frozenset({"manual", "@manual", "off", "never", "@never"})
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_MONTHS = {m: i for i, m in enumerate(
    ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"], start=1)}
_DAYS = {d: i for i, d in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}
_FIELDS = (("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}), ("month", 1, 12, _MONTHS),
           ("day of week", 0, 7, _DAYS))


class ScheduleError(InvalidArgument, ValueError):
    """A schedule that cannot be parsed: an InvalidArgument naming the field `schedule`."""

    def __init__(self, message: str) -> None:
        super().__init__("schedule", message)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A parsed schedule: `every` (an interval) or `cron` (the five fields' value sets), or neither
    (manual). `text` is the normalised form that is stored."""

    text: str
    every: timedelta | None = None
    cron: tuple[frozenset[int], ...] | None = None
    dom_any: bool = True
    dow_any: bool = True

    @property
    def manual(self) -> bool:
        return self.every is None and self.cron is None


def _field(spec: str, name: str, low: int, high: int, names: dict[str, int]) -> frozenset[int]:
    values: set[int] = set()
    for part in spec.upper().split(","):
        for word, number in names.items():
            part = re.sub(rf"\b{word}\b", str(number), part)
        base, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ScheduleError(f"{name}: bad step in '{part}'")
            step = int(step_text)
        if base == "*":
            start, end = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            if not (a.isdigit() and b.isdigit()):
                raise ScheduleError(f"{name}: bad range '{base}'")
            start, end = int(a), int(b)
        elif base.isdigit():
            start = int(base)
            end = high if step_text else start
        else:
            raise ScheduleError(f"{name}: '{part}' is not a number, range or *")
        if not (low <= start <= high and low <= end <= high) or start > end:
            raise ScheduleError(f"{name}: '{part}' is outside {low}-{high}")
        values.update(range(start, end + 1, step))
    return frozenset(values)


def _parse(text: str, minimum: timedelta) -> Schedule:
    text = " ".join(text.split())
    lowered = text.lower()
    if lowered in MANUAL:
        return Schedule(lowered)
    if lowered == "@every" or lowered.startswith("@every "):
        duration = lowered[len("@every"):].replace(" ", "")
        match = _DURATION.match(duration)
        if not duration or match is None:
            raise ScheduleError(f"'{text}': expected a duration such as 15m, 1h30m or 1d")
        days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
        every = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        if every < minimum:
            raise ScheduleError(f"'{text}': the shortest interval is {_span(minimum)}")
        return Schedule(f"@every {duration}", every=every)
    cron_text = MACROS.get(lowered)
    if cron_text is None:
        if lowered.startswith("@"):
            raise ScheduleError(f"'{text}': unknown macro (use @every <duration>, @hourly, @daily, @weekly, "
                                "@monthly, @yearly or manual)")
        cron_text = text
    parts = cron_text.split(" ")
    if len(parts) != 5:
        raise ScheduleError(f"'{text}': a cron expression has 5 fields (minute hour day month weekday)")
    sets = [_field(part, name, low, high, names)
            for part, (name, low, high, names) in zip(parts, _FIELDS, strict=True)]
    dows = frozenset(d % 7 for d in sets[4])
    return Schedule(lowered if lowered in MACROS else text, cron=(sets[0], sets[1], sets[2], sets[3], dows),
                    dom_any=parts[2].startswith("*"), dow_any=parts[4].startswith("*"))


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    return f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s"


def parse(value: Any) -> Schedule:
    """A schedule someone wrote (CLI, Source spec); None is the default. Raises ScheduleError."""
    if value is None:
        return _parse(DEFAULT_SCHEDULE, MIN_INTERVAL)
    if not isinstance(value, str) or not value.strip():
        raise ScheduleError(
            "must be a cron expression, '@every <duration>', a macro such as @hourly, or manual")
    return _parse(value, MIN_INTERVAL)


def parse_stored(value: str | None) -> Schedule:
    """A `sources.schedule` value: NULL or empty is the default; intervals down to 10 s still run."""
    return _parse((value or "").strip() or DEFAULT_SCHEDULE, STORED_MIN_INTERVAL)
