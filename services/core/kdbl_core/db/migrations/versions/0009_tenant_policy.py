"""enforced tenant policy, shared rate-limit buckets, audit of refusals (issue 12 items 2-3) (see ../sql/0009_tenant_policy.sql).

Revision ID: 0009
Revises: 0008
"""

from pathlib import Path

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_SQL = Path(__file__).resolve().parent.parent / "sql" / "0009_tenant_policy.sql"


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_SQL.read_text())


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute("""
        DROP INDEX IF EXISTS audit_status_ts_idx;
        DROP FUNCTION IF EXISTS kdbl_token_set_fingerprint(text, bytea);
        DROP FUNCTION IF EXISTS kdbl_token_lookup(text);
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
        ALTER TABLE tokens DROP COLUMN IF EXISTS fingerprint;
        DROP FUNCTION IF EXISTS kdbl_token_state(uuid);
        DROP FUNCTION IF EXISTS kdbl_tenant_settings(uuid);
        DROP FUNCTION IF EXISTS kdbl_rate_peek(text[], double precision[], double precision[]);
        DROP FUNCTION IF EXISTS kdbl_rate_take(text[], double precision[], double precision[]);
        DROP TABLE IF EXISTS rate_buckets;
    """)
