"""The lag bound of reads on a replica (kdbl_core.db.replica): a replica is read only when it has replayed what
the primary had KDBL_READ_MAX_LAG_S ago; stricter, never looser, when the samples are young or missing."""

from __future__ import annotations

from kdbl_core.db.replica import LagBound, Replay, parse_lsn


def test_lsn_text_is_bytes_of_wal():
    assert parse_lsn("0/0") == 0 and parse_lsn("16/B374D848") == (0x16 << 32) + 0xB374D848
    assert parse_lsn(None) is None and parse_lsn("1/0") > parse_lsn("0/FFFFFFFF")


def test_a_replica_must_have_replayed_what_the_primary_had_max_lag_ago():
    bound = LagBound(10.0, clock=lambda: 100.0)
    for at, lsn in ((70.0, 1000), (85.0, 2000), (90.0, 3000), (95.0, 4000), (99.0, 5000)):
        bound.add(lsn, at)
    assert bound.required(100.0) == 3000  # the newest sample at or before 90
    assert bound.fresh(Replay(True, 3000), 100.0) and not bound.fresh(Replay(True, 2999), 100.0)
    assert bound.lag_s(Replay(True, 3500), 100.0) == 10.0 and bound.lag_s(Replay(True, 5000), 100.0) == 0.0


def test_young_or_missing_samples_are_stricter_and_a_primary_is_always_fresh():
    bound = LagBound(10.0)
    assert bound.required(5.0) is None and not bound.fresh(Replay(True, 10**9), 5.0)  # no sample: not read
    assert bound.fresh(Replay(False, None), 5.0)  # the read URL is a primary (nothing to replay)
    bound.add(500, 3.0)
    assert bound.required(5.0) == 500  # younger than the bound: the oldest sample counts
    assert not bound.fresh(Replay(True, None), 5.0)


def test_old_samples_are_dropped_but_one_older_than_the_bound_is_kept():
    bound = LagBound(2.0)
    for second in range(100):
        bound.add(second * 10, float(second))
    assert len(bound._samples) <= 5 and bound.required(99.0) == 970
