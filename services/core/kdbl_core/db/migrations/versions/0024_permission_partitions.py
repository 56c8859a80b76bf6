"""The keyword index partitioned by the share's permission sets (issue 30): from-source searches read lists.

Migration 0023 made a from-source file readable through its permission set and put it in
`kdbl_granted_files()`, so the search took its statistics and postings from its chunks' own terms at query
time (the `gf` arm of kdbl_core.search.lexical): exact, but ~0.09 ms per readable file per query — 46 ms
against 4 ms at 1,000 files. Here the keyword index itself is cut by permission set: term_stats,
corpus_stats and bm25_lists carry `permission_set` (0: none, every source not in 'source' mode), and
row-level security lets a caller read the partitions of the sets that allow it (in sources that take their
permissions from the share), as it reads the whole partitions of the sources it sees whole. A from-source
search then reads packed lists and summed statistics like any other, whatever the number of files.

The invariant: a file's chunks are indexed in the partition `coalesce(files.permission_set, 0)`. Writers
write there (kdbl_core.content.store) and builds pack there (kdbl_core.content.bm25_lists); whatever changes a
file's set — the crawl's `share_sets.apply`, leaving 'source' mode, plain SQL — fires `files_move_index`,
which moves the file's chunks: the rows are written again under new ids (embeddings and terms copied, nothing
extracted or analysed again), the statistics go from one partition to the other and the new ids are packed
as a writer's generation of the new partition; the old ids go to bm25_dead as any deletion does.

SMB sources may read a file's security descriptor only when its change time moved (`permission_checks:
changed`): `files.access_stamp` keeps the change time it was last read with, `sources.permissions_checked_at`
when all were last read (kdbl_worker.share_permissions).

Revision ID: 0024
Revises: 0023
"""

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

# The partitions a principal reads: those of the sources it sees whole, and in sources that take their
# permissions from the share, those of the sets that allow it.
_VISIBLE = """tenant_id = kdbl_tenant()
           AND (source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id))
                OR (permission_set <> 0 AND source_id IN (SELECT ss.id FROM kdbl_share_sources() AS ss(id))
                    AND permission_set IN (SELECT rs.id FROM kdbl_readable_sets() AS rs(id))))"""

# A row of chunks or postings is readable when its source is seen whole, a grant names its file, or (in a
# source that takes its permissions from the share) its file's permission set allows the caller.
_ROW_OF_FILE = """tenant_id = kdbl_tenant()
           AND (source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id))
                OR file_id IN (SELECT gf.id FROM kdbl_grant_files() AS gf(id))
                OR (source_id IN (SELECT ss.id FROM kdbl_share_sources() AS ss(id))
                    AND EXISTS (SELECT 1 FROM files f WHERE f.id = {table}.file_id
                                   AND f.permission_set IN (SELECT rs.id FROM kdbl_readable_sets() AS rs(id)))))"""

_UP = f"""
-- SMB `permission_checks: changed` (kdbl_worker.share_permissions): the change time a file's descriptor was
-- last read with, and when the source's files were last all read
ALTER TABLE files ADD COLUMN access_stamp text;
ALTER TABLE sources ADD COLUMN permissions_checked_at timestamptz;
GRANT UPDATE (permissions_checked_at) ON sources TO kdbl_worker;
ALTER TABLE term_stats ADD COLUMN permission_set bigint NOT NULL DEFAULT 0;
ALTER TABLE term_stats DROP CONSTRAINT term_stats_pkey;
ALTER TABLE term_stats ADD CONSTRAINT term_stats_pkey PRIMARY KEY (tenant_id, term, source_id, permission_set, shard);
ALTER TABLE corpus_stats ADD COLUMN permission_set bigint NOT NULL DEFAULT 0;
ALTER TABLE corpus_stats DROP CONSTRAINT corpus_stats_pkey;
ALTER TABLE corpus_stats ADD CONSTRAINT corpus_stats_pkey PRIMARY KEY (tenant_id, source_id, permission_set, shard);
ALTER TABLE bm25_lists ADD COLUMN permission_set bigint NOT NULL DEFAULT 0;
ALTER TABLE bm25_lists DROP CONSTRAINT bm25_lists_pkey;
ALTER TABLE bm25_lists ADD CONSTRAINT bm25_lists_pkey PRIMARY KEY (tenant_id, term, source_id, permission_set, gen);

DROP POLICY api_read ON term_stats;
CREATE POLICY api_read ON term_stats FOR SELECT TO kdbl_api USING ({_VISIBLE});
DROP POLICY api_read ON corpus_stats;
CREATE POLICY api_read ON corpus_stats FOR SELECT TO kdbl_api USING ({_VISIBLE});
DROP POLICY api_read ON bm25_lists;
CREATE POLICY api_read ON bm25_lists FOR SELECT TO kdbl_api USING ({_VISIBLE});
-- the chunks deleted since the last build, left out of every list read: chunk ids alone, never content
DROP POLICY api_read ON bm25_dead;
CREATE POLICY api_read ON bm25_dead FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant() AND (source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id))
                                          OR source_id IN (SELECT ss.id FROM kdbl_share_sources() AS ss(id))));

-- Files granted by a grant (by key, or as a member of a granted container): the search's `gf` arm, whose
-- statistics and postings come from their chunks' terms. Files read through their permission set are in
-- the partitions above instead. It replaces kdbl_granted_files(), whose third arm listed every file the
-- share lets the caller read: chunks' and postings' policies built a hash of them on every query (3 ms at
-- 556 files, linear in them); they now look up the one file of the row they check.
DROP POLICY api_read ON chunks;
DROP POLICY api_read ON postings;
DROP FUNCTION kdbl_granted_files();
CREATE FUNCTION kdbl_grant_files() RETURNS SETOF bigint
    LANGUAGE sql STABLE
    AS $$
        SELECT f.id FROM files f
          JOIN grants g ON g.source_id = f.source_id AND g.file_key = f.key
         WHERE g.tenant_id = kdbl_tenant() AND g.subject = ANY (kdbl_subjects())
        UNION ALL
        SELECT m.id FROM kdbl_granted_members() AS m(id)
    $$;
CREATE POLICY api_read ON chunks FOR SELECT TO kdbl_api USING ({_ROW_OF_FILE.format(table="chunks")});
CREATE POLICY api_read ON postings FOR SELECT TO kdbl_api USING ({_ROW_OF_FILE.format(table="postings")});

-- The permission sets that allow the caller, computed once per transaction: 52 of 116 sets took 0.7 ms to
-- decide, and a search asks in a dozen policies. The answer is kept in transaction-local settings keyed by
-- the tenant and subjects it was computed for (the settings row-level security already trusts), so another
-- principal in the same transaction computes its own; permission sets never change once written (one per
-- digest of their rules), so the answer cannot go stale within the transaction.
CREATE OR REPLACE FUNCTION kdbl_readable_sets() RETURNS SETOF bigint
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    ROWS 20
    AS $$
DECLARE
    key text := coalesce(current_setting('kdbl.tenant_id', true), '') || '|'
                || coalesce(current_setting('kdbl.subjects', true), '');
    ids bigint[];
BEGIN
    IF current_setting('kdbl.readable_sets_for', true) IS NOT DISTINCT FROM key THEN
        RETURN QUERY SELECT unnest(CAST(current_setting('kdbl.readable_sets', true) AS bigint[]));
        RETURN;
    END IF;
    ids := ARRAY(SELECT p.id FROM public.permission_sets p
                  WHERE p.tenant_id = public.kdbl_tenant() AND public.kdbl_rules_allow(p.rules, public.kdbl_subjects()));
    PERFORM set_config('kdbl.readable_sets', CAST(ids AS text), true),
            set_config('kdbl.readable_sets_for', key, true);
    RETURN QUERY SELECT unnest(ids);
END
$$;

-- One file's chunks from partition `from_set` to `to_set` (module docstring); the number moved. Runs as
-- whoever changed the file's set (the worker, an administrator, the owner through a trigger).
CREATE FUNCTION kdbl_move_file_index(file bigint, from_set bigint, to_set bigint) RETURNS integer
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public
    AS $fn$
DECLARE
    packed boolean := coalesce(has_function_privilege(
        to_regprocedure('kdbl_bm25_pack(bigint, integer, integer)'), 'EXECUTE'), false);
    moved integer;
BEGIN
    EXECUTE format($sql$
WITH gone AS (
    DELETE FROM chunks WHERE file_id = $1
    RETURNING tenant_id, source_id, file_id, seq, text, page_no, char_start, char_end, ts_start_ms, ts_end_ms,
              token_count, embedding, embedding_model, context_header, text_tokens, terms, tfs
), ins AS (
    INSERT INTO chunks (tenant_id, source_id, file_id, seq, text, page_no, char_start, char_end, ts_start_ms,
                        ts_end_ms, token_count, embedding, embedding_model, context_header, text_tokens, terms, tfs)
    SELECT * FROM gone ORDER BY seq
    RETURNING id, tenant_id, source_id, token_count, terms, tfs
), t AS MATERIALIZED (
    SELECT ins.id, ins.tenant_id, ins.source_id, ins.token_count, x.term, least(x.tf, 32767) AS tf
      FROM ins CROSS JOIN LATERAL unnest(string_to_array(ins.terms, ' '), ins.tfs) AS x(term, tf)
), df AS (  -- out of one partition, into the other: one statement, rows in key order
    INSERT INTO term_stats (tenant_id, term, source_id, permission_set, shard, df, tf_max)
    SELECT tenant_id, term, source_id, s.set, (pg_backend_pid() %% 16)::smallint, s.sign * count(*),
           CASE WHEN s.sign > 0 THEN max(tf) END
      FROM t CROSS JOIN (VALUES ($2, -1), ($3, 1)) AS s(set, sign)
     GROUP BY tenant_id, term, source_id, s.set, s.sign
     ORDER BY term, source_id, s.set
    ON CONFLICT (tenant_id, term, source_id, permission_set, shard) DO UPDATE SET
        df = term_stats.df + EXCLUDED.df, tf_max = greatest(term_stats.tf_max, EXCLUDED.tf_max)
), cs AS (
    INSERT INTO corpus_stats (tenant_id, source_id, permission_set, shard, n_chunks, total_len, dl_min)
    SELECT tenant_id, source_id, s.set, (pg_backend_pid() %% 16)::smallint, s.sign * count(*),
           s.sign * coalesce(sum(token_count), 0), CASE WHEN s.sign > 0 THEN min(token_count) END
      FROM ins CROSS JOIN (VALUES ($2, -1), ($3, 1)) AS s(set, sign)
     GROUP BY tenant_id, source_id, s.set, s.sign
     ORDER BY source_id, s.set
    ON CONFLICT (tenant_id, source_id, permission_set, shard) DO UPDATE SET
        n_chunks = corpus_stats.n_chunks + EXCLUDED.n_chunks, total_len = corpus_stats.total_len + EXCLUDED.total_len,
        dl_min = least(corpus_stats.dl_min, EXCLUDED.dl_min)
), old_rows AS (DELETE FROM postings WHERE file_id = $1)%s
SELECT count(*) FROM ins$sql$, CASE WHEN packed THEN $k$, built AS (
    INSERT INTO bm25_built (tenant_id) SELECT tenant_id FROM ins LIMIT 1 ON CONFLICT (tenant_id) DO NOTHING
), lists AS (
    INSERT INTO bm25_lists (tenant_id, term, source_id, permission_set, gen, n, list)
    SELECT tenant_id, term, source_id, $3, -(SELECT min(id) FROM ins), count(*),
           kdbl_bm25_pack(id, CAST(tf AS integer), token_count ORDER BY id)
      FROM t GROUP BY tenant_id, term, source_id
)$k$ ELSE $k$, rows AS (
    INSERT INTO postings (tenant_id, term, chunk_id, source_id, file_id, tf, dl)
    SELECT tenant_id, term, id, source_id, $1, tf, token_count FROM t
)$k$ END)
    INTO moved USING file, from_set, to_set;
    RETURN moved;
END
$fn$;
REVOKE ALL ON FUNCTION kdbl_move_file_index(bigint, bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION kdbl_move_file_index(bigint, bigint, bigint) TO kdbl_worker, kdbl_admin;

-- Whether the caller reads some file of `source` through the share: one probe of the permission-set index
-- per readable set until one holds a file of the source (0023's form hashed every file of the source, 0.5
-- ms at 1,000 files, and every policy that asks for the sources seen whole asked it).
CREATE OR REPLACE FUNCTION kdbl_share_readable(source uuid) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
        SELECT EXISTS (SELECT 1 FROM public.kdbl_readable_sets() AS rs(id)
                        CROSS JOIN LATERAL (SELECT 1 FROM public.files f
                                             WHERE f.permission_set = rs.id AND f.source_id = source
                                               AND f.tenant_id = public.kdbl_tenant() LIMIT 1) x)
    $$;

CREATE FUNCTION kdbl_files_move_index() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM kdbl_move_file_index(NEW.id, coalesce(OLD.permission_set, 0), coalesce(NEW.permission_set, 0));
    RETURN NULL;
END
$$;
CREATE TRIGGER files_move_index AFTER UPDATE OF permission_set ON files FOR EACH ROW
    WHEN (coalesce(OLD.permission_set, 0) <> coalesce(NEW.permission_set, 0))
    EXECUTE FUNCTION kdbl_files_move_index();

-- the files 0023 gave a set were indexed in partition 0
SELECT count(kdbl_move_file_index(id, 0, permission_set)) FROM files WHERE permission_set IS NOT NULL;
"""

_DOWN = """
SELECT count(kdbl_move_file_index(id, permission_set, 0)) FROM files WHERE permission_set IS NOT NULL;
DROP TRIGGER files_move_index ON files;
DROP FUNCTION kdbl_files_move_index();
DROP FUNCTION kdbl_move_file_index(bigint, bigint, bigint);
DROP POLICY api_read ON chunks;
DROP POLICY api_read ON postings;
DROP FUNCTION kdbl_grant_files();
CREATE FUNCTION kdbl_granted_files() RETURNS SETOF bigint
    LANGUAGE sql STABLE
    AS $$
        SELECT f.id FROM files f
          JOIN grants g ON g.source_id = f.source_id AND g.file_key = f.key
         WHERE g.tenant_id = kdbl_tenant() AND g.subject = ANY (kdbl_subjects())
        UNION ALL
        SELECT m.id FROM kdbl_granted_members() AS m(id)
        UNION ALL
        SELECT f.id FROM files f
         WHERE f.tenant_id = kdbl_tenant() AND f.permission_set IN (SELECT rs.id FROM kdbl_readable_sets() AS rs(id))
    $$;
CREATE POLICY api_read ON chunks FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant()
           AND (source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id))
                OR file_id IN (SELECT gf.id FROM kdbl_granted_files() AS gf(id))));
CREATE POLICY api_read ON postings FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant()
           AND (source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id))
                OR file_id IN (SELECT gf.id FROM kdbl_granted_files() AS gf(id))));
CREATE OR REPLACE FUNCTION kdbl_share_readable(source uuid) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
        SELECT EXISTS (SELECT 1 FROM public.files f
                        WHERE f.source_id = source AND f.tenant_id = public.kdbl_tenant()
                          AND f.permission_set IN (SELECT rs.id FROM public.kdbl_readable_sets() AS rs(id)))
    $$;
CREATE OR REPLACE FUNCTION kdbl_readable_sets() RETURNS SETOF bigint
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
        SELECT p.id FROM public.permission_sets p
         WHERE p.tenant_id = public.kdbl_tenant() AND public.kdbl_rules_allow(p.rules, public.kdbl_subjects())
    $$;
DROP POLICY api_read ON bm25_dead;
CREATE POLICY api_read ON bm25_dead FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant() AND source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id)));
DROP POLICY api_read ON bm25_lists;
CREATE POLICY api_read ON bm25_lists FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant() AND source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id)));
DROP POLICY api_read ON term_stats;
CREATE POLICY api_read ON term_stats FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant() AND source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id)));
DROP POLICY api_read ON corpus_stats;
CREATE POLICY api_read ON corpus_stats FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant() AND source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id)));
-- every file is in partition 0 now: the other partitions' lists hold only chunks moved out (dead)
DELETE FROM bm25_lists WHERE permission_set <> 0;
ALTER TABLE bm25_lists DROP CONSTRAINT bm25_lists_pkey;
ALTER TABLE bm25_lists DROP COLUMN permission_set;
ALTER TABLE bm25_lists ADD CONSTRAINT bm25_lists_pkey PRIMARY KEY (tenant_id, term, source_id, gen);
CREATE TEMP TABLE kdbl_terms_0024 ON COMMIT DROP AS
SELECT tenant_id, term, source_id, shard, sum(df)::int AS df, max(tf_max) AS tf_max
  FROM term_stats GROUP BY tenant_id, term, source_id, shard;
DELETE FROM term_stats;
ALTER TABLE term_stats DROP CONSTRAINT term_stats_pkey;
ALTER TABLE term_stats DROP COLUMN permission_set;
ALTER TABLE term_stats ADD CONSTRAINT term_stats_pkey PRIMARY KEY (tenant_id, term, source_id, shard);
INSERT INTO term_stats (tenant_id, term, source_id, shard, df, tf_max) SELECT * FROM kdbl_terms_0024;
CREATE TEMP TABLE kdbl_corpus_0024 ON COMMIT DROP AS
SELECT tenant_id, source_id, shard, sum(n_chunks)::bigint AS n_chunks, sum(total_len)::bigint AS total_len,
       min(dl_min) AS dl_min
  FROM corpus_stats GROUP BY tenant_id, source_id, shard;
DELETE FROM corpus_stats;
ALTER TABLE corpus_stats DROP CONSTRAINT corpus_stats_pkey;
ALTER TABLE corpus_stats DROP COLUMN permission_set;
ALTER TABLE corpus_stats ADD CONSTRAINT corpus_stats_pkey PRIMARY KEY (tenant_id, source_id, shard);
INSERT INTO corpus_stats (tenant_id, source_id, shard, n_chunks, total_len, dl_min) SELECT * FROM kdbl_corpus_0024;
REVOKE UPDATE (permissions_checked_at) ON sources FROM kdbl_worker;
ALTER TABLE sources DROP COLUMN permissions_checked_at;
ALTER TABLE files DROP COLUMN access_stamp;
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_UP)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_DOWN)
