"""Content: the one file and chunk record, the write path (files, chunks, postings, BM25 statistics),
the API's reads, chunk vectors and kdbl:// URIs."""
