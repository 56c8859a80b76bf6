"""files.authors and files.labels: who wrote a document (its own properties: PDF /Author, Office and
EPUB dc:creator, an e-mail's From name and address, HTML <meta name="author">) and the labels its source
gives it (config `labels`, `label_globs`, Markdown front matter `tags`); search filters by either (issue 16).

Both are text[] NOT NULL DEFAULT '{}' (adding a column with a constant default rewrites nothing, so the
migration is instant on a large files table). `labels` gets a GIN index, partial on non-empty arrays (most
files have none, the index stays small): the labels filter is `labels && $1`, which the index answers. The
authors filter matches case-insensitively (lower() of each stored name), which a plain GIN index cannot
serve; it runs inside the files subquery already narrowed by tenant and the other filters, no index.

Revision ID: 0013
Revises: 0012
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute("""
        ALTER TABLE files ADD COLUMN authors text[] NOT NULL DEFAULT '{}'::text[],
                          ADD COLUMN labels text[] NOT NULL DEFAULT '{}'::text[];
        CREATE INDEX files_labels_idx ON files USING gin (labels) WHERE labels <> '{}'::text[];
    """)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute("""
        DROP INDEX IF EXISTS files_labels_idx;
        ALTER TABLE files DROP COLUMN IF EXISTS labels, DROP COLUMN IF EXISTS authors;
    """)
