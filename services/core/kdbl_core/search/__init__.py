"""Retrieval: the search pipeline behind one entry point (`pipeline.search`), its BM25 (`lexical`) and
vector (`vector`) arms, fusion and rerank (`hybrid`), hit windows (`windows`) and snippets (`snippets`)."""
