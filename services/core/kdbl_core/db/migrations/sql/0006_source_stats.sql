-- Per-source counters (files, chunks, chunks embedded per model) so list_sources and /capacity read a
-- few rows instead of counting every file and chunk under row-level security on each call (7k chunks:
-- 10 ms of database CPU per list_sources; a million: seconds).
--
-- Maintained by statement-level triggers with transition tables on files and chunks, so every path that
-- adds or removes rows — the worker's one-statement file write, drops, deletions, embedding, a cascade
-- from a deleted source or tenant — keeps them exact without knowing about them. Sharded by backend
-- like corpus_stats so concurrent writers rarely touch the same row; readers sum the shards.
CREATE TABLE source_stats (
    tenant_id       uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    source_id       uuid NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    model           text NOT NULL DEFAULT '',  -- '' = all chunks; a model id = chunks embedded with it
    shard           smallint NOT NULL,
    files           bigint NOT NULL DEFAULT 0,
    chunks          bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (source_id, model, shard)
);

-- Each trigger adds its deltas only for sources that still exist (a cascade from a deleted source must
-- not re-create rows), in source order (two writers never deadlock on counter rows). A statement reads
-- only the transition tables its event has, so each event has its own query (planned when first run).
CREATE FUNCTION kdbl_add_source_stats(p_source uuid[], p_model text[], p_files bigint[], p_chunks bigint[])
    RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
        INSERT INTO public.source_stats AS st (tenant_id, source_id, model, shard, files, chunks)
        SELECT s.tenant_id, s.id, d.model, (pg_backend_pid() % 16)::smallint, d.files, d.chunks
          FROM unnest(p_source, p_model, p_files, p_chunks) AS d(source_id, model, files, chunks)
          JOIN public.sources s ON s.id = d.source_id
         ORDER BY s.id, d.model
        ON CONFLICT (source_id, model, shard) DO UPDATE
           SET files = st.files + EXCLUDED.files, chunks = st.chunks + EXCLUDED.chunks
    $$;
REVOKE ALL ON FUNCTION kdbl_add_source_stats(uuid[], text[], bigint[], bigint[]) FROM PUBLIC;

CREATE FUNCTION kdbl_files_counter() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
DECLARE src uuid[]; n bigint[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(source_id), array_agg(c) INTO src, n
          FROM (SELECT source_id, count(*) AS c FROM new_rows GROUP BY source_id) x;
    ELSE
        SELECT array_agg(source_id), array_agg(-c) INTO src, n
          FROM (SELECT source_id, count(*) AS c FROM old_rows GROUP BY source_id) x;
    END IF;
    IF src IS NOT NULL THEN
        PERFORM kdbl_add_source_stats(src, array_fill(''::text, ARRAY[cardinality(src)]), n,
                                      array_fill(0::bigint, ARRAY[cardinality(src)]));
    END IF;
    RETURN NULL;
END
$$;

-- Chunks: model '' counts every chunk; a model id counts chunks whose embedding came from that model.
CREATE FUNCTION kdbl_chunks_counter() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
DECLARE src uuid[]; mdl text[]; n bigint[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(source_id), array_agg(model), array_agg(c) INTO src, mdl, n FROM (
            SELECT source_id, '' AS model, count(*) AS c FROM new_rows GROUP BY source_id
            UNION ALL
            SELECT source_id, embedding_model, count(*) FROM new_rows
             WHERE embedding IS NOT NULL AND embedding_model IS NOT NULL GROUP BY source_id, embedding_model) x;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT array_agg(source_id), array_agg(model), array_agg(-c) INTO src, mdl, n FROM (
            SELECT source_id, '' AS model, count(*) AS c FROM old_rows GROUP BY source_id
            UNION ALL
            SELECT source_id, embedding_model, count(*) FROM old_rows
             WHERE embedding IS NOT NULL AND embedding_model IS NOT NULL GROUP BY source_id, embedding_model) x;
    ELSE  -- UPDATE: only a change of embedding moves a chunk between model counters
        SELECT array_agg(source_id), array_agg(model), array_agg(c) INTO src, mdl, n FROM (
            SELECT source_id, model, sum(c) AS c FROM (
                SELECT source_id, embedding_model AS model, -count(*) AS c FROM old_rows
                 WHERE embedding IS NOT NULL AND embedding_model IS NOT NULL GROUP BY 1, 2
                UNION ALL
                SELECT source_id, embedding_model, count(*) FROM new_rows
                 WHERE embedding IS NOT NULL AND embedding_model IS NOT NULL GROUP BY 1, 2) y
             GROUP BY source_id, model HAVING sum(c) <> 0) x;
    END IF;
    IF src IS NOT NULL THEN
        PERFORM kdbl_add_source_stats(src, mdl, array_fill(0::bigint, ARRAY[cardinality(src)]), n);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER files_counter_ins AFTER INSERT ON files REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kdbl_files_counter();
CREATE TRIGGER files_counter_del AFTER DELETE ON files REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kdbl_files_counter();
CREATE TRIGGER chunks_counter_ins AFTER INSERT ON chunks REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kdbl_chunks_counter();
CREATE TRIGGER chunks_counter_del AFTER DELETE ON chunks REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kdbl_chunks_counter();
CREATE TRIGGER chunks_counter_upd AFTER UPDATE ON chunks REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kdbl_chunks_counter();

-- What is there now.
INSERT INTO source_stats (tenant_id, source_id, model, shard, files, chunks)
SELECT s.tenant_id, s.id, '', 0,
       (SELECT count(*) FROM files f WHERE f.source_id = s.id),
       (SELECT count(*) FROM chunks c WHERE c.source_id = s.id)
  FROM sources s;
INSERT INTO source_stats (tenant_id, source_id, model, shard, files, chunks)
SELECT c.tenant_id, c.source_id, c.embedding_model, 0, 0, count(*)
  FROM chunks c WHERE c.embedding IS NOT NULL AND c.embedding_model IS NOT NULL
 GROUP BY c.tenant_id, c.source_id, c.embedding_model;

ALTER TABLE source_stats ENABLE ROW LEVEL SECURITY;
ALTER TABLE source_stats FORCE ROW LEVEL SECURITY;
CREATE POLICY admin_all ON source_stats TO kdbl_admin USING (true) WITH CHECK (true);
-- Totals of a source are shown only to principals who see the whole source; a principal who sees it
-- through per-file grants counts the files it may see (reads.py), so totals never leak.
CREATE POLICY api_read ON source_stats FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant() AND source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id)));
GRANT SELECT ON source_stats TO kdbl_api;  -- the worker writes it only through the triggers

-- Installation-wide progress from the counters (same columns as before).
CREATE OR REPLACE FUNCTION kdbl_embedding_progress()
    RETURNS TABLE (hybrid_chunks bigint, embedded_chunks bigint)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
        SELECT coalesce(sum(st.chunks) FILTER (WHERE st.model = ''), 0)::bigint,
               coalesce(sum(st.chunks) FILTER (WHERE st.model <> ''), 0)::bigint
          FROM public.source_stats st
          JOIN public.sources s ON s.id = st.source_id
          JOIN public.tenants t ON t.id = s.tenant_id
         WHERE s.hybrid_enabled AND t.hybrid_enabled
    $$;
