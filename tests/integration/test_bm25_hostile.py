"""The kdbl_bm25 extension's C code under hostile arguments (issue 27 §1): extreme and negative chunk ids,
corrupt and truncated lists, huge k, NULLs, random bytes and mutated lists each end in a clean ERROR with
its SQLSTATE (or a correct answer) and the server stays up: the same connection and a new one still
work, and the postmaster was never restarted. A long top k stops at its statement timeout. The dense
accumulator's windows (work_mem) and the merge give the same top k as one window and as Python.

Lists are built here byte for byte (`packed`, `header`) as kdbl_bm25_pack writes them (kdbl_bm25.c):
a 40-byte little-endian header (magic "KB25", version 1, n, tf_max, first, last, dl_min, 0), then per
posting LEB128 varints of (chunk-id delta, tf, dl).
"""

from __future__ import annotations

import random
import struct
import time
from collections import Counter

import psycopg
import pytest

from kdbl_core.db.connect import conninfo

MAGIC = 0x3532424B
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_ID = 2**53  # the top k's ids travel as float8
K1B, K1_1MB = 0.003, 0.3
CLEAN = {"XX001", "22003"}  # data_corrupted, numeric_value_out_of_range: what a bad list may raise


def varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def header(n: int, first: int, last: int, *, magic: int = MAGIC, version: int = 1, tf_max: int = 1,
           dl_min: int = 0) -> bytes:
    return struct.pack("<IIIIqqII", magic, version, n & 0xFFFFFFFF, tf_max, first, last, dl_min, 0)


def body(postings: list[tuple[int, int, int]]) -> bytes:
    out, prev = bytearray(), postings[0][0]
    for chunk_id, tf, dl in postings:
        out += varint(chunk_id - prev) + varint(tf) + varint(dl)
        prev = chunk_id
    return bytes(out)


def packed(postings: list[tuple[int, int, int]]) -> bytes:
    return header(len(postings), postings[0][0], postings[-1][0], tf_max=max(p[1] for p in postings),
                  dl_min=min(p[2] for p in postings)) + body(postings)


def bm25(w: float, tf: int, dl: int) -> float:
    return w * tf / (tf + (K1_1MB + K1B * dl))  # lexical.BM25_SQL, the C code's float8 operations


TOPK = """
SELECT kdbl_bm25_topk(x.list, x.chunk_id, x.tf, x.dl, x.w, %(k1b)s, %(k1_1mb)s, %(k)s, %(ex)s)
  FROM unnest(CAST(%(lists)s AS bytea[]), CAST(%(ids)s AS bigint[]), CAST(%(tfs)s AS integer[]),
              CAST(%(dls)s AS integer[]), CAST(%(ws)s AS float8[])) AS x(list, chunk_id, tf, dl, w)
"""


def topk_params(rows: list[tuple], *, k=10, k1b=K1B, k1_1mb=K1_1MB, exclude=None) -> dict:
    """rows: (list, chunk_id, tf, dl, weight), any of them None."""
    cols = list(zip(*rows)) if rows else [(), (), (), (), ()]
    return {"lists": list(cols[0]), "ids": list(cols[1]), "tfs": list(cols[2]), "dls": list(cols[3]),
            "ws": list(cols[4]), "k": k, "k1b": k1b, "k1_1mb": k1_1mb, "ex": exclude}


def topk(conn, rows: list[tuple], **kw) -> list[tuple[int, float]]:
    flat = conn.execute(TOPK, topk_params(rows, **kw)).fetchone()[0]
    return [(int(flat[i]), flat[i + 1]) for i in range(0, len(flat), 2)]


def reference_topk(rows: list[tuple], k: int, exclude=()) -> list[int]:
    """The top k in Python: rows of lists given as postings, best first by score to 1e-9, ties by id."""
    scores: dict[int, float] = {}
    for postings, w in rows:
        for chunk_id, tf, dl in postings:
            scores[chunk_id] = scores.get(chunk_id, 0.0) + bm25(w, tf, dl)
    ranked = sorted((cid for cid, s in scores.items() if s > 0 and cid not in set(exclude)),
                    key=lambda cid: (-round(scores[cid] * 1e9), cid))
    return ranked[:k]


@pytest.fixture(scope="module")
def server(owner_url):
    """The postmaster's start time: a crashed backend makes the postmaster restart, which changes it."""
    with psycopg.connect(conninfo(owner_url), autocommit=True) as conn:
        return conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0]


@pytest.fixture
def conn(owner_url, server):
    """The owner's connection (it may call every function), checked to be alive and on the same postmaster
    after the test."""
    with psycopg.connect(conninfo(owner_url), autocommit=True) as c:
        yield c
        assert c.execute("SELECT pg_postmaster_start_time()").fetchone()[0] == server
    with psycopg.connect(conninfo(owner_url), autocommit=True) as other:
        assert other.execute("SELECT pg_postmaster_start_time()").fetchone()[0] == server


def refused(conn, sql: str, params, sqlstate: str) -> str:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(sql, params)
    assert caught.value.sqlstate == sqlstate, str(caught.value)
    assert conn.execute("SELECT 1").fetchone() == (1,)  # the same session goes on
    return str(caught.value)


ISSUE_27 = ("SELECT kdbl_bm25_topk(NULL, v, 1, 1, 1.0, 1.0, 1.0, 10, NULL) "
            "FROM (VALUES ('-9223372036854775808'::bigint), (9223372036854775807)) t(v)")


def test_the_query_that_crashed_the_server_is_a_clean_error(conn):
    message = refused(conn, ISSUE_27, None, "22003")
    assert "outside 0 to 2^53" in message


def test_a_role_without_grants_may_call_no_kdbl_bm25_function(conn, unique):
    role = f"kdbl_nobody_{unique}"
    conn.execute(f"CREATE ROLE {role} NOLOGIN")
    try:
        conn.execute(f"SET ROLE {role}")
        refused(conn, ISSUE_27, None, "42501")
        refused(conn, "SELECT kdbl_bm25_pack(v, 1, 1) FROM (VALUES (CAST(1 AS bigint))) t(v)", None, "42501")
        refused(conn, "SELECT * FROM kdbl_bm25_unpack(CAST('' AS bytea))", None, "42501")
        conn.execute("RESET ROLE")
        functions = conn.execute(
            "SELECT CAST(p.oid AS regprocedure)::text FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid "
            "WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'kdbl_bm25') AND d.deptype = 'e' "
            "AND d.classid = CAST('pg_proc' AS regclass) AND has_function_privilege('public', p.oid, 'EXECUTE')"
        ).fetchall()
        assert functions == []  # nor any support function, through PUBLIC
    finally:
        conn.execute("RESET ROLE")
        conn.execute(f"DROP ROLE {role}")


def test_each_role_may_call_only_what_it_uses(conn):
    rows = conn.execute("""
        SELECT r.rolname, p.proname
          FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid CROSS JOIN pg_roles r
         WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'kdbl_bm25') AND d.deptype = 'e'
           AND d.classid = CAST('pg_proc' AS regclass) AND r.rolname IN ('kdbl_api', 'kdbl_worker', 'kdbl_admin')
           AND has_function_privilege(r.oid, p.oid, 'EXECUTE')
         ORDER BY 1, 2""").fetchall()
    assert rows == [("kdbl_admin", "kdbl_bm25_pack"), ("kdbl_admin", "kdbl_bm25_topk"),
                    ("kdbl_admin", "kdbl_bm25_unpack"), ("kdbl_api", "kdbl_bm25_topk"),
                    ("kdbl_api", "kdbl_bm25_unpack"), ("kdbl_worker", "kdbl_bm25_pack")]


def test_the_aggregates_are_parallel_safe_as_their_support_functions(conn):
    rows = conn.execute("""
        SELECT a.aggfnoid::text, p.proparallel, s.proparallel, f.proparallel
          FROM pg_aggregate a JOIN pg_proc p ON p.oid = a.aggfnoid JOIN pg_proc s ON s.oid = a.aggtransfn
          JOIN pg_proc f ON f.oid = a.aggfinalfn
         WHERE p.proname LIKE 'kdbl_bm25%' ORDER BY 1""").fetchall()
    assert rows == [("kdbl_bm25_pack", "s", "s", "s"), ("kdbl_bm25_topk", "s", "s", "s")]


GOOD = [(10, 1, 7), (12, 2, 30), (50, 1, 9)]
FAR = (None, MAX_ID, 1, 1, 1.0)  # a valid posting far from GOOD's ids: the top k merges instead (span > 16x)

# (what, rows, keyword arguments, SQLSTATE)
TOPK_CASES = [
    ("the smallest and largest bigint ids", [(None, INT64_MIN, 1, 1, 1.0), (None, INT64_MAX, 1, 1, 1.0)], {},
     "22003"),
    ("a negative id", [(None, -1, 1, 1, 1.0)], {}, "22003"),
    ("an id past 2^53", [(None, MAX_ID + 1, 1, 1, 1.0)], {}, "22003"),
    ("tf 0", [(None, 5, 0, 1, 1.0)], {}, "22023"),
    ("a negative tf", [(None, 5, -3, 1, 1.0)], {}, "22023"),
    ("a negative dl", [(None, 5, 1, -1, 1.0)], {}, "22023"),
    ("a posting without tf", [(None, 5, None, 1, 1.0)], {}, "22004"),
    ("a posting without its id", [(None, None, 1, 1, 1.0)], {}, "22004"),
    ("a row with a list and a posting", [(packed(GOOD), 5, 1, 1, 1.0)], {}, "22023"),
    ("k -1", [(None, 5, 1, 1, 1.0)], {"k": -1}, "22023"),
    ("k past 100000", [(None, 5, 1, 1, 1.0)], {"k": 100001}, "22023"),
    ("the largest int k", [(None, 5, 1, 1, 1.0)], {"k": 2**31 - 1}, "22023"),
    ("a null k", [(None, 5, 1, 1, 1.0)], {"k": None}, "22004"),
    ("a NaN k1b_avgdl", [(None, 5, 1, 1, 1.0)], {"k1b": float("nan")}, "22023"),
    ("an infinite k1_1mb", [(None, 5, 1, 1, 1.0)], {"k1_1mb": float("inf")}, "22023"),
    ("a negative k1_1mb", [(None, 5, 1, 1, 1.0)], {"k1_1mb": -0.3}, "22023"),
    ("a NaN weight", [(None, 5, 1, 1, float("nan"))], {}, "22023"),
    ("an infinite weight", [(None, 5, 1, 1, float("-inf"))], {}, "22023"),
    ("a list with ids past 2^53", [(packed([(0, 1, 1), (INT64_MAX, 1, 1)]), None, None, None, 1.0)], {},
     "22003"),
]


@pytest.mark.parametrize("what,rows,kw,sqlstate", TOPK_CASES, ids=[c[0] for c in TOPK_CASES])
def test_the_top_k_refuses_hostile_arguments_with_a_clean_error(conn, what, rows, kw, sqlstate):
    refused(conn, TOPK, topk_params(rows, **kw), sqlstate)


def _varint_past_64_bits() -> bytes:
    return header(1, 10, 10) + b"\xff" * 9 + b"\x7f" + b"\x01\x01"


# (what, list bytes): each refused as corrupt (XX001) by the top k (dense and merged) and by unpack
CORRUPT_LISTS = [
    ("an empty list", b""),
    ("a list shorter than its header", packed(GOOD)[:39]),
    ("another magic", header(3, 10, 50, magic=0x12345678) + body(GOOD)),
    ("another version", header(3, 10, 50, version=2) + body(GOOD)),
    ("no postings", header(0, 10, 50)),
    ("a negative first id", header(3, -5, 50) + body(GOOD)),
    ("the smallest bigint first id", header(3, INT64_MIN, INT64_MAX) + body(GOOD)),
    ("last before first", header(3, 50, 10) + body(GOOD)),
    ("more postings than bytes", header(2**32 - 1, 10, 50) + body(GOOD)),
    ("more postings than ids", header(3, 10, 11) + body(GOOD)),
    ("a posting past the last id", header(3, 10, 40) + body(GOOD)),
    ("a delta of 2^63", header(2, 10, 50) + varint(0) + b"\x01\x07" + varint(2**63) + b"\x01\x07"),
    ("a last id short of the header's", header(3, 10, 60) + body(GOOD)),
    ("a body cut short", packed(GOOD)[:-2]),
    ("a body cut in a varint", packed(GOOD)[:-1] + b"\x80"),
    ("bytes after the last posting", packed(GOOD) + b"\x00"),
    ("a varint past 64 bits", _varint_past_64_bits()),
    ("tf 0", header(1, 10, 10) + b"\x00\x00\x07"),
    ("tf past int4", header(1, 10, 10) + b"\x00" + varint(2**31) + b"\x07"),
    ("dl past int4", header(1, 10, 10) + b"\x00\x01" + varint(2**31)),
    ("a long list with a bad posting in its fast path",
     packed([(i, 1 + i % 3, 100) for i in range(10, 3010)])[:-400] + b"\xff" * 11 + b"\x01" * 389),
]


@pytest.mark.parametrize("what,data", CORRUPT_LISTS, ids=[c[0] for c in CORRUPT_LISTS])
def test_a_corrupt_list_is_refused_by_the_top_k_and_by_unpack(conn, what, data):
    refused(conn, TOPK, topk_params([(data, None, None, None, 1.0)]), "XX001")
    refused(conn, TOPK, topk_params([(data, None, None, None, 1.0), FAR]), "XX001")
    refused(conn, "SELECT count(*) FROM kdbl_bm25_unpack(%s)", [data], "XX001")


PACK = ("SELECT kdbl_bm25_pack(x.id, x.tf, x.dl) "
        "FROM unnest(CAST(%s AS bigint[]), CAST(%s AS integer[]), CAST(%s AS integer[])) x(id, tf, dl)")


@pytest.mark.parametrize("ids,tfs,dls,sqlstate", [
    pytest.param([INT64_MIN], [1], [1], "22023", id="the smallest bigint id"),
    pytest.param([5], [0], [1], "22023", id="tf 0"),
    pytest.param([5], [1], [-1], "22023", id="a negative dl"),
    pytest.param([5], [None], [1], "22004", id="a null tf"),
    pytest.param([5, 7, 5], [1, 1, 1], [1, 1, 1], "22023", id="one chunk twice"),
])
def test_pack_refuses_hostile_postings_with_a_clean_error(conn, ids, tfs, dls, sqlstate):
    refused(conn, PACK, [ids, tfs, dls], sqlstate)


def test_pack_and_unpack_keep_the_extreme_ids_and_the_top_k_keeps_2_to_the_53(conn):
    extreme = conn.execute(PACK, [[INT64_MAX, 0], [2**31 - 1, 1], [2**31 - 1, 0]]).fetchone()[0]
    assert extreme == packed([(0, 1, 0), (INT64_MAX, 2**31 - 1, 2**31 - 1)])
    unpacked = conn.execute("SELECT array_agg(ARRAY[chunk_id, tf, dl]) FROM kdbl_bm25_unpack(%s)", [extreme])
    assert unpacked.fetchone()[0] == [[0, 1, 0], [INT64_MAX, 2**31 - 1, 2**31 - 1]]
    edge = packed([(0, 1, 5), (MAX_ID, 2, 5)])
    assert [i for i, _ in topk(conn, [(edge, None, None, None, 1.0)])] == [MAX_ID, 0]  # merged: a span of 2^53


def test_rows_without_weight_or_anything_score_nothing_and_k_0_answers_empty(conn):
    assert topk(conn, []) == []
    assert topk(conn, [(None, None, None, None, None), (packed(GOOD), None, None, None, None),
                       (None, None, None, None, 1.0)]) == []
    assert topk(conn, [(packed(GOOD), None, None, None, 1.0)], k=0) == []
    top = topk(conn, [(packed(GOOD), None, None, None, 1.0)], exclude=[INT64_MIN, 12, None, INT64_MAX])
    assert [i for i, _ in top] == [10, 50]


def _valid_lists(rng: random.Random) -> list[list[tuple[int, int, int]]]:
    lists = []
    for n in [rng.randint(1, 60) for _ in range(40)] + [3000] * 6:  # 3000 postings: ~10 kB, a malloc block
        first = rng.choice([0, 1, rng.randint(0, 10**6), MAX_ID - 10**5])
        ids = sorted(rng.sample(range(first, first + n * rng.choice([1, 3, 40])), n))
        lists.append([(i, rng.choice([1, 1, 2, 3, 7, 300, 70000]), rng.choice([0, 5, 100, 511, 600, 2**20]))
                      for i in ids])
    return lists


def _mutated(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    how = rng.randrange(7)
    if how == 0:  # bit flips
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif how == 1:  # a byte anywhere
        b[rng.randrange(len(b))] = rng.randrange(256)
    elif how == 2:  # cut
        del b[rng.randrange(len(b)):]
    elif how == 3:  # appended bytes
        b += rng.randbytes(rng.randint(1, 12))
    elif how == 4:  # a header field
        n, first, last = struct.unpack_from("<I4xqq", b, 8)
        field = rng.choice(["n", "first", "last"])
        extreme = rng.choice([0, 1, -1, INT64_MIN, INT64_MAX, MAX_ID, MAX_ID + 1, first - 1, first + 1, last - 1,
                              last + 1, n - 1, n + 1, 2**32 - 1])
        if field == "n":
            struct.pack_into("<I", b, 8, extreme & 0xFFFFFFFF)
        else:
            struct.pack_into("<q", b, 16 if field == "first" else 24, max(INT64_MIN, min(INT64_MAX, extreme)))
    elif how == 5:  # a run of continuation bytes in the body
        i = rng.randrange(40, max(41, len(b)))
        b[i:i + 11] = b"\xff" * 11
    else:  # a body byte set to a one-byte varint
        if len(b) > 40:
            b[rng.randrange(40, len(b))] = rng.randrange(128)
    return bytes(b)


def test_random_and_mutated_lists_are_read_or_refused_cleanly(conn):
    """Seeded: 3,000 lists (a quarter random bytes, some behind a valid magic and version; the rest
    valid lists mutated), each through unpack, the dense top k and the merged one. A list is read or
    refused the same way by all three, and a top k only names chunks the list holds."""
    rng = random.Random(27)
    valid = [packed(p) for p in _valid_lists(rng)]
    outcomes: Counter = Counter()
    for _ in range(3000):
        if rng.random() < 0.25:
            data = rng.randbytes(rng.randint(0, 120))
            if rng.random() < 0.5:
                data = struct.pack("<II", MAGIC, 1) + data
        else:
            data = _mutated(rng, rng.choice(valid))
        try:
            ids = conn.execute("SELECT coalesce(array_agg(chunk_id), '{}') FROM kdbl_bm25_unpack(%s)",
                               [data]).fetchone()[0]
            unpacked = "ok"
        except psycopg.Error as exc:
            assert exc.sqlstate == "XX001", (data.hex(), str(exc))
            ids, unpacked = [], exc.sqlstate
        for rows in ([(data, None, None, None, 1.0)], [(data, None, None, None, 1.0), FAR]):
            try:
                top = topk(conn, rows, k=25)
                assert unpacked == "ok", data.hex()
                assert {i for i, _ in top} <= set(ids) | {MAX_ID}
                outcomes["read"] += 1
            except psycopg.Error as exc:
                assert exc.sqlstate in CLEAN, (data.hex(), str(exc))
                # ids past 2^53 are the top k's own refusal, before it reads the postings
                assert exc.sqlstate == "22003" or unpacked == "XX001", (data.hex(), str(exc))
                outcomes[exc.sqlstate] += 1
    assert outcomes["read"] > 300 and outcomes["XX001"] > 2000, outcomes


def test_one_window_many_windows_and_the_merge_give_the_same_top_k(conn):
    rng = random.Random(5)
    lists = []
    for w in (0.4, 1.1, 2.5, 0.9, 3.0):
        ids = sorted(rng.sample(range(1, 200_000), rng.randint(2_000, 12_000)))
        lists.append(([(i, rng.choice([1, 1, 2, 3, 5]), rng.randint(1, 700)) for i in ids], w))
    singles = [(rng.randrange(1, 200_000), rng.choice([1, 2]), rng.randint(1, 300), 1.7) for _ in range(3000)]
    singles = list({s[0]: s for s in singles}.values())  # one posting per chunk, as postings rows are
    exclude = rng.sample(range(1, 200_000), 500)
    rows = [(packed(p), None, None, None, w) for p, w in lists]
    rows += [(None, i, tf, dl, w) for i, tf, dl, w in singles]
    expected = reference_topk(lists + [([(i, tf, dl)], w) for i, tf, dl, w in singles], 200, exclude)
    conn.execute("SET work_mem = '64MB'")
    one = topk(conn, rows, k=200, exclude=exclude)
    conn.execute("SET work_mem = '64kB'")  # 8,192 ids a window: 25 windows
    many = topk(conn, rows, k=200, exclude=exclude)
    conn.execute("RESET work_mem")
    merged = topk(conn, rows + [(None, MAX_ID, 1, 1, 1.0)], k=200, exclude=exclude + [MAX_ID])
    assert [i for i, _ in one] == [i for i, _ in many] == [i for i, _ in merged] == expected
    assert [s for _, s in many] == [s for _, s in one]  # the same sums, in the same order
    assert [s for _, s in merged] == pytest.approx([s for _, s in one], rel=1e-12)


def test_a_long_top_k_stops_at_its_statement_timeout(conn):
    """100 lists of 100,000 postings, each list's chunks scoring above the previous list's, so that every
    chunk enters the k = 100,000 best: ~2 s in the aggregate's final function, after ~20 ms reading its
    rows. A statement timeout of a tenth of the run stops it within a third of the run (without interrupt
    checks in the final function it ran to the end)."""
    k, lists = 100_000, 100
    posting_bytes = b"\x00\x01\x05" + b"\x01\x01\x05" * (k - 1)
    conn.execute("CREATE TEMP TABLE long_lists (list bytea, w float8)")
    conn.execute("ALTER TABLE long_lists ALTER COLUMN list SET STORAGE EXTERNAL")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO long_lists VALUES (%s, %s)",
                        [(header(k, j * k + 1, (j + 1) * k) + posting_bytes, float(j + 1)) for j in range(lists)])
    query = "SELECT kdbl_bm25_topk(list, NULL, NULL, NULL, w, 0.003, 0.3, 100000, NULL) FROM long_lists"
    started = time.perf_counter()
    top = conn.execute(query).fetchone()[0]
    full = time.perf_counter() - started
    assert len(top) == 2 * k and top[0] == (lists - 1) * k + 1 and top[-2] == lists * k  # the last list's
    conn.execute(f"SET statement_timeout = {max(50, int(full * 100))}")
    started = time.perf_counter()
    with pytest.raises(psycopg.errors.QueryCanceled):
        conn.execute(query)
    cancelled = time.perf_counter() - started
    conn.execute("RESET statement_timeout")
    assert cancelled < full / 3, (cancelled, full)
