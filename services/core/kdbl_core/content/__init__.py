"""Content: the one file and chunk record, the write path (files, chunks with their terms, the keyword
index's packed lists or postings rows, BM25 statistics), the lists' builds,
the API's reads, chunk vectors and kdbl:// URIs."""
