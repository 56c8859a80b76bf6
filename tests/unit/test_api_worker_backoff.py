"""kdbl_api.workers.Backoff: when the supervisor restarts a dead worker, and when it gives up."""

from __future__ import annotations

from kdbl_api.workers import CRASH_WINDOW_S, MAX_QUICK_DEATHS, Backoff


def test_a_worker_that_ran_a_while_is_replaced_at_once():
    backoff = Backoff()
    assert backoff.died(lived_s=CRASH_WINDOW_S) == 0.0
    assert backoff.died(lived_s=3600) == 0.0


def test_start_up_crashes_in_a_row_wait_longer_each_then_give_up():
    backoff = Backoff()
    delays = [backoff.died(lived_s=1.0) for _ in range(MAX_QUICK_DEATHS)]
    assert delays == [0.5, 1.0, 2.0, 4.0, None]


def test_a_worker_that_outlives_the_crash_window_resets_the_count():
    backoff = Backoff(max_quick_deaths=3)
    assert [backoff.died(lived_s=0.1), backoff.died(lived_s=0.1)] == [0.5, 1.0]
    assert backoff.died(lived_s=CRASH_WINDOW_S + 1) == 0.0
    assert [backoff.died(lived_s=0.1), backoff.died(lived_s=0.1), backoff.died(lived_s=0.1)] == [0.5, 1.0, None]
