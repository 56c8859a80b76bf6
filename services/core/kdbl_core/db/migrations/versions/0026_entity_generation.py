"""index_generations.entity_generation: entities read move a state of their own (issue 31, search mode graph).

The worker reads a file's entities in a background stage, after its chunks were written (migration 0025): the
mentions change while no chunk does, so neither `generation` nor `vector_generation` moves. A search served
in mode `graph` ranks by mentions, so a result cached or a cursor cut before the stage read a file would be
one a fresh query no longer gives. Now mentions inserted or deleted take a fresh generation from the one
sequence, in a column of their own: lexical, semantic and hybrid results, which no mention changes, keep
theirs (kdbl_core.search.cache.INDEX_STATE: the fourth number, read by graph searches alone). And the
stage's mark on the file (`files.entities_version`) no longer moves the content generation, as a change of
`seen_at` alone never did: reading entities staled every lexical result and cursor of the source.

The entity extractor's version 2 also reads an e-mail's recipients (the To and Cc display names) and no longer
runs a name across a blank line or a heading's end ("# Acquisitions" above "Acme Corp. acquired ..." made one
organisation "Acquisitions Acme Corp."): every file read waits to be read again.

Same rows, shards and primary key as 0014/0018; one statement-level trigger per insert, update and delete.

Revision ID: 0026
Revises: 0025
"""

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

_CHANGED = """CREATE OR REPLACE FUNCTION kdbl_bump_changed_sources() RETURNS trigger
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
    ELSE  -- chunks: a vector filled or replaced moves the vector generation, any other change the content's
        PERFORM kdbl_bump_vector_generation(d.tenant_id, d.source_id)
           FROM (SELECT DISTINCT n.tenant_id, n.source_id FROM new_rows n JOIN old_rows o ON o.id = n.id
                  WHERE (n.embedding, n.embedding_model) IS DISTINCT FROM (o.embedding, o.embedding_model)) d;
        PERFORM kdbl_bump_generation(d.tenant_id, d.source_id)
           FROM (SELECT DISTINCT n.tenant_id, n.source_id FROM new_rows n JOIN old_rows o ON o.id = n.id
                  WHERE (to_jsonb(n) - 'embedding' - 'embedding_model')
                        IS DISTINCT FROM (to_jsonb(o) - 'embedding' - 'embedding_model')) d;
    END IF;
    RETURN NULL;
END $$;"""

# the files branch: a change of seen_at (an unchanged file re-crawled) or of entities_version (its entities
# read: the mentions move the entity generation) alone is none
_FILES_BEFORE = """    ELSIF TG_TABLE_NAME = 'files' THEN  -- a change of seen_at alone (an unchanged file re-crawled) is none
        PERFORM kdbl_bump_generation(d.tenant_id, d.source_id)
           FROM (SELECT DISTINCT n.tenant_id, n.source_id FROM new_rows n JOIN old_rows o ON o.id = n.id
                  WHERE (to_jsonb(n) - 'seen_at') IS DISTINCT FROM (to_jsonb(o) - 'seen_at')) d;"""
_FILES_AFTER = """    ELSIF TG_TABLE_NAME = 'files' THEN
        PERFORM kdbl_bump_generation(d.tenant_id, d.source_id)
           FROM (SELECT DISTINCT n.tenant_id, n.source_id FROM new_rows n JOIN old_rows o ON o.id = n.id
                  WHERE (to_jsonb(n) - 'seen_at' - 'entities_version')
                        IS DISTINCT FROM (to_jsonb(o) - 'seen_at' - 'entities_version')) d;"""
assert _FILES_BEFORE in _CHANGED
_FILES_IGNORE_ENTITIES = _CHANGED.replace(_FILES_BEFORE, _FILES_AFTER)

_UP = f"""
ALTER TABLE index_generations ADD COLUMN entity_generation bigint NOT NULL DEFAULT 0;
{_FILES_IGNORE_ENTITIES}

CREATE FUNCTION kdbl_bump_entity_generation(t uuid, s uuid) RETURNS void
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public
    AS $$ INSERT INTO index_generations (tenant_id, scope, shard, generation, entity_generation)
          VALUES (t, s, CAST(pg_backend_pid() % 16 AS smallint), 0, nextval('index_generation_seq'))
          ON CONFLICT (tenant_id, scope, shard) DO UPDATE SET entity_generation = EXCLUDED.entity_generation $$;
REVOKE ALL ON FUNCTION kdbl_bump_entity_generation(uuid, uuid) FROM PUBLIC;

CREATE FUNCTION kdbl_bump_entity_sources() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public
    AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM kdbl_bump_entity_generation(d.tenant_id, d.source_id)
           FROM (SELECT DISTINCT tenant_id, source_id FROM old_rows) d;
    ELSE
        PERFORM kdbl_bump_entity_generation(d.tenant_id, d.source_id)
           FROM (SELECT DISTINCT tenant_id, source_id FROM new_rows) d;
    END IF;
    RETURN NULL;
END $$;
-- entity extractor 2 (kdbl_core.content.entity_store.VERSION) reads e-mails' recipients and ends names at blank
-- lines and headings: every file it read waits to be read again
UPDATE files SET entities_version = NULL WHERE entities_version IS NOT NULL;

CREATE TRIGGER entity_mentions_generation_ins AFTER INSERT ON entity_mentions REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kdbl_bump_entity_sources();
CREATE TRIGGER entity_mentions_generation_upd AFTER UPDATE ON entity_mentions REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kdbl_bump_entity_sources();  -- a mention's count read again
CREATE TRIGGER entity_mentions_generation_del AFTER DELETE ON entity_mentions REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kdbl_bump_entity_sources();
"""

_DOWN = _CHANGED + """
DROP TRIGGER entity_mentions_generation_del ON entity_mentions;
DROP TRIGGER entity_mentions_generation_upd ON entity_mentions;
DROP TRIGGER entity_mentions_generation_ins ON entity_mentions;
DROP FUNCTION kdbl_bump_entity_sources();
DROP FUNCTION kdbl_bump_entity_generation(uuid, uuid);
ALTER TABLE index_generations DROP COLUMN entity_generation;
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_UP)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_DOWN)
