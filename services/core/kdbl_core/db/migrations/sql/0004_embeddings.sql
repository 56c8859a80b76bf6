-- Hybrid retrieval: which model produced each chunk's embedding, an HNSW index per embedding dimension,
-- and a progress figure for /capacity.
--
-- chunks.embedding stays an untyped `vector` so any GGUF embedding model can be dropped in. HNSW needs a
-- fixed dimension, so each dimension gets a partial expression index
--     USING hnsw ((embedding::vector(D)) vector_cosine_ops) WHERE vector_dims(embedding) = D
-- created on first use by the worker through kdbl_ensure_vector_index(D). A model change (new
-- embedding_model) makes the worker re-embed; queries only ever compare vectors of one model.

ALTER TABLE chunks ADD COLUMN embedding_model text;
CREATE INDEX chunks_embedding_pending_idx ON chunks (tenant_id, source_id, id) WHERE embedding IS NULL;

CREATE FUNCTION kdbl_ensure_vector_index(p_dim integer) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
DECLARE
    name text := format('chunks_embedding_%s_hnsw', p_dim);
BEGIN
    IF p_dim < 1 OR p_dim > 16000 THEN
        RAISE EXCEPTION 'embedding dimension % out of range', p_dim;
    END IF;
    IF to_regclass('public.' || name) IS NULL THEN
        EXECUTE format('CREATE INDEX %I ON public.chunks USING hnsw ((embedding::vector(%s)) vector_cosine_ops) '
                       'WHERE vector_dims(embedding) = %s', name, p_dim, p_dim);
    END IF;
    RETURN name;
END
$$;
REVOKE ALL ON FUNCTION kdbl_ensure_vector_index(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION kdbl_ensure_vector_index(integer) TO kdbl_worker, kdbl_admin;

-- Installation-wide counts only (no content, no tenant names): what /capacity may show unauthenticated.
-- kdbl_embedding_progress(): 0004_embedding_progress.sql (0006's downgrade restores it from there)
