"""Score bounds for the keyword arm's MaxScore top-k (issue 19): term_stats.tf_max, corpus_stats.dl_min.

A posting of term t scores idf_t (k1+1) tf / (tf + k1 (1-b + b dl / avgdl)): rising with tf, falling
with dl. So no posting of t scores more than with its largest tf (`term_stats.tf_max`, per source and
shard, summed as a max over what the principal sees) in the shortest chunk (`corpus_stats.dl_min`, per
source). kdbl_core.search.bm25_topk uses these bounds to skip the postings of terms that cannot change
the top k. Writers keep the maximum and the minimum; a delete leaves them, which only loosens a bound
(never makes it wrong). Both are filled here from the postings and chunks (one pass over postings:
about a minute per 60M postings).

Revision ID: 0016
Revises: 0015
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute("""
        ALTER TABLE term_stats ADD COLUMN tf_max smallint;
        ALTER TABLE corpus_stats ADD COLUMN dl_min integer;
        UPDATE term_stats s SET tf_max = m.tf_max
          FROM (SELECT tenant_id, source_id, term, max(tf) AS tf_max FROM postings
                 GROUP BY tenant_id, source_id, term) m
         WHERE m.tenant_id = s.tenant_id AND m.source_id = s.source_id AND m.term = s.term;
        UPDATE corpus_stats s SET dl_min = m.dl_min
          FROM (SELECT source_id, min(token_count) AS dl_min FROM chunks GROUP BY source_id) m
         WHERE m.source_id = s.source_id;
    """)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute("""
        ALTER TABLE corpus_stats DROP COLUMN IF EXISTS dl_min;
        ALTER TABLE term_stats DROP COLUMN IF EXISTS tf_max;
    """)
