-- Crawl leases that expire without progress, and poison files (issue 12 item 1).
--
-- A worker's heartbeat used to renew every lease it held as long as the process was alive, so a
-- writer stuck for good kept its file claimed for good, and after a kill -9 the next worker claimed
-- the same file and stuck again. Now (kdbl_worker/jobs.py, kdbl_worker/queue.py):
--   started_at  stamped by the holder's heartbeat on the items it is actually extracting or writing
--               (not on those merely claimed and waiting in its batch); cleared by every new claim.
--   breaks      how many times a lease on the item expired while it was started: its holder died or
--               stopped making progress with this very file in hand. At `max_breaks` (2) the item is
--               recorded failed ("poison file") instead of being claimed again.

ALTER TABLE crawl_items ADD COLUMN started_at timestamptz;
ALTER TABLE crawl_items ADD COLUMN breaks integer NOT NULL DEFAULT 0;
