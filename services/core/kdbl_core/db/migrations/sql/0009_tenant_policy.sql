-- Tenant policy enforced by the API (issue 12 item 2), token fingerprints (issue 13 item 5) and the
-- download link's re-check of its minting token (issue 13 item 3).

-- Rate-limit buckets shared by every API replica and process: one row per (tenant or token, tier).
-- UNLOGGED: a crash empties it (every bucket starts full again), and its writes skip the WAL.
-- The API role has no privilege on the table: it calls kdbl_rate_take.
CREATE UNLOGGED TABLE rate_buckets (
    key         text PRIMARY KEY,
    tokens      double precision NOT NULL,
    capacity    double precision NOT NULL,
    rate        double precision NOT NULL,      -- tokens added per second
    stamp       timestamptz NOT NULL
);
REVOKE ALL ON rate_buckets FROM PUBLIC;
GRANT SELECT, DELETE ON rate_buckets TO kdbl_admin;

-- Take one request from every named bucket, or from none: a refill (one UPSERT, rows locked in key
-- order, so concurrent callers never deadlock) and, when every bucket holds a whole token, one
-- decrement. Returns each bucket's remaining tokens and, for a refused call, the seconds until it
-- would pass.
CREATE FUNCTION kdbl_rate_take(p_keys text[], p_caps double precision[], p_rates double precision[])
    RETURNS TABLE (key text, remaining double precision, capacity double precision,
                   retry_after double precision)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
#variable_conflict use_column
DECLARE
    t   timestamptz := clock_timestamp();
    ok  boolean;
BEGIN
    WITH refill AS (
        INSERT INTO public.rate_buckets AS b (key, tokens, capacity, rate, stamp)
        SELECT u.k, u.c, u.c, u.r, t FROM unnest(p_keys, p_caps, p_rates) AS u(k, c, r) ORDER BY u.k
        ON CONFLICT (key) DO UPDATE
           SET tokens = least(EXCLUDED.capacity,
                              b.tokens + greatest(0, extract(epoch FROM t - b.stamp)) * EXCLUDED.rate),
               capacity = EXCLUDED.capacity, rate = EXCLUDED.rate, stamp = t
        RETURNING b.tokens)
    SELECT bool_and(refill.tokens >= 1) INTO ok FROM refill;
    IF ok THEN
        RETURN QUERY UPDATE public.rate_buckets b SET tokens = b.tokens - 1 WHERE b.key = ANY (p_keys)
                     RETURNING b.key, b.tokens, b.capacity, 0::double precision;
    ELSE
        RETURN QUERY SELECT b.key, b.tokens, b.capacity,
                            CASE WHEN b.tokens >= 1 THEN 0 ELSE (1 - b.tokens) / b.rate END
                       FROM public.rate_buckets b WHERE b.key = ANY (p_keys);
    END IF;
END
$$;
REVOKE ALL ON FUNCTION kdbl_rate_take(text[], double precision[], double precision[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION kdbl_rate_take(text[], double precision[], double precision[]) TO kdbl_api;

-- A tenant's settings before any principal exists (the API's policy cache; the role sees tenants
-- only through RLS otherwise).
CREATE FUNCTION kdbl_tenant_settings(p_tenant uuid)
    RETURNS TABLE (settings jsonb)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$ SELECT t.settings FROM public.tenants t WHERE t.id = p_tenant $$;
REVOKE ALL ON FUNCTION kdbl_tenant_settings(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION kdbl_tenant_settings(uuid) TO kdbl_api;

-- The state of the token a download link was minted with (revoked, expired, its tenant).
CREATE FUNCTION kdbl_token_state(p_token uuid)
    RETURNS TABLE (tenant_id uuid, expires_at timestamptz, revoked_at timestamptz)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$ SELECT t.tenant_id, t.expires_at, t.revoked_at FROM public.tokens t WHERE t.id = p_token $$;
REVOKE ALL ON FUNCTION kdbl_token_state(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION kdbl_token_state(uuid) TO kdbl_api;

-- A cheap fingerprint of each token (HMAC-SHA256, first 16 bytes): a wrong secret is refuted
-- without argon2, so guesses need no per-lookup-id failure budget that could lock out the holder.
ALTER TABLE tokens ADD COLUMN fingerprint bytea;

DROP FUNCTION kdbl_token_lookup(text);
CREATE FUNCTION kdbl_token_lookup(p_lookup_id text)
    RETURNS TABLE (id uuid, tenant_id uuid, tenant_name text, kind text, subject text, groups text[],
                   scopes text[], hash text, expires_at timestamptz, revoked_at timestamptz,
                   fingerprint bytea)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
        SELECT t.id, t.tenant_id, n.name, t.kind, t.subject, t.groups, t.scopes, t.hash,
               t.expires_at, t.revoked_at, t.fingerprint
          FROM public.tokens t LEFT JOIN public.tenants n ON n.id = t.tenant_id
         WHERE t.lookup_id = p_lookup_id
    $$;
REVOKE ALL ON FUNCTION kdbl_token_lookup(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION kdbl_token_lookup(text) TO kdbl_api;

-- A token made before this migration gets its fingerprint when the API first verifies it with
-- argon2 (set once: it can never be changed through this function).
CREATE FUNCTION kdbl_token_set_fingerprint(p_lookup_id text, p_fingerprint bytea)
    RETURNS void
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$ UPDATE public.tokens SET fingerprint = p_fingerprint
           WHERE lookup_id = p_lookup_id AND fingerprint IS NULL $$;
REVOKE ALL ON FUNCTION kdbl_token_set_fingerprint(text, bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION kdbl_token_set_fingerprint(text, bytea) TO kdbl_api;

-- `kdbl-control mcp audit` filters by status and principal over time
CREATE INDEX audit_status_ts_idx ON audit (status, ts DESC);

-- The buckets as they would stand now, without taking anything (for /capacity).
CREATE FUNCTION kdbl_rate_peek(p_keys text[], p_caps double precision[], p_rates double precision[])
    RETURNS TABLE (key text, remaining double precision, capacity double precision)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
        SELECT u.k,
               coalesce(least(u.c, b.tokens + greatest(0, extract(epoch FROM clock_timestamp() - b.stamp)) * u.r),
                        u.c),
               u.c
          FROM unnest(p_keys, p_caps, p_rates) AS u(k, c, r)
          LEFT JOIN public.rate_buckets b ON b.key = u.k
    $$;
REVOKE ALL ON FUNCTION kdbl_rate_peek(text[], double precision[], double precision[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION kdbl_rate_peek(text[], double precision[], double precision[]) TO kdbl_api;
