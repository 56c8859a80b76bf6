"""chunks.embedding as `halfvec`: half the bytes a vector, in the table and in its HNSW indexes (issue 29).

A 384-dimension `vector` is 1,544 bytes (4 a dimension and a header); as pgvector's `halfvec` (IEEE half
precision, 2 a dimension) 776. Sentence-embedding models are trained and compared in 16-bit precision
anyway, and a cosine over half-precision components moves by ~1e-3 at most; on SciFact hybrid nDCG@10
moved by less than the issue's 0.002 bound (docs/benchmarks.md). The HNSW graph's vectors halve with the
heap's, so more of the graph stays in shared buffers at the same memory (issue 29: the 1M hybrid p50).

- The per-dimension HNSW indexes are dropped, the column converted in place (`ALTER ... TYPE halfvec USING
  embedding::halfvec`: one rewrite of `chunks`, its other indexes rebuilt with it — a few minutes at 1M
  chunks, under an ACCESS EXCLUSIVE lock: plan it like any schema upgrade; every vector is kept, nothing
  is re-embedded), `kdbl_ensure_vector_index(D)` redefined to build `USING hnsw ((embedding::halfvec(D))
  halfvec_cosine_ops)`, and the index of every dimension present built again (maintenance_work_mem as the
  server has it; `kdbl-control db compact` does not touch them).
- halfvec's HNSW takes up to 4,000 dimensions (vector's: 2,000), so the dimension check follows.
- The worker still sends `vector` values (pgvector's binary `Vector`): the assignment cast converts them;
  the queries cast the query vector to `halfvec(D)`, as the index's expression needs.

Needs pgvector 0.7 or later (halfvec); the embedded server, the app image and the chart's PostgreSQL ship
0.8. Downgrade converts back to `vector` (the half-precision values, widened) and restores the function.

Revision ID: 0020
Revises: 0019
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_DROP_HNSW = r"""
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT c.relname FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
              WHERE i.indrelid = 'public.chunks'::regclass AND c.relname ~ '^chunks_embedding_[0-9]+_hnsw$'
    LOOP
        EXECUTE format('DROP INDEX public.%I', r.relname);
    END LOOP;
END
$$;
"""

_ENSURE = r"""
CREATE OR REPLACE FUNCTION kdbl_ensure_vector_index(p_dim integer) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
DECLARE
    name text := format('chunks_embedding_%s_hnsw', p_dim);
BEGIN
    IF p_dim < 1 OR p_dim > {max_dim} THEN
        RAISE EXCEPTION 'embedding dimension % out of range (1 to {max_dim})', p_dim;
    END IF;
    IF to_regclass('public.' || name) IS NULL THEN
        EXECUTE format('CREATE INDEX %I ON public.chunks USING hnsw ((embedding::{kind}(%s)) {kind}_cosine_ops) '
                       'WHERE vector_dims(embedding) = %s', name, p_dim, p_dim);
    END IF;
    RETURN name;
END
$$;
"""

# The dimensions first, then one index each: CREATE INDEX cannot run while a scan of chunks is open.
_REBUILD = """
DO $$
DECLARE dims integer[];
        d integer;
BEGIN
    SELECT coalesce(array_agg(DISTINCT vector_dims(embedding)), '{}') INTO dims
      FROM chunks WHERE embedding IS NOT NULL;
    FOREACH d IN ARRAY dims LOOP
        PERFORM kdbl_ensure_vector_index(d);
    END LOOP;
END
$$;
"""


def upgrade() -> None:
    op.execute(_DROP_HNSW)
    op.execute("ALTER TABLE chunks ALTER COLUMN embedding TYPE halfvec USING embedding::halfvec")
    op.execute(_ENSURE.format(max_dim=4000, kind="halfvec"))
    op.execute(_REBUILD)


def downgrade() -> None:
    op.execute(_DROP_HNSW)
    op.execute("ALTER TABLE chunks ALTER COLUMN embedding TYPE vector USING embedding::vector")
    op.execute(_ENSURE.format(max_dim=16000, kind="vector"))
    op.execute(_REBUILD)
