-- Installation-wide embedding progress as of migration 0004 (0006 replaces it with source_stats totals).
CREATE OR REPLACE FUNCTION kdbl_embedding_progress()
    RETURNS TABLE (hybrid_chunks bigint, embedded_chunks bigint)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
        SELECT count(*), count(c.embedding)
          FROM public.chunks c
          JOIN public.sources s ON s.id = c.source_id
          JOIN public.tenants t ON t.id = c.tenant_id
         WHERE s.hybrid_enabled AND t.hybrid_enabled
    $$;
REVOKE ALL ON FUNCTION kdbl_embedding_progress() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION kdbl_embedding_progress() TO kdbl_api, kdbl_admin;
