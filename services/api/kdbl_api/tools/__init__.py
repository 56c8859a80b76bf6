"""The MCP tools of the skills reference, one module per family, registered in `registry`."""
