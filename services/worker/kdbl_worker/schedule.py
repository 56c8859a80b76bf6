"""Crawl schedules (`sources.schedule`): when is a source due?

Accepted forms (times are UTC):

- `@every <duration>` — a duration of whole units `d`, `h`, `m`, `s`, e.g. `@every 15m`, `@every 1h30m`
  (at least 10 s). Slots are aligned to the Unix epoch, so every replica computes the same ones.
- `@hourly`, `@daily` (= `@midnight`), `@weekly` (Sunday 00:00), `@monthly`, `@yearly` (= `@annually`).
- A 5-field cron expression `minute hour day-of-month month day-of-week` with `*`, numbers, ranges
  `a-b`, lists `a,b`, steps `*/n` and `a-b/n`; months `JAN`-`DEC` and days `SUN`-`SAT` by name too
  (any case); day-of-week 0-7 (0 and 7 are Sunday). As in cron, when both day fields are restricted a
  day matching either one fires. No `L`/`W`/`#`. (A superset of what the operator's CRD validation
  accepts, so every schedule it lets through runs.)
- `manual` (also `off`, `never`, `@manual`): never scheduled; only `kdbl-control crawl` starts a run.
- Empty / NULL: `DEFAULT_SCHEDULE`.

A source is due when no run exists that was created at or after the latest slot (`latest_slot`):
missed slots are not caught up one by one (one run serves them all), and a new source is crawled at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from kdbl_core.errors import InvalidArgument

DEFAULT_SCHEDULE = "@every 1h"  # as the Source CRD's default
MIN_INTERVAL = timedelta(seconds=10)

_MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}
_MANUAL = {"manual", "@manual", "off", "never", "@never"}
_DURATION = re.compile(r"(\d+)([dhms])")
_UNIT = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_MONTHS = {m: i for i, m in enumerate(
    ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"], start=1)}
_DAYS = {d: i for i, d in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}
_FIELDS = (("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}), ("month", 1, 12, _MONTHS),
           ("day of week", 0, 7, _DAYS))
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class ScheduleError(InvalidArgument, ValueError):
    """A schedule that cannot be parsed: an InvalidArgument naming the field `schedule` (the CLI, the
    worker's scheduler and source configuration all see it)."""

    def __init__(self, message: str) -> None:
        super().__init__("schedule", message)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A parsed schedule: `every` (interval) or `cron` (field sets), or neither (manual)."""

    text: str
    every: timedelta | None = None
    cron: tuple[frozenset[int], ...] | None = None
    dom_any: bool = True
    dow_any: bool = True

    @property
    def manual(self) -> bool:
        return self.every is None and self.cron is None

    def latest_slot(self, now: datetime) -> datetime | None:
        """The latest fire time at or before `now` (None: manual, or a cron that never fires)."""
        now = now.astimezone(UTC)
        if self.every is not None:
            step = int(self.every.total_seconds())
            return _EPOCH + timedelta(seconds=int((now - _EPOCH).total_seconds()) // step * step)
        if self.cron is None:
            return None
        minutes, hours, doms, months, dows = self.cron
        day = now.replace(second=0, microsecond=0)
        for back in range(366 * 8 + 2):  # 29 February can be 8 years apart (2096 → 2104)
            date = (day - timedelta(days=back)).date()
            weekday = (date.weekday() + 1) % 7  # cron: Sunday is 0
            if date.month not in months or not self._day_matches(date.day, weekday, doms, dows):
                continue
            last_hour = now.hour if back == 0 else 23
            for hour in sorted((h for h in hours if h <= last_hour), reverse=True):
                last_minute = now.minute if back == 0 and hour == now.hour else 59
                candidates = [m for m in minutes if m <= last_minute]
                if candidates:
                    return datetime(date.year, date.month, date.day, hour, max(candidates), tzinfo=UTC)
        return None

    def _day_matches(self, dom: int, dow: int, doms: frozenset[int], dows: frozenset[int]) -> bool:
        if self.dom_any or self.dow_any:
            return dom in doms and dow in dows
        return dom in doms or dow in dows


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


def parse(expr: str | None) -> Schedule:
    """Parse a schedule; raises ScheduleError (a ValueError) naming what is wrong."""
    text = (expr or "").strip() or DEFAULT_SCHEDULE
    lowered = text.lower()
    if lowered in _MANUAL:
        return Schedule(text)
    if lowered.startswith("@every"):
        spec = lowered[len("@every"):].strip()
        if not spec or _DURATION.sub("", spec) != "":
            raise ScheduleError(f"'{text}': expected a duration such as 15m, 1h30m or 1d")
        seconds = sum(int(n) * _UNIT[u] for n, u in _DURATION.findall(spec))
        if timedelta(seconds=seconds) < MIN_INTERVAL:
            raise ScheduleError(f"'{text}': the shortest interval is {int(MIN_INTERVAL.total_seconds())} s")
        return Schedule(text, every=timedelta(seconds=seconds))
    cron_text = _MACROS.get(lowered)
    if cron_text is None:
        if lowered.startswith("@"):
            raise ScheduleError(
                f"'{text}': unknown macro (use @every, @hourly, @daily, @weekly, @monthly, @yearly)")
        cron_text = text
    parts = cron_text.split()
    if len(parts) != 5:
        raise ScheduleError(f"'{text}': a cron expression has 5 fields (minute hour day month weekday)")
    sets = [_field(part, name, low, high, names)
            for part, (name, low, high, names) in zip(parts, _FIELDS, strict=True)]
    dows = frozenset(d % 7 for d in sets[4])
    return Schedule(text, cron=(sets[0], sets[1], sets[2], sets[3], dows),
                    dom_any=parts[2].startswith("*"), dow_any=parts[4].startswith("*"))


def latest_slot(expr: str | None, now: datetime) -> datetime | None:
    return parse(expr).latest_slot(now)
