"""embedding_rate: how fast each embedder is filling a tenant's vectors, for an ETA (issue 29).

Embedding runs behind the crawl (~20 chunks/s on two cores: hours for a large share), so users ask how
long hybrid search stays partial. Each embedding process keeps one row per (tenant, model, holder): its
recent rate (chunks a second, an exponential average over its batches) and when it last wrote one.
`list_sources`, `/capacity` and `kdbl-control up` sum the rates of the rows written in the last two
minutes (several workers embed side by side) and divide what is pending by it. A worker that stopped
drops out of the sum by age; its row is removed by the next writer after a day.

Revision ID: 0022
Revises: 0021
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

_UP = """
CREATE TABLE embedding_rate (
    tenant_id     uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    model         text NOT NULL,
    holder        text NOT NULL,              -- the embedding process (host and pid)
    chunks_per_s  double precision NOT NULL,  -- its recent rate
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, model, holder)
);
ALTER TABLE embedding_rate ENABLE ROW LEVEL SECURITY;
ALTER TABLE embedding_rate FORCE ROW LEVEL SECURITY;
CREATE POLICY admin_all ON embedding_rate TO kdbl_admin USING (true) WITH CHECK (true);
CREATE POLICY api_read ON embedding_rate FOR SELECT TO kdbl_api USING (tenant_id = kdbl_tenant());
CREATE POLICY worker_tenant ON embedding_rate TO kdbl_worker
    USING (tenant_id = kdbl_tenant()) WITH CHECK (tenant_id = kdbl_tenant());
GRANT SELECT, INSERT, UPDATE, DELETE ON embedding_rate TO kdbl_admin, kdbl_worker;
GRANT SELECT ON embedding_rate TO kdbl_api;
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_UP)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute("DROP TABLE IF EXISTS embedding_rate")
