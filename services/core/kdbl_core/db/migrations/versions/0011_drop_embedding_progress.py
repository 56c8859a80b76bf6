"""Drop kdbl_embedding_progress(): nothing has called it since /capacity and list_sources read the
per-tenant source_stats counters (issue 13); an installation-wide count was never shown to a tenant.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute("DROP FUNCTION IF EXISTS kdbl_embedding_progress()")


def downgrade() -> None:
    # 0006's body (totals from source_stats) with 0004's grants
    op.get_bind().connection.driver_connection.execute("""
        CREATE FUNCTION kdbl_embedding_progress()
            RETURNS TABLE (hybrid_chunks bigint, embedded_chunks bigint)
            LANGUAGE sql STABLE SECURITY DEFINER
            SET search_path = pg_catalog, public
            AS $$
                SELECT coalesce(sum(st.chunks) FILTER (WHERE st.model = ''), 0)::bigint,
                       coalesce(sum(st.chunks) FILTER (WHERE st.model <> ''), 0)::bigint
                  FROM public.source_stats st
                  JOIN public.sources s ON s.id = st.source_id
                  JOIN public.tenants t ON t.id = s.tenant_id
                 WHERE s.hybrid_enabled AND t.hybrid_enabled
            $$;
        REVOKE ALL ON FUNCTION kdbl_embedding_progress() FROM PUBLIC;
        GRANT EXECUTE ON FUNCTION kdbl_embedding_progress() TO kdbl_api, kdbl_admin;
    """)
