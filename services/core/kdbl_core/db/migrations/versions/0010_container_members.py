"""files.parent_id: archive members and attachments as child files (../sql/0010_container_members.sql).

Revision ID: 0010
Revises: 0009
"""

from pathlib import Path

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_SQL = Path(__file__).resolve().parent.parent / "sql" / "0010_container_members.sql"


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_SQL.read_text())


def downgrade() -> None:
    # Member rows stay as plain files (their statistics stay exact); the next listing of their source
    # no longer lists their keys and deletes them like any vanished file.
    op.get_bind().connection.driver_connection.execute("""
        DROP POLICY api_read ON files;
        CREATE POLICY api_read ON files FOR SELECT TO kdbl_api
            USING (tenant_id = kdbl_tenant()
                   AND (source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id))
                        OR (source_id, key) IN (SELECT g.source_id, g.file_key FROM grants g
                                                 WHERE g.file_key IS NOT NULL
                                                   AND g.subject = ANY (kdbl_subjects()))));
        CREATE OR REPLACE FUNCTION kdbl_granted_files() RETURNS SETOF bigint
            LANGUAGE sql STABLE
            AS $$
                SELECT f.id FROM files f
                  JOIN grants g ON g.source_id = f.source_id AND g.file_key = f.key
                 WHERE g.tenant_id = kdbl_tenant() AND g.subject = ANY (kdbl_subjects())
            $$;
        DROP FUNCTION IF EXISTS kdbl_granted_members();
        DROP INDEX IF EXISTS files_parent_idx;
        ALTER TABLE files DROP COLUMN IF EXISTS parent_id;
    """)
