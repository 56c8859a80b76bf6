"""K-Lake API pod: MCP over Streamable HTTP, downloads, capacity, health."""
