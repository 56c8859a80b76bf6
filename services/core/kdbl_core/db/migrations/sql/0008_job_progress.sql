-- crawl leases that expire without progress, poison files (issue 12 item 1)
-- (placeholder: filled in by the change that owns it)
SELECT 1;
