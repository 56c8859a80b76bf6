"""When is a source due? The latest slot of its schedule (`sources.schedule`) at or before now.

The schedule text is parsed by the one parser, `kdbl_core.sources.schedule` (forms, defaults, errors);
this module is the worker scheduler's half: slot arithmetic. A source is due when no run exists that
was created at or after the latest slot (the scheduler's SQL in `jobs.enqueue_due`): missed slots are
not caught up one by one (one run serves them all), and a new source is crawled at once. `@every`
slots are aligned to the Unix epoch, so every replica computes the same ones; times are UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kdbl_core.sources.schedule import Schedule, ScheduleError, parse_stored

__all__ = ["ScheduleError", "latest_slot", "slot_of"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def slot_of(schedule: Schedule, now: datetime) -> datetime | None:
    """The latest fire time at or before `now` (None: manual, or a cron that never fires)."""
    now = now.astimezone(UTC)
    if schedule.every is not None:
        step = int(schedule.every.total_seconds())
        return _EPOCH + timedelta(seconds=int((now - _EPOCH).total_seconds()) // step * step)
    if schedule.cron is None:
        return None
    minutes, hours, doms, months, dows = schedule.cron
    day = now.replace(second=0, microsecond=0)
    for back in range(366 * 8 + 2):  # 29 February can be 8 years apart (2096 -> 2104)
        date = (day - timedelta(days=back)).date()
        weekday = (date.weekday() + 1) % 7  # cron: Sunday is 0
        if date.month not in months or not _day_matches(schedule, date.day, weekday, doms, dows):
            continue
        last_hour = now.hour if back == 0 else 23
        for hour in sorted((h for h in hours if h <= last_hour), reverse=True):
            last_minute = now.minute if back == 0 and hour == now.hour else 59
            candidates = [m for m in minutes if m <= last_minute]
            if candidates:
                return datetime(date.year, date.month, date.day, hour, max(candidates), tzinfo=UTC)
    return None


def _day_matches(schedule: Schedule, dom: int, dow: int, doms: frozenset[int], dows: frozenset[int]) -> bool:
    if schedule.dom_any or schedule.dow_any:
        return dom in doms and dow in dows
    return dom in doms or dow in dows


def latest_slot(expr: str | None, now: datetime) -> datetime | None:
    """The latest slot of a stored schedule; raises ScheduleError for one the parser refuses."""
    return slot_of(parse_stored(expr), now)
