"""Who may see what: principals and the RLS transactions scoped to them, bearer tokens (PAT, OIDC),
tenant policy, signed links and cursors."""
