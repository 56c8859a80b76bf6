-- per-source BM25 statistics (issue 13 item 4)
-- (placeholder: filled in by the change that owns it)
SELECT 1;
