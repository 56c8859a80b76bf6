"""The keyword arm over packed posting lists: the exact BM25 top k in one statement, summed in C.

With the kdbl_bm25 extension installed (kdbl_core.db.pgext), each (tenant, term, source) has its postings
packed in `bm25_lists` rows, one per generation (~3.3 bytes a posting instead of a ~100-byte row and index
entry), built by kdbl_core.content.bm25_lists up to a chunk id `upto`. A query reads, for its terms:

- the packed lists of the sources the principal sees whole, every generation (row-level security on
  bm25_lists, and the source filters, in SQL);
- every visible posting written after the last build (`chunk_id > upto`: a range of the postings
  primary key per term; a build deletes the rows it packs, so postings hold only these) and, for files
  granted one by one (never in a list the principal sees), the terms on their chunks' rows;
- the chunks deleted since the last full build (`bm25_dead`, kept by a trigger on chunks), left out.

kdbl_bm25_topk sums each chunk's BM25 over all of it with the same float8 operations as the SQL query
(lexical.BM25_SQL) and returns the k best, ties by chunk id: the exhaustive top k, read from compact
lists. Statistics (idf, average length) are those of what the principal sees, as everywhere
(lexical._STATS). File-level filters (path, type, authors, labels, dates) are not in the lists: those
searches sum the unpacked lists of the filtered chunks in SQL (lexical.LISTED_POSTINGS, bm25_topk).
"""

from __future__ import annotations

import logging
import time
from typing import Literal

import psycopg

from kdbl_core.content import analysis
from kdbl_core.db.async_pool import Connection
from kdbl_core.errors import Unavailable
from kdbl_core.search import lexical
from kdbl_core.search.lexical import B, K1, ChunkHit, Filters
from kdbl_core.search.windows import COLUMNS as WINDOW_COLUMNS
from kdbl_core.search.windows import Fetched

log = logging.getLogger(__name__)
_K1_1_B = f"CAST({K1 * (1 - B):.6g} AS float8)"  # k1 (1-b), written as lexical.BM25_SQL writes it
_AVAILABLE_TTL_S = 300.0
_available: dict[str, tuple[float, str]] = {}
State = Literal["ready", "absent", "unusable"]

# Each term's lists and postings are read per term (LATERAL ... OFFSET 0: primary-key lookups). The
# statement runs on a generic plan (lexical.fetch_generic), which knows neither the query's terms nor
# `upto`; left to a join, it read all 28,854 lists of a 10k-chunk tenant with a sequential scan (33 ms
# against 2 ms).
_SQL = """
, built AS MATERIALIZED (
    SELECT coalesce((SELECT b.upto FROM bm25_built b WHERE b.tenant_id = kdbl_tenant()), 0) AS upto
), ex AS MATERIALIZED (  -- chunks deleted since the lists were built{exclude_comment}
    SELECT ARRAY(SELECT d.chunk_id FROM bm25_dead d WHERE d.tenant_id = kdbl_tenant(){list_filter_d}{exclude}) AS ids
), r AS (
    SELECT kdbl_bm25_topk(x.list, x.chunk_id, x.tf, x.dl, x.idf_k1, (SELECT w.k1b_avgdl FROM w LIMIT 1),
                          {k1_1_b}, %(limit)s, (SELECT ex.ids FROM ex)) AS r
      FROM (
        SELECT l.list, CAST(NULL AS bigint) AS chunk_id, CAST(NULL AS integer) AS tf,
               CAST(NULL AS integer) AS dl, w.idf_k1
          FROM w CROSS JOIN LATERAL (
              SELECT l.list FROM bm25_lists l
               WHERE l.tenant_id = kdbl_tenant() AND l.term = w.term{list_filter_l}
              OFFSET 0) l
        UNION ALL  -- written since the build
        SELECT NULL, p.chunk_id, p.tf, p.dl, w.idf_k1
          FROM w CROSS JOIN LATERAL (
              SELECT p.chunk_id, p.tf, p.dl FROM postings p
               WHERE p.tenant_id = kdbl_tenant() AND p.term = w.term
                 AND p.chunk_id > (SELECT built.upto FROM built){extra}
                 AND (NOT EXISTS (SELECT 1 FROM gf) OR p.file_id NOT IN (SELECT gf.id FROM gf))
              OFFSET 0) p
        UNION ALL  -- files granted one by one, in sources the principal does not see whole (their rows' terms)
        SELECT NULL, c.id, CAST(t.tf AS integer), c.token_count, w.idf_k1
          FROM chunks c CROSS JOIN LATERAL {chunk_terms} JOIN w ON w.term = t.term
         WHERE c.file_id IN (SELECT gf.id FROM gf) AND EXISTS (SELECT 1 FROM gf){extra_c}
      ) x
), top AS (
    SELECT CAST(r.r[2 * i - 1] AS bigint) AS chunk_id, r.r[2 * i] AS score
      FROM r CROSS JOIN LATERAL generate_series(1, cardinality(r.r) / 2) AS i
)
"""


def build_query(filters: Filters, *, given_terms: bool = False, windows: bool = False) -> tuple[str, dict]:
    """The statement (and its filter parameters) for `filters`, which must not touch files. `windows`: each
    hit's row is followed by its chunk's and neighbours' (_WINDOWS), and the first row carries the query's
    lexemes (a query's, not given terms)."""
    if filters.touches_files:
        raise ValueError("file-level filters are not in the packed lists: use bm25_topk's SQL top-k")
    params: dict = {}
    extra = lexical.filters_sql(filters, params, "p")
    extra_c = lexical.filters_sql(filters, params, "c")
    exclude = ""
    if filters.exclude_file_id is not None:  # find_similar's subject: its chunks, in lists or not
        exclude = " UNION ALL SELECT c.id FROM chunks c WHERE c.file_id = %(exclude_file_id)s"
    terms = lexical.TERMS.replace(lexical.QUERY_LEXEMES, lexical.GIVEN_TERMS, 1) if given_terms else lexical.TERMS
    sql = terms + _SQL.format(
        exclude_comment=", and the excluded file's chunks" if exclude else "",
        list_filter_d=lexical.source_filter_sql(filters, params, "d"), exclude=exclude,
        list_filter_l=lexical.source_filter_sql(filters, params, "l"), k1_1_b=_K1_1_B, extra=extra, extra_c=extra_c,
        chunk_terms=analysis.chunk_terms("c"))
    order = lexical.rank_order('top.score', 'top.chunk_id')
    if windows and not given_terms:
        return sql + _WINDOWS.format(hits=lexical.HITS_OF_TOP, order=lexical.rank_order("h.score", "h.chunk_id")), params
    sql += lexical.HITS_OF_TOP + f" ORDER BY {order}\n"
    return sql, params


# A lexical search's keyword statement with the windows of its hits (issue 33: one statement a call fewer than
# ranking, then reading the windows; kdbl_core.search.windows.expand_hits takes them when they cover the page).
# The hit's chunk and its neighbours, primary-key probes under the caller's row-level security, as the
# windows' own statement reads them; the lexemes are the query's `q`, once.
_WINDOWS = """, h AS MATERIALIZED (
{{hits}}), lexemes AS MATERIALIZED (SELECT array_agg(q.term) AS terms FROM q)
SELECT h.chunk_id, h.file_id, h.source_id, h.key, h.seq, h.score, {n_columns},
       CASE WHEN row_number() OVER () = 1 THEN (SELECT l.terms FROM lexemes l) END AS lexemes  -- one row's
  FROM h LEFT JOIN LATERAL (
      SELECT {c_columns}
        FROM chunks c WHERE c.file_id = h.file_id AND c.seq BETWEEN h.seq - 1 AND h.seq + 1 OFFSET 0) n ON true
 ORDER BY {{order}}, n.seq
""".format(n_columns=", ".join(f"n.{c}" for c in WINDOW_COLUMNS),  # read by position (no aliases: see
           # kdbl_core.db.sql_text: the folded statement stays within psycopg's cached length)
           c_columns=", ".join(f"c.{c}" for c in WINDOW_COLUMNS))
_HIT_COLUMNS = 6  # chunk_id, file_id, source_id, key, seq, score; then the window row (WINDOW_COLUMNS)
_WINDOW_END = _HIT_COLUMNS + len(WINDOW_COLUMNS)
_N_FILE_ID, _N_SEQ = _HIT_COLUMNS + WINDOW_COLUMNS.index("file_id"), _HIT_COLUMNS + WINDOW_COLUMNS.index("seq")


# One call of the aggregate (k = 0: nothing scored), which loads the library and needs EXECUTE on it
# (kdbl_bm25 1.1 grants it to kdbl_api and kdbl_admin only: kdbl_core.db.pgext.GRANTS).
_PROBE = "SELECT kdbl_bm25_topk(NULL, NULL, NULL, NULL, NULL, CAST(0 AS float8), CAST(0 AS float8), 0, NULL)"


async def state(conn: Connection) -> State:
    """`ready`: this database has the extension, its library loads and this role may call it; `absent`: no
    extension (postings rows are the index); `unusable`: installed, but the library does not load or the
    role may not call it — the keyword index is in packed lists nobody can read here. Checked once per
    server and database every 5 minutes."""
    key = f"{conn.info.host}:{conn.info.port}/{conn.info.dbname}"
    now = time.monotonic()
    cached = _available.get(key)
    if cached is not None and now - cached[0] < _AVAILABLE_TTL_S:
        return cached[1]  # type: ignore[return-value]
    cur = await conn.execute("SELECT to_regprocedure('kdbl_bm25_topk_final(internal)') IS NOT NULL")
    found: State = "ready" if (await cur.fetchone())[0] else "absent"
    if found == "ready":
        try:  # in a savepoint: the caller's transaction goes on
            async with conn.transaction():
                await conn.execute(_PROBE)
        except psycopg.Error as exc:
            found = "unusable"
            log.error("kdbl_bm25 extension installed but unusable: keyword search refuses to answer from "
                      "part of the index", extra={"reason": str(exc).strip()[:300]})
    _available[key] = (now, found)
    return found


async def available(conn: Connection) -> bool:
    """Whether the packed lists can be read here (state() is `ready`)."""
    return await state(conn) == "ready"


async def require_readable(conn: Connection) -> bool:
    """True when the packed lists are the index (`ready`), False when postings rows are (`absent`); an
    `unusable` extension raises Unavailable: answering from the rows alone would leave out every chunk
    a writer or a build packed."""
    found = await state(conn)
    if found == "unusable":
        raise Unavailable("keyword search is unavailable: the keyword index is in packed lists, but this "
                          "database server cannot run the kdbl_bm25 extension (its library is missing or not "
                          "granted). Restore it: the chart's kdbl-pgext init container, or `./dev setup` for "
                          "the embedded server", retry_after_sec=60)
    return found == "ready"


async def search(conn: Connection, term_params: dict, filters: Filters, *, limit: int,
                 given_terms: bool, fetched: Fetched | None = None) -> list[ChunkHit]:
    """The exhaustive top `limit` over what the current principal sees, from the packed lists.
    `term_params`: {"cfg", "query"} (a query) or {"terms"} (given_terms: terms as indexed). `fetched`: filled
    with the hits' windows, read in the same statement (a query's terms only)."""
    with_windows = fetched is not None and not given_terms
    sql, params = build_query(filters, given_terms=given_terms, windows=with_windows)
    rows = await lexical.fetch_generic(conn, sql, {**params, **term_params, "limit": limit})
    if not with_windows:
        return lexical.hits(rows)
    assert fetched is not None
    hits: list[ChunkHit] = []
    fetched.rows.clear()
    fetched.hits.clear()
    fetched.lexemes = frozenset(next((r.lexemes for r in rows if r.lexemes is not None), ()))  # on one row
    for r in rows:
        if not hits or hits[-1].chunk_id != r.chunk_id:
            hits.append(ChunkHit(r.chunk_id, r.file_id, r.source_id, r.key, r.seq, float(r.score)))
            fetched.hits.add((r.file_id, r.seq))
        if r[_N_SEQ] is not None:  # the window row, in WINDOW_COLUMNS' order
            fetched.rows[(r[_N_FILE_ID], r[_N_SEQ])] = tuple(r[_HIT_COLUMNS:_WINDOW_END])
    return hits
