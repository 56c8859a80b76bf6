"""Near-duplicate collapse: the same text appears once in a result list, its other copies listed on the
hit (`duplicates`), and a page still holds the best `limit` distinct texts.

"The same text" is the chunk's text with case folded (PostgreSQL's lower()) and every run of white space
made one space, ends trimmed, compared by its md5. This is what copies look like here: a paper saved
twice, a report in two folders, a passage a .docx repeats — the same extraction gives the same chunks,
byte for byte or up to line breaks and capitals. Overlapping chunks cut at different places are not
copies; within a file, diversification keeps neighbours (±1 seq) apart.

Cost, measured on the long-document eval's chunks (1,350 characters on average, PostgreSQL 18, 2 cores):
the normalised key costs ~80 µs a chunk (the regular expression), ~12 ms over hybrid's ~150 candidates
— more than its whole rerank — while the md5 of the raw text costs ~1 µs. So keys come in two tiers:
  * every candidate's raw key (`TEXT_KEY`, "r:" + md5 of the bytes) rides on the statements that already
    read the candidates — the vector arm's and the rerank's cosine lookup — at no round trip;
  * two copies hold the same terms as often and are as long, so their BM25 scores are equal to the last
    digit the ranking compares (lexical.rank_key): where every candidate has its BM25 score (lexical;
    hybrid, whose rerank looked up the missing ones), only chunks tied with another whose raw keys differ
    (or are unknown) get the normalised key ("n:", `refine`), in one statement — none on a corpus
    without such ties (byte copies tie with equal raw keys and need none).
The vector arm alone (semantic) has no BM25 scores: it folds byte copies only (a copy in capitals or
spaced otherwise embeds differently anyway).

Exact top-k: collapsing leaves fewer distinct hits than fetched; the caller fetches deeper (`deeper`)
until a page is full or the arms have no more (the keyword arm's top-k is exact, so the page is the best
k distinct texts of the whole corpus).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from kdbl_core.content.uris import file_uri
from kdbl_core.db.async_pool import Connection
from kdbl_core.search.lexical import ChunkHit

T = TypeVar("T")

# A chunk's raw text key (its bytes), and its normalised one: case folded, runs of white space one space.
TEXT_KEY = "'r:' || md5({c}.text)"
NORMALISED_KEY = r"'n:' || md5(btrim(regexp_replace(lower({c}.text), '\s+', ' ', 'g')))"
# The normalised key and page of each given chunk, under RLS.
_KEYS = f"""
SELECT c.id, {NORMALISED_KEY.format(c="c")} AS text_key, c.page_no
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


def tied(scores: Mapping[int, float]) -> list[list[int]]:
    """Groups of chunks whose BM25 scores are equal (to 1e-9 of their size: a sum's last bits may depend on
    the order its terms were added): the only chunks that can be copies of one another."""
    ordered = sorted(scores.items(), key=lambda item: (item[1], item[0]))
    groups: list[list[int]] = []
    for i, (cid, score) in enumerate(ordered):
        if i and score - ordered[i - 1][1] <= 1e-9 * max(1.0, abs(score)):
            groups[-1].append(cid)
        else:
            groups.append([cid])
    return [g for g in groups if len(g) > 1]


async def refine(conn: Connection, keys: dict[int, TextKey], scores: Mapping[int, float],
                 among: Collection[int] | None = None) -> int:
    """Give the normalised key to the chunks of `scores` (every candidate's BM25 score, 0 for none) tied
    with another whose raw key differs or is unknown (one statement; none when no such tie). Chunks that
    hold no query term (score 0: the vector arm's) all tie and are left to their raw keys. `among`: only
    the ties of these chunks (the hits chosen so far). The cosines cannot narrow the ties: each chunk
    embeds its own file's header (kdbl_core.content.analysis.embedding_text), so copies in two files
    differ by up to ~0.08 in cosine to a query (measured on test_duplicates' copies)."""
    wanted: list[int] = []
    for group in tied({cid: score for cid, score in scores.items() if score > 0}):
        if among is not None and not any(c in among for c in group):
            continue
        if all(c in keys and keys[c].key.startswith("n:") for c in group):
            continue  # refined already
        if len({keys[c].key if c in keys else c for c in group}) > 1:
            wanted.extend(group)
    # byte copies keep one key: a chunk refined takes every chunk with its raw key along (their cosines
    # may differ: each embeds its own file's header, kdbl_core.content.analysis.embedding_text)
    raw = {keys[c].key for c in wanted if c in keys and keys[c].key.startswith("r:")}
    wanted.extend(c for c, k in keys.items() if k.key in raw and c not in wanted)
    keys.update(await text_keys(conn, wanted))
    return len(wanted)


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


async def collapse_ranked(conn: Connection, ranked: Sequence[T], keys: dict[int, TextKey],
                          scores: Mapping[int, float] | None, *, chunk: Callable[[T], ChunkHit], limit: int,
                          admit: Callable[[], Callable[[ChunkHit], bool]] | None = None
                          ) -> tuple[list[Group[T]], int]:
    """collapse() with the raw `keys` known, then, given every candidate's BM25 `scores` (None: raw keys
    only), refine() the ties of the hits it chose and collapse again, until no chosen hit's ties are left:
    on the eval, no statement for most searches, one for the others. `admit` makes a fresh admission
    test for each pass. `keys` gains the normalised keys read."""
    refined: set[int] = set()
    while True:
        groups, folded = collapse(ranked, keys, chunk=chunk, limit=limit, admit=admit() if admit else None)
        chosen = {chunk(g.item).chunk_id for g in groups} - refined
        if scores is None or not chosen:
            return groups, folded
        given = await refine(conn, keys, {chunk(x).chunk_id: scores.get(chunk(x).chunk_id, 0.0) for x in ranked},
                             among=chosen)
        refined |= chosen
        if not given:
            return groups, folded


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
