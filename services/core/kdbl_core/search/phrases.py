"""Phrase queries: `"exact phrase"` in a query requires its words adjacent and in order; the rest stays OR.

A phrase is text between straight double quotes ("…") or typographic ones (“…”, „…“, „…”); a quote
without its partner is an ordinary character. Every phrase is a required condition: a chunk qualifies
when its text holds each phrase as `phraseto_tsquery` reads it (the words' lexemes at consecutive
positions, stop words counted as gaps), and qualifying chunks rank by BM25 over all the query's terms,
the phrases' words included, exactly as without quotes. A phrase of stop words alone requires nothing.

Where it is checked: the postings have no positions (issue 29 keeps them lean), so the text is parsed
again, only for chunks that can qualify. One statement: the candidates are the chunks that hold every
lexeme of every phrase (the postings of the phrases' rarest term, the others checked on the chunk's row:
`chunks.terms @> lexemes`), scored exactly (BM25 over the terms on their rows, as lexical.BM25_SQL), ranked; then `to_tsvector` of their text
is matched against the phrases in rank order, within the first `window` of them. When fewer than k of
those qualify and more candidates are left, the window grows eightfold and the statement runs again.
So the answer is the exact top k of the qualifying chunks, and a phrase most candidates hold costs about
k re-parses (~50 µs a chunk), not one per candidate.

The vector arm has no words: in hybrid and semantic modes its hits are kept only where the phrases hold
(`holding`), so every hit of a phrase query has its phrases, and the keyword arm's top k stays exact.
"""

from __future__ import annotations

import re

from kdbl_core.content import analysis
from kdbl_core.db.async_pool import Connection
from kdbl_core.search import lexical
from kdbl_core.search.lexical import ChunkHit, Filters

FIRST_WINDOW = 64  # candidates checked first, at least 4 k
GROWTH = 8

# "…", “…”, „…“, „…”: the shortest span to the partner quote; an unpaired quote is left as it is.
_PHRASE = re.compile(r'"([^"]*)"|\u201c([^\u201d]*)\u201d|\u201e([^\u201c\u201d]*)[\u201c\u201d]')


def parse(query: str) -> list[str]:
    """The query's quoted phrases, in order (blank ones dropped)."""
    found = []
    for m in _PHRASE.finditer(query):
        text = next(g for g in m.groups() if g is not None)
        if text.strip():
            found.append(text.strip())
    return found


# The phrases' lexemes (to_tsvector's: the text is checked with it), each with the df the principal sees;
# `phr` holds the phrases' tsqueries; `checked` matches a chunk `c`'s text against all of them.
_PHRASE_CTES = """
, phr AS MATERIALIZED (
    SELECT tq FROM (SELECT phraseto_tsquery(CAST(%(cfg)s AS regconfig), p) AS tq
                      FROM unnest(CAST(%(phrases)s AS text[])) AS p) x
     WHERE numnode(tq) > 0
), need AS MATERIALIZED (
    SELECT DISTINCT t.lexeme AS term
      FROM unnest(CAST(%(phrases)s AS text[])) AS p, unnest(to_tsvector(CAST(%(cfg)s AS regconfig), p)) AS t
), rarest AS MATERIALIZED (
    SELECT n.term FROM need n LEFT JOIN dfs d ON d.term = n.term ORDER BY coalesce(d.df, 0), n.term LIMIT 1
), pt AS MATERIALIZED (  -- whose postings give the candidates: the rarest lexeme, or (no lexeme) every query term
    SELECT term FROM rarest UNION ALL SELECT term FROM w WHERE NOT EXISTS (SELECT 1 FROM need)
)"""
_CHECKED = ("NOT EXISTS (SELECT 1 FROM phr WHERE NOT (to_tsvector(CAST(%(cfg)s AS regconfig), c.text) "
            "@@ phr.tq))")

_SEARCH = """
, cand AS MATERIALIZED (  -- every lexeme of every phrase: the rarest one's postings, the others on the chunk's row
    SELECT c.id AS chunk_id FROM chunks c
     WHERE c.id = ANY (ARRAY(SELECT DISTINCT p.chunk_id FROM {postings} WHERE true{extra}))
       AND {chunk_term_array} @> ARRAY(SELECT term FROM need)
), ranked AS MATERIALIZED (
    SELECT p.chunk_id, sum({bm25}) AS score,
           row_number() OVER (ORDER BY {order}) AS rn
      FROM {chunk_postings} p JOIN w ON w.term = p.term
     GROUP BY p.chunk_id
), top AS (
    SELECT r.chunk_id, r.score FROM ranked r JOIN chunks c ON c.id = r.chunk_id
     WHERE r.rn <= %(window)s AND {checked}
     ORDER BY r.rn LIMIT %(limit)s
)
{hits} UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, (SELECT count(*) FROM ranked)
"""


def _statement(filters: Filters, *, lists: bool) -> tuple[str, dict]:
    params: dict = {}
    ctes, relation, extra = lexical.postings_relation(filters, params, lists=lists, terms="pt")
    sql = lexical.TERMS + _PHRASE_CTES + ctes + _SEARCH.format(
        postings=relation, extra=extra, bm25=lexical.BM25_SQL, chunk_term_array=analysis.chunk_term_array("c"),
        chunk_postings=lexical.CHUNK_POSTINGS.format(ids="ARRAY(SELECT chunk_id FROM cand)"),
        order=lexical.rank_order(f"sum({lexical.BM25_SQL})", "p.chunk_id"), checked=_CHECKED,
        hits=lexical.HITS_OF_TOP)
    return sql, params


async def search(conn: Connection, query: str, found: list[str], filters: Filters, *, limit: int,
                 ts_config: str, lists: bool, stats: dict | None = None) -> list[ChunkHit]:
    """The exact BM25 top `limit` (all of `query`'s terms) among the chunks holding every phrase of `found`.
    `lists`: lexical.postings_relation's. `stats` (optional) gets the candidates and the windows checked."""
    sql, params = _statement(filters, lists=lists)
    params.update({"cfg": ts_config, "query": query, "phrases": found, "limit": limit})
    window, windows = max(FIRST_WINDOW, 4 * limit), 1
    while True:
        rows = await lexical.fetch_generic(conn, sql, {**params, "window": window})
        hits = lexical.hits([r for r in rows if r.chunk_id is not None])
        candidates = next(int(r.score) for r in rows if r.chunk_id is None)
        if len(hits) >= limit or window >= candidates:
            if stats is not None:
                stats.update({"phrase_candidates": candidates, "phrase_windows": windows})
            return sorted(hits, key=lexical.rank_key)
        window, windows = window * GROWTH, windows + 1


_HOLDING = """
WITH phr AS MATERIALIZED (
    SELECT tq FROM (SELECT phraseto_tsquery(CAST(%(cfg)s AS regconfig), p) AS tq
                      FROM unnest(CAST(%(phrases)s AS text[])) AS p) x
     WHERE numnode(tq) > 0
)
SELECT c.id FROM chunks c WHERE c.id = ANY (CAST(%(ids)s AS bigint[])) AND {checked}
""".format(checked=_CHECKED)


async def holding(conn: Connection, chunk_ids: list[int], found: list[str], *, ts_config: str) -> set[int]:
    """Of the given chunks, those whose text holds every phrase of `found`."""
    if not chunk_ids or not found:
        return set(chunk_ids)
    cur = await conn.execute(_HOLDING, {"cfg": ts_config, "phrases": found, "ids": chunk_ids})
    return {r[0] for r in await cur.fetchall()}
