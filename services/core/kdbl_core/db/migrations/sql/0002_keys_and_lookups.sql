-- Per-installation secrets (cursor signing) shared by every API replica, and a tenant lookup by name
-- for OIDC tokens (the API role sees only its own tenant's row through RLS, so it cannot resolve a
-- tenant name on its own before a principal exists).

CREATE TABLE server_keys (
    name        text PRIMARY KEY,
    secret      bytea NOT NULL CHECK (length(secret) >= 32),
    created_at  timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON server_keys FROM PUBLIC;
GRANT SELECT ON server_keys TO kdbl_api;
GRANT SELECT, INSERT, UPDATE, DELETE ON server_keys TO kdbl_admin;

CREATE FUNCTION kdbl_tenant_by_name(p_name text)
    RETURNS TABLE (id uuid, name text)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$ SELECT t.id, t.name FROM public.tenants t WHERE t.name = p_name $$;
REVOKE ALL ON FUNCTION kdbl_tenant_by_name(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION kdbl_tenant_by_name(text) TO kdbl_api;
