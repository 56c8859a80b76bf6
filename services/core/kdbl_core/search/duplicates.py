"""Near-duplicate collapse: the same text appears once in a result list, its other copies listed on the
hit (`duplicates`), and a page still holds the best `limit` distinct texts.

"The same text" is the chunk's text with case folded (PostgreSQL's lower()) and every run of white space
made one space, ends trimmed — compared by its md5, computed when asked for the few chunks that can be
copies of another (below). This is what copies look like here: a paper saved twice, a report in two
folders, a passage a .docx repeats — the same extraction gives the same chunks, byte for byte or up to
line breaks and capitals. Overlapping chunks cut at different places are not copies; within a file,
diversification keeps neighbours (±1 seq) apart.

Which chunks are hashed: two chunks with the same text hold the same terms as often and have the same
length, so their BM25 scores are equal to the last digit the ranking compares (lexical.rank_key: scores
rounded to 1e-9). Where every candidate has its BM25 score (lexical; hybrid, whose rerank looked up the
missing ones), only chunks tied with another are hashed — on a corpus without copies, usually none, and
then no statement is sent. The vector arm alone (semantic) has no such test: embeddings of one text
need not be equal to the bit across batches, and case or spacing changes them, so all its ranked
candidates are hashed. Measured in docs/benchmarks.md (the statement, at 11 and 101 candidates).

Exact top-k: collapsing leaves fewer distinct hits than fetched; the caller fetches deeper (`deeper`)
until a page is full or the arms have no more (the keyword arm's top-k is exact, so the page is the best
k distinct texts of the whole corpus).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from kdbl_core.content.uris import file_uri
from kdbl_core.db.async_pool import Connection
from kdbl_core.search.lexical import ChunkHit

T = TypeVar("T")

# The key of a chunk's text: md5 of the text case-folded, runs of white space one space, ends trimmed.
TEXT_KEY = r"md5(btrim(regexp_replace(lower({c}.text), '\s+', ' ', 'g')))"
# The text key and page of each given chunk, under RLS.
_KEYS = f"""
SELECT c.id, {TEXT_KEY.format(c="c")} AS text_key, c.page_no
  FROM chunks c
 WHERE c.id = ANY(CAST(%(ids)s AS bigint[]))
"""
MAX_DEPTH = 1000  # fetching deeper than this for copies stops: the page is served short (`capped`)


@dataclass(frozen=True, slots=True)
class TextKey:
    key: str
    page_no: int | None


@dataclass(slots=True)
class Group(Generic[T]):
    """A chosen item and the other chunks with the same text found below it in the ranking."""

    item: T
    copies: list[ChunkHit] = field(default_factory=list)


async def text_keys(conn: Connection, chunk_ids: Iterable[int]) -> dict[int, TextKey]:
    """The text key (and page) of each given chunk the caller sees; one statement, none for no ids."""
    ids = sorted(set(chunk_ids))
    if not ids:
        return {}
    cur = await conn.execute(_KEYS, {"ids": ids})
    return {r.id: TextKey(r.text_key, r.page_no) for r in await cur.fetchall()}


def tied(scores: Mapping[int, float]) -> list[int]:
    """The chunks whose BM25 score equals another's (to 1e-9 of its size: the sum's last bits may depend
    on the order its terms were added): the only ones that can be copies of another."""
    ordered = sorted(scores.items(), key=lambda item: item[1])
    out: set[int] = set()
    for (a, sa), (b, sb) in zip(ordered, ordered[1:]):
        if sb - sa <= 1e-9 * max(1.0, abs(sb)):
            out.update((a, b))
    return sorted(out)


def collapse(ranked: Sequence[T], keys: Mapping[int, TextKey], *, chunk: Callable[[T], ChunkHit], limit: int,
             admit: Callable[[ChunkHit], bool] | None = None) -> tuple[list[Group[T]], int]:
    """The first `limit` items of `ranked` whose text no earlier chosen item has (and that `admit` takes,
    when given: it is asked once per distinct text, and may keep its own state), each with the copies
    of its text found anywhere in `ranked`; and how many copies were folded into the chosen ones.
    Items without a key (not hashed: not a copy of anything) are distinct."""
    chosen: list[Group[T]] = []
    by_key: dict[str, Group[T]] = {}
    folded = 0
    for item in ranked:
        hit = chunk(item)
        text = keys.get(hit.chunk_id)
        if text is not None and text.key in by_key:
            by_key[text.key].copies.append(hit)
            folded += 1
            continue
        if len(chosen) == limit or (admit is not None and not admit(hit)):
            continue  # past the page: only copies of the chosen are still collected
        group = Group(item)
        chosen.append(group)
        if text is not None:
            by_key[text.key] = group
    return chosen, folded


async def collapse_ranked(conn: Connection, ranked: Sequence[T], scores: Mapping[int, float], *,
                          chunk: Callable[[T], ChunkHit], limit: int,
                          admit: Callable[[ChunkHit], bool] | None = None
                          ) -> tuple[list[Group[T]], int, dict[int, TextKey]]:
    """collapse() over `ranked`, given every candidate's BM25 `scores` (a missing one counts as 0): the
    text keys of the tied chunks only are read (no statement when none tie). Returns the groups, the
    copies folded and the keys."""
    keys = await text_keys(conn, tied({chunk(x).chunk_id: scores.get(chunk(x).chunk_id, 0.0) for x in ranked}))
    groups, folded = collapse(ranked, keys, chunk=chunk, limit=limit, admit=admit)
    return groups, folded, keys


def deeper(fetched: int, got: int, wanted: int, chosen: int, folded: int) -> int | None:
    """The depth to fetch again at when copies left the page short of `wanted` and the arm returned all
    it was asked for (`got` == `fetched`: it may hold more); None: no need, or MAX_DEPTH reached."""
    if chosen >= wanted or not folded or got < fetched or fetched >= MAX_DEPTH:
        return None
    return min(MAX_DEPTH, max(2 * fetched, fetched + 2 * folded))


def described(copies: Sequence[ChunkHit], keys: Mapping[int, TextKey]) -> list[dict]:
    """The copies as a hit lists them: where each is (source, file, its URI, chunk seq, page)."""
    out = []
    for hit in copies:
        text = keys.get(hit.chunk_id)
        out.append({"source_id": str(hit.source_id), "key": hit.key, "uri": file_uri(hit.source_id, hit.key),
                    "seq": hit.seq, "page_no": text.page_no if text else None})
    return out
