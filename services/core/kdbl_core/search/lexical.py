"""BM25 keyword search in Postgres: OR over the query's terms, weighted by rarity, exact top-N.

Scoring is Okapi BM25 (k1=1.2, b=0.75, Lucene's idf = ln(1 + (N - df + 0.5) / (df + 0.5))) over the
postings the principal may see: row-level security filters postings *before* ranking, so a
principal finds its own documents even where invisible ones dominate the corpus.

Term statistics (df, N, average length) are those of what the principal sees, so hidden content never
moves a score (issue 13: tenant-wide df let a user count the hidden chunks holding a word). They are
kept per source (term_stats, corpus_stats, sharded) and row-level security returns only the rows of
sources the principal sees whole, which the query sums: a few rows per (source, term), never a scan.
Files granted one by one (in a source the principal does not see whole) add their exact counts: df
from the terms on their chunks' rows, N and length from their chunks — work proportional to those
files, done only for principals that hold such grants (an uncorrelated EXISTS skips it otherwise).
Sources that take their permissions from the share (issue 30) are partitioned by permission set: the rows
of the sets that allow the principal are visible, so such a search sums a few rows per (source, set, term)
and reads packed lists, as for a source seen whole (migration 0024).

Where the postings come from (issue 29): with the kdbl_bm25 extension, from the packed lists (writers
pack their own, builds merge them; bm25_native sums them in C, LISTED_POSTINGS unpacks them for SQL);
without it, from the postings rows, which are then the whole index (bm25_topk's MaxScore reads them).
A given chunk's terms are on its row (`chunks.terms`, `chunks.tfs`; analysis.chunk_terms).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime

from kdbl_core.content import analysis
from kdbl_core.db.async_pool import Connection
from kdbl_core.db.sql_text import fold

K1 = 1.2
B = 0.75


@dataclass(frozen=True, slots=True)
class Filters:
    """What a search is restricted to; every filter given narrows (AND). The list filters match any of
    their values: `source_ids` (the tools refuse it together with `source_id`; given both here, both hold), `content_types` (each a MIME type or a family
    like `content_type`), `authors` (a stored author equal to one, ignoring case: lower() on both sides,
    whole names, no substring) and `labels` (exact, case-sensitive: `files.labels && values`, served by
    the GIN index of migration 0013). All apply inside each arm, before its top-N."""

    source_id: uuid.UUID | None = None
    path: str | None = None  # key prefix
    content_type: str | None = None
    modified_after: datetime | None = None
    modified_before: datetime | None = None
    source_ids: tuple[uuid.UUID, ...] = ()
    content_types: tuple[str, ...] = ()
    authors: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    exclude_file_id: int | None = None  # find_similar: never the subject file itself

    @property
    def touches_files(self) -> bool:
        return any(v is not None for v in (self.path, self.content_type, self.modified_after,
                                           self.modified_before)) or bool(self.content_types or self.authors
                                                                          or self.labels)


@dataclass(frozen=True, slots=True)
class ChunkHit:
    """One ranked chunk, from either arm: `score` is BM25 (lexical) or cosine similarity (vector)."""

    chunk_id: int
    file_id: int
    source_id: uuid.UUID
    key: str
    seq: int
    score: float


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _content_type_sql(content_type: str, params: dict, name: str) -> str:
    """A MIME type (exact) or a family ('text/*' or 'text'): a prefix match."""
    if content_type.endswith("/*") or "/" not in content_type:
        params[f"{name}_prefix"] = _like_prefix(content_type.removesuffix("*").rstrip("/") + "/")
        return f"f.content_type LIKE %({name}_prefix)s"
    params[name] = content_type
    return f"f.content_type = %({name})s"


def file_filter_sql(filters: Filters, params: dict) -> str:
    clauses = []
    if filters.path is not None:
        clauses.append("f.key LIKE %(path_prefix)s")
        params["path_prefix"] = _like_prefix(filters.path.lstrip("/"))
    if filters.content_type is not None:
        clauses.append(_content_type_sql(filters.content_type, params, "ctype"))
    if filters.content_types:
        clauses.append("(" + " OR ".join(_content_type_sql(ct, params, f"ctype{i}")
                                         for i, ct in enumerate(filters.content_types)) + ")")
    if filters.authors:
        clauses.append("EXISTS (SELECT 1 FROM unnest(f.authors) AS a(name) WHERE lower(a.name) IN "
                       "(SELECT lower(v) FROM unnest(CAST(%(authors)s AS text[])) AS v))")  # one lower() both sides
        params["authors"] = list(filters.authors)
    if filters.labels:
        clauses.append("f.labels && CAST(%(labels)s AS text[])")
        params["labels"] = list(filters.labels)
    if filters.modified_after is not None:
        clauses.append("f.mtime >= %(mod_after)s")
        params["mod_after"] = filters.modified_after
    if filters.modified_before is not None:
        clauses.append("f.mtime < %(mod_before)s")
        params["mod_before"] = filters.modified_before
    return " AND ".join(clauses)


def source_filter_sql(filters: Filters, params: dict, alias: str) -> str:
    """` AND ...` restricting rows of `alias` (any table with source_id) to the source filters."""
    extra = ""
    if filters.source_id is not None:
        extra += f" AND {alias}.source_id = %(source_id)s"
        params["source_id"] = filters.source_id
    if filters.source_ids:
        extra += f" AND {alias}.source_id = ANY (CAST(%(source_ids)s AS uuid[]))"
        params["source_ids"] = list(filters.source_ids)
    return extra


def chunk_filters_sql(filters: Filters, params: dict, alias: str) -> str:
    """` AND ...` restricting rows of `alias` by their `chunk_id` alone (rows of a packed list know no
    file): the excluded file's chunks out, the file-level filters as the set of their files' chunks."""
    extra = ""
    if filters.exclude_file_id is not None:
        extra += (f" AND {alias}.chunk_id NOT IN (SELECT x.id FROM chunks x "
                  f"WHERE x.file_id = %(exclude_file_id)s)")
        params["exclude_file_id"] = filters.exclude_file_id
    if filters.touches_files:
        extra += (f" AND {alias}.chunk_id IN (SELECT x.id FROM chunks x WHERE x.file_id IN (SELECT f.id FROM files f "
                  f"WHERE f.tenant_id = kdbl_tenant() AND {file_filter_sql(filters, params)}))")
    return extra


def filters_sql(filters: Filters, params: dict, alias: str) -> str:
    """` AND ...` restricting rows of `alias` (postings or chunks: both carry source_id and file_id)."""
    extra = ""
    if filters.exclude_file_id is not None:
        extra += f" AND {alias}.file_id <> %(exclude_file_id)s"
        params["exclude_file_id"] = filters.exclude_file_id
    extra += source_filter_sql(filters, params, alias)
    if filters.touches_files:
        extra += (f" AND {alias}.file_id IN (SELECT f.id FROM files f WHERE f.tenant_id = kdbl_tenant() AND "
                  f"{file_filter_sql(filters, params)})")
    return extra


# Statistics of what the principal sees (see the module docstring), for the terms of CTE `q`.
# `gf`: files granted one by one in sources not seen whole; their counts come from their chunks (the terms on
# each chunk's row, migration 0021: never in a list the principal sees). Files read through the share's
# permissions are not among them: their permission set's partition of the index is visible (migration 0024),
# unless that set does not allow the caller and a grant names the file.
_STATS = f"""
gf AS MATERIALIZED (  -- from the grants (few, usually none): a generic plan scanned all files (6.5 ms at 100k chunks)
    SELECT f.id, f.chunk_count FROM kdbl_grant_files() AS g(id)
     CROSS JOIN LATERAL (SELECT f.id, f.chunk_count, f.source_id, f.permission_set FROM files f
                          WHERE f.id = g.id AND f.tenant_id = kdbl_tenant() OFFSET 0) f
     WHERE f.source_id NOT IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id))
       AND (f.permission_set IS NULL OR f.permission_set NOT IN (SELECT rs.id FROM kdbl_readable_sets() AS rs(id)))
), corpus AS MATERIALIZED (
    SELECT greatest(n, 1)::float8 AS n, greatest(total_len, 1)::float8 / greatest(n, 1)::float8 AS avgdl,
           CAST(coalesce(dl_min, 0) AS float8) AS dl_min
      FROM (SELECT coalesce(s.n, 0) + coalesce(g.n, 0) AS n, coalesce(s.len, 0) + coalesce(g.len, 0) AS total_len,
                   least(s.dl_min, g.dl_min) AS dl_min
              FROM (SELECT sum(n_chunks) AS n, sum(total_len) AS len, min(dl_min) AS dl_min
                      FROM corpus_stats WHERE tenant_id = kdbl_tenant()) s,
                   (SELECT sum(chunk_count) AS n,
                           (SELECT sum(c.token_count) FROM chunks c
                             WHERE c.file_id IN (SELECT id FROM gf) AND EXISTS (SELECT 1 FROM gf)) AS len,
                           (SELECT min(c.token_count) FROM chunks c
                             WHERE c.file_id IN (SELECT id FROM gf) AND EXISTS (SELECT 1 FROM gf)) AS dl_min
                      FROM gf) g) t
), dfs AS (  -- tf_max: the largest tf of the term's visible postings or more (a bound, migration 0016)
    SELECT term, sum(df) AS df, CAST(coalesce(max(tf_max), 32767) AS float8) AS tf_max FROM (
        SELECT s.term, s.df, s.tf_max FROM q CROSS JOIN LATERAL (  -- per term: the generic plan scanned the tenant's
            SELECT s.term, s.df, s.tf_max FROM term_stats s   -- rows (17k, 5 ms with 116 permission sets)
             WHERE s.tenant_id = kdbl_tenant() AND s.term = q.term OFFSET 0) s
        UNION ALL
        SELECT t.term, 1, t.tf FROM chunks c CROSS JOIN LATERAL {analysis.chunk_terms("c")}
         WHERE c.file_id IN (SELECT id FROM gf) AND EXISTS (SELECT 1 FROM gf) AND t.term IN (SELECT term FROM q)
    ) d GROUP BY term HAVING sum(df) > 0
)"""

# The query's terms: its lexemes, or (find_similar's more-like-this) terms given as they are indexed.
QUERY_LEXEMES = f"SELECT DISTINCT term FROM {analysis.TERMS.format(text='%(query)s')}"
GIVEN_TERMS = "SELECT DISTINCT unnest(CAST(%(terms)s AS text[])) AS term"

# The query's terms with their idf and the visible average chunk length; BM25_SQL scores one posting.
TERMS = f"""
WITH q AS (
    {QUERY_LEXEMES}
), {_STATS.strip()}, w AS MATERIALIZED (  -- once per term (inlined, each posting redid idf in numeric)
    SELECT d.term, ln(1 + (nc.n - d.df + 0.5) / (d.df + 0.5)) AS idf, nc.avgdl, d.df, nc.n,
           ln(1 + (nc.n - d.df + 0.5) / (d.df + 0.5)) * CAST({K1 + 1} AS float8) AS idf_k1,
           CAST({K1 * B:.6g} AS float8) / nc.avgdl AS k1b_avgdl, nc.dl_min, d.tf_max
      FROM dfs d CROSS JOIN corpus nc
)"""
# idf·tf·(k1+1) / (tf + k1·(1 - b + b·dl/avgdl)), arranged so that each posting costs a few float8
# operations: idf·(k1+1) and k1·b/avgdl are computed once per term (an untyped 0.75 would make every row numeric math).
BM25_SQL = f"w.idf_k1 * p.tf / (p.tf + (CAST({K1 * (1 - B):.6g} AS float8) + w.k1b_avgdl * p.dl))"

# Ranking order: by score to 1e-9, then chunk id. Two chunks whose scores are equal in exact arithmetic
# can differ in the last bit depending on the order their terms were summed (a hash aggregate's, C's),
# so scores are compared rounded (half to even, as rint() in kdbl_bm25 and Python's round()): a tie is
# a tie whichever method summed it, and every method breaks it by the smaller chunk id.
RANK_SCALE = 1e9


def rank_order(score: str, chunk_id: str) -> str:
    """SQL ORDER BY items for the ranking order of rows with `score` and `chunk_id`."""
    return f"round({score} * CAST({RANK_SCALE:.0e} AS float8)) DESC, {chunk_id}"


def rank_key(hit: ChunkHit) -> tuple[float, int]:
    """The ranking order as a Python sort key."""
    return (-round(hit.score * RANK_SCALE), hit.chunk_id)


# The keyword statements (every statement over _STATS below) carry the statistics CTEs and their
# row-level-security subplans: 4-6 ms to plan at any corpus size, more than executing them at 10k chunks. psycopg prepares a statement on its 5th
# run; PostgreSQL's `auto` plan cache then kept re-planning these (custom plans looked cheaper), so the
# exhaustive query took 9 ms at 10k chunks against 3.3 ms with its generic plan. The setting is set
# for the keyword statements alone and put back after them, in the same round trip (a pipeline): other
# statements (the vector arm's ORDER BY ... LIMIT) keep `auto`. A lexical search_content call sets it for
# its whole transaction in its preflight instead (kdbl_core.search.plan: nothing after its keyword arm
# wants a custom plan — the hits' neighbours and facts are primary-key probes either way), and runs its
# keyword statements inside `generic_plans_set()`: two statements fewer a call (issue 33).
_GENERIC = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"
AUTO_PLANS = "SELECT set_config('plan_cache_mode', 'auto', true)"
_SET_FOR_TRANSACTION: ContextVar[bool] = ContextVar("kdbl_generic_plans_set", default=False)


@contextmanager
def generic_plans_set() -> Iterator[None]:
    """Within it, the caller's transaction already plans generically (its preflight set it): the keyword
    statements are sent alone, without the setting around them."""
    token = _SET_FOR_TRANSACTION.set(True)
    try:
        yield
    finally:
        _SET_FOR_TRANSACTION.reset(token)


async def fetch_generic(conn: Connection, sql: str, params: dict, *, first: bool = True,
                        last: bool = True) -> list:
    """`sql`'s rows, planned with a cached generic plan once psycopg prepared it. `first`/`last`: whether
    this statement opens or closes a run of keyword statements (the setting goes on before the first
    and back after the last, pipelined with them); neither inside `generic_plans_set()`."""
    sql = fold(sql)  # within psycopg's cached length: its placeholders parsed once, not per call
    if _SET_FOR_TRANSACTION.get():
        cur = await conn.execute(sql, params)
        return await cur.fetchall()
    async with conn.pipeline():
        if first:
            await conn.execute(_GENERIC)
        cur = await conn.execute(sql, params)
        if last:
            await conn.execute(AUTO_PLANS)
    return await cur.fetchall()


def hits(rows: list) -> list[ChunkHit]:
    """ChunkHits from rows of (chunk_id, file_id, source_id, key, seq, score), as HITS_OF_TOP selects them."""
    return [ChunkHit(r.chunk_id, r.file_id, r.source_id, r.key, r.seq, float(r.score)) for r in rows]


# The hits of CTE `top` (chunk_id, score): each chunk's file, source, key and seq, one index probe each.
HITS_OF_TOP = """SELECT top.chunk_id, c.file_id, c.source_id, f.key, c.seq, top.score
  FROM top
  CROSS JOIN LATERAL (SELECT c.file_id, c.source_id, c.seq FROM chunks c WHERE c.id = top.chunk_id OFFSET 0) c
  CROSS JOIN LATERAL (SELECT f.key FROM files f WHERE f.id = c.file_id OFFSET 0) f
"""


# Every posting of the query's terms the principal sees, where a build packed them (the kdbl_bm25
# extension): each visible packed list unpacked, less the chunks deleted since (bm25_dead, an anti-join);
# the postings rows written since the build (`chunk_id > upto`); the chunks of files granted one by one
# (whose lists the principal does not see), from their rows' terms. The exact reference and the file-filtered searches read this.
# `{terms}`: the CTE of the terms to read (w: the query's).
LISTED_POSTINGS = """
, built AS MATERIALIZED (
    SELECT coalesce((SELECT b.upto FROM bm25_built b WHERE b.tenant_id = kdbl_tenant()), 0) AS upto
), vp AS (
    SELECT u.chunk_id, l.term, u.tf, u.dl
      FROM {terms} w CROSS JOIN LATERAL (
          SELECT l.term, l.list FROM bm25_lists l
           WHERE l.tenant_id = kdbl_tenant() AND l.term = w.term{list_filter}
          OFFSET 0) l
     CROSS JOIN LATERAL kdbl_bm25_unpack(l.list) AS u
     WHERE NOT EXISTS (SELECT 1 FROM bm25_dead d WHERE d.tenant_id = kdbl_tenant() AND d.chunk_id = u.chunk_id)
    UNION ALL  -- written since the build
    SELECT p.chunk_id, p.term, p.tf, p.dl
      FROM {terms} w CROSS JOIN LATERAL (
          SELECT p.chunk_id, p.term, p.tf, p.dl FROM postings p
           WHERE p.tenant_id = kdbl_tenant() AND p.term = w.term
             AND p.chunk_id > (SELECT built.upto FROM built){postings_filter}
             AND (NOT EXISTS (SELECT 1 FROM gf) OR p.file_id NOT IN (SELECT gf.id FROM gf))
          OFFSET 0) p
    UNION ALL  -- files granted one by one, in sources the principal does not see whole
    SELECT c.id, t.term, t.tf, c.token_count
      FROM chunks c CROSS JOIN LATERAL {chunk_terms}
     WHERE c.file_id IN (SELECT gf.id FROM gf) AND EXISTS (SELECT 1 FROM gf)
       AND t.term IN (SELECT w.term FROM {terms} w){chunk_filter}
)"""


def postings_relation(filters: Filters, params: dict, *, lists: bool, terms: str = "w") -> tuple[str, str, str]:
    """(CTEs to add, relation `p`, ` AND ...` on p): the visible postings of the terms of CTE `terms`
    under `filters`, with rows (chunk_id, term, tf, dl). `lists`: LISTED_POSTINGS (the database has the
    kdbl_bm25 extension), else the postings rows."""
    if lists:
        ctes = LISTED_POSTINGS.format(terms=terms, chunk_terms=analysis.chunk_terms("c"),
                                      list_filter=source_filter_sql(filters, params, "l"),
                                      postings_filter=source_filter_sql(filters, params, "p"),
                                      chunk_filter=source_filter_sql(filters, params, "c"))
        return ctes, "vp p", chunk_filters_sql(filters, params, "p")
    of_terms = "" if terms == "w" else f" AND p.term IN (SELECT term FROM {terms})"  # w: the caller joins it
    return "", "postings p", f" AND p.tenant_id = kdbl_tenant(){of_terms}{filters_sql(filters, params, 'p')}"


def build_query(filters: Filters, *, given_terms: bool = False, at_most: bool = False,
                lists: bool = False) -> tuple[str, dict]:
    """Exhaustive BM25 top-N: every posting of every query term the principal sees, summed per chunk.
    The reference the top-k methods must equal (and `KDBL_BM25_EXHAUSTIVE=true` serves). `lists`: the
    postings are those of LISTED_POSTINGS (a database with the kdbl_bm25 extension, whose builds pack
    postings into lists), else the postings rows (all of them: nothing is ever packed). `at_most`: only
    when the terms hold at most %(at_most)s postings in all; otherwise one row of NULLs."""
    params: dict = {}
    terms = TERMS.replace(QUERY_LEXEMES, GIVEN_TERMS, 1) if given_terms else TERMS
    guard = " AND (SELECT sum(df) FROM w) <= %(at_most)s" if at_most else ""
    ctes, relation, extra = postings_relation(filters, params, lists=lists)
    sql = terms + ctes + f"""
, top AS (
    SELECT p.chunk_id, sum({BM25_SQL}) AS score
      FROM {relation} JOIN w ON w.term = p.term
     WHERE true{guard}{extra}
     GROUP BY p.chunk_id
     ORDER BY {rank_order(f"sum({BM25_SQL})", "p.chunk_id")}
     LIMIT %(limit)s
)
{HITS_OF_TOP}"""
    if at_most:
        sql += " UNION ALL\nSELECT NULL, NULL, NULL, NULL, NULL, NULL WHERE (SELECT sum(df) FROM w) > %(at_most)s\n"
    else:
        sql += f" ORDER BY {rank_order('top.score', 'top.chunk_id')}\n"
    return sql, params


async def exhaustive_search(conn: Connection, query: str, filters: Filters, *, limit: int,
                            ts_config: str, lists: bool) -> list[ChunkHit]:
    """Top `limit` chunks by BM25 among rows the current RLS principal may see, every posting read
    (`lists`: build_query's)."""
    sql, params = build_query(filters, lists=lists)
    params.update({"cfg": ts_config, "query": query, "limit": limit})
    rows = await fetch_generic(conn, sql, params)
    return hits(rows)


async def exhaustive_search_terms(conn: Connection, terms: list[str], filters: Filters, *,
                                  limit: int, lists: bool) -> list[ChunkHit]:
    """exhaustive_search() for terms given as indexed (lexemes: distinctive_terms() picks them)."""
    sql, params = build_query(filters, given_terms=True, lists=lists)
    params.update({"terms": terms, "limit": limit})
    rows = await fetch_generic(conn, sql, params)
    return hits(rows)


# A subject's most distinctive terms (more-like-this): its term frequencies times the idf of what the
# principal sees; a term in no other visible chunk (df < min_df) cannot find anything else.
_DISTINCTIVE = f"""
WITH st AS MATERIALIZED ({{subject}}), q AS (SELECT term FROM st), {_STATS.strip()}
SELECT st.term FROM st JOIN dfs d ON d.term = st.term CROSS JOIN corpus nc
 WHERE d.df >= %(min_df)s
 ORDER BY st.tf * ln(1 + (nc.n - d.df + 0.5) / (d.df + 0.5)) DESC, st.term
 LIMIT %(k)s
"""
_TEXT_TF = f"SELECT term, CAST(tf AS float8) AS tf FROM {analysis.TERMS.format(text='%(text)s')}"
_CHUNKS_TF = ("SELECT t.term, CAST(sum(t.tf) AS float8) AS tf FROM chunks c "
              f"CROSS JOIN LATERAL {analysis.chunk_terms('c')} "
              "WHERE c.id = ANY (CAST(%(chunks)s AS bigint[])) GROUP BY t.term")


async def distinctive_terms(conn: Connection, *, text: str | None = None, chunk_ids: list[int] | None = None,
                            ts_config: str, k: int = 25) -> list[str]:
    """The `k` terms that best characterise a text (analysed as queries are) or stored chunks (the terms
    on their rows), by tf x idf over what the principal sees. Stored chunks' own terms count once in df, so
    they need df >= 2 to reach another chunk."""
    if text is not None:
        sql, params = _DISTINCTIVE.format(subject=_TEXT_TF), {"cfg": ts_config, "text": text, "min_df": 1}
    else:
        sql, params = _DISTINCTIVE.format(subject=_CHUNKS_TF), {"chunks": chunk_ids or [], "min_df": 2}
    params["k"] = k
    return [r[0] for r in await fetch_generic(conn, sql, params)]


# The postings of given chunks, from the terms on their rows (dl: their length, as in every posting).
CHUNK_POSTINGS = ("(SELECT c.id AS chunk_id, t.term, t.tf, c.token_count AS dl FROM chunks c "
                  f"CROSS JOIN LATERAL {analysis.chunk_terms('c')} WHERE c.id = ANY({{ids}}))")
_SCORES_FOR = TERMS + f"""
SELECT p.chunk_id, sum({BM25_SQL}) AS score
  FROM {CHUNK_POSTINGS.format(ids="CAST(%(ids)s AS bigint[])")} p JOIN w ON w.term = p.term
 GROUP BY p.chunk_id
"""


async def scores_for(conn: Connection, query: str, chunk_ids: list[int], *, ts_config: str) -> dict[int, float]:
    """The BM25 score of each given chunk (absent: no query term in it) — the same formula as search()."""
    if not chunk_ids:
        return {}
    rows = await fetch_generic(conn, _SCORES_FOR, {"cfg": ts_config, "query": query, "ids": chunk_ids})
    return {r.chunk_id: float(r.score) for r in rows}


async def query_terms(conn: Connection, query: str, ts_config: str) -> list[str]:
    cur = await conn.execute(QUERY_LEXEMES, {"cfg": ts_config, "query": query})
    return [r[0] for r in await cur.fetchall()]


_RARE_TERMS = f"""
WITH q AS (SELECT DISTINCT unnest(CAST(%(terms)s AS text[])) AS term), {_STATS.strip()}
SELECT term FROM dfs WHERE df BETWEEN 1 AND %(max_df)s
"""


async def rare_terms(conn: Connection, terms: list[str], max_df: int = 3) -> list[str]:
    """The terms in at most `max_df` chunks the principal sees (the statistics BM25 uses)."""
    if not terms:
        return []
    return [r[0] for r in await fetch_generic(conn, _RARE_TERMS, {"terms": terms, "max_df": max_df})]


_PINNED = f"""
WITH q AS (SELECT DISTINCT unnest(CAST(%(terms)s AS text[])) AS term), {_STATS.strip()}
SELECT c.id FROM chunks c
 WHERE c.id = ANY(CAST(%(c)s AS bigint[]))
   AND {analysis.chunk_term_array("c")} && ARRAY(SELECT term FROM dfs WHERE df BETWEEN 1 AND %(max_df)s)
"""


async def chunks_with_rare_terms(conn: Connection, chunk_ids: list[int], terms: list[str],
                                 max_df: int = 3) -> set[int]:
    """Of the given chunks, those holding one of `terms` that is rare (in 1..`max_df` chunks the principal
    sees, rare_terms' statistics): one round trip for what was rare_terms + the chunks' terms."""
    if not chunk_ids or not terms:
        return set()
    return {r[0] for r in await fetch_generic(conn, _PINNED, {"terms": terms, "c": chunk_ids, "max_df": max_df})}
