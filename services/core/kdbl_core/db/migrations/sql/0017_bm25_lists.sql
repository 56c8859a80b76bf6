-- Packed BM25 posting lists (issue 19): one row per (tenant, term, source, generation) holding that term's
-- postings in that source and generation's chunk range, packed by the kdbl_bm25 extension (kdbl_core.db.pgext) up to chunk id `upto`
-- (bm25_built); the keyword arm reads them instead of postings rows when the extension is installed
-- (kdbl_core.search.bm25_native). Postings stay the source of truth: the lists are rebuilt from them
-- (kdbl_core.content.bm25_lists), and what was written or deleted since is read from postings and
-- bm25_dead, so a search is exact whatever the lists' age. Without the extension these tables stay empty.
CREATE TABLE bm25_lists (
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    term        text NOT NULL,
    source_id   uuid NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    gen         integer NOT NULL,          -- generation: 0 from a full build, then one per added range
    n           integer NOT NULL,          -- postings in the list
    list        bytea NOT NULL,
    PRIMARY KEY (tenant_id, term, source_id, gen)
);
-- Varints do not compress; uncompressed out-of-line values are read without a decompression pass.
ALTER TABLE bm25_lists ALTER COLUMN list SET STORAGE EXTERNAL;

CREATE TABLE bm25_built (
    tenant_id   uuid PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    upto        bigint NOT NULL DEFAULT 0,  -- the lists hold every posting of chunks with id <= upto
    gens        integer NOT NULL DEFAULT 0, -- generations in the lists
    chunks      bigint NOT NULL DEFAULT 0,  -- chunks in the tenant at the build
    dead        bigint NOT NULL DEFAULT 0,  -- rows in bm25_dead at the build
    lists       bigint NOT NULL DEFAULT 0,
    postings    bigint NOT NULL DEFAULT 0,
    bytes       bigint NOT NULL DEFAULT 0,
    seconds     double precision,
    built_at    timestamptz
);

-- Chunks deleted since a tenant's lists were built (their postings may still be in a list).
CREATE TABLE bm25_dead (
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    chunk_id    bigint NOT NULL,
    source_id   uuid NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    PRIMARY KEY (tenant_id, chunk_id)
);

-- Every deleted chunk of a tenant that has a bm25_built row is recorded, whatever its id: a build
-- running meanwhile may have read it (the build clears only the rows its snapshot sees). Sources that
-- are being deleted are skipped (their lists go with them).
CREATE FUNCTION kdbl_bm25_dead() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
BEGIN
    INSERT INTO public.bm25_dead (tenant_id, chunk_id, source_id)
    SELECT o.tenant_id, o.id, o.source_id FROM old_rows o
      JOIN public.bm25_built b ON b.tenant_id = o.tenant_id
      JOIN public.sources s ON s.id = o.source_id
     ORDER BY o.id
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER chunks_bm25_dead AFTER DELETE ON chunks REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kdbl_bm25_dead();

-- Every statement that inserts chunks holds this lock (shared) until its transaction ends; a build takes
-- it exclusively for the instant it reads `upto`, so no chunk id <= upto can still be uncommitted.
CREATE FUNCTION kdbl_bm25_write_lock() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(7738418277376668213);  -- 'kdblbm25'
    RETURN NULL;
END
$$;
CREATE TRIGGER chunks_bm25_write_lock BEFORE INSERT ON chunks
    FOR EACH STATEMENT EXECUTE FUNCTION kdbl_bm25_write_lock();

ALTER TABLE bm25_lists ENABLE ROW LEVEL SECURITY;
ALTER TABLE bm25_lists FORCE ROW LEVEL SECURITY;
ALTER TABLE bm25_built ENABLE ROW LEVEL SECURITY;
ALTER TABLE bm25_built FORCE ROW LEVEL SECURITY;
ALTER TABLE bm25_dead ENABLE ROW LEVEL SECURITY;
ALTER TABLE bm25_dead FORCE ROW LEVEL SECURITY;
-- Administration (the owner, kdbl-control: db compact, bench scale) and the trigger, which runs as the owner.
CREATE POLICY admin_all ON bm25_lists TO kdbl_admin USING (true) WITH CHECK (true);
CREATE POLICY admin_all ON bm25_built TO kdbl_admin USING (true) WITH CHECK (true);
CREATE POLICY admin_all ON bm25_dead TO kdbl_admin USING (true) WITH CHECK (true);
GRANT SELECT, INSERT, UPDATE, DELETE ON bm25_lists, bm25_built, bm25_dead TO kdbl_admin;
-- The API reads the lists and deletions of the sources it sees whole (files granted one by one are read
-- from postings), and its tenant's build mark.
CREATE POLICY api_read ON bm25_lists FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant() AND source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id)));
CREATE POLICY api_read ON bm25_dead FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant() AND source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id)));
CREATE POLICY api_read ON bm25_built FOR SELECT TO kdbl_api USING (tenant_id = kdbl_tenant());
-- The worker builds the lists of the tenant it works for.
CREATE POLICY worker_tenant ON bm25_lists TO kdbl_worker
    USING (tenant_id = kdbl_tenant()) WITH CHECK (tenant_id = kdbl_tenant());
CREATE POLICY worker_tenant ON bm25_dead TO kdbl_worker
    USING (tenant_id = kdbl_tenant()) WITH CHECK (tenant_id = kdbl_tenant());
CREATE POLICY worker_tenant ON bm25_built TO kdbl_worker
    USING (tenant_id = kdbl_tenant()) WITH CHECK (tenant_id = kdbl_tenant());
GRANT SELECT ON bm25_lists, bm25_dead, bm25_built TO kdbl_api;
GRANT SELECT, INSERT, UPDATE, DELETE ON bm25_lists, bm25_dead, bm25_built TO kdbl_worker;
