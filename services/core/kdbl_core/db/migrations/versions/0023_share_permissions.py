"""Permissions from the share (issue 30): a source's files readable as the share's own permissions say.

`sources.acl_mode` gains 'source' (CLI `--permissions from-source`; 'tenant' and 'restricted' as before:
`tenant`, `grants`). Each file of such a source points at a *permission set* (`files.permission_set`): the
rules of kdbl_core.access.share_acl (checks of ordered (subject, allow) entries, every check must pass; the
first entry matching one of the caller's subjects, or '*', decides a check), deduplicated per tenant by
digest, so a share of a million files with a few hundred distinct permissions has a few hundred sets.

Row-level security: a file is readable when its source is seen whole, when a grant names it, or when its
permission set allows the caller (`kdbl_readable_sets()`, SECURITY DEFINER: the API role has no privilege
on the sets themselves, so the rules — who may read what — are never readable through it). Such files
join `kdbl_granted_files()`, so chunks, postings, counts and the granted files' statistics (the search's
`gf` arm, from the chunks' own terms) follow without another path. `permission_changes` records each change
the crawl takes from the share (which file, before and after, which job).

Revision ID: 0023
Revises: 0022
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

_UP = """
ALTER TABLE sources DROP CONSTRAINT sources_acl_mode_check;
ALTER TABLE sources ADD CONSTRAINT sources_acl_mode_check CHECK (acl_mode IN ('tenant', 'restricted', 'source'));
-- uid:N / gid:N / SID -> user:NAME, group:NAME or '*' (kdbl_core.access.share_acl.PrincipalMap)
ALTER TABLE sources ADD COLUMN permission_map jsonb NOT NULL DEFAULT '{}'::jsonb;

CREATE TABLE permission_sets (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    digest      text NOT NULL,
    rules       jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, digest)
);
ALTER TABLE files ADD COLUMN permission_set bigint REFERENCES permission_sets (id);
CREATE INDEX files_permission_set_idx ON files (permission_set) WHERE permission_set IS NOT NULL;
ALTER TABLE crawl_items ADD COLUMN permission_set bigint;

CREATE TABLE permission_changes (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    source_id   uuid NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    job_id      bigint,
    file_key    text NOT NULL,
    before_set  bigint,
    after_set   bigint,
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX permission_changes_source_idx ON permission_changes (source_id, at);

DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['permission_sets', 'permission_changes']
    LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY admin_all ON %I TO kdbl_admin USING (true) WITH CHECK (true)', t);
        EXECUTE format('CREATE POLICY worker_tenant ON %I TO kdbl_worker '
                       'USING (tenant_id = kdbl_tenant()) WITH CHECK (tenant_id = kdbl_tenant())', t);
    END LOOP;
END
$$;
GRANT SELECT, INSERT, UPDATE, DELETE ON permission_sets, permission_changes TO kdbl_admin;
GRANT SELECT, INSERT ON permission_sets, permission_changes TO kdbl_worker;

-- Whether `subjects` pass every check of `rules` (kdbl_core.access.share_acl.allows is the same in Python).
CREATE FUNCTION kdbl_rules_allow(rules jsonb, subjects text[]) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
        SELECT NOT EXISTS (
            SELECT 1 FROM jsonb_array_elements(rules) AS c(chk)
             WHERE NOT coalesce((SELECT (e.v ->> 1)::boolean
                                   FROM jsonb_array_elements(c.chk) WITH ORDINALITY AS e(v, n)
                                  WHERE e.v ->> 0 = '*' OR e.v ->> 0 = ANY (subjects)
                                  ORDER BY e.n LIMIT 1), false))
    $$;

-- The permission sets of the principal's tenant that allow the principal.
CREATE FUNCTION kdbl_readable_sets() RETURNS SETOF bigint
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
        SELECT p.id FROM public.permission_sets p
         WHERE p.tenant_id = public.kdbl_tenant() AND public.kdbl_rules_allow(p.rules, public.kdbl_subjects())
    $$;
REVOKE ALL ON FUNCTION kdbl_readable_sets() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION kdbl_readable_sets() TO kdbl_api;

-- Whether the principal may read some file of `source` through the share's permissions (list_sources):
-- the first such file ends the search. Only a source in 'source' mode asks (the policy tests that first).
CREATE FUNCTION kdbl_share_readable(source uuid) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
        SELECT EXISTS (SELECT 1 FROM public.files f
                        WHERE f.source_id = source AND f.tenant_id = public.kdbl_tenant()
                          AND f.permission_set IN (SELECT rs.id FROM public.kdbl_readable_sets() AS rs(id)))
    $$;
REVOKE ALL ON FUNCTION kdbl_share_readable(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION kdbl_share_readable(uuid) TO kdbl_api;

-- The tenant's sources in 'source' mode, whether or not the principal reads any of their files now: the
-- search cache's index state counts them all (kdbl_core.search.cache), so a permission revoked on the share
-- moves the state of everyone who might hold a result cut before it.
CREATE FUNCTION kdbl_share_sources() RETURNS SETOF uuid
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
        SELECT s.id FROM public.sources s WHERE s.tenant_id = public.kdbl_tenant() AND s.acl_mode = 'source'
    $$;
REVOKE ALL ON FUNCTION kdbl_share_sources() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION kdbl_share_sources() TO kdbl_api;

CREATE OR REPLACE FUNCTION kdbl_granted_files() RETURNS SETOF bigint
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

DROP POLICY api_read ON files;
CREATE POLICY api_read ON files FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant()
           AND (source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id))
                OR (source_id, key) IN (SELECT g.source_id, g.file_key FROM grants g
                                         WHERE g.file_key IS NOT NULL
                                           AND g.subject = ANY (kdbl_subjects()))
                OR id IN (SELECT gm.id FROM kdbl_granted_members() AS gm(id))
                OR permission_set IN (SELECT rs.id FROM kdbl_readable_sets() AS rs(id))));

-- A source that stops taking its permissions from the share keeps none of them: its files' sets are cleared
-- in the statement that changes its mode, whoever changes it (kdbl-control, the operator, plain SQL).
CREATE FUNCTION kdbl_clear_share_permissions() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
    BEGIN
        UPDATE public.files SET permission_set = NULL WHERE source_id = NEW.id AND permission_set IS NOT NULL;
        RETURN NULL;
    END
    $$;
REVOKE ALL ON FUNCTION kdbl_clear_share_permissions() FROM PUBLIC;
CREATE TRIGGER sources_leave_share_permissions AFTER UPDATE OF acl_mode ON sources FOR EACH ROW
    WHEN (OLD.acl_mode = 'source' AND NEW.acl_mode <> 'source')
    EXECUTE FUNCTION kdbl_clear_share_permissions();

DROP POLICY api_read ON sources;
CREATE POLICY api_read ON sources FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant()
           AND (acl_mode = 'tenant'
                OR id IN (SELECT g.source_id FROM grants g WHERE g.subject = ANY (kdbl_subjects()))
                OR (acl_mode = 'source' AND kdbl_share_readable(id))));
"""

_DOWN = """
DROP TRIGGER sources_leave_share_permissions ON sources;
DROP FUNCTION kdbl_clear_share_permissions();
DROP POLICY api_read ON sources;
CREATE POLICY api_read ON sources FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant()
           AND (acl_mode = 'tenant'
                OR id IN (SELECT g.source_id FROM grants g WHERE g.subject = ANY (kdbl_subjects()))));
DROP POLICY api_read ON files;
CREATE POLICY api_read ON files FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant()
           AND (source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id))
                OR (source_id, key) IN (SELECT g.source_id, g.file_key FROM grants g
                                         WHERE g.file_key IS NOT NULL
                                           AND g.subject = ANY (kdbl_subjects()))
                OR id IN (SELECT gm.id FROM kdbl_granted_members() AS gm(id))));
CREATE OR REPLACE FUNCTION kdbl_granted_files() RETURNS SETOF bigint
    LANGUAGE sql STABLE
    AS $$
        SELECT f.id FROM files f
          JOIN grants g ON g.source_id = f.source_id AND g.file_key = f.key
         WHERE g.tenant_id = kdbl_tenant() AND g.subject = ANY (kdbl_subjects())
        UNION ALL
        SELECT m.id FROM kdbl_granted_members() AS m(id)
    $$;
DROP FUNCTION kdbl_share_readable(uuid);
DROP FUNCTION kdbl_share_sources();
DROP FUNCTION kdbl_readable_sets();
DROP FUNCTION kdbl_rules_allow(jsonb, text[]);
DROP TABLE permission_changes;
ALTER TABLE crawl_items DROP COLUMN permission_set;
ALTER TABLE files DROP COLUMN permission_set;
DROP TABLE permission_sets;
-- a source whose permissions came from the share keeps its files closed: grants only
UPDATE sources SET acl_mode = 'restricted' WHERE acl_mode = 'source';
ALTER TABLE sources DROP COLUMN permission_map;
ALTER TABLE sources DROP CONSTRAINT sources_acl_mode_check;
ALTER TABLE sources ADD CONSTRAINT sources_acl_mode_check CHECK (acl_mode IN ('tenant', 'restricted'));
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_UP)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_DOWN)
