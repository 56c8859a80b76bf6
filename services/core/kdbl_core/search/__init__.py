"""Retrieval: BM25 keyword arm, hit windows; the vector arm and fusion join here (hybrid issue)."""
