-- Crawl job queue: any number of worker replicas share the crawling through leases.
--
-- Two levels:
--   crawl_jobs   one row per crawl run of a source. queued → listing (one worker holds a lease and lists
--                the source) → running (the listing is complete; its changed files wait as items) →
--                done | failed. At most one queued and one listing/running job per source.
--   crawl_items  one row per changed file of a run (key + the stat the listing saw). queued → running
--                (a worker holds a lease) → done | failed. An item is completed *in the same transaction*
--                that writes the file's rows, fenced by (leased_by, attempts): a worker whose lease was
--                taken over cannot commit, so every item is written exactly once.
--
-- Claims use SELECT … FOR UPDATE SKIP LOCKED. A lease is renewed by its holder's heartbeat; an
-- expired lease (crashed worker) is claimed again by any worker, which increments `attempts`.
-- The SQL that reads and writes these tables lives in kdbl_worker/jobs.py (kdbl_core/db/jobs.py when written).

CREATE TABLE crawl_jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id        uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    source_id        uuid NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    state            text NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'listing', 'running', 'done', 'failed')),
    reason           text NOT NULL DEFAULT 'manual' CHECK (reason IN ('manual', 'schedule')),
    -- the schedule slot this run serves (NULL for on-demand runs): one run per slot and source
    scheduled_for    timestamptz,
    run_after        timestamptz NOT NULL DEFAULT now(),
    leased_by        text,
    lease_expires_at timestamptz,
    attempts         integer NOT NULL DEFAULT 0,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    listed_at        timestamptz,
    finished_at      timestamptz,
    -- outcome counters (listing: listed/excluded/unchanged/deleted; at the end: the items' totals)
    listed           bigint NOT NULL DEFAULT 0,
    excluded         bigint NOT NULL DEFAULT 0,
    unchanged        bigint NOT NULL DEFAULT 0,
    deleted          bigint NOT NULL DEFAULT 0,
    queued_files     bigint NOT NULL DEFAULT 0,
    indexed          bigint NOT NULL DEFAULT 0,
    failed           bigint NOT NULL DEFAULT 0,
    chunks           bigint NOT NULL DEFAULT 0,
    bytes            bigint NOT NULL DEFAULT 0,
    problems         jsonb NOT NULL DEFAULT '[]'::jsonb,
    CHECK (state <> 'listing' OR (leased_by IS NOT NULL AND lease_expires_at IS NOT NULL))
);
CREATE UNIQUE INDEX crawl_jobs_one_queued_idx ON crawl_jobs (source_id) WHERE state = 'queued';
CREATE UNIQUE INDEX crawl_jobs_one_active_idx ON crawl_jobs (source_id) WHERE state IN ('listing', 'running');
CREATE UNIQUE INDEX crawl_jobs_slot_idx ON crawl_jobs (source_id, scheduled_for);
CREATE INDEX crawl_jobs_source_created_idx ON crawl_jobs (source_id, created_at DESC);
CREATE INDEX crawl_jobs_open_idx ON crawl_jobs (run_after, id) WHERE state IN ('queued', 'listing', 'running');
CREATE INDEX crawl_jobs_tenant_idx ON crawl_jobs (tenant_id);

CREATE TABLE crawl_items (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id           bigint NOT NULL REFERENCES crawl_jobs (id) ON DELETE CASCADE,
    tenant_id        uuid NOT NULL,
    source_id        uuid NOT NULL,
    key              text NOT NULL,
    size             bigint NOT NULL,
    mtime            timestamptz,
    etag             text,
    storage_class    text,
    owner            text,
    mode             integer,
    uid              integer,
    gid              integer,
    -- the file had a row when listed: its old content must be dropped (a hint that saves a statement)
    had_file         boolean NOT NULL DEFAULT true,
    state            text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'running', 'done', 'failed')),
    leased_by        text,
    lease_expires_at timestamptz,
    attempts         integer NOT NULL DEFAULT 0,
    last_error       text,
    file_status      text,
    chunk_count      integer,
    finished_at      timestamptz,
    UNIQUE (job_id, key),
    CHECK (state <> 'running' OR (leased_by IS NOT NULL AND lease_expires_at IS NOT NULL))
);
-- Claim order is the id; only open items are in these indexes, so finished runs cost claims nothing.
CREATE INDEX crawl_items_open_idx ON crawl_items (id) WHERE state IN ('queued', 'running');
CREATE INDEX crawl_items_source_open_idx ON crawl_items (source_id, id) WHERE state IN ('queued', 'running');
CREATE INDEX crawl_items_job_open_idx ON crawl_items (job_id) WHERE state IN ('queued', 'running');
CREATE INDEX crawl_items_holder_idx ON crawl_items (leased_by) WHERE state = 'running';

-- Abort the current transaction with SQLSTATE `code` unless `ok`: lets a statement sent ahead in a
-- pipeline (no round trip to look at its result) veto the COMMIT that follows it. Used by the file
-- write (KL002: the file still has content) and the fenced completion of a queue item (KL001).
CREATE FUNCTION kdbl_check(ok boolean, code text, message text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message;
    END IF;
    RETURN true;
END
$$;

-- Every file write counts itself: proves "indexed exactly once" after crashes and with many workers,
-- and shows churn (a file re-indexed on every run) to an operator.
ALTER TABLE files ADD COLUMN index_runs integer NOT NULL DEFAULT 0;

-- ---------------------------------------------------------------------------------------------
-- Privileges and row-level security
-- ---------------------------------------------------------------------------------------------
REVOKE ALL ON crawl_jobs, crawl_items FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON crawl_jobs, crawl_items TO kdbl_worker, kdbl_admin;
-- kdbl_api: nothing. Queue rows are internal work state.

ALTER TABLE crawl_jobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE crawl_jobs FORCE ROW LEVEL SECURITY;
ALTER TABLE crawl_items ENABLE ROW LEVEL SECURITY;
ALTER TABLE crawl_items FORCE ROW LEVEL SECURITY;
CREATE POLICY admin_all ON crawl_jobs TO kdbl_admin USING (true) WITH CHECK (true);
CREATE POLICY admin_all ON crawl_items TO kdbl_admin USING (true) WITH CHECK (true);

-- The worker claims work across tenants: one pool of replicas serves every tenant, so claims and
-- heartbeats run in transactions *without* a tenant and must see every tenant's queue rows. That is
-- no wider than what kdbl_worker already reads (every tenant's `sources`, including their roots and
-- buckets): queue rows hold ids, file keys and stat data, never extracted content. Inside a tenant
-- transaction (where file content is written and an item is completed in the same transaction) the
-- worker sees and may change only that tenant's queue rows, so a content write can never complete or
-- fence another tenant's work.
CREATE POLICY worker_queue ON crawl_jobs TO kdbl_worker
    USING (kdbl_tenant() IS NULL OR tenant_id = kdbl_tenant())
    WITH CHECK (kdbl_tenant() IS NULL OR tenant_id = kdbl_tenant());
CREATE POLICY worker_queue ON crawl_items TO kdbl_worker
    USING (kdbl_tenant() IS NULL OR tenant_id = kdbl_tenant())
    WITH CHECK (kdbl_tenant() IS NULL OR tenant_id = kdbl_tenant());
