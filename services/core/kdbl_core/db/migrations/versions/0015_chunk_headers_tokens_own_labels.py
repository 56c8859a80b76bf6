"""chunks.context_header, chunks.text_tokens and files.own_labels (issue 16).

- `chunks.context_header`: the heading path above a chunk ("Guide > Install > Offline"): Markdown/HTML
  headings, DOCX heading styles, the PDF outline, carried from extraction through chunking. NULL where
  the format has no headings or the file was indexed before this migration (a re-index fills it).
- `chunks.text_tokens`: the chunk text's length in the tokens of the embedding model's tokenizer, the
  per-hit `token_count` an agent budgets its context with. (`chunks.token_count` stays what it was: the
  BM25 document length in analyzed terms, which the statistics sum.) NULL for chunks indexed before.
- `files.own_labels`: the file's own tags (S3 object tags, Markdown front matter `tags`), kept apart
  from `files.labels` (the source's config labels + the own tags) so that a change of the source's
  `labels` / `label_globs` relabels every file without reading it again.

All three are nullable or have a constant default: adding them rewrites nothing (instant on a large
table).

Revision ID: 0015
Revises: 0014
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute("""
        ALTER TABLE chunks ADD COLUMN context_header text,
                           ADD COLUMN text_tokens integer;
        ALTER TABLE files ADD COLUMN own_labels text[] NOT NULL DEFAULT '{}'::text[];
    """)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute("""
        ALTER TABLE files DROP COLUMN IF EXISTS own_labels;
        ALTER TABLE chunks DROP COLUMN IF EXISTS text_tokens, DROP COLUMN IF EXISTS context_header;
    """)
