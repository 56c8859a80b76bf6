"""kdbl-control: the admin CLI (tenants, sources, tokens, grants, crawl, mcp smoke/audit, up)."""
