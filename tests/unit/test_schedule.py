"""Crawl schedules: @every slots aligned to the epoch, macros, a 5-field cron subset, manual, errors
(the parser is kdbl_core.sources.schedule, the slots kdbl_worker.schedule)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from kdbl_core.sources.schedule import DEFAULT_SCHEDULE, ScheduleError, parse, parse_stored
from kdbl_worker.schedule import latest_slot


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


NOW = at(2026, 3, 14, 10, 37, 12)  # a Saturday


@pytest.mark.parametrize(("expr", "slot"), [
    ("@every 15m", at(2026, 3, 14, 10, 30)),
    ("@every 1h30m", at(2026, 3, 14, 10, 30)),  # 90-minute slots counted from 1970-01-01 00:00 UTC
    ("@every 7h", at(2026, 3, 14, 8, 0)),
    ("@EVERY 1d", at(2026, 3, 14)),
    ("@every 10s", at(2026, 3, 14, 10, 37, 10)),
    ("@hourly", at(2026, 3, 14, 10, 0)),
    ("@daily", at(2026, 3, 14)),
    ("@midnight", at(2026, 3, 14)),
    ("@weekly", at(2026, 3, 8)),  # the Sunday before
    ("@monthly", at(2026, 3, 1)),
    ("@yearly", at(2026, 1, 1)),
    ("*/20 * * * *", at(2026, 3, 14, 10, 20)),
    ("37 10 * * *", at(2026, 3, 14, 10, 37)),  # the current minute counts
    ("38 10 * * *", at(2026, 3, 13, 10, 38)),
    ("*/20 9-17 * * 1-5", at(2026, 3, 13, 17, 40)),  # weekdays only: Friday's last slot
    ("0 9,13 * * 7", at(2026, 3, 8, 13, 0)),  # 7 is Sunday too
    ("0 0 13 * 5", at(2026, 3, 13)),  # day-of-month OR day-of-week when both are restricted
    ("0 0 29 2 *", at(2024, 2, 29)),  # leap day
    ("5-10/2 3 1 1-6 *", at(2026, 3, 1, 3, 9)),
    ("0 8 * jan-feb,Dec MON-fri", at(2026, 2, 27, 8, 0)),  # names, as the operator accepts them
])
def test_latest_slot(expr, slot):
    assert latest_slot(expr, NOW) == slot


def test_every_slots_are_the_same_for_every_replica_and_move_on():
    first = latest_slot("@every 15m", NOW)
    assert latest_slot("@every 15m", NOW + timedelta(minutes=7)) == first
    assert latest_slot("@every 15m", NOW + timedelta(minutes=8)) == first + timedelta(minutes=15)


def test_times_in_other_zones_are_read_as_utc():
    cet = timezone(timedelta(hours=1))
    assert latest_slot("@daily", datetime(2026, 3, 14, 0, 30, tzinfo=cet)) == at(2026, 3, 13)


def test_manual_schedules_never_fire_and_empty_means_the_default():
    for expr in ("manual", "off", "@never", "never", "@manual"):
        assert parse(expr).manual and latest_slot(expr, NOW) is None
    assert parse(None).text == parse_stored("").text == parse_stored(None).text == DEFAULT_SCHEDULE
    assert latest_slot(None, NOW) == latest_slot(DEFAULT_SCHEDULE, NOW)


def test_a_cron_that_can_never_fire_has_no_slot():
    assert latest_slot("0 0 30 2 *", NOW) is None


@pytest.mark.parametrize(("expr", "message"), [
    ("@every", "duration"),
    ("@every 15 minutes", "duration"),
    ("@every 5s", "shortest interval"),
    ("@fortnightly", "unknown macro"),
    ("* * * *", "5 fields"),
    ("60 * * * *", "minute"),
    ("* 24 * * *", "hour"),
    ("* * 0 * *", "day of month"),
    ("* * * 13 *", "month"),
    ("* * * * 8", "day of week"),
    ("*/0 * * * *", "step"),
    ("5-1 * * * *", "outside"),
    ("mon * * * *", "not a number"),
    ("* * * * MONDAY", "not a number"),
])
def test_bad_schedules_name_the_problem(expr, message):
    with pytest.raises(ScheduleError, match=message):
        parse(expr)
    assert issubclass(ScheduleError, ValueError)
