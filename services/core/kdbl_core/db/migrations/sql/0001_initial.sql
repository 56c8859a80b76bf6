-- K-Lake initial schema: tenants, sources, files, chunks, BM25 keyword index, grants, tokens, audit,
-- and the row-level-security model. Runs as the owner role (migrations only).
--
-- Roles (cluster-wide; created here when missing, or pre-created by a DBA):
--   kdbl_api     runtime role of the API: reads content through RLS, appends audit rows.
--   kdbl_worker  runtime role of the worker: writes files/chunks/postings of one tenant per transaction.
--   kdbl_admin   administration (kdbl-control, operator): full access through explicit policies.
-- Runtime roles own nothing and have no BYPASSRLS, so FORCE'd policies always apply to them.

CREATE EXTENSION IF NOT EXISTS vector;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'kdbl_api') THEN
        CREATE ROLE kdbl_api NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'kdbl_worker') THEN
        CREATE ROLE kdbl_worker NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'kdbl_admin') THEN
        CREATE ROLE kdbl_admin NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
    END IF;
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE format('GRANT kdbl_admin TO %I', current_user);
    END IF;
END
$$;

REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO kdbl_api, kdbl_worker, kdbl_admin;

-- ---------------------------------------------------------------------------------------------
-- Tables
-- ---------------------------------------------------------------------------------------------
CREATE TABLE tenants (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name            text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    display_name    text,
    hybrid_enabled  boolean NOT NULL DEFAULT true,
    managed_by      text NOT NULL DEFAULT 'cli' CHECK (managed_by IN ('cli', 'operator')),
    settings        jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE sources (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id       uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name            text NOT NULL,
    protocol        text NOT NULL CHECK (protocol IN ('fs', 's3', 'smb', 'webdav', 'http')),
    -- connection details, include/exclude globs, credentials *reference* (never secret values)
    config          jsonb NOT NULL DEFAULT '{}'::jsonb,
    enabled         boolean NOT NULL DEFAULT true,
    hybrid_enabled  boolean NOT NULL DEFAULT true,
    acl_mode        text NOT NULL DEFAULT 'tenant' CHECK (acl_mode IN ('tenant', 'restricted')),
    schedule        text,
    managed_by      text NOT NULL DEFAULT 'cli' CHECK (managed_by IN ('cli', 'operator')),
    last_indexed_at timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);
CREATE INDEX sources_tenant_idx ON sources (tenant_id);

CREATE TABLE files (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id       uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    source_id       uuid NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    key             text NOT NULL,
    size            bigint,
    mtime           timestamptz,
    etag            text,
    content_type    text,
    storage_class   text,
    owner           text,
    mode            integer,
    uid             integer,
    gid             integer,
    status          text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'ok', 'partial', 'failed', 'skipped')),
    status_reason   text,
    title           text,
    chunk_count     integer NOT NULL DEFAULT 0,
    text_chars      bigint NOT NULL DEFAULT 0,
    indexed_at      timestamptz,
    seen_at         timestamptz,
    UNIQUE (source_id, key)
);
CREATE INDEX files_tenant_source_key_idx ON files (tenant_id, source_id, key);

CREATE TABLE chunks (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id       uuid NOT NULL,
    source_id       uuid NOT NULL,
    file_id         bigint NOT NULL REFERENCES files (id) ON DELETE CASCADE,
    seq             integer NOT NULL,
    text            text NOT NULL,
    page_no         integer,
    char_start      integer NOT NULL,
    char_end        integer NOT NULL,
    ts_start_ms     bigint,
    ts_end_ms       bigint,
    token_count     integer NOT NULL DEFAULT 0,
    embedding       vector,
    UNIQUE (file_id, seq)
);

-- BM25 keyword index: one posting per (term, chunk) with the term frequency and the chunk's
-- length; document frequencies and corpus sizes kept as sharded counters so concurrent
-- writers do not serialise on one hot row (the query sums the shards).
CREATE TABLE postings (
    tenant_id       uuid NOT NULL,
    term            text NOT NULL,
    chunk_id        bigint NOT NULL,
    source_id       uuid NOT NULL,
    file_id         bigint NOT NULL REFERENCES files (id) ON DELETE CASCADE,
    tf              smallint NOT NULL,
    dl              integer NOT NULL,
    PRIMARY KEY (tenant_id, term, chunk_id) INCLUDE (tf, dl, source_id, file_id)
);
CREATE INDEX postings_file_idx ON postings (file_id);

CREATE TABLE term_stats (
    tenant_id       uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    term            text NOT NULL,
    shard           smallint NOT NULL,
    df              integer NOT NULL,
    PRIMARY KEY (tenant_id, term, shard)
);

CREATE TABLE corpus_stats (
    tenant_id       uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    shard           smallint NOT NULL,
    n_chunks        bigint NOT NULL DEFAULT 0,
    total_len       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, shard)
);

-- Access grants: a whole source (file_key NULL) or one file, for a user or a group.
CREATE TABLE grants (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id       uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    source_id       uuid NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    file_key        text,
    subject         text NOT NULL CHECK (subject ~ '^(user|group):.+$'),
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE NULLS NOT DISTINCT (source_id, file_key, subject)
);
CREATE INDEX grants_subject_idx ON grants (tenant_id, subject);

CREATE TABLE tokens (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    lookup_id       text NOT NULL UNIQUE,
    tenant_id       uuid REFERENCES tenants (id) ON DELETE CASCADE,
    kind            text NOT NULL CHECK (kind IN ('tenant', 'admin')),
    name            text NOT NULL,
    subject         text NOT NULL,
    groups          text[] NOT NULL DEFAULT '{}',
    scopes          text[] NOT NULL DEFAULT '{}',
    hash            text NOT NULL,
    managed_by      text NOT NULL DEFAULT 'cli' CHECK (managed_by IN ('cli', 'operator')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz,
    revoked_at      timestamptz,
    CHECK ((kind = 'admin') = (tenant_id IS NULL))
);

CREATE TABLE audit (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ts              timestamptz NOT NULL DEFAULT now(),
    tenant_id       uuid,
    principal       text NOT NULL,
    token_id        uuid,
    tool            text NOT NULL,
    arguments       jsonb NOT NULL DEFAULT '{}'::jsonb,
    source_ids      uuid[] NOT NULL DEFAULT '{}',
    keys            text[] NOT NULL DEFAULT '{}',
    row_count       integer NOT NULL DEFAULT 0,
    status          text NOT NULL,
    error           text,
    client_ip       text,
    duration_ms     real
);
CREATE INDEX audit_tenant_ts_idx ON audit (tenant_id, ts DESC);
CREATE INDEX audit_tool_ts_idx ON audit (tool, ts DESC);

-- ---------------------------------------------------------------------------------------------
-- The principal of the current transaction (set with set_config(..., true) by the services)
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION kdbl_tenant() RETURNS uuid
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT nullif(current_setting('kdbl.tenant_id', true), '')::uuid $$;

-- 'user:<subject>' and 'group:<name>' entries, separated by the unit separator (0x1f)
CREATE FUNCTION kdbl_subjects() RETURNS text[]
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT coalesce(string_to_array(nullif(current_setting('kdbl.subjects', true), ''), chr(31)),
                          '{}'::text[]) $$;

-- Sources whose every file the principal may read (open to the tenant, or granted as a whole).
-- Not SECURITY DEFINER: it runs under the caller's own policies. Policies call it in FROM
-- (`SELECT ws.id FROM kdbl_whole_sources() ws(id)`), where Postgres inlines a STABLE SQL function
-- into the query; called in the select list it ran as a separate per-query function call (~1 ms).
CREATE FUNCTION kdbl_whole_sources() RETURNS SETOF uuid
    LANGUAGE sql STABLE
    AS $$
        SELECT s.id FROM sources s
         WHERE s.tenant_id = kdbl_tenant()
           AND (s.acl_mode = 'tenant'
                OR s.id IN (SELECT g.source_id FROM grants g
                             WHERE g.file_key IS NULL AND g.subject = ANY (kdbl_subjects())))
    $$;

-- Files granted one by one.
CREATE FUNCTION kdbl_granted_files() RETURNS SETOF bigint
    LANGUAGE sql STABLE
    AS $$
        SELECT f.id FROM files f
          JOIN grants g ON g.source_id = f.source_id AND g.file_key = f.key
         WHERE g.tenant_id = kdbl_tenant() AND g.subject = ANY (kdbl_subjects())
    $$;

-- Token verification happens before any tenant is known: the API may look one token up by
-- its lookup id and nothing else (it has no privilege on the tokens table itself).
CREATE FUNCTION kdbl_token_lookup(p_lookup_id text)
    RETURNS TABLE (id uuid, tenant_id uuid, tenant_name text, kind text, subject text, groups text[],
                   scopes text[], hash text, expires_at timestamptz, revoked_at timestamptz)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
        SELECT t.id, t.tenant_id, n.name, t.kind, t.subject, t.groups, t.scopes, t.hash,
               t.expires_at, t.revoked_at
          FROM public.tokens t LEFT JOIN public.tenants n ON n.id = t.tenant_id
         WHERE t.lookup_id = p_lookup_id
    $$;
REVOKE ALL ON FUNCTION kdbl_token_lookup(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION kdbl_token_lookup(text) TO kdbl_api;

-- ---------------------------------------------------------------------------------------------
-- Privileges
-- ---------------------------------------------------------------------------------------------
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC;
GRANT SELECT ON tenants, sources, files, chunks, postings, term_stats, corpus_stats, grants TO kdbl_api;
GRANT INSERT ON audit TO kdbl_api;

GRANT SELECT ON tenants, sources TO kdbl_worker;
GRANT UPDATE (last_indexed_at) ON sources TO kdbl_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON files, chunks, postings, term_stats, corpus_stats TO kdbl_worker;

GRANT SELECT, INSERT, UPDATE, DELETE
    ON tenants, sources, files, chunks, postings, term_stats, corpus_stats, grants, tokens, audit
    TO kdbl_admin;

-- ---------------------------------------------------------------------------------------------
-- Row-level security: ENABLE + FORCE everywhere, so even the owner goes through a policy.
-- ---------------------------------------------------------------------------------------------
DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['tenants', 'sources', 'files', 'chunks', 'postings', 'term_stats',
                             'corpus_stats', 'grants', 'tokens', 'audit']
    LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY admin_all ON %I TO kdbl_admin USING (true) WITH CHECK (true)', t);
    END LOOP;
END
$$;

-- API: the tenant of the principal; content only where the source ACL or a grant allows.
CREATE POLICY api_read ON tenants FOR SELECT TO kdbl_api USING (id = kdbl_tenant());
CREATE POLICY api_read ON sources FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant()
           AND (acl_mode = 'tenant'
                OR id IN (SELECT g.source_id FROM grants g WHERE g.subject = ANY (kdbl_subjects()))));
CREATE POLICY api_read ON grants FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant() AND subject = ANY (kdbl_subjects()));
CREATE POLICY api_read ON files FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant()
           AND (source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id))
                OR (source_id, key) IN (SELECT g.source_id, g.file_key FROM grants g
                                         WHERE g.file_key IS NOT NULL
                                           AND g.subject = ANY (kdbl_subjects()))));
CREATE POLICY api_read ON chunks FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant()
           AND (source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id))
                OR file_id IN (SELECT gf.id FROM kdbl_granted_files() AS gf(id))));
CREATE POLICY api_read ON postings FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant()
           AND (source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id))
                OR file_id IN (SELECT gf.id FROM kdbl_granted_files() AS gf(id))));
CREATE POLICY api_read ON term_stats FOR SELECT TO kdbl_api USING (tenant_id = kdbl_tenant());
CREATE POLICY api_read ON corpus_stats FOR SELECT TO kdbl_api USING (tenant_id = kdbl_tenant());
CREATE POLICY api_append ON audit FOR INSERT TO kdbl_api WITH CHECK (tenant_id = kdbl_tenant());

-- Worker: configuration of every tenant (it crawls them all), content of one tenant per transaction.
CREATE POLICY worker_read ON tenants FOR SELECT TO kdbl_worker USING (true);
CREATE POLICY worker_read ON sources FOR SELECT TO kdbl_worker USING (true);
CREATE POLICY worker_mark ON sources FOR UPDATE TO kdbl_worker USING (true) WITH CHECK (true);
DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['files', 'chunks', 'postings', 'term_stats', 'corpus_stats']
    LOOP
        EXECUTE format('CREATE POLICY worker_tenant ON %I TO kdbl_worker '
                       'USING (tenant_id = kdbl_tenant()) WITH CHECK (tenant_id = kdbl_tenant())', t);
    END LOOP;
END
$$;
