"""The write path of indexed content: one file's rows replaced atomically, BM25 statistics kept exact.

Callers run these inside `tenant_transaction` (the worker role sees one tenant at a time);
`FileWriter.write` runs its own transaction and sends it with its COMMIT in one round trip, draining
each statement before the next (`_drain`: psycopg's pipeline could leave a big statement half-sent and
hang, issue 12). BM25 statistics are kept
per source and permission set (term_stats, corpus_stats: migrations 0007, 0024) so the query side can sum
those of the sources a principal sees whole and of the share's permission sets that allow it
(kdbl_core.search.lexical); a file is indexed in the partition of its `permission_set` (0: none).
A file is written in one transaction: its old chunks, postings and statistics go out and the new
ones come in together, so a crash at any moment leaves either the old file or the new one.

The keyword index (issue 29): each chunk row carries its terms (`chunks.terms`, `chunks.tfs`); with the
kdbl_bm25 extension the statement packs the file's postings as its own small generation of lists
(`writes_packed`), without it it writes postings rows. A drop subtracts document frequencies from the
deleted chunks' own terms, whichever form their postings took.
"""

from __future__ import annotations

import selectors
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg.rows import tuple_row
from psycopg_pool import ConnectionPool

from kdbl_core.content import analysis, bm25_lists
from kdbl_core.content.records import Chunk, FileMeta
from kdbl_core.errors import Conflict

Connection = psycopg.Connection
Statement = tuple[str, dict]  # SQL with psycopg's %(name)s placeholders, and its parameters

# Statistics counters are sharded by backend so concurrent writers rarely touch the same row.
_SHARD = "(pg_backend_pid() %% 16)::smallint"  # %% : a literal % in psycopg's %(name)s SQL


@dataclass(frozen=True, slots=True)
class MemberFile:
    """An archive member or e-mail attachment, written as a child row of its listed file (migration 0010):
    key = the parent's key + '!/' + member path (nested members: each level adds one), size = the member's,
    mtime = the parent's."""

    meta: FileMeta
    status: str
    status_reason: str | None
    title: str | None
    chunks: Sequence[Chunk]
    text_chars: int
    authors: Sequence[str] = ()  # the member's own document properties (migration 0013)
    labels: Sequence[str] = ()
    own_labels: Sequence[str] = ()  # its own tags alone (migration 0015; kdbl_core.sources.relabel)


@dataclass(frozen=True, slots=True)
class FileState:
    size: int | None
    mtime: datetime | None
    etag: str | None
    status: str
    status_reason: str | None = None
    stale: bool = False  # its chunks were indexed with an older analysis (files.index_format): index it again
    permission_set: int | None = None  # the share's permissions when they were last applied (migration 0023)
    access_stamp: str | None = None  # what they were last read with (an SMB change time; migration 0024)


# Dropping a file's indexed content, in one statement: its chunks and postings go, and the statistics
# they contributed to their source are subtracted (term order: two writers never deadlock on term_stats rows).
_DROP_TEMPLATE = f"""
WITH old AS ({{old}}),
gone_chunks AS (DELETE FROM chunks WHERE file_id IN (SELECT id FROM old)
                RETURNING source_id, file_id, token_count, terms, tfs),
gone AS (DELETE FROM postings WHERE file_id IN (SELECT id FROM old)),  -- those written since the last build
gone_mentions AS (DELETE FROM entity_mentions WHERE file_id IN (SELECT id FROM old)),  -- read again (0025)
gone_relations AS (DELETE FROM entity_relations WHERE file_id IN (SELECT id FROM old)),
g AS MATERIALIZED (  -- each chunk's partition: its file's permission set (migration 0024; the file row stays)
    SELECT c.*, coalesce(f.permission_set, 0) AS permission_set
      FROM gone_chunks c LEFT JOIN files f ON f.id = c.file_id
),
df AS (  -- each chunk's terms (its row's vector, migration 0021): one document frequency each
    INSERT INTO term_stats (tenant_id, term, source_id, permission_set, shard, df)
    SELECT %(tenant_id)s, t.term, g.source_id, g.permission_set, {_SHARD}, -count(*)
      FROM g CROSS JOIN LATERAL {analysis.chunk_terms("g")}
     GROUP BY t.term, g.source_id, g.permission_set
     ORDER BY t.term, g.source_id, g.permission_set
    ON CONFLICT (tenant_id, term, source_id, permission_set, shard) DO UPDATE SET df = term_stats.df + EXCLUDED.df
), cs AS (
    INSERT INTO corpus_stats (tenant_id, source_id, permission_set, shard, n_chunks, total_len)
    SELECT %(tenant_id)s, source_id, permission_set, {_SHARD}, -count(*), -coalesce(sum(token_count), 0)
      FROM g GROUP BY source_id, permission_set ORDER BY source_id, permission_set
    ON CONFLICT (tenant_id, source_id, permission_set, shard) DO UPDATE SET
        n_chunks = corpus_stats.n_chunks + EXCLUDED.n_chunks,
        total_len = corpus_stats.total_len + EXCLUDED.total_len
)
SELECT count(*) FROM gone_chunks
"""
_DROP_BY_KEY = _DROP_TEMPLATE.format(
    old="SELECT id FROM files WHERE source_id = %(source_id)s AND key = %(key)s")
_DROP_BY_IDS = _DROP_TEMPLATE.format(old="SELECT unnest(CAST(%(ids)s AS bigint[])) AS id")
# A container's members (children by parent_id, never by '!/' in the key) go before it is written again.
_DROP_MEMBERS = _DROP_TEMPLATE.format(
    old="SELECT c.id FROM files c JOIN files p ON p.id = c.parent_id WHERE p.source_id = %(source_id)s "
        "AND p.key = %(key)s AND p.parent_id IS NULL")
_DELETE_MEMBERS = ("DELETE FROM files WHERE parent_id IN (SELECT id FROM files "
                   "WHERE source_id = %(source_id)s AND key = %(key)s AND parent_id IS NULL)")

# Writing a file, in one statement: upsert its row, insert its chunks, analyse them in Postgres (kdbl_terms,
# the analysis the query side uses: kdbl_core.content.analysis), add each chunk's header (the file's name,
# folders and title, the chunk's heading path: weighted terms, BM25F), write one posting per (term, chunk)
# with tf and the chunk length, and add the document frequencies and corpus counters, with the score bounds of the
# MaxScore top-k (each term's largest tf, each source's shortest chunk; a drop leaves them: looser, never wrong).
# The statement writes nothing when the file still has chunks (the `old` guard): then the caller drops
# them first and runs it again. So it is correct whatever the caller believed about the file.
_FILE_UPSERT = """old AS (
    SELECT count(*) AS n FROM chunks c JOIN files f ON f.id = c.file_id
     WHERE f.source_id = %(source_id)s AND f.key = %(key)s
), f AS (
    INSERT INTO files (tenant_id, source_id, key, size, mtime, etag, content_type, storage_class, owner,
                       mode, uid, gid, status, status_reason, title, authors, labels, own_labels, chunk_count, text_chars,
                       index_runs, indexed_at, seen_at, index_format, permission_set)
    SELECT %(tenant_id)s, %(source_id)s, %(key)s, %(size)s, %(mtime)s, %(etag)s, %(content_type)s, %(storage_class)s, %(owner)s,
           %(mode)s, %(uid)s, %(gid)s, %(status)s, %(status_reason)s, %(title)s, %(authors)s, %(labels)s, %(own_labels)s,
           %(chunk_count)s, %(text_chars)s, 1, now(), now(), %(index_format)s, %(permission_set)s
      FROM old WHERE old.n = 0
    ON CONFLICT (source_id, key) DO UPDATE SET
        size = EXCLUDED.size, mtime = EXCLUDED.mtime, etag = EXCLUDED.etag,
        content_type = EXCLUDED.content_type, storage_class = EXCLUDED.storage_class,
        owner = EXCLUDED.owner, mode = EXCLUDED.mode, uid = EXCLUDED.uid, gid = EXCLUDED.gid,
        status = EXCLUDED.status, status_reason = EXCLUDED.status_reason, title = EXCLUDED.title,
        authors = EXCLUDED.authors, labels = EXCLUDED.labels, own_labels = EXCLUDED.own_labels,
        chunk_count = EXCLUDED.chunk_count, text_chars = EXCLUDED.text_chars, parent_id = NULL,
        index_runs = files.index_runs + 1, indexed_at = now(), seen_at = now(), index_format = EXCLUDED.index_format,
        permission_set = EXCLUDED.permission_set, entities_version = NULL
    RETURNING id, coalesce(permission_set, 0) AS permission_set
)"""
# A member of a listed file (its members were just dropped, so a conflict is another file's key: a real
# folder 'x!' holding 'y' beside container 'x' with member 'y'; that file keeps its row).
_MEMBER_INSERT = """old AS (SELECT 0 AS n), f AS (
    INSERT INTO files (tenant_id, source_id, key, size, mtime, etag, content_type, storage_class, owner,
                       mode, uid, gid, status, status_reason, title, authors, labels, own_labels, chunk_count, text_chars,
                       index_runs, indexed_at, seen_at, parent_id, index_format, permission_set)
    SELECT %(tenant_id)s, %(source_id)s, %(key)s, %(size)s, %(mtime)s, %(etag)s, %(content_type)s, %(storage_class)s, %(owner)s,
           %(mode)s, %(uid)s, %(gid)s, %(status)s, %(status_reason)s, %(title)s, %(authors)s, %(labels)s, %(own_labels)s,
           %(chunk_count)s, %(text_chars)s, 1, now(), now(), p.id, %(index_format)s, p.permission_set
      FROM files p WHERE p.source_id = %(source_id)s AND p.key = %(parent_key)s AND p.parent_id IS NULL
    ON CONFLICT (source_id, key) DO NOTHING
    RETURNING id, coalesce(permission_set, 0) AS permission_set
)"""
_TERMS_OF_BODY = analysis.TERMS.format(text="i.body")
_TERMS_OF_HEADING = analysis.TERMS.format(text="h.heading")
_TERMS_OF_FIELD = analysis.TERMS.format(text="v.body")
_WRITE_TEMPLATE = f"""
WITH {{file}}, input AS (
    {{input}}
), lex AS (  -- the body's terms (kdbl_core.content.analysis: kdbl_terms, migration 0019)
    SELECT i.seq, t.term, t.tf FROM input i CROSS JOIN LATERAL {_TERMS_OF_BODY} AS t
), fh AS MATERIALIZED (  -- the file's header (its name and folders, its title), weighted, once per file
    SELECT t.term, sum(t.tf * v.weight) AS tf
      FROM unnest(CAST(%(header_fields)s AS text[]), CAST(%(header_weights)s AS int[])) AS v(body, weight)
     CROSS JOIN LATERAL {_TERMS_OF_FIELD} AS t
     WHERE v.weight > 0
     GROUP BY t.term
), ht AS MATERIALIZED (  -- each heading path's terms, weighted, once per distinct path
    SELECT h.heading, t.term, t.tf * %(heading_weight)s AS tf
      FROM (SELECT DISTINCT heading FROM input WHERE heading IS NOT NULL AND %(heading_weight)s > 0) h
     CROSS JOIN LATERAL {_TERMS_OF_HEADING} AS t
), hdr AS (  -- every chunk's header, if the chunk has terms of its own (a chunk without text gets none)
    SELECT seq, term, sum(tf) AS tf FROM (
        SELECT i.seq, fh.term, fh.tf FROM input i CROSS JOIN fh
        UNION ALL
        SELECT i.seq, ht.term, ht.tf FROM input i JOIN ht ON ht.heading = i.heading
    ) h
     WHERE seq IN (SELECT seq FROM lex)
     GROUP BY seq, term
), terms AS (  -- body and header: a hash join on the header's few rows, not an aggregate over all rows
    SELECT coalesce(l.seq, h.seq) AS seq, coalesce(l.term, h.term) AS term, coalesce(l.tf, 0) + coalesce(h.tf, 0) AS tf
      FROM lex l FULL JOIN hdr h ON h.seq = l.seq AND h.term = l.term
), dl AS (  -- the chunk's length (body and header, the header with its weights: BM25F) and its terms
    SELECT seq, sum(tf)::int AS dl, {analysis.TERMS_JOINED.format(term="term")} AS terms,
           {analysis.TFS_JOINED.format(term="term", tf="tf")} AS tfs
      FROM terms GROUP BY seq
), ch AS (
    INSERT INTO chunks (tenant_id, source_id, file_id, seq, text, page_no, char_start, char_end,
                        ts_start_ms, ts_end_ms, token_count, context_header, text_tokens, terms, tfs)
    SELECT %(tenant_id)s, %(source_id)s, f.id, i.seq, i.body, i.page_no, i.char_start, i.char_end,
           i.ts_start_ms, i.ts_end_ms, coalesce(dl.dl, 0), i.context_header, i.text_tokens, dl.terms, dl.tfs
      FROM f CROSS JOIN input i LEFT JOIN dl ON dl.seq = i.seq
    RETURNING id, seq, file_id, token_count
){{keyword}}, df AS (
    INSERT INTO term_stats (tenant_id, term, source_id, permission_set, shard, df, tf_max)
    SELECT %(tenant_id)s, term, %(source_id)s, (SELECT f.permission_set FROM f), {_SHARD}, n, tf_max
      FROM per_term ORDER BY term
    ON CONFLICT (tenant_id, term, source_id, permission_set, shard) DO UPDATE SET
        df = term_stats.df + EXCLUDED.df, tf_max = greatest(term_stats.tf_max, EXCLUDED.tf_max)
), cs AS (
    INSERT INTO corpus_stats (tenant_id, source_id, permission_set, shard, n_chunks, total_len, dl_min)
    SELECT %(tenant_id)s, %(source_id)s, (SELECT f.permission_set FROM f), {_SHARD}, count(*),
           coalesce(sum(token_count), 0), min(token_count)
      FROM ch HAVING count(*) > 0
    ON CONFLICT (tenant_id, source_id, permission_set, shard) DO UPDATE SET
        n_chunks = corpus_stats.n_chunks + EXCLUDED.n_chunks,
        total_len = corpus_stats.total_len + EXCLUDED.total_len,
        dl_min = least(corpus_stats.dl_min, EXCLUDED.dl_min)
)
SELECT (SELECT id FROM f) AS file_id, (SELECT n FROM old) AS old_chunks{{check}}
"""
_ARRAY_INPUT = """SELECT * FROM unnest(CAST(%(seqs)s AS int[]), CAST(%(bodies)s AS text[]), CAST(%(pages)s AS int[]),
                         CAST(%(starts)s AS int[]), CAST(%(ends)s AS int[]), CAST(%(ts_starts)s AS bigint[]),
                         CAST(%(ts_ends)s AS bigint[]), CAST(%(headers)s AS text[]), CAST(%(text_tokens)s AS int[]),
                         CAST(%(headings)s AS text[]))
                AS u(seq, body, page_no, char_start, char_end, ts_start_ms, ts_end_ms, context_header, text_tokens,
                     heading)"""
# The keyword index of the chunks written: one postings row per (term, chunk) where the database has no
# kdbl_bm25 extension; with it, the statement's own generation of packed lists (one row per term, numbered
# -(its first chunk id): kdbl_core.content.bm25_lists folds it into a build's generation), and the tenant's
# bm25_built row, so that deleting these chunks records them in bm25_dead (migration 0017's trigger).
# `per_term`: each term's document frequency and largest tf among the chunks written (term_stats), and
# with the extension its packed list, in one pass over the (term, chunk) rows.
_PER_TERM = """
    SELECT terms.term, count(*) AS n, max(least(terms.tf, 32767)) AS tf_max{list}
      FROM terms JOIN ch ON ch.seq = terms.seq GROUP BY terms.term"""
_PACK_TERM = ",\n           kdbl_bm25_pack(ch.id, CAST(least(terms.tf, 32767) AS integer), ch.token_count ORDER BY ch.id) AS list"
_POSTINGS_ROWS = """, per_term AS ({per_term}
), ins AS (
    INSERT INTO postings (tenant_id, term, chunk_id, source_id, file_id, tf, dl)
    SELECT %(tenant_id)s, terms.term, ch.id, %(source_id)s, ch.file_id, least(terms.tf, 32767), ch.token_count
      FROM terms JOIN ch ON ch.seq = terms.seq
)""".format(per_term=_PER_TERM.format(list=""))
_PACKED_LISTS = """, built AS (
    INSERT INTO bm25_built (tenant_id) SELECT %(tenant_id)s WHERE EXISTS (SELECT 1 FROM ch)
    ON CONFLICT (tenant_id) DO NOTHING
), per_term AS MATERIALIZED ({per_term}
), ins AS (
    INSERT INTO bm25_lists (tenant_id, term, source_id, permission_set, gen, n, list)
    SELECT %(tenant_id)s, term, %(source_id)s, (SELECT f.permission_set FROM f), -(SELECT min(id) FROM ch), n, list
      FROM per_term
)""".format(per_term=_PER_TERM.format(list=_PACK_TERM))
_CHECK = ",\n       kdbl_check((SELECT n FROM old) = 0, 'KL002', 'the file still has indexed content')"


def _write_statement(file: str, check: str, packed: bool) -> str:
    return _WRITE_TEMPLATE.format(file=file, input=_ARRAY_INPUT, check=check,
                                  keyword=_PACKED_LISTS if packed else _POSTINGS_ROWS)


# [packed]: the statements of each keyword-index form. _WRITE_CHECKED is for a pipeline (the COMMIT is
# already on its way): a file that still has content aborts the transaction.
_WRITE = {p: _write_statement(_FILE_UPSERT, "", p) for p in (False, True)}
_WRITE_CHECKED = {p: _write_statement(_FILE_UPSERT, _CHECK, p) for p in (False, True)}
_WRITE_MEMBER = {p: _write_statement(_MEMBER_INSERT, "", p) for p in (False, True)}
_PACKED_TTL_S = 300.0
_packed: dict[str, tuple[float, bool]] = {}


def writes_packed(conn: Connection) -> bool:
    """Whether this database has the kdbl_bm25 extension for this role (bm25_lists.extension_installed),
    checked once per server and database every 5 minutes: then writers pack their own lists."""
    key = f"{conn.info.host}:{conn.info.port}/{conn.info.dbname}/{conn.info.user}"
    now = time.monotonic()
    cached = _packed.get(key)
    if cached is None or now - cached[0] >= _PACKED_TTL_S:
        cached = (now, bm25_lists.extension_installed(conn))
        _packed[key] = cached
    return cached[1]


HAS_CONTENT = "KL002"
FENCE_LOST = "KL001"


class FenceLost(Conflict):
    """A statement of the transaction vetoed its commit (kdbl_check with SQLSTATE KL001): another holder
    owns the row now (the worker's pipeline catches it and leaves the file to that holder)."""


# Principal and commit mode of a file transaction, in one round trip.
_FILE_TX = (
    "SELECT set_config('kdbl.tenant_id', %(tenant)s, true), set_config('kdbl.subjects', '', true), "
    "set_config('synchronous_commit', %(sync)s, true)"
)


def _drain(conn: psycopg.Connection) -> None:
    """Hand libpq's whole output buffer to the socket, reading what the server sends meanwhile.

    psycopg (3.3, C and Python alike) sends a pipeline's commands as the socket allows and returns once
    its queue is empty, ignoring PQflush's "data left"; at COMMIT it then waits for results only. With a
    statement bigger than the socket buffers (a 3-5 MB text file's chunks) the rest of the message stayed
    in libpq, Postgres waited for it in ClientRead, and the crawl hung for good (issue 12). This loop is
    what libpq asks of a non-blocking client: flush until done, waiting for write or read readiness and
    consuming input on the latter (the server may be sending results of earlier statements). Small
    messages leave nothing to flush (no system call). A server that goes away makes consume_input raise.
    """
    pgconn = conn.pgconn
    if not pgconn.flush():
        return
    with selectors.DefaultSelector() as sel:
        sel.register(pgconn.socket, selectors.EVENT_READ | selectors.EVENT_WRITE)
        while pgconn.flush():
            for _, events in sel.select():
                if events & selectors.EVENT_READ:
                    pgconn.consume_input()


class FileWriter:
    """File transactions over one connection, held across files (one per writer thread).

    Holding it saves the pool's checkout per file and keeps psycopg's prepared statements warm. A
    broken connection goes back to the pool (which discards it) and the next call takes a fresh one.
    The connection comes from `pool` (its connect options apply: the worker's per-file deadlines are
    set there, kdbl_worker.deadlines); `on_checkout(conn)` is told of each connection taken (the
    worker's deadline watchdog learns the backend pid it may have to terminate).
    """

    def __init__(self, pool: ConnectionPool,
                 on_checkout: Callable[[psycopg.Connection], None] | None = None) -> None:
        self.pool, self.on_checkout = pool, on_checkout
        self._conn: psycopg.Connection | None = None

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            if not conn.closed:
                conn.autocommit = False  # back to the pool as it came
            self.pool.putconn(conn)

    def _connection(self) -> psycopg.Connection:
        if self._conn is None:
            self._conn = self.pool.getconn()
            self._conn.autocommit = True
            if self.on_checkout is not None:
                self.on_checkout(self._conn)
        return self._conn

    def packed(self) -> bool:
        """writes_packed() for this writer's connection."""
        try:
            return writes_packed(self._connection())
        except BaseException:
            if self._conn is not None and (self._conn.closed or self._conn.broken):
                self.close()
            raise

    def run(self, statements: Sequence[Statement]) -> None:
        """Run statements and COMMIT as one transaction in ONE round trip (psycopg pipeline mode).

        BEGIN and COMMIT are statements of the pipeline: the connection is held in autocommit, since
        psycopg's own BEGIN waits for its answer before anything else is sent, and its commit() inside a
        pipeline syncs again (3 round trips per file before, counted on the wire). Each statement is
        drained (`_drain`) before the next goes out, so the pipeline never waits for results while part
        of a message is still unsent. A statement that fails (kdbl_check included) aborts the
        transaction: the server skips the rest, COMMIT included, and the transaction is rolled back.
        """
        raw = self._connection()
        try:
            # plain tuples: the pool's named-tuple rows refuse _FILE_TX's three set_config columns
            with raw.pipeline(), raw.cursor(row_factory=tuple_row) as cur:
                cur.execute("BEGIN")
                for sql, params in statements:
                    cur.execute(sql, params)
                    _drain(raw)
                cur.execute("COMMIT")
        except BaseException:
            if raw.closed or raw.broken:
                self.close()  # the pool discards a closed connection
            else:
                raw.rollback()
            raise

    def write(
        self,
        *,
        tenant_id: uuid.UUID,
        source_id: uuid.UUID,
        meta: FileMeta,
        status: str,
        status_reason: str | None,
        title: str | None,
        chunks: Sequence[Chunk],
        text_chars: int,
        ts_config: str,
        replace: bool = True,
        durable: bool = True,
        then: Sequence[Statement] = (),
        members: Sequence[MemberFile] = (),
        container: bool = False,
        authors: Sequence[str] = (),
        labels: Sequence[str] = (),
        own_labels: Sequence[str] = (),
    ) -> None:
        """`write_file` in its own transaction, sent with its COMMIT in one round trip (see `run`).

        `then`: more statements for the same transaction (a queue item's completion); one that aborts
        with SQLSTATE KL001 (`kdbl_check`) raises FenceLost and nothing is written.

        durable=False commits without waiting for the WAL flush (`synchronous_commit = off` for this
        transaction only). Atomicity is unchanged: a crash of the *database server* may forget the last
        few such commits (never part of one), which leaves those files as they were before; a queue item
        completed in the same transaction is forgotten with it, so the file is simply indexed again. A
        worker crash loses nothing. Any later durable commit (end of a listing, of a run) flushes them.

        `members` (a container's, `container=True`): its old members go and these come in, in the same
        transaction (one statement each); an ordinary file sends nothing more.

        `authors` (the document's own properties) and `labels` (its source's config and its own tags) are
        stored as given, replacing the old ones (migration 0013); `own_labels` (its own tags alone,
        migration 0015) too, so a label config change can relabel it (kdbl_core.sources.relabel).
        """
        params = _file_params(tenant_id, source_id, meta, status, status_reason, title, chunks, text_chars,
                              ts_config, authors, labels, own_labels)
        setup = (_FILE_TX, {"tenant": str(tenant_id), "sync": "on" if durable else "off"})
        packed = self.packed()
        kin = _member_statements(tenant_id, source_id, meta.key, members, ts_config, packed)
        container = container or bool(members)
        for drop in ((True,) if replace else (False, True)):
            old = [(_DROP_BY_KEY, params)] if drop else []
            if drop and container:
                old += [(_DROP_MEMBERS, params), (_DELETE_MEMBERS, params)]
            statements = [setup, *old, (_WRITE_CHECKED[packed], params), *kin, *then]
            try:
                self.run(statements)
                return
            except psycopg.Error as exc:
                if exc.sqlstate == FENCE_LOST:
                    raise FenceLost(str(exc.diag.message_primary or exc)) from None
                if exc.sqlstate != HAS_CONTENT or drop:
                    raise


def _file_params(tenant_id: uuid.UUID, source_id: uuid.UUID, meta: FileMeta, status: str,
                 status_reason: str | None, title: str | None, chunks: Sequence[Chunk], text_chars: int,
                 ts_config: str, authors: Sequence[str] = (), labels: Sequence[str] = (),
                 own_labels: Sequence[str] = ()) -> dict:
    fields = analysis.file_header(meta.key, title)
    return {
        "tenant_id": tenant_id, "source_id": source_id, "key": meta.key, "size": meta.size,
        "mtime": meta.mtime, "etag": meta.etag, "content_type": meta.content_type,
        "storage_class": meta.storage_class, "owner": meta.owner, "mode": meta.mode, "uid": meta.uid,
        "gid": meta.gid, "permission_set": meta.permission_set, "status": status, "status_reason": status_reason,
        "title": title,
        "authors": list(authors), "labels": list(labels), "own_labels": list(own_labels), "chunk_count": len(chunks), "text_chars": text_chars,
        "cfg": ts_config,
        "seqs": [c.seq for c in chunks], "bodies": [c.text for c in chunks],
        "pages": [c.page_no for c in chunks], "starts": [c.char_start for c in chunks],
        "ends": [c.char_end for c in chunks], "ts_starts": [c.ts_start_ms for c in chunks],
        "ts_ends": [c.ts_end_ms for c in chunks], "headers": [c.context_header for c in chunks],
        "text_tokens": [c.text_tokens for c in chunks],
        "headings": [analysis.heading_header(c.context_header) for c in chunks],
        "header_fields": [text for text, _ in fields], "header_weights": [weight for _, weight in fields],
        "heading_weight": analysis.HEADING_WEIGHT,
        "index_format": analysis.INDEX_FORMAT,
    }


def _member_statements(tenant_id: uuid.UUID, source_id: uuid.UUID, parent_key: str,
                       members: Sequence[MemberFile], ts_config: str, packed: bool) -> list[Statement]:
    out = []
    for m in members:
        params = _file_params(tenant_id, source_id, m.meta, m.status, m.status_reason, m.title, m.chunks,
                              m.text_chars, ts_config, m.authors, m.labels, m.own_labels)
        params["parent_key"] = parent_key
        out.append((_WRITE_MEMBER[packed], params))
    return out


def load_file_states(conn: Connection, source_id: uuid.UUID) -> dict[str, FileState]:
    """The listed files of a source (not their members: those come and go with their parent)."""
    rows = conn.execute(
        "SELECT key, size, mtime, etag, status, status_reason, "
        "       index_format < %(format)s AND chunk_count > 0 AS stale, permission_set, access_stamp FROM files "
        "WHERE source_id = %(s)s AND parent_id IS NULL",
        {"s": source_id, "format": analysis.INDEX_FORMAT},
    )
    return {r.key: FileState(r.size, r.mtime, r.etag, r.status, r.status_reason, r.stale, r.permission_set,
                             r.access_stamp)
            for r in rows}


def _drop_content(conn: Connection, tenant_id: uuid.UUID, file_ids: Sequence[int]) -> None:
    conn.execute(_DROP_BY_IDS, {"ids": list(file_ids), "tenant_id": tenant_id})


def write_file(
    conn: Connection,
    *,
    tenant_id: uuid.UUID,
    source_id: uuid.UUID,
    meta: FileMeta,
    status: str,
    status_reason: str | None,
    title: str | None,
    chunks: Sequence[Chunk],
    text_chars: int,
    ts_config: str,
    replace: bool = True,
    members: Sequence[MemberFile] = (),
    container: bool = False,
    authors: Sequence[str] = (),
    labels: Sequence[str] = (),
    own_labels: Sequence[str] = (),
) -> int:
    """Replace one file's metadata, chunks and keyword index (and, for a container, its members). Returns
    the file id.

    `replace=False` is a hint that the file has no indexed content yet (first crawl): it saves the drop
    statement. A wrong hint costs one more statement, never correctness.
    """
    params = _file_params(tenant_id, source_id, meta, status, status_reason, title, chunks, text_chars,
                          ts_config, authors, labels, own_labels)
    if replace:
        conn.execute(_DROP_BY_KEY, params)
    if replace and (container or members):
        conn.execute(_DROP_MEMBERS, params)
        conn.execute(_DELETE_MEMBERS, params)
    packed = writes_packed(conn)
    row = conn.execute(_WRITE[packed], params).fetchone()
    if row.file_id is None:  # it had content after all: drop it, then write
        conn.execute(_DROP_BY_KEY, params)
        conn.execute(_DROP_MEMBERS, params)
        conn.execute(_DELETE_MEMBERS, params)
        row = conn.execute(_WRITE[packed], params).fetchone()
    for stmt, member_params in _member_statements(tenant_id, source_id, meta.key, members, ts_config, packed):
        conn.execute(stmt, member_params)
    return row.file_id


def delete_files(conn: Connection, tenant_id: uuid.UUID, source_id: uuid.UUID, keys: Iterable[str]) -> int:
    """Remove listed files that vanished from the source, with their members (and the chunks, postings and
    statistics of all of them). Returns how many listed files went."""
    ids = [r.id for r in conn.execute(
        "SELECT id FROM files WHERE source_id = %(s)s AND key = ANY(%(keys)s) AND parent_id IS NULL",
        {"s": source_id, "keys": list(keys)},
    )]
    if not ids:
        return 0
    members = [r.id for r in conn.execute("SELECT id FROM files WHERE parent_id = ANY(%(ids)s)",
                                          {"ids": ids})]
    _drop_content(conn, tenant_id, ids + members)
    conn.execute("DELETE FROM files WHERE id = ANY(%(ids)s)", {"ids": ids + members})
    return len(ids)
