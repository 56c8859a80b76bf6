"""Authentication: tenant PATs (offline argon2id check) and, later, OIDC tokens via a JWKS file."""
