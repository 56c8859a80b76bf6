-- enforced tenant policy, shared rate-limit buckets, audit of refusals (issue 12 items 2-3)
-- (placeholder: filled in by the change that owns it)
SELECT 1;
