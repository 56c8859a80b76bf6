"""Named entities of the indexed text (issue 31): entities and their mentions, trimmed by row-level security.

`entities` holds one row per (tenant, type, canonical name) (kdbl_core.content.entities.canonical_key:
"Acme Corp." and "ACME Corporation" are one); `entity_mentions` says which chunk names which entity, by
(file, seq): a chunk keeps that pair when the share's permissions move it to new ids (migration 0024), so
mentions never follow ids. A mention is readable exactly when its chunk is (the chunks' policy: the source
seen whole, a grant naming the file, or its permission set); an entity is readable when one of its mentions
is — an entity named only in files the caller cannot read does not exist for it, and every count and type
distribution is a count of readable mentions.

The worker extracts entities in a background stage (kdbl_worker.entity_stage) for sources whose config says
`entities: true`; `files.entities_version` records which extractor read the file (NULL: not yet, or indexed
again since: the write path clears it and drops the file's mentions with its chunks).

Revision ID: 0025
Revises: 0024
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

_READABLE = """tenant_id = kdbl_tenant()
           AND source_id IN (SELECT s.id FROM sources s WHERE s.tenant_id = kdbl_tenant()
                                AND coalesce((s.config ->> 'entities')::boolean, false))
           AND (source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id))
                OR file_id IN (SELECT gf.id FROM kdbl_grant_files() AS gf(id))
                OR (source_id IN (SELECT ss.id FROM kdbl_share_sources() AS ss(id))
                    AND EXISTS (SELECT 1 FROM files f WHERE f.id = {table}.file_id
                                   AND f.permission_set IN (SELECT rs.id FROM kdbl_readable_sets() AS rs(id)))))"""

_UP = f"""
ALTER TABLE files ADD COLUMN entities_version smallint;
-- the files whose entities were read: what a source switched off still has to forget
CREATE INDEX files_entities_read_idx ON files (source_id) WHERE entities_version IS NOT NULL;
-- the files waiting for it, per source (an extractor that finds other entities sets them all back to NULL)
CREATE INDEX files_entities_pending_idx ON files (source_id, id) WHERE entities_version IS NULL AND chunk_count > 0;

CREATE TABLE entities (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    type        text NOT NULL CHECK (type IN ('PERSON', 'ORG', 'PLACE', 'PRODUCT', 'EVENT', 'DATE', 'MONEY')),
    key         text NOT NULL,
    name        text NOT NULL,
    UNIQUE (tenant_id, type, key)
);
CREATE INDEX entities_tenant_key_idx ON entities (tenant_id, key text_pattern_ops);

CREATE TABLE entity_mentions (
    tenant_id   uuid NOT NULL,
    entity_id   bigint NOT NULL REFERENCES entities (id) ON DELETE CASCADE,
    file_id     bigint NOT NULL REFERENCES files (id) ON DELETE CASCADE,
    seq         integer NOT NULL,
    source_id   uuid NOT NULL,
    n           smallint NOT NULL,
    PRIMARY KEY (file_id, seq, entity_id)
);
CREATE INDEX entity_mentions_entity_idx ON entity_mentions (entity_id, file_id, seq);

-- typed relations a sentence states ("Acme acquired Initech"): kdbl_core.content.entity_relations
CREATE TABLE entity_relations (
    tenant_id   uuid NOT NULL,
    subject_id  bigint NOT NULL REFERENCES entities (id) ON DELETE CASCADE,
    object_id   bigint NOT NULL REFERENCES entities (id) ON DELETE CASCADE,
    type        text NOT NULL,
    file_id     bigint NOT NULL REFERENCES files (id) ON DELETE CASCADE,
    seq         integer NOT NULL,
    source_id   uuid NOT NULL,
    PRIMARY KEY (file_id, seq, subject_id, object_id, type)
);
CREATE INDEX entity_relations_subject_idx ON entity_relations (subject_id);
-- an administrator's corrections (kdbl-control entity alias | block): a name read as another, a name dropped
CREATE TABLE entity_rules (
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    kind        text NOT NULL CHECK (kind IN ('alias', 'block')),
    key         text NOT NULL,
    target_key  text,
    target_name text,
    PRIMARY KEY (tenant_id, key),
    CHECK ((kind = 'alias') = (target_key IS NOT NULL))
);
CREATE INDEX entity_relations_object_idx ON entity_relations (object_id);

DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['entities', 'entity_mentions', 'entity_relations', 'entity_rules']
    LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY admin_all ON %I TO kdbl_admin USING (true) WITH CHECK (true)', t);
        EXECUTE format('CREATE POLICY worker_tenant ON %I TO kdbl_worker '
                       'USING (tenant_id = kdbl_tenant()) WITH CHECK (tenant_id = kdbl_tenant())', t);
    END LOOP;
END
$$;
-- a mention or a relation is readable as its chunk is (migration 0024's policy on chunks, for its file),
-- while its source has entities on (switched off, they are gone at once; the worker deletes them later)
CREATE POLICY api_read ON entity_mentions FOR SELECT TO kdbl_api USING ({_READABLE.format(table="entity_mentions")});
CREATE POLICY api_read ON entity_relations FOR SELECT TO kdbl_api USING ({_READABLE.format(table="entity_relations")});
-- an entity exists for the caller when one of its mentions is readable
CREATE POLICY api_read ON entities FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant()
           AND EXISTS (SELECT 1 FROM entity_mentions m WHERE m.entity_id = entities.id));
GRANT SELECT ON entities, entity_mentions, entity_relations TO kdbl_api;
GRANT SELECT, INSERT, UPDATE, DELETE ON entities, entity_mentions, entity_relations TO kdbl_worker, kdbl_admin;
GRANT SELECT ON entity_rules TO kdbl_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON entity_rules TO kdbl_admin;
"""

_DOWN = """
DROP TABLE entity_rules;
DROP TABLE entity_relations;
DROP POLICY api_read ON entities;
DROP TABLE entity_mentions;
DROP TABLE entities;
ALTER TABLE files DROP COLUMN entities_version;
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_UP)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_DOWN)
