-- BM25 statistics per source (issue 13 item 4).
--
-- Document frequencies (term_stats) and corpus size/length (corpus_stats) were kept per tenant, so a
-- principal's scores moved with content it may not see: idf(df) with N let anyone count the hidden
-- chunks that contain a word. They are now kept per source (still sharded by backend, so concurrent
-- writers rarely touch the same row) and kdbl_api reads only the rows of sources it sees whole; the
-- query side (kdbl_core.search.lexical) adds the exact counts of files granted one by one.
-- A source's rows go with it (ON DELETE CASCADE); a tenant's go with its sources.

ALTER TABLE term_stats DROP CONSTRAINT term_stats_pkey;
ALTER TABLE term_stats DROP CONSTRAINT term_stats_tenant_id_fkey;
ALTER TABLE term_stats ADD COLUMN source_id uuid;
DELETE FROM term_stats;
INSERT INTO term_stats (tenant_id, term, shard, df, source_id)
SELECT tenant_id, term, 0, count(*), source_id FROM postings GROUP BY tenant_id, source_id, term;
ALTER TABLE term_stats ALTER COLUMN source_id SET NOT NULL;
ALTER TABLE term_stats ADD CONSTRAINT term_stats_pkey PRIMARY KEY (tenant_id, term, source_id, shard);
ALTER TABLE term_stats ADD CONSTRAINT term_stats_source_id_fkey
    FOREIGN KEY (source_id) REFERENCES sources (id) ON DELETE CASCADE;

ALTER TABLE corpus_stats DROP CONSTRAINT corpus_stats_pkey;
ALTER TABLE corpus_stats DROP CONSTRAINT corpus_stats_tenant_id_fkey;
ALTER TABLE corpus_stats ADD COLUMN source_id uuid;
DELETE FROM corpus_stats;
INSERT INTO corpus_stats (tenant_id, shard, n_chunks, total_len, source_id)
SELECT tenant_id, 0, count(*), coalesce(sum(token_count), 0), source_id FROM chunks GROUP BY tenant_id, source_id;
ALTER TABLE corpus_stats ALTER COLUMN source_id SET NOT NULL;
ALTER TABLE corpus_stats ADD CONSTRAINT corpus_stats_pkey PRIMARY KEY (tenant_id, source_id, shard);
ALTER TABLE corpus_stats ADD CONSTRAINT corpus_stats_source_id_fkey
    FOREIGN KEY (source_id) REFERENCES sources (id) ON DELETE CASCADE;

-- The API sees the statistics of the sources it sees whole (open to the tenant or granted as a whole).
DROP POLICY api_read ON term_stats;
CREATE POLICY api_read ON term_stats FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant() AND source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id)));
DROP POLICY api_read ON corpus_stats;
CREATE POLICY api_read ON corpus_stats FOR SELECT TO kdbl_api
    USING (tenant_id = kdbl_tenant() AND source_id IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id)));
