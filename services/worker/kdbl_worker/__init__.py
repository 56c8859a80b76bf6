"""K-Lake ingestion worker: connectors, extraction, chunking, indexing, internal fetch."""
