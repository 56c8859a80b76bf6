"""index_generations.vector_generation: vectors written move a state of their own (issue 28).

Migration 0014 bumped one generation per source for everything: a file written and a chunk's vector
filled alike. While a source was embedded (~15 chunks/s on two cores, for hours on a large source) every
search's state moved with each vector, so lexical results, which no vector can change, missed the cache
and their cursors went stale within seconds. Now a row holds two generations, both from the one
sequence:

- `generation`: the content (a file written, re-indexed or deleted; a chunk changed in anything but its
  vector) and, on the tenant's own row, grants, sources and policy, as before;
- `vector_generation`: a chunk's embedding or embedding_model changed.

An UPDATE of chunks that changes the vector and something else bumps both. The search reads which ones
its mode depends on (kdbl_core.search.cache.INDEX_STATE): lexical the content of every source the
principal sees (BM25 statistics span them all), semantic the content and vectors of the sources it
filters to, hybrid both. Same rows, same shards, same primary key: no new hot row, one index range scan.

Revision ID: 0018
Revises: 0017
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_UP = """
ALTER TABLE index_generations ADD COLUMN vector_generation bigint NOT NULL DEFAULT 0;

CREATE FUNCTION kdbl_bump_vector_generation(t uuid, s uuid) RETURNS void
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public
    AS $$ INSERT INTO index_generations (tenant_id, scope, shard, generation, vector_generation)
          VALUES (t, s, CAST(pg_backend_pid() % 16 AS smallint), 0, nextval('index_generation_seq'))
          ON CONFLICT (tenant_id, scope, shard) DO UPDATE SET vector_generation = EXCLUDED.vector_generation $$;
REVOKE ALL ON FUNCTION kdbl_bump_vector_generation(uuid, uuid) FROM PUBLIC;

CREATE OR REPLACE FUNCTION kdbl_bump_changed_sources() RETURNS trigger
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
END $$;
DROP TRIGGER chunks_generation_upd ON chunks;
CREATE TRIGGER chunks_generation_upd AFTER UPDATE ON chunks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kdbl_bump_changed_sources();
"""

_DOWN = """
DROP TRIGGER chunks_generation_upd ON chunks;
CREATE TRIGGER chunks_generation_upd AFTER UPDATE ON chunks REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION kdbl_bump_changed_sources();
CREATE OR REPLACE FUNCTION kdbl_bump_changed_sources() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public
    AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM kdbl_bump_generation(d.tenant_id, d.source_id)
           FROM (SELECT DISTINCT tenant_id, source_id FROM old_rows) d;
    ELSIF TG_OP = 'INSERT' THEN
        PERFORM kdbl_bump_generation(d.tenant_id, d.source_id)
           FROM (SELECT DISTINCT tenant_id, source_id FROM new_rows) d;
    ELSIF TG_TABLE_NAME = 'files' THEN
        PERFORM kdbl_bump_generation(d.tenant_id, d.source_id)
           FROM (SELECT DISTINCT n.tenant_id, n.source_id FROM new_rows n JOIN old_rows o ON o.id = n.id
                  WHERE (to_jsonb(n) - 'seen_at') IS DISTINCT FROM (to_jsonb(o) - 'seen_at')) d;
    ELSE
        PERFORM kdbl_bump_generation(d.tenant_id, d.source_id)
           FROM (SELECT DISTINCT tenant_id, source_id FROM new_rows) d;
    END IF;
    RETURN NULL;
END $$;
DROP FUNCTION IF EXISTS kdbl_bump_vector_generation(uuid, uuid);
-- what vectors moved stays visible to the old readers, which read `generation` alone
UPDATE index_generations SET generation = greatest(generation, vector_generation);
ALTER TABLE index_generations DROP COLUMN vector_generation;
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_UP)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_DOWN)
