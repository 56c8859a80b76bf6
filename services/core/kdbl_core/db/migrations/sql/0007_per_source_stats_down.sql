-- Undo 0007: tenant-wide statistics again (the per-source rows summed), readable by the whole tenant.

DROP POLICY api_read ON term_stats;
CREATE POLICY api_read ON term_stats FOR SELECT TO kdbl_api USING (tenant_id = kdbl_tenant());
DROP POLICY api_read ON corpus_stats;
CREATE POLICY api_read ON corpus_stats FOR SELECT TO kdbl_api USING (tenant_id = kdbl_tenant());

CREATE TEMP TABLE kdbl_term_stats_0006 ON COMMIT DROP AS
SELECT tenant_id, term, shard, sum(df)::int AS df FROM term_stats GROUP BY tenant_id, term, shard;
ALTER TABLE term_stats DROP CONSTRAINT term_stats_pkey;
ALTER TABLE term_stats DROP CONSTRAINT term_stats_source_id_fkey;
DELETE FROM term_stats;
ALTER TABLE term_stats DROP COLUMN source_id;
INSERT INTO term_stats (tenant_id, term, shard, df) SELECT tenant_id, term, shard, df FROM kdbl_term_stats_0006;
ALTER TABLE term_stats ADD CONSTRAINT term_stats_pkey PRIMARY KEY (tenant_id, term, shard);
ALTER TABLE term_stats ADD CONSTRAINT term_stats_tenant_id_fkey
    FOREIGN KEY (tenant_id) REFERENCES tenants (id) ON DELETE CASCADE;

CREATE TEMP TABLE kdbl_corpus_stats_0006 ON COMMIT DROP AS
SELECT tenant_id, shard, sum(n_chunks)::bigint AS n_chunks, sum(total_len)::bigint AS total_len
  FROM corpus_stats GROUP BY tenant_id, shard;
ALTER TABLE corpus_stats DROP CONSTRAINT corpus_stats_pkey;
ALTER TABLE corpus_stats DROP CONSTRAINT corpus_stats_source_id_fkey;
DELETE FROM corpus_stats;
ALTER TABLE corpus_stats DROP COLUMN source_id;
INSERT INTO corpus_stats (tenant_id, shard, n_chunks, total_len)
SELECT tenant_id, shard, n_chunks, total_len FROM kdbl_corpus_stats_0006;
ALTER TABLE corpus_stats ADD CONSTRAINT corpus_stats_pkey PRIMARY KEY (tenant_id, shard);
ALTER TABLE corpus_stats ADD CONSTRAINT corpus_stats_tenant_id_fkey
    FOREIGN KEY (tenant_id) REFERENCES tenants (id) ON DELETE CASCADE;
