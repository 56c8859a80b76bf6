"""The whole-document signal and compound terms (issue 28, migration 0019, kdbl_core.content.analysis).

Every chunk is indexed with its file's header (name, folders, title) and its heading path; compounds are
indexed as their parts too (`FY2018` -> `fy`, `2018`; `10K` -> `10`, `k`), the same on both sides; files
indexed with an older analysis are indexed again by the next crawl; snippets mark the parts."""

from __future__ import annotations

import pytest
from helpers import POSTINGS, crawl, make_corpus
from sqlalchemy import text

from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.content import analysis
from kdbl_core.search import bm25_topk, lexical, pipeline
from kdbl_core.search.plan import SearchPlan
from kdbl_core.search.snippets import MARK, snippet
from kdbl_core.settings import Settings


def _terms(owner_engine, value: str) -> dict[str, int]:
    with owner_engine.connect() as conn:
        return dict(conn.execute(text("SELECT term, tf FROM kdbl_terms('english', :v)"), {"v": value}).all())


def test_compounds_are_indexed_as_their_parts_too(owner_engine):
    assert _terms(owner_engine, "FY2018 capital") == {"fy2018": 1, "fy": 1, "2018": 1, "capit": 1}
    assert _terms(owner_engine, "10-K") == {"10": 1, "k": 1}
    assert _terms(owner_engine, "10K 10K") == {"10k": 2, "10": 2, "k": 2}
    assert set(_terms(owner_engine, "3M_2018_10K.pdf")) == {"3m_2018_10k.pdf", "3m", "3", "m", "2018", "10k",
                                                             "10", "k", "pdf"}
    assert _terms(owner_engine, "COVID-19") == {"covid": 1, "-19": 1, "19": 1}
    assert _terms(owner_engine, "ended 2021-12-31") == {"end": 1, "2021": 1, "-12": 1, "-31": 1, "12": 1, "31": 1}
    assert _terms(owner_engine, "sales2018") == {"sales2018": 1, "sale": 1, "2018": 1}  # parts are stemmed
    assert _terms(owner_engine, "a1b2c3d4e5 1.5 e-mail") == {  # a hash stays whole; floats, words as before
        "a1b2c3d4e5": 1, "1.5": 1, "e-mail": 1, "e": 1, "mail": 1}
    assert _terms(owner_engine, "the of") == {}


def _principal(corpus) -> Principal:
    return Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:t")


async def _keys(api_pool, corpus, query: str, limit: int = 10) -> list[tuple[str, int]]:
    async with rls_transaction(api_pool, _principal(corpus)) as conn:
        hits = await bm25_topk.search(conn, query, lexical.Filters(), limit=limit, ts_config="english")
    return [(h.key, h.seq) for h in hits]


async def test_fy2018_meets_2018_and_10_k_meets_10k_on_both_sides(api_pool, owner_engine, worker_engine,
                                                                   tmp_path, unique):
    files = {"a.txt": "Revenue grew in 2018, as the annual 10K report says.",
             "b.txt": "Revenue grew in FY2019, as the quarterly 10-Q report says.",
             "c.txt": "Our FY2018 revenue and the 10-K filing."}
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"cmp-{unique}", files, tenant=f"cmp-{unique}")
    assert [k for k, _ in await _keys(api_pool, corpus, "FY2018")] == ["c.txt", "a.txt", "b.txt"]  # b: "fy"
    # a and c tie on "2018" (tf 1, the same length): the tie goes to the smaller chunk id, and files are
    # written in the order their extractions end (one extractor child per core)
    assert {k for k, _ in (await _keys(api_pool, corpus, "2018"))[:2]} == {"a.txt", "c.txt"}
    for query in ("10-K", "10K"):  # 10-Q's "10" matches too, less
        assert {k for k, _ in (await _keys(api_pool, corpus, query))[:2]} == {"a.txt", "c.txt"}


SECTION = ("The committee reviewed the figures for the period in detail and compared them with the plan "
           "agreed at the start of the year, noting where the spending differed and why. ")


def _report() -> str:
    return (f"# Annual report\n\n## Liquidity\n\n{SECTION * 15}\n\n## Capital spending\n\n"
            f"Purchases of property and equipment were 1,577 million. {SECTION * 8}\n")


@pytest.fixture(scope="module")
def reports(owner_engine, worker_engine, tmp_path_factory):
    files = {f"filings/{name}": _report() for name in ("3M_2017_10K.md", "3M_2018_10K.md", "ACME_2018_10K.md")}
    files["notes/untitled.md"] = "Purchases of property and equipment: see the filings."
    return make_corpus(owner_engine, worker_engine, tmp_path_factory.mktemp("reports"), files, tenant="reports")


async def test_every_chunk_of_a_file_matches_the_words_of_its_name_and_headings(api_pool, reports):
    with_name = await _keys(api_pool, reports, "What were 3M's FY2018 purchases of property and equipment?")
    # the same text in three files, which says neither 3M nor 2018: the file named for both comes first
    assert list(dict.fromkeys(k for k, _ in with_name))[0] == "filings/3M_2018_10K.md"
    liquidity = await _keys(api_pool, reports, "liquidity committee plan")
    assert {k for k, _ in liquidity} >= {"filings/3M_2017_10K.md"}
    async with rls_transaction(api_pool, _principal(reports)) as conn:
        cur = await conn.execute(
            "SELECT c.seq, c.context_header, c.text FROM chunks c JOIN files f ON f.id = c.file_id "
            "WHERE f.key = 'filings/3M_2018_10K.md' ORDER BY c.seq")
        chunks = await cur.fetchall()
    assert len(chunks) >= 2 and all("3M" not in c.text and "2018" not in c.text for c in chunks)
    deep = [c.seq for c in chunks if c.context_header and "Liquidity" in c.context_header
            and "iquidity" not in c.text]
    assert deep  # a chunk under the heading that does not say it ...
    assert ("filings/3M_2018_10K.md", deep[0]) in liquidity  # ... matches it


def test_the_header_is_a_few_words_weighted_per_field_in_the_terms_and_the_length(owner_engine, worker_engine, tmp_path,
                                                                        unique):
    title = "Zebra " + " ".join(f"word{n}x" for n in range(40))
    files = {"deep/er/notes.md": f"# {title}\n\nQuince jam recipe."}
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"hdr-{unique}", files, tenant=f"hdr-{unique}")
    with owner_engine.connect() as conn:
        rows = dict(conn.execute(text(f"SELECT p.term, p.tf FROM {POSTINGS} p WHERE p.source_id = :s"),
                                 {"s": corpus.source_id}).all())
        dl = conn.execute(text("SELECT token_count FROM chunks WHERE source_id = :s"), {"s": corpus.source_id}).scalar()
    assert rows["quinc"] == 1  # body only
    assert rows["note"] == rows["er"] == rows["deep"] == analysis.NAME_WEIGHT  # the name and its folders
    # beside the body: the title's first words, and the last words of the heading path (the same heading,
    # stored cut to ~160 characters); a long title is not copied into every chunk
    assert rows["zebra"] == rows["word5x"] == 1 + analysis.TITLE_WEIGHT
    assert rows["word15x"] == 1 + analysis.HEADING_WEIGHT
    assert rows["word25x"] == rows["word39x"] == 1
    assert len([t for t, tf in rows.items() if tf > 1]) <= analysis.NAME_WORDS + analysis.TITLE_WORDS + \
        analysis.HEADING_WORDS + 12  # with the parts of compounds ("word5x": "word", "5", "x")
    assert dl == sum(rows.values())  # the header counts in the length, with its weight (BM25F)


def test_a_file_indexed_with_an_older_analysis_is_indexed_again_by_the_next_crawl(
        owner_engine, worker_engine, tmp_path, unique):
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"fmt-{unique}",
                         {"a.txt": "FY2018 plan", "b.txt": "other words", "empty.txt": ""}, tenant=f"fmt-{unique}")
    with owner_engine.begin() as conn:
        assert set(conn.execute(text("SELECT index_format FROM files WHERE source_id = :s"),
                                {"s": corpus.source_id}).scalars()) == {analysis.INDEX_FORMAT}
        # as migration 0019 leaves every file indexed before it
        conn.execute(text("UPDATE files SET index_format = 0 WHERE source_id = :s"), {"s": corpus.source_id})
    stats = crawl(worker_engine, corpus)
    assert (stats.indexed, stats.unchanged) == (2, 1)  # the empty file has no chunks: nothing to redo
    with owner_engine.connect() as conn:
        assert {r.key: (r.index_format, r.index_runs) for r in conn.execute(text(
            "SELECT key, index_format, index_runs FROM files WHERE source_id = :s"), {"s": corpus.source_id})} == {
            "a.txt": (analysis.INDEX_FORMAT, 2), "b.txt": (analysis.INDEX_FORMAT, 2), "empty.txt": (0, 1)}
    stats = crawl(worker_engine, corpus)
    assert (stats.indexed, stats.unchanged) == (0, 3)


def test_snippets_mark_the_parts_of_compounds_where_the_index_matches_them(owner_engine):
    body = ("Capital expenditure in FY2018 was 1,577; the 10-K for 3M_2018_10K.pdf and the 10K of 2019 say so. "
            "COVID-19 and H1N1; the hash a1b2c3d4e5 and R_LIBS_USER.")
    for query in ("2018", "FY2018 capex", "10-K", "10K", "3M", "covid 19", "1", "H1N1", "R libs"):
        wanted = frozenset(_terms(owner_engine, query))
        marked = [p.split("</mark>", 1)[0] for p in snippet(body, wanted, "english").split(MARK)[1:]]
        assert marked, query
        for word in marked:  # every mark is a word or part the index matches for the query
            assert set(_terms(owner_engine, word)) & wanted, (query, word)
    marks = snippet(body, frozenset(_terms(owner_engine, "2018")), "english")
    assert "FY<mark>2018</mark>" in marks and "3M_<mark>2018</mark>_10K" in marks
    assert "<mark>" not in snippet("a1b2c3d4e5", frozenset(_terms(owner_engine, "1")), "english")  # left whole


async def test_a_search_marks_the_part_of_a_compound_it_matched(api_pool, reports):
    async with rls_transaction(api_pool, _principal(reports)) as conn:
        result = await SearchPlan(pipeline.SearchRequest(query="10-K", mode="lexical", limit=3),
                                  settings=Settings()).run(conn)
    assert result.hits and all(h["key"].endswith("_10K.md") for h in result.hits)  # by the file name alone
