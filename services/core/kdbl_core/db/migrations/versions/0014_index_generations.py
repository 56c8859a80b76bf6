"""index_generations: the index state a search result or a search cursor was cut from (issue 16).

Any change that can alter what a search returns bumps a generation: a file written, re-indexed or
deleted and chunk vectors filled bump their source's; a grant added or revoked, a source created,
deleted or switched (acl_mode, hybrid_enabled, enabled) and a tenant's policy (settings, hybrid_enabled)
bump the tenant's own row (scope = the tenant id). Every bump takes nextval() of one sequence, so the
largest generation over the rows a query depends on (its source, or all the tenant's sources, plus the
tenant row) changes whenever anything it depends on changed and never returns to an earlier value. The
API reads it in one statement (kdbl_core.search.cache.read_index_state) and puts it in the result
cache's key and in search cursors.

No hot row: a source's writers upsert (tenant, source, pg_backend_pid() % 16), as the BM25 statistics
do (0006/0007), so concurrent file writers of one source rarely touch the same row, and nextval() takes
no row lock. The file and chunk triggers are per statement over transition tables (one upsert per
source a statement touched, not per row); an UPDATE of files that changes only seen_at (a re-crawl
that finds the file unchanged) bumps nothing.

No foreign keys: a cascade deleting a source or a tenant fires the file triggers after the parent row
is gone, and an insert referencing it would fail the delete; the rows of a deleted source stay (a few
bytes each, never read again for a filter on it; the tenant row's bump covers the deletion).

Trigger functions are SECURITY DEFINER (the table is ENABLEd for row security, not FORCEd: the owner
writes it, kdbl_api reads its tenant's rows, nobody else sees it).

Revision ID: 0014
Revises: 0013
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_UP = """
CREATE SEQUENCE index_generation_seq;
CREATE TABLE index_generations (
    tenant_id   uuid NOT NULL,
    scope       uuid NOT NULL,          -- a source id, or the tenant id for tenant-wide changes
    shard       smallint NOT NULL,
    generation  bigint NOT NULL,
    PRIMARY KEY (tenant_id, scope, shard)
);
ALTER TABLE index_generations ENABLE ROW LEVEL SECURITY;
CREATE POLICY api_read ON index_generations FOR SELECT TO kdbl_api USING (tenant_id = kdbl_tenant());
CREATE POLICY admin_all ON index_generations TO kdbl_admin USING (true) WITH CHECK (true);
GRANT SELECT ON index_generations TO kdbl_api;
GRANT SELECT ON index_generations TO kdbl_admin;

CREATE FUNCTION kdbl_bump_generation(t uuid, s uuid) RETURNS void
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public
    AS $$ INSERT INTO index_generations (tenant_id, scope, shard, generation)
          VALUES (t, s, CAST(pg_backend_pid() % 16 AS smallint), nextval('index_generation_seq'))
          ON CONFLICT (tenant_id, scope, shard) DO UPDATE SET generation = EXCLUDED.generation $$;
REVOKE ALL ON FUNCTION kdbl_bump_generation(uuid, uuid) FROM PUBLIC;

-- files and chunks, per statement: one bump per source the statement touched
CREATE FUNCTION kdbl_bump_changed_sources() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public
    AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM kdbl_bump_generation(d.tenant_id, d.source_id)
           FROM (SELECT DISTINCT tenant_id, source_id FROM old_rows) d;
    ELSIF TG_OP = 'INSERT' THEN
        PERFORM kdbl_bump_generation(d.tenant_id, d.source_id)
           FROM (SELECT DISTINCT tenant_id, source_id FROM new_rows) d;
    ELSIF TG_TABLE_NAME = 'files' THEN  -- a change of seen_at alone (an unchanged file re-crawled) is none
        PERFORM kdbl_bump_generation(d.tenant_id, d.source_id)
           FROM (SELECT DISTINCT n.tenant_id, n.source_id FROM new_rows n JOIN old_rows o ON o.id = n.id
                  WHERE (to_jsonb(n) - 'seen_at') IS DISTINCT FROM (to_jsonb(o) - 'seen_at')) d;
    ELSE  -- chunks: vectors filled or replaced
        PERFORM kdbl_bump_generation(d.tenant_id, d.source_id)
           FROM (SELECT DISTINCT tenant_id, source_id FROM new_rows) d;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER files_generation_ins AFTER INSERT ON files REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kdbl_bump_changed_sources();
CREATE TRIGGER files_generation_upd AFTER UPDATE ON files REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kdbl_bump_changed_sources();
CREATE TRIGGER files_generation_del AFTER DELETE ON files REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kdbl_bump_changed_sources();
CREATE TRIGGER chunks_generation_upd AFTER UPDATE ON chunks REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kdbl_bump_changed_sources();

-- grants, sources, tenants: who sees what, and the tenant's policy (rare: one bump per row)
CREATE FUNCTION kdbl_bump_tenant_generation() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public
    AS $$
DECLARE t uuid;
BEGIN
    IF TG_TABLE_NAME = 'tenants' THEN
        t := NEW.id;
    ELSIF TG_OP = 'DELETE' THEN
        t := OLD.tenant_id;
    ELSE
        t := NEW.tenant_id;
    END IF;
    PERFORM kdbl_bump_generation(t, t);
    RETURN NULL;
END $$;
CREATE TRIGGER grants_generation AFTER INSERT OR UPDATE OR DELETE ON grants
    FOR EACH ROW EXECUTE FUNCTION kdbl_bump_tenant_generation();
CREATE TRIGGER sources_generation AFTER INSERT OR DELETE ON sources
    FOR EACH ROW EXECUTE FUNCTION kdbl_bump_tenant_generation();
CREATE TRIGGER sources_generation_upd AFTER UPDATE ON sources FOR EACH ROW
    WHEN ((OLD.acl_mode, OLD.hybrid_enabled, OLD.enabled)
          IS DISTINCT FROM (NEW.acl_mode, NEW.hybrid_enabled, NEW.enabled))
    EXECUTE FUNCTION kdbl_bump_tenant_generation();
CREATE TRIGGER tenants_generation AFTER UPDATE ON tenants FOR EACH ROW
    WHEN ((OLD.settings, OLD.hybrid_enabled) IS DISTINCT FROM (NEW.settings, NEW.hybrid_enabled))
    EXECUTE FUNCTION kdbl_bump_tenant_generation();
"""

_DOWN = """
DROP TRIGGER IF EXISTS tenants_generation ON tenants;
DROP TRIGGER IF EXISTS sources_generation_upd ON sources;
DROP TRIGGER IF EXISTS sources_generation ON sources;
DROP TRIGGER IF EXISTS grants_generation ON grants;
DROP TRIGGER IF EXISTS chunks_generation_upd ON chunks;
DROP TRIGGER IF EXISTS files_generation_del ON files;
DROP TRIGGER IF EXISTS files_generation_upd ON files;
DROP TRIGGER IF EXISTS files_generation_ins ON files;
DROP FUNCTION IF EXISTS kdbl_bump_tenant_generation();
DROP FUNCTION IF EXISTS kdbl_bump_changed_sources();
DROP FUNCTION IF EXISTS kdbl_bump_generation(uuid, uuid);
DROP TABLE IF EXISTS index_generations;
DROP SEQUENCE IF EXISTS index_generation_seq;
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_UP)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_DOWN)
