"""The keyword arm's top-k: exact BM25 that reads little (MaxScore, then term-by-term probing).

`search` chooses how (issue 29): with the kdbl_bm25 extension the packed lists are the index (writers
and builds pack them), read in C by bm25_native, or summed in SQL over the unpacked lists for file-level
filters and `native=False` (lexical.LISTED_POSTINGS); without it, postings rows are the index and the
MaxScore below reads them. Every way returns the exhaustive top k.

Exhaustive BM25 (lexical.exhaustive_search) reads every posting of every query term; at 1M chunks a
SciFact query's terms hold ~300,000-1,100,000 postings. This module returns the same top k (same chunks,
same order; the proof is below) while reading the postings of the rarer terms only and probing the
common ones for the few chunks that can still reach the top k.

A posting of term t scores idf_t (k1+1) tf / (tf + k1 (1-b) + k1 b dl / avgdl), rising with tf and
falling with dl, so in a chunk of length dl it scores at most ub_t(dl) with tf = tf_max_t, the term's
largest tf (term_stats, migration 0016), and anywhere at most ub_t = ub_t(dl_min), dl_min being the
shortest visible chunk (corpus_stats). Two statements:

0. When the query's terms hold at most `SMALL_POSTINGS` postings in all (what the principal sees), the
   exhaustive top k at once: one statement, as small tenants always had (at 10k chunks: 3.3 ms).
1. *plan*: the terms' statistics and a first threshold theta0: the k-th best
   exact score among the best `SEED_CANDIDATES` chunks of the rarest terms (those holding up to
   `SEED_POSTINGS` postings together), each scored over all terms by primary-key probes.
2. *score*: terms sorted by ub_t ascending; the longest prefix whose bounds sum below theta0 is
   *non-essential* (NE), the rest *essential*. Every posting of the essential terms is read (RLS and
   filters apply to each) and summed per chunk (`partial`). The best `PROBE_CANDIDATES` chunks by partial
   are probed for every NE term, which raises the threshold to theta1 (the k-th best exact score among
   them). Then the candidates whose partial + the NE bounds at their own length reach theta1 are probed
   for the NE term with the largest bound; those still able to reach theta1 with the exact score of that
   term and the bounds of the rest go on to the next NE term, and so on. The top k of what survives the
   last term, each scored exactly, is the answer.

Why it is the exhaustive top k: theta0 <= theta1 <= theta*, the true k-th best score, because each is the
k-th best of real chunks' exact scores. A chunk holding no essential term scores at most the NE prefix's
sum < theta0 <= theta*; a chunk dropped at any step has an upper bound (exact scores so far + bounds of
the terms not yet probed) below theta1 <= theta*. Neither can reach the top k, even on a tie (ties break
by chunk id, as exhaustively), and every chunk that can is scored exactly. A margin of 1e-9 keeps float
rounding on the safe side. When fewer than k chunks are seeded, theta0 = 0, no term is non-essential and
the read is the exhaustive one: small tenants and restricted principals get the exhaustive answer over
what they see, and a restricted principal's top k is its own, never what is left of everybody's.

Measured at 1M synthetic chunks in docs/benchmarks.md (`kdbl-control bench scale` on a database without
the extension serves this method and prints it beside the exhaustive one and their top-10 agreement).
"""

from __future__ import annotations

from dataclasses import dataclass

from kdbl_core.db.async_pool import Connection
from kdbl_core.search import bm25_native, lexical, phrases
from kdbl_core.search.lexical import B, K1, ChunkHit, Filters
from kdbl_core.search.windows import Fetched

SMALL_POSTINGS = 200_000  # the query's terms hold no more: read them all at once. At 100k chunks (their
# terms hold ~30,000-150,000) MaxScore's two statements took 36.7 ms p50 against 33.8 for the exhaustive one
SEED_POSTINGS = 5_000  # the rarest terms read for theta0, together (at least one term)
SEED_CANDIDATES = 256  # their best chunks, scored exactly for theta0
PROBE_CANDIDATES = 256  # the best chunks by partial score, scored exactly for theta1
_MARGIN = 1e-9
_K1_1_B = f"CAST({K1 * (1 - B):.6g} AS float8)"  # k1 (1-b), written as lexical.BM25_SQL writes it


@dataclass(frozen=True, slots=True)
class _Term:
    term: str
    idf_k1: float  # idf (k1+1)
    tf_max: float
    bound: float  # ub_t(dl_min)


_PLAN = lexical.TERMS + f"""
, seed_t AS (
    SELECT term FROM (SELECT term, sum(df) OVER (ORDER BY df, term) AS cum,
                             row_number() OVER (ORDER BY df, term) AS r FROM w) s
     WHERE r = 1 OR cum <= %(seed_postings)s
), seed AS MATERIALIZED (
    SELECT p.chunk_id FROM postings p JOIN w ON w.term = p.term
     WHERE p.tenant_id = kdbl_tenant() AND p.term IN (SELECT term FROM seed_t){{extra}}
     GROUP BY p.chunk_id
     ORDER BY sum({lexical.BM25_SQL}) DESC, p.chunk_id
     LIMIT %(seed_candidates)s
), seed_full AS (
    SELECT sum({lexical.BM25_SQL}) AS score
      FROM w JOIN postings p ON p.tenant_id = kdbl_tenant() AND p.term = w.term
                            AND p.chunk_id = ANY (CAST((SELECT array_agg(chunk_id ORDER BY chunk_id) FROM seed)
                                                       AS bigint[]))
     GROUP BY p.chunk_id
)
SELECT w.term, w.idf_k1, w.k1b_avgdl, w.tf_max,
       w.idf_k1 * w.tf_max / (w.tf_max + ({_K1_1_B} + w.k1b_avgdl * w.dl_min)) AS bound,
       (SELECT score FROM seed_full ORDER BY score DESC OFFSET %(limit)s - 1 LIMIT 1) AS theta0
  FROM w
 ORDER BY bound, w.term
"""

_HITS = "\n" + lexical.HITS_OF_TOP + f" ORDER BY {lexical.rank_order('top.score', 'top.chunk_id')}\n"
# The essential terms from the plan as arrays; `bm25` as lexical.BM25_SQL writes it.
_ESSENTIAL = f"""w AS (
    SELECT * FROM unnest(CAST(%(terms)s AS text[]), CAST(%(idf_k1)s AS float8[])) AS w(term, idf_k1)
), agg AS MATERIALIZED (
    SELECT p.chunk_id, max(p.dl) AS dl,
           sum(w.idf_k1 * p.tf / (p.tf + ({_K1_1_B} + %(k1b_avgdl)s * p.dl))) AS score
      FROM postings p JOIN w ON w.term = p.term
     WHERE p.tenant_id = kdbl_tenant(){{extra}}
     GROUP BY p.chunk_id
)"""
_ALL = f"""
WITH {_ESSENTIAL}, top AS (
    SELECT chunk_id, score FROM agg ORDER BY {lexical.rank_order("score", "chunk_id")} LIMIT %(limit)s
)""" + _HITS


def _term_score(i: int) -> str:
    """NE term i's score of posting p (its idf (k1+1) as a parameter)."""
    return f"%(ne{i}_idf_k1)s * p.tf / (p.tf + ({_K1_1_B} + %(k1b_avgdl)s * p.dl))"


def _bounds(terms: range, dl: str) -> str:
    """The sum of NE terms' bounds in a chunk of length `dl` (0 when `terms` is empty)."""
    parts = [f"%(ne{i}_a)s / (%(ne{i}_c)s + %(k1b_avgdl)s * {dl})" for i in terms]
    return " + ".join(parts) or "CAST(0 AS float8)"


def _probe(i: int, rel: str) -> str:
    """NE term i's postings in the chunks of `rel`, by primary key (one index pass: a sorted array)."""
    return (f"SELECT p.chunk_id, {_term_score(i)} AS s FROM postings p "
            f"WHERE p.tenant_id = kdbl_tenant() AND p.term = %(ne{i})s AND p.chunk_id = ANY (CAST("
            f"(SELECT array_agg(chunk_id ORDER BY chunk_id) FROM {rel}) AS bigint[]))")


def maxscore_sql(n_ne: int) -> str:
    """Statement 2 with `n_ne` non-essential terms, probed from the largest bound (index 0) down."""
    every = range(n_ne)
    best_ne = " UNION ALL ".join(_probe(i, "best") for i in every)
    steps, prev = [], "cand"
    for i in every:
        rest = _bounds(range(i + 1, n_ne), "s.dl")
        steps.append(f"""s{i} AS MATERIALIZED (
    SELECT s.chunk_id, s.dl, s.score + coalesce(x.s, 0) AS score
      FROM {prev} s LEFT JOIN ({_probe(i, prev)}) x ON x.chunk_id = s.chunk_id
     WHERE s.score + coalesce(x.s, 0) + {rest} >= (SELECT t FROM theta)
)""")
        prev = f"s{i}"
    return f"""
WITH {_ESSENTIAL}, best AS MATERIALIZED (
    SELECT chunk_id, score FROM agg ORDER BY score DESC, chunk_id LIMIT %(probe_candidates)s
), theta AS (
    SELECT greatest(%(theta0)s, coalesce((
        SELECT b.score + coalesce(n.s, 0) AS score
          FROM best b LEFT JOIN (SELECT chunk_id, sum(s) AS s FROM ({best_ne}) u GROUP BY chunk_id) n
            ON n.chunk_id = b.chunk_id
         ORDER BY score DESC OFFSET %(limit)s - 1 LIMIT 1), 0)) * {1 - _MARGIN!r} AS t
), cand AS MATERIALIZED (
    SELECT a.chunk_id, a.dl, a.score FROM agg a WHERE a.score + {_bounds(every, "a.dl")} >= (SELECT t FROM theta)
), {", ".join(steps)}, top AS (
    SELECT chunk_id, score FROM {prev} ORDER BY {lexical.rank_order("score", "chunk_id")} LIMIT %(limit)s
)""" + _HITS


def non_essential(terms: list[_Term], theta0: float) -> list[_Term]:
    """The longest prefix of `terms` (sorted by bound ascending) whose bounds sum below theta0."""
    total = 0.0
    for n, t in enumerate(terms):
        total += t.bound
        if total * (1 + _MARGIN) >= theta0:
            return terms[:n]
    return list(terms)


async def _search(conn: Connection, plan_params: dict, filters: Filters, *, limit: int, given_terms: bool,
                  stats: dict | None = None) -> list[ChunkHit]:
    params: dict = {}
    extra = lexical.filters_sql(filters, params, "p")
    small, small_params = lexical.build_query(filters, given_terms=given_terms, at_most=True)
    found = await lexical.fetch_generic(conn, small, {**small_params, **plan_params, "limit": limit,
                                                      "at_most": SMALL_POSTINGS})
    if not found or found[0].chunk_id is not None:
        if stats is not None:
            stats.update({"non_essential": 0, "theta0": 0.0, "small": True})
        return sorted(lexical.hits(found), key=lexical.rank_key)  # the UNION ALL's order is not promised
    plan = _PLAN.replace(lexical.QUERY_LEXEMES, lexical.GIVEN_TERMS, 1) if given_terms else _PLAN
    rows = await lexical.fetch_generic(conn, plan.format(extra=extra), {
        **params, **plan_params, "limit": limit, "seed_postings": SEED_POSTINGS,
        "seed_candidates": SEED_CANDIDATES})
    if not rows:
        return []
    terms = [_Term(r.term, float(r.idf_k1), float(r.tf_max), float(r.bound)) for r in rows]
    theta0 = float(rows[0].theta0 or 0.0)
    ne = non_essential(terms, theta0)
    if len(ne) == len(terms):  # cannot happen with theta0 a real chunk's score, but never read nothing
        ne = ne[:-1]
    essential = terms[len(ne):]
    k1b_avgdl = float(rows[0].k1b_avgdl)
    params.update({"terms": [t.term for t in essential], "idf_k1": [t.idf_k1 for t in essential],
                   "k1b_avgdl": k1b_avgdl, "limit": limit})
    if stats is not None:
        stats.update({"terms": len(terms), "non_essential": len(ne), "theta0": theta0, "small": False})
    if not ne:
        sql = _ALL.format(extra=extra)
    else:
        by_bound = sorted(ne, key=lambda t: (-t.bound, t.term))  # probe the loosest bound first
        for i, t in enumerate(by_bound):
            # ub_t(dl) = idf_k1 tf_max / (tf_max + k1 (1-b) + k1b_avgdl dl) = a / (c + k1b_avgdl dl)
            params.update({f"ne{i}": t.term, f"ne{i}_idf_k1": t.idf_k1, f"ne{i}_a": t.idf_k1 * t.tf_max,
                           f"ne{i}_c": t.tf_max + K1 * (1 - B)})
        params.update({"theta0": theta0, "probe_candidates": PROBE_CANDIDATES})
        sql = maxscore_sql(len(ne)).format(extra=extra)
    found = await lexical.fetch_generic(conn, sql, params)
    return lexical.hits(found)


async def search(conn: Connection, query: str, filters: Filters, *, limit: int, ts_config: str,
                 exhaustive: bool = False, native: bool = True, stats: dict | None = None,
                 fetched: Fetched | None = None) -> list[ChunkHit]:
    """Top `limit` chunks by BM25 among rows the current RLS principal may see, always the exhaustive top k.
    With the kdbl_bm25 extension the postings are in packed lists (the rows are the delta since a build):
    the C top-k reads them (bm25_native) when `native` and no file-level filter is given, else SQL sums
    the unpacked lists (lexical.LISTED_POSTINGS). Without it, every posting is a row and MaxScore reads
    them (module docstring). `exhaustive` reads every posting (evaluation's reference). A query with
    quoted phrases ranks only the chunks that hold them (kdbl_core.search.phrases). An extension installed
    but unusable raises Unavailable (bm25_native.require_readable). `fetched`: where the packed lists rank
    (bm25_native), the hits' windows are read in the same statement into it (kdbl_core.search.windows)."""
    lists = await bm25_native.require_readable(conn)
    found = phrases.parse(query)
    if found:
        return await phrases.search(conn, query, found, filters, limit=limit, ts_config=ts_config, lists=lists,
                                    stats=stats)
    if exhaustive or (lists and (filters.touches_files or not native)):
        return await lexical.exhaustive_search(conn, query, filters, limit=limit, ts_config=ts_config, lists=lists)
    term_params = {"cfg": ts_config, "query": query}
    if lists:
        if stats is not None:
            stats["native"] = True
        return await bm25_native.search(conn, term_params, filters, limit=limit, given_terms=False,
                                        fetched=fetched)
    return await _search(conn, term_params, filters, limit=limit, given_terms=False, stats=stats)


async def search_terms(conn: Connection, terms: list[str], filters: Filters, *, limit: int,
                       exhaustive: bool = False, native: bool = True) -> list[ChunkHit]:
    """search() for terms given as indexed (find_similar's more-like-this), each weighted once."""
    lists = await bm25_native.require_readable(conn)
    if exhaustive or (lists and (filters.touches_files or not native)):
        return await lexical.exhaustive_search_terms(conn, terms, filters, limit=limit, lists=lists)
    if lists:
        return await bm25_native.search(conn, {"terms": terms}, filters, limit=limit, given_terms=True)
    return await _search(conn, {"terms": terms}, filters, limit=limit, given_terms=True)
